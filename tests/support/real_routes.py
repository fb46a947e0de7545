"""Long prompts on the remote route, on a loaded machine.

A router lowers a link's available bandwidth when its KV pulls run late (:mod:`prfaas_core.policy.link_estimate`),
and on CPU vLLM a pull now and then takes seconds instead of a fraction of one (the decode engine busy-steps on a
loaded 2-core machine; in the netns tier the shaped veth adds its own queue). For a while after such a pull the
router keeps long prompts local *for the link's sake*, as designed: the decision's reason is ``admission`` (the
squeezed cap) or ``wait_for_link`` (the gateway's window, later than the local TTFT). Both CI failures of the real
tier's remote-route tests (a 1,500-token prompt answered ``local``) were this: the loopback stack's link is now
``availableBandwidth: Configured`` (engines on one host), and the netns tier, whose link is measured, uses these.

So a test about what happens on the remote route waits until the router's estimate has lifted back to the
configured capacity before it sends, and sends again (a fresh attempt, measured afresh by the caller) when the
link, and only the link, kept the request local. Any other reason for ``local`` fails the test, with the router's
decisions in the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx

from prfaas_core import names
from prfaas_router.path.call import ROUTE_HEADER
from prfaas_router.state.metrics import sample_sum
from prfaas_testbed.prom import wait_until

T = TypeVar("T")

LINK_REASONS = ("admission", names.REASON_WAIT_FOR_LINK)
"""The decision reasons of a long prompt kept local because of the link's bandwidth."""
REASONS = ("threshold", "unavailable", "admission", "spill", names.REASON_WAIT_FOR_LINK, "no-local-prefill")


def _metrics(router: str) -> str:
    return httpx.get(router + "/metrics", timeout=10).text


def link_whole(router: str) -> bool:
    """Every link's available bandwidth is the configured capacity (no squeeze or stall in force)."""
    text = _metrics(router)
    whole = sample_sum(text, names.METRIC_ROUTER_LINK_AVAILABLE_SOURCE, {"source": "configured"})
    links = sample_sum(text, names.METRIC_ROUTER_LINK_AVAILABLE_SOURCE)
    return whole is not None and whole == links


def wait_link_whole(router: str, timeout_s: float = 90.0) -> None:
    """Wait until the router's links are back at their configured capacity (a squeeze lifts within ~25 s)."""
    wait_until(lambda: link_whole(router), timeout_s, f"{router}'s link estimate back at the configured capacity")


def local_decisions(router: str) -> dict[str, float]:
    text = _metrics(router)
    labels = {"route": "local"}
    return {r: sample_sum(text, names.METRIC_ROUTER_ROUTE_DECISIONS, {**labels, "reason": r}) or 0.0 for r in REASONS}


def route_of(r: httpx.Response) -> str:
    """The route a router answer took (the answer must be a 200)."""
    assert r.status_code == 200, r.text
    return str(r.headers[ROUTE_HEADER])


def on_the_remote_route(router: str, send: Callable[[], T], route: Callable[[T], str], tries: int = 4) -> T:
    """``send()`` once the link is whole; again (up to ``tries``) while the link alone keeps it local.
    Returns the first result whose ``route`` is ``remote``."""
    seen: list[str] = []
    for _ in range(tries):
        wait_link_whole(router)
        before = local_decisions(router)
        out = send()
        got = route(out)
        if got == "remote":
            return out
        seen.append(got)
        moved = {r: v - before[r] for r, v in local_decisions(router).items() if v != before[r]}
        assert moved and set(moved) <= set(LINK_REASONS), (
            f"a long prompt went {got}, not for the link's bandwidth: the router's local decisions moved by {moved}"
        )
    raise AssertionError(f"the link kept a long prompt off the remote route {tries} times: {seen}")
