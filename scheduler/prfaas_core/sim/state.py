"""The types the simulation loop and its long-term control share: a request's state in one run, and what
the control reads and changes on the simulation (:class:`SimState`, which
:class:`~prfaas_core.sim.simulation.Simulation` provides), so that neither module imports the other."""

from __future__ import annotations

import math
from typing import Protocol

from ..policy.link_calendar import Window
from .arrivals import SimRequest
from .config import SimConfig
from .instances import Instance
from .results import RunResult


class Req:
    """A request's state in one run."""

    __slots__ = (
        "done_s",
        "first_token_s",
        "kv_ready_s",
        "prefill_end_s",
        "remote",
        "replica",
        "spec",
        "transfer_bytes",
        "uncached",
        "window",
    )

    def __init__(self, spec: SimRequest) -> None:
        self.spec = spec
        self.remote = False
        self.uncached = spec.input_tokens
        self.transfer_bytes = 0.0
        self.prefill_end_s = math.nan
        self.kv_ready_s = math.nan
        self.first_token_s = math.nan
        self.done_s = math.nan
        self.replica = 0
        """The router replica that routed it (its ledger records the stream)."""
        self.window: Window | None = None
        """The link window booked for its KV stream (the gateway's calendar), if any."""


class SimState(Protocol):
    """What the long-term control observes and acts on."""

    cfg: SimConfig
    duration_s: float
    pd: list[Instance]
    prfaas: list[Instance]
    by_name: dict[str, Instance]
    result: RunResult
    t: int
    """The ``t`` in force."""
    t_min: int
    """The threshold policy's lower bound (the long-term loop publishes it)."""

    def redispatch_prefill(self, req: Req) -> None:
        """A queued PD prefill whose instance was flipped before it started."""

    def redispatch_decode(self, req: Req) -> None:
        """A stream waiting on an instance flipped to prefill."""
