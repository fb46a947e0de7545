"""The TTFT objective of one request: the one rule every part judges a first token by.

It is judged on **the whole prompt as the client sent it** — the tokens the engine reports as ``prompt_tokens``
(a trace's ``input_tokens``) — not on the uncached part: the prompt's length is known exactly before routing, is
the same in the router, its ``x-prfaas-slo-ttft-ms`` header and its metrics, the simulator, the load client,
``prfaas up``'s report and the benchmarks, and depends on no cache prediction. Uncached tokens stay the measure
of prefill *work* for routing; they do not move the objective.

The rule's parameters live in the API (``SloSpec.ttft``); this package sits beside the API in the core's layers
and reads them through :class:`SloLike`, so anything shaped like ``SloSpec`` can be judged.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["SloLike", "TtftRule", "ttft_objective_s"]


class TtftRule(Protocol):
    """The affine TTFT rule's two parameters (``TtftSlo`` in the API)."""

    @property
    def base_seconds(self) -> float: ...

    @property
    def seconds_per_k_tokens(self) -> float: ...


class SloLike(Protocol):
    """What the objective reads of the service-level objectives (``SloSpec`` in the API)."""

    @property
    def ttft(self) -> TtftRule: ...


def ttft_objective_s(slo: SloLike, prompt_tokens: float) -> float:
    """A request's TTFT objective: ``base + per_1K x prompt_tokens / 1024`` seconds, ``prompt_tokens`` the whole
    prompt as the client sent it (cached or not)."""
    return slo.ttft.base_seconds + slo.ttft.seconds_per_k_tokens * prompt_tokens / 1024
