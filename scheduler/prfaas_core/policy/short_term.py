"""The short-term pipeline as two entry points, shared by the router, the gateway and the simulator.

* :func:`refresh` (about once a second): the links' egress measurements go into their
  :class:`~.link_state.EgressLedger`, each ledger's estimate gives the link's next scarce/abundant state, and the
  threshold ``t`` is re-evaluated from the recent incremental lengths against the scarcest link's budget.
* :func:`route` (per request): the routing view (``t`` in force, the remote link's mode, the ledger's
  admission estimate and queue wait, the local queue) -> :func:`~.routing.decide_route` -> the prefill and
  decode instances (:func:`~.routing.pick_prefill_instance`, :func:`~.routing.pick_decode_instance`), the
  remote side chosen among the ready ones whose :class:`~.breaker.BreakerBoard` could allow it (of several, the
  lowest TTFT predicted through each link's ledger, :func:`.fleet.predicted_ttft_s`); only when
  the decision sends the request there (and a decode instance takes it) is a probe acquired
  (:attr:`RoutePlan.probe`), so a short request never takes a half-open breaker's probe.

Which functions decide is a parameter, :class:`ShortTermPolicy` (:data:`PRODUCTION` by default): a baseline
(fixed ``t``, least-queued instances) is another instance of it, never a monkeypatch. A shell that picks an
instance later than it routes (the simulator picks when a queued move has landed) calls the policy's pickers
itself. Time is a parameter; nothing here does I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..capacity.kv import KvModel
from .breaker import BreakerBoard, BreakerParams
from .fleet import fastest, predicted_ttft_s
from .frozen import quick_init
from .link_state import NO_TRAFFIC, EgressLedger, LinkMode, LinkParams, LinkState, next_link_state
from .routing import (
    InstancePick,
    InstanceView,
    RouteDecision,
    RouteRequest,
    RoutingView,
    decide_route,
    pick_decode_instance,
    pick_prefill_instance,
    transfer_bytes,
)
from .threshold import ThresholdBounds, ThresholdDecision, calendar_threshold, decide_threshold

SecondsFn = Callable[[float], float]
RouteFn = Callable[[RouteRequest, RoutingView, KvModel, SecondsFn, SecondsFn | None], RouteDecision]
PrefillPickFn = Callable[[Sequence[InstanceView], int, SecondsFn], InstancePick]
DecodePickFn = Callable[[Sequence[InstanceView]], InstancePick]
ThresholdFn = Callable[[LinkMode, ThresholdBounds, Sequence[int], float, KvModel, LinkParams], ThresholdDecision]
LinkStateFn = Callable[[LinkState, float, LinkParams, float], LinkState]


@dataclass(frozen=True)
class ShortTermPolicy:
    """The decisions the pipeline calls; the defaults are the production policies."""

    route: RouteFn = decide_route
    pick_prefill: PrefillPickFn = pick_prefill_instance
    pick_decode: DecodePickFn = pick_decode_instance
    threshold: ThresholdFn = decide_threshold
    link_state: LinkStateFn = next_link_state


PRODUCTION = ShortTermPolicy()
SCHEDULED_LINK = ShortTermPolicy(threshold=calendar_threshold)
"""The production policies where the link is scheduled (a gateway's link calendar books every stream)."""


class RecentLengths:
    """The incremental lengths of recent requests (``(model time, tokens)``), what ``t`` is computed from."""

    def __init__(self) -> None:
        self._times: deque[float] = deque()
        self._lengths: deque[int] = deque()
        """Apart from their times: the list is copied in C (a router at 1,300 req/s holds 78,000 in a 60-s window,
        and a comprehension over pairs paused its event loop ~4 ms every refresh)."""

    def add(self, now_s: float, tokens: int) -> None:
        self._times.append(now_s)
        self._lengths.append(tokens)

    def within(self, now_s: float, window_s: float) -> list[int]:
        """The lengths that arrived in the last ``window_s`` (older ones are forgotten)."""
        horizon = now_s - window_s
        times, lengths = self._times, self._lengths
        while times and times[0] < horizon:
            times.popleft()
            lengths.popleft()
        return list(lengths)

    def __len__(self) -> int:
        return len(self._times)


# --- entry point 1: link states and t -----------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class RefreshTick:
    """One refresh's input."""

    now_s: float
    links: Mapping[str, LinkParams]
    """The links, in configuration order (the first scarce one, else the first, prices ``t``)."""
    ledgers: Mapping[str, EgressLedger]
    previous: Mapping[str, LinkState]
    """Each link's state after the last refresh (a link missing starts abundant)."""
    bounds: ThresholdBounds
    kv: KvModel
    lengths: Sequence[int]
    """The incremental lengths of the last window (:meth:`RecentLengths.within`)."""
    window_s: float
    """The span those lengths arrived over (the rate is their count over it)."""
    threshold: ThresholdDecision
    """The ``t`` in force; kept when ``decide_threshold`` is False."""
    measured_gbps: Mapping[str, float] | None = None
    """Each link's measured total egress since the last refresh, recorded into its ledger first."""
    decide_threshold: bool = True
    scheduled: frozenset[str] = frozenset()
    """The links a gateway books in its calendar: their state follows the measured egress (what the wire
    carries), not this ledger's estimate, which counts a dispatched stream from its expected start although the
    gateway may hold its prefill for a later window (a router read 9.6 Gbps on a 4-Gbps cap carrying 2)."""


@quick_init
@dataclass(frozen=True)
class Refreshed:
    links: dict[str, LinkState]
    threshold: ThresholdDecision
    changed_links: tuple[str, ...]
    """The links whose mode changed (a shell logs them)."""

    @property
    def scarce(self) -> bool:
        return any(s.scarce for s in self.links.values())


NO_LINK = "no link: t = t_min"


def refresh(tick: RefreshTick, policy: ShortTermPolicy = PRODUCTION) -> Refreshed:
    """Ledger -> link state per link -> ``t``."""
    now = tick.now_s
    links: dict[str, LinkState] = {}
    changed: list[str] = []
    for name, params in tick.links.items():
        ledger = tick.ledgers[name]
        if tick.measured_gbps is not None and name in tick.measured_gbps:
            ledger.record_measurement(tick.measured_gbps[name], now)
        prev = tick.previous.get(name) or NO_TRAFFIC
        estimate = ledger.estimate_gbps(now, params)
        if name in tick.scheduled and tick.measured_gbps is not None and name in tick.measured_gbps:
            estimate = tick.measured_gbps[name]
        links[name] = policy.link_state(prev, estimate, params, now)
        if links[name].mode != prev.mode:
            changed.append(name)
    threshold = tick.threshold
    if tick.decide_threshold:
        scarce = [n for n, s in links.items() if s.scarce]
        mode: LinkMode = "scarce" if scarce else "abundant"
        pricing = tick.links[scarce[0]] if scarce else next(iter(tick.links.values()), None)
        if pricing is None:
            threshold = ThresholdDecision(tick.bounds.min_tokens, 0, NO_LINK)
        else:
            threshold = policy.threshold(mode, tick.bounds, tick.lengths, tick.window_s, tick.kv, pricing)
    return Refreshed(links, threshold, tuple(changed))


# --- entry point 2: one request -----------------------------------------------------------------------------
# (slotted values, as :mod:`.routing`'s: made per request, never mutated)


@dataclass(slots=True)
class RemoteSide:
    """A remote PrFaaS cluster as one decision sees it."""

    name: str
    link: str
    not_ready: str | None = None
    """Why it cannot take work (its status), None when ready."""
    cached_tokens: int = 0
    """The request's prefix it already holds."""
    scheduled: bool = False
    """Its gateway books the link in a calendar (source-side admission, :mod:`.link_calendar`): this router's
    ledger, which sees only its own streams at their production rate, is a pre-filter there, not the judge. A
    long request the ledger would not admit is still sent; the gateway reserves a window or declines it with
    the earliest start, and the router then waits or prefills locally (the simulator asks its gateway the same
    way)."""


DEFAULT_BREAKER = BreakerParams()
"""The breaker parameters a :class:`RouteTick` carries unless given others."""


@dataclass(slots=True)
class RouteTick:
    """One request's input: the request, what the last refresh left, the ledgers and the local queue."""

    now_s: float
    request: RouteRequest
    threshold_tokens: int
    kv: KvModel
    prfaas_seconds: SecondsFn
    pd_seconds: SecondsFn
    links: Mapping[str, LinkParams]
    link_states: Mapping[str, LinkState]
    ledgers: Mapping[str, EgressLedger]
    remotes: Sequence[RemoteSide] = ()
    """The remote sides in preference order: of the ready ones its breaker allows, the lowest predicted TTFT is
    used (ties: the first)."""
    local_wait_s: float | None = None
    remote_wait_s: float | None = None
    """The remote queue's wait when ``wait_from_ledger`` is False (the simulator knows its PrFaaS queues)."""
    wait_from_ledger: bool = True
    """The remote wait is the ledger's (its lanes' queue), as a router predicts it."""
    breakers: BreakerBoard | None = None
    """Consulted per remote; acquired (a half-open breaker's probe) only for a request routed there."""
    breaker_now_s: float = 0.0
    breaker_params: BreakerParams = DEFAULT_BREAKER
    """(A frozen value: the default shared, where a factory made one per request.)"""
    prefill: Sequence[InstanceView] | None = None
    """The local prefill instances to pick from now (None: the shell picks later)."""
    decode: Sequence[InstanceView] | None = None
    unavailable_reason: str = "remote unavailable"
    cache_moves: bool = True
    """Whether prefixes can move between clusters (:attr:`~.routing.RoutingView.cache_moves`)."""


@dataclass(slots=True)
class RoutePlan:
    decision: RouteDecision
    remote: RemoteSide | None
    """The remote side that prefills (``decision.target == "remote"``), else None."""
    prefill: InstancePick | None = None
    decode: InstancePick | None = None
    probe: float | None = None
    """The breaker ticket of ``remote`` (its outcome must reach the board: success, failure or cancelled)."""


def _why_no_remote(tick: RouteTick) -> str:
    if not tick.remotes:
        return "no remote PrFaaS cluster configured"
    reasons = []
    for remote in tick.remotes:
        if remote.not_ready:
            reasons.append(f"{remote.name}: {remote.not_ready}")
        elif tick.breakers is not None and tick.breakers.is_open(remote.name):
            reasons.append(f"{remote.name}: breaker {tick.breakers.reason(remote.name)}")
    return "; ".join(reasons) or tick.unavailable_reason


def _usable(tick: RouteTick) -> RemoteSide | None:
    """The remote this request would use: of the ready ones whose breakers allow them, the one with the lowest
    TTFT predicted through its link (:func:`.fleet.predicted_ttft_s`; ties and a single one: the configured order)."""
    usable = [
        r
        for r in tick.remotes
        if r.not_ready is None
        and (tick.breakers is None or tick.breakers.available(r.name, tick.breaker_now_s, tick.breaker_params))
    ]
    if len(usable) <= 1:
        return usable[0] if usable else None
    req = tick.request
    nbytes = transfer_bytes(tick.kv, req.total_tokens, req.pd_cached_tokens)
    predicted = [
        predicted_ttft_s(
            tick.ledgers[r.link],
            tick.now_s,
            nbytes,
            tick.prfaas_seconds(float(max(1, req.total_tokens - r.cached_tokens))),
            tick.links[r.link],
        )
        if r.link in tick.ledgers and r.link in tick.links
        else math.inf
        for r in usable
    ]
    return usable[fastest(predicted)]


def route(tick: RouteTick, policy: ShortTermPolicy = PRODUCTION) -> RoutePlan:
    """View -> decision -> instance picks, for one request; the breaker is acquired only when the request
    will use the remote (routed there, and a decode instance is there to take it)."""
    plan = _route(tick, policy, _usable(tick))
    if plan.remote is None or tick.breakers is None:
        return plan
    if plan.decode is not None and plan.decode.name is None:
        plan.remote = None  # nothing can decode it: no remote work, no probe taken
        return plan
    ticket = tick.breakers.acquire(plan.remote.name, tick.breaker_now_s, tick.breaker_params)
    if ticket is None:  # not available after all: decide again without it
        return _route(tick, policy, None)
    plan.probe = ticket  # (the plan is this request's own, made just now)
    return plan


def _route(tick: RouteTick, policy: ShortTermPolicy, remote: RemoteSide | None) -> RoutePlan:
    req = tick.request
    if remote is None:
        view = RoutingView(
            tick.threshold_tokens, "abundant", 0.0, None, False, _why_no_remote(tick), tick.local_wait_s, None
        )
        if req.prfaas_cached_tokens != 0:
            req = replace(req, prfaas_cached_tokens=0)
    else:
        params = tick.links[remote.link]
        ledger = tick.ledgers[remote.link]
        state = tick.link_states.get(remote.link) or NO_TRAFFIC
        wait = ledger.queue_wait_s(tick.now_s) if tick.wait_from_ledger else tick.remote_wait_s
        view = RoutingView(
            tick.threshold_tokens,
            state.mode,
            ledger.admission_gbps(tick.now_s, params),
            params,
            True,
            "",
            tick.local_wait_s,
            wait,
            tick.cache_moves,
        )
        if req.prfaas_cached_tokens != remote.cached_tokens:  # (replace() is slow: copy only a changed request)
            req = replace(req, prfaas_cached_tokens=remote.cached_tokens)
    decision = policy.route(req, view, tick.kv, tick.prfaas_seconds, tick.pd_seconds)
    if decision.kind == "admission" and remote is not None and remote.scheduled:
        decision = _ask_the_calendar(decision, req, view, tick, policy)
    decode = policy.pick_decode(tick.decode) if tick.decode is not None else None
    prefill = None
    if tick.prefill is not None and (decode is None or decode.name is not None):
        prefill = policy.pick_prefill(tick.prefill, req.total_tokens, tick.pd_seconds)
        if prefill.name is None and decision.target == "local" and remote is not None:
            # no local prefill instance can take it (all draining or down): the remote, if it admits it,
            # prefills whatever its length (a threshold below every length)
            forced = policy.route(req, replace(view, threshold_tokens=-1), tick.kv, tick.prfaas_seconds, None)
            if forced.target == "remote":
                decision = replace(forced, why=("{}: {}", prefill.why, forced.why), kind="no-local-prefill")
    return RoutePlan(decision, remote if decision.target == "remote" else None, prefill, decode)


def _ask_the_calendar(
    declined: RouteDecision, req: RouteRequest, view: RoutingView, tick: RouteTick, policy: ShortTermPolicy
) -> RouteDecision:
    """A long request this router's ledger would not admit, on a link its remote's gateway schedules: sent
    there anyway (the calendar books every router's streams and the real PrFaaS queue; it answers with a window
    or a decline). The decision is the one an empty ledger gives; its reason is the ledger's verdict and who
    decides instead."""
    asked = policy.route(req, replace(view, egress_estimate_gbps=0.0), tick.kv, tick.prfaas_seconds, tick.pd_seconds)
    if asked.target != "remote":
        return declined
    reason = ("{} by this router's own ledger: remote prefill, the gateway's link calendar decides", declined.why)
    return replace(asked, why=reason)
