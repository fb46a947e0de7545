"""The discrete-event simulation of one deployment, driving the production policies on a virtual clock.

Request path (ARCHITECTURE.md, "The request path"): arrival -> prefix lookup in each cluster's pool -> the
core's short-term :func:`~prfaas_core.policy.short_term.route` (threshold ``t`` in force, link mode, egress
estimate, admission under the cap) -> the policy's prefill picker -> prefill (FIFO) -> for a remote prefill its
KV streams over the link layer-wise *during* the prefill -> when the KV is at the PD cluster, the policy's
decode picker -> decode slot -> done. The policies are a parameter (``policy``: production by default).

Short term, once per simulated second: the link's 1-s egress goes to the core's
:func:`~prfaas_core.policy.short_term.refresh` (the router's ledger, the scarce/abundant state, and with a
live threshold ``t`` re-evaluated from the last window of incremental lengths), as the router's refresher
does. Long term: the core's :func:`~prfaas_core.policy.long_term.step` on :mod:`.control`'s observation, its
effects carried out by :mod:`.control`, on its own schedule (``next_due_s``). Cross-cluster cache moves of
the abundant mode take the link too (PD -> PrFaaS moves the reverse direction, a link of its own).

TTFT is measured from arrival to the first token, which the decode instance streams after its first step;
it therefore includes prefill queueing, the part of the transfer not hidden by pipelining and any wait
for a decode slot. TPOT is ``T_decode``. Nothing is dropped: every request runs to completion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..names import GBPS_BITS
from ..policy import long_term
from ..policy.link_state import EgressLedger, LinkParams, LinkState
from ..policy.routing import RouteRequest, transfer_bytes
from ..policy.short_term import (
    PRODUCTION,
    SCHEDULED_LINK,
    RecentLengths,
    RefreshTick,
    RouteTick,
    ShortTermPolicy,
    refresh,
    route,
)
from ..request.slo import ttft_objective_s
from . import gateway as windows
from .arrivals import SimRequest
from .cache import HybridPrefixPool
from .config import SimConfig
from .control import SimControl
from .decode import DecodeSide
from .events import EventQueue
from .fluid_link import FluidLink
from .gateway import SimGateway
from .instances import Instance, Job, least_wait
from .results import RunResult
from .state import Req
from .stream_timer import StreamTimer
from .views import PickerViews, RouteMaps

__all__ = ["Req", "Simulation"]

ProgressFn = Callable[[float], None]
GIB = float(1 << 30)
LINK = "prfaas-to-pd"
"""The simulated link's name (the router's ledgers and link states are keyed by link)."""


class Simulation(DecodeSide):
    """One deployment over one request sequence (see the module docstring); ``policy``: the short-term
    policies (a baseline is another :class:`~prfaas_core.policy.short_term.ShortTermPolicy`)."""

    def __init__(
        self,
        config: SimConfig,
        requests: Sequence[SimRequest],
        duration_s: float,
        policy: ShortTermPolicy = PRODUCTION,
    ) -> None:
        self.cfg = config
        self.policy = SCHEDULED_LINK if config.link_windows and policy is PRODUCTION else policy
        self.requests = requests
        self.duration_s = duration_s
        inputs = config.inputs
        self.kv = inputs.kv
        # ``T_prefill`` of each side: the profiles' curves themselves (``HardwareProfile.prefill_seconds`` calls its
        # curve; called per request, per instance and per booked stream, the curve is one call less)
        self.prfaas_seconds = inputs.prfaas_hardware.prefill_curve
        self.pd_seconds = inputs.pd_hardware.prefill_curve
        decode = inputs.pd_hardware.decode
        assert decode is not None  # PlanInputs guarantees a decode capacity
        self.step_s = decode.step_time_s
        self.events = EventQueue()
        self.prfaas = [Instance(f"prfaas-{i}", "prfaas", "prefill", 0) for i in range(config.n_prfaas)]
        roles = ["prefill"] * config.n_prefill + ["decode"] * config.n_decode
        self.pd = [Instance(f"pd-{i}", "pd", r, decode.max_batch_size) for i, r in enumerate(roles)]  # type: ignore[arg-type]
        self.by_name = {i.name: i for i in self.pd}
        link = config.link
        self.configured_params = LinkParams(
            LINK, link.capacity_gbps, link.max_utilization, link.scarce_watermark, link.abundant_watermark
        )
        """The link as configured (a schedule step is an operator changing the capacity)."""
        self.link_params = self.configured_params
        """The configured link bounded by the available bandwidth the routers measure (:mod:`.link_estimate`)."""
        self.streams = StreamTimer()
        one_way = link.rtt_ms / 2000.0
        cap = link.capacity_gbps * GBPS_BITS / 8.0
        self.link = FluidLink(self.events, cap, one_way)
        self.reverse = FluidLink(self.events, cap, one_way)
        # one ledger per router replica (each sees its own streams and the measured total), like a router
        # reading the gateway's ready count; with link windows the gateway's calendar sees every stream
        self.ledgers = [EgressLedger(lanes=config.n_prfaas) for _ in range(config.router_replicas)]
        self.ledger = self.ledgers[0]
        self.link_states = [LinkState() for _ in self.ledgers]
        self.link_state = self.link_states[0]
        self.gateway = (
            SimGateway(config.n_prfaas, config.stream_timing, config.lane_order) if config.link_windows else None
        )
        cache = config.cache
        pool_bytes = cache.pool_capacity_gib * GIB
        self.pd_pool = HybridPrefixPool(self.kv, pool_bytes, cache.block_tokens, cache.checkpoints_per_session)
        self.prfaas_pool = HybridPrefixPool(self.kv, pool_bytes, cache.block_tokens, cache.checkpoints_per_session)
        self.t = config.threshold_tokens
        self.t_min = config.threshold_tokens
        self.threshold_reason = "initial t = t_min"
        self.window = RecentLengths()
        self.control = SimControl(self)
        self.loop_state: long_term.LoopState | None = long_term.LoopState() if config.live_roles else None
        self.result = RunResult(config.name, duration_s, len(requests))
        self.series = self.result.series
        self.arrived = 0
        self.completed = 0
        self._last_sent = 0.0
        self._window_capacity_gbps = config.link.capacity_gbps
        """The largest capacity in force during the current 1-s window (the series' ``capacity_gbps``)."""
        self._stop_s = math.inf
        self._progress: ProgressFn | None = None
        self.views, self.route_maps = PickerViews(), RouteMaps(LINK, self.ledgers)

    # --- running -----------------------------------------------------------------------------------------

    def run(self, until_s: float | None = None, progress: ProgressFn | None = None) -> RunResult:
        """Run to ``until_s`` (default: until every request has finished, at most ``3 × duration + 600`` s)."""
        ev = self.events
        arrive = self._arrive_spec  # (a request's state is made when it arrives: nothing held before, for GC)
        ev.at_all([(spec.arrival_s, arrive, spec) for spec in self.requests])
        for step in self.cfg.link.schedule:
            ev.at(step.at_seconds, self._set_capacity, step.capacity_gbps)
        ev.at(1.0, self._tick, None)
        if self.loop_state is not None:
            ev.at(self.cfg.role_params.period_s, self._run_loop, None)
        self._stop_s = until_s if until_s is not None else 3.0 * self.duration_s + 600.0
        self._progress = progress
        ev.run_until(self._stop_s)
        return self._finish(min(ev.now_s, self._last_event_s()))

    def _last_event_s(self) -> float:
        times = self.series.time_s
        return times[-1] if times else 0.0

    def _finish(self, end_s: float) -> RunResult:
        r = self.result
        r.end_s = end_s
        r.events = self.events.events_run
        r.completed = self.completed
        r.link_max_over_capacity_gbps = self.link.max_over_capacity * 8.0 / GBPS_BITS
        r.pool_hit_tokens = self.pd_pool.hit_tokens + self.prfaas_pool.hit_tokens
        r.pool_block_match_tokens = self.pd_pool.block_match_tokens + self.prfaas_pool.block_match_tokens
        if self.loop_state is not None:
            r.decisions = [(e.time_s, e.action, e.reason) for e in r.role_events[-len(self.loop_state.history) :]]
        return r

    # --- arrival and routing -------------------------------------------------------------------------------

    def _arrive_spec(self, spec: SimRequest) -> None:
        self._arrive(Req(spec))

    def _arrive(self, req: Req) -> None:
        now = self.events.now_s
        self.arrived += 1
        spec = req.spec
        total = spec.input_tokens
        shared = spec.shared_prefix_tokens
        cache_on = self.cfg.cache.enabled and shared > 0
        routing = self.cfg.routing
        if routing == "local":
            l_pd = self.pd_pool.lookup(spec.session, shared) if cache_on else 0
            self._record_length(now, total - l_pd)
            self._to_pd_prefill(req, total - l_pd)
            return
        l_pd = self.pd_pool.lookup(spec.session, shared) if cache_on else 0
        l_prf = self.prfaas_pool.lookup(spec.session, shared) if cache_on else 0
        held = max(l_pd, min(self.pd_pool.peek(spec.session, shared)[1], total - 1)) if cache_on else 0  # decode
        if routing == "remote":
            self._record_length(now, total - l_prf)
            self._to_remote(req, total - l_prf, transfer_bytes(self.kv, total, held))
            return
        if routing == "oblivious":  # remote by length, no cap: a PD router that ignores the link
            self._record_length(now, total - l_pd)
            if total - l_pd > self.t:
                self._to_remote(req, total - l_pd, transfer_bytes(self.kv, total, held))
            else:
                self._to_pd_prefill(req, total - l_pd)
            return
        k = req.replica = (self.arrived - 1) % len(self.ledgers)
        links, states, ledgers, remotes = self.route_maps.get(k, self.link_params, self.link_states[k], l_prf)
        local_wait = self.least_wait(self.pd, now)  # routing changes no queue: the gateway's ask reads it too
        slo = ttft_objective_s(self.cfg.slo, total)
        tick = RouteTick(
            now,
            RouteRequest(total, l_pd, l_prf, slo, held),
            self.t,
            self.kv,
            self.prfaas_seconds,
            self.pd_seconds,
            links,
            states,
            ledgers,
            remotes,
            local_wait_s=local_wait,
            remote_wait_s=self.least_wait(self.prfaas, now),
            wait_from_ledger=False,
        )
        decision = route(tick, self.policy).decision
        self._record_length(now, decision.uncached_tokens)
        moved = decision.cache_transfer_tokens
        if self.gateway is not None:
            ask = windows.remote_candidate(decision, self.kv, total, l_pd, l_prf, self.link_states[k].scarce, held)
            if ask is not None:
                if windows.dispatch(self, req, ask, k, total - l_pd, local_wait, slo):
                    return
                self._to_pd_prefill(req, total - l_pd)
                return
        if decision.target == "remote":
            self._to_remote(req, decision.uncached_tokens, decision.transfer_bytes, l_prf + moved, l_prf)
        elif moved:
            # abundant mode: the longer prefix sits in PrFaaS's pool; it crosses the link first, admitted
            # (and counted by the ledger) like a KV stream
            best = l_pd + moved
            nbytes = decision.move_bytes
            self.result.cache_move_bytes += nbytes
            uncached = decision.uncached_tokens
            key = f"move-{req.spec.id}"
            self.ledgers[k].start(key, nbytes, now, self.pd_seconds(float(moved)), queued=False)
            self.link.start(("move", req), nbytes, now, now, lambda _k: self._moved_to_pd(req, best, uncached, key))
        else:
            self._to_pd_prefill(req, decision.uncached_tokens)

    least_wait = staticmethod(least_wait)

    def _record_length(self, now: float, uncached: int) -> None:
        if self.cfg.live_threshold:
            self.window.add(now, uncached)
        if self.loop_state is not None:
            self.control.record(now, uncached)

    def redispatch_prefill(self, req: Req) -> None:
        """A queued PD prefill whose instance was flipped before it started (forced flip)."""
        self._to_pd_prefill(req, req.uncached)

    def redispatch_decode(self, req: Req) -> None:
        """A stream waiting on an instance flipped to prefill (forced flip)."""
        self._to_decode(req)

    def _moved_to_pd(self, req: Req, best: int, uncached: int, ledger_key: str) -> None:
        self.ledgers[req.replica].finish(ledger_key)
        self.pd_pool.import_prefix(req.spec.session, best)
        self._to_pd_prefill(req, uncached)

    # --- prefill ----------------------------------------------------------------------------------------------

    def _to_pd_prefill(self, req: Req, uncached: int) -> None:
        now = self.events.now_s
        req.uncached = uncached
        inst = self._pick_prefill(self.pd, req, uncached, self.pd_seconds, now)
        job = inst.enqueue_prefill(req, now, self.pd_seconds(float(max(uncached, 1))))
        self.events.at(job.end_s, self.prefill_end, (job, job.gen))

    def _to_remote(self, req: Req, uncached: int, nbytes: float, move_best: int = 0, prfaas_has: int = 0) -> None:
        """Remote prefill; with ``move_best`` PD's longer prefix (``move_best`` tokens, PrFaaS holding
        ``prfaas_has``) is first moved to PrFaaS over the reverse direction (abundant mode)."""
        now = self.events.now_s
        req.remote = True
        req.uncached = uncached
        req.transfer_bytes = nbytes
        duration = self.prfaas_seconds(float(max(uncached, 1)))
        cap = self.link_params.cap_gbps
        self.ledgers[req.replica].start(str(req.spec.id), nbytes, now, duration, max_gbps=cap)
        if self.gateway is not None:  # a remote prefill outside a window still takes a lane and the link
            self.gateway.ledger.start(str(req.spec.id), nbytes, now, duration)
        if move_best > prfaas_has:
            size = transfer_bytes(self.kv, move_best, prfaas_has)
            self.result.cache_move_bytes += size
            self.reverse.start(
                ("move", req), size, now, now, lambda _k: self._moved_to_prfaas(req, move_best, duration)
            )
            return
        self._enqueue_remote(req, duration)

    def _moved_to_prfaas(self, req: Req, tokens: int, duration: float) -> None:
        self.prfaas_pool.import_prefix(req.spec.session, tokens)
        self._enqueue_remote(req, duration)

    def _enqueue_remote(self, req: Req, duration: float) -> None:
        now = self.events.now_s
        inst = self._pick_prefill(self.prfaas, req, req.uncached, self.prfaas_seconds, now)
        job = inst.enqueue_prefill(req, now, duration)
        self.events.at(job.start_s, self.remote_start, (job, job.gen))
        self.events.at(job.end_s, self.prefill_end, (job, job.gen))

    def _pick_prefill(
        self, pool: list[Instance], req: Req, uncached: int, seconds: Callable[[float], float], now: float
    ) -> Instance:
        total = req.spec.input_tokens
        cached = total - uncached
        prefill_view = self.views.prefill
        views = [prefill_view(i, now, cached) for i in pool if i.role == "prefill"]
        pick = self.policy.pick_prefill(views, total, seconds)
        if pick.name is None:  # every prefill instance drains or warms up: queue on the least busy one
            candidates = [i for i in pool if i.role == "prefill"] or pool
            return min(candidates, key=lambda i: (i.queued_prefill_s(now), i.name))
        return self._instance(pool, pick.name)

    @staticmethod
    def _instance(pool: list[Instance], name: str) -> Instance:
        for i in pool:
            if i.name == name:
                return i
        raise KeyError(name)  # pragma: no cover - the picker only returns names it was given

    def remote_start(self, arg: tuple[Job, int]) -> None:
        job, gen = arg
        if gen != job.gen:
            return
        req: Req = job.req  # type: ignore[assignment]
        w = req.window
        if w is None:
            self._stream(req, job.start_s, job.end_s)
        elif w.stream_start_s <= w.start_s + 1e-9:  # layer-wise: paced at the booked rate
            pace = w.rate_gbps * GBPS_BITS / 8.0 if w.rate_gbps > 0 else math.inf
            self._stream(req, job.start_s, job.end_s, pace)

    def _stream(self, req: Req, prod_start_s: float, prod_end_s: float, pace: float = math.inf) -> None:
        """Put a request's KV on the link (timed for the available-bandwidth estimate)."""
        self.streams.start(req.spec.id, self.events.now_s, req.transfer_bytes, prod_end_s - prod_start_s, pace)
        self.link.start(req, req.transfer_bytes, prod_start_s, prod_end_s, self._kv_arrived, pace)

    def prefill_end(self, arg: tuple[Job, int]) -> None:
        job, gen = arg
        if gen != job.gen:
            return
        job.instance.finish_prefill(job)
        req: Req = job.req  # type: ignore[assignment]
        spec = req.spec
        now = self.events.now_s
        req.prefill_end_s = now
        if req.remote:
            self.result.busy_prfaas_s += job.duration_s
            if self.cfg.cache.enabled:
                self.prfaas_pool.store(spec.session, spec.input_tokens, spec.shared_prefix_tokens)
            w = req.window
            if w is not None and w.stream_start_s > w.start_s + 1e-9:  # pull-after-prefill: the pull starts now
                pace = w.rate_gbps * GBPS_BITS / 8.0 if w.rate_gbps > 0 else math.inf
                self._stream(req, now, now, pace)
            return  # the KV is still streaming: _kv_arrived continues
        self.result.busy_pd_prefill_s += job.duration_s
        if self.cfg.cache.enabled:
            self.pd_pool.store(spec.session, spec.input_tokens, spec.shared_prefix_tokens)
        req.kv_ready_s = now
        self._to_decode(req)

    def _kv_arrived(self, req: Req) -> None:
        req.kv_ready_s = self.events.now_s
        self.streams.arrived(req.spec.id, self.events.now_s)
        if self.gateway is not None:
            self.gateway.finish(str(req.spec.id))
        self.result.transferred_bytes += req.transfer_bytes
        self._to_decode(req)

    # --- link capacity, ticks, the role loop ----------------------------------------------------------------

    def _set_capacity(self, gbps: float) -> None:
        cap = gbps * GBPS_BITS / 8.0
        self.link.set_capacity(cap)
        self.reverse.set_capacity(cap)
        p = self.configured_params
        self.configured_params = LinkParams(p.name, gbps, p.max_utilization, p.scarce_watermark, p.abundant_watermark)
        self.link_params = self.streams.estimator.current.bound(self.configured_params)
        self.result.capacity_changes.append((self.events.now_s, gbps))
        self._window_capacity_gbps = max(self._window_capacity_gbps, gbps)

    def _tick(self, _: object) -> None:
        now = self.events.now_s
        sent = self.link.bytes_sent(now)
        egress = (sent - self._last_sent) * 8.0 / GBPS_BITS
        self._last_sent = sent
        avail = self.streams.update(now, self.configured_params.capacity_gbps, egress)
        params = self.link_params = avail.bound(self.configured_params)
        live = self.cfg.live_threshold and now <= self.duration_s  # after the last arrival nothing reads t
        window_s = self.cfg.threshold_window_s
        lengths = self.window.within(now, window_s) if live else ()
        measured = {LINK: egress}
        for k in range(len(self.ledgers)):  # replica 0's t is the one in force (one t for the routers)
            links, ledgers, bounds, held = self.route_maps.refresh_values(
                k, params, self.t_min, self.t, self.threshold_reason
            )
            state, window, decide = {LINK: self.link_states[k]}, min(window_s, now), live and k == 0
            tick = RefreshTick(now, links, ledgers, state, bounds, self.kv, lengths, window, held, measured, decide)
            done = refresh(tick, self.policy)
            self.link_states[k] = done.links[LINK]
            if k == 0:
                self.t, self.threshold_reason = done.threshold.tokens, done.threshold.reason
        self.link_state = self.link_states[0]
        in_system = self.arrived - self.completed
        self.control.sample(now)
        control = self.control
        self.series.sample(
            now,
            egress,
            self._window_capacity_gbps,
            self.t,
            self.link_state.scarce,
            in_system,
            (control.n_prefill, control.n_decode),
            control.last_queues,
        )
        self._window_capacity_gbps = self.link.capacity * 8.0 / GBPS_BITS
        if self._progress is not None and int(now) % 60 == 0:
            self._progress(min(1.0, now / self.duration_s))
        if now < self.duration_s or (in_system > 0 and now + 1.0 <= self._stop_s):
            self.events.at(now + 1.0, self._tick, None)

    def _run_loop(self, _: object) -> None:
        """One long-term cycle: observe, the core's step, carry out its effects (the routers' live ``t`` is the
        verdict's ``t``)."""
        assert self.loop_state is not None
        now = self.events.now_s
        if now >= self.duration_s and self.arrived == self.completed:
            return
        tick = long_term.LoopTick(
            now,
            self.cfg.role_params,
            self.cfg.inputs,
            self.loop_state,
            self.control.observe(now),
            threshold_tokens=float(self.t),
            history_limit=100,
        )
        decision = long_term.step(tick)
        self.control.apply(decision, now)
        self.loop_state = decision.state
        self.events.at(max(decision.next_due_s, now + 1e-3), self._run_loop, None)
