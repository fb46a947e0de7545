"""Signals refreshed off the hot path, about once a second: engine health and load (their /metrics; health over
consecutive probes), each link's measured egress (its metrics endpoint), each remote gateway's status; then the
link states and the threshold are recomputed with the core's policies and a new :class:`Snapshot` is swapped in
by reference. Also whether the router can serve (``/ready``), and the engines' KV events (:class:`KvEventFeed`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field, replace

import httpx
import msgspec
import structlog
import zmq
import zmq.asyncio

from prfaas_core import names
from prfaas_core.api import GatewayStatus, RouterEndpoint
from prfaas_core.launch.vllm import KV_EVENTS_TOPIC
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.engine_load import EngineLoad
from prfaas_core.policy.link_estimate import ESTIMATE_SOURCES
from prfaas_core.policy.short_term import Refreshed

from .metrics import RouterMetrics, sample_sum, sample_sums
from .runtime import Runtime, Snapshot
from .wire import Aborts, engine_side, remote_side

# --- Engine health over consecutive probes: an engine is unhealthy only after ``unhealthy_after_failures`` failed
# probes in a row (one slow or lost read does not take it out), and healthy again at its next good probe. While
# it is still counted healthy between failures, its last good load is kept. An engine never seen answering is
# unhealthy. Each change is queued as a transition for the refresher's log line.

SLOW_PROBES = 3
"""Good probes in a row an engine must be slow at before its slowness counts."""


@dataclass
class HealthBook:
    _failures: dict[str, int] = field(default_factory=dict)
    _last: dict[str, EngineLoad] = field(default_factory=dict)
    _healthy: dict[str, bool] = field(default_factory=dict)
    _transitions: list[tuple[str, bool, str]] = field(default_factory=list)
    _durations: dict[str, deque[float]] = field(default_factory=dict)

    def _set(self, name: str, healthy: bool, why: str) -> None:
        before = self._healthy.get(name)
        self._healthy[name] = healthy
        if before != healthy and (before is not None or not healthy):
            self._transitions.append((name, healthy, why))

    def probed(self, name: str, load: EngineLoad, seconds: float) -> EngineLoad:
        """A good probe that took ``seconds``; the load it returns carries the fastest of the last few."""
        self._failures[name] = 0
        recent = self._durations.setdefault(name, deque(maxlen=SLOW_PROBES))
        recent.append(seconds)
        load = replace(load, healthy=True, probe_s=min(recent))
        self._last[name] = load
        self._set(name, True, f"probe answered in {seconds:.3f} s")
        return load

    def failed(self, name: str, why: str, threshold: int) -> EngineLoad:
        """A failed probe: still the last good load until ``threshold`` failures in a row."""
        fails = self._failures[name] = self._failures.get(name, 0) + 1
        last = self._last.get(name)
        if last is not None and fails < threshold:
            return last
        self._set(name, False, f"{fails} consecutive failed probe(s), last: {why}")
        return EngineLoad(healthy=False)

    def healthy(self, name: str) -> bool:
        return self._healthy.get(name, False)

    def take_transitions(self) -> list[tuple[str, bool, str]]:
        out, self._transitions = self._transitions, []
        return out


# --- Whether the router can serve, and why not: ``/ready`` answers 503 with the reason (a load balancer then
# sends its clients to a router that can), the refresher logs each change once and sets
# ``prfaas_router_ready``.


def not_ready_reason(rt: Runtime) -> str | None:
    """None when the router can serve, else why not (one line)."""
    c, snap = rt.compiled, rt.snapshot
    if not snap.engines:
        return "no engine probed yet"

    def serving(e: RouterEndpoint) -> bool:
        load = snap.engines.get(e.name)
        return load is not None and load.healthy and e.name not in c.draining

    if c.config.mode == "gateway":  # prefill legs only
        if any(serving(e) for e in c.prefill or c.both):
            return None
        return "no healthy, non-draining PrFaaS prefill instance"
    decoders = c.decode or c.both
    if not decoders:
        return "no decode instance configured"
    if not any(serving(e) for e in decoders):
        return f"no healthy, non-draining decode instance (of {len(decoders)})"
    if c.both or not c.prefill or any(serving(e) for e in c.prefill):
        return None
    why = []
    for r in c.remotes:
        status = snap.remote_ready.get(r.name)
        if status is None and not rt.breaker(r.name).is_open:
            return None
        why.append(f"{r.name}: {status or rt.breaker(r.name).reason}")
    remote = "; ".join(why) or "no remote PrFaaS cluster configured"
    return f"no healthy, non-draining prefill instance (of {len(c.prefill)}) and no usable remote ({remote})"


# --- Signals refreshed off the hot path, about once a second (see the module's docstring)

log = structlog.get_logger("prfaas.router.signals")

REMOTE_UNREACHABLE_POLLS = 3
"""Consecutive failed status polls after which a remote is out of use (and its breaker opens)."""


def parse_engine_load(text: str) -> EngineLoad:
    sums = sample_sums(text, (names.VLLM_REQUESTS_WAITING, names.VLLM_REQUESTS_RUNNING))
    return EngineLoad(True, sums.get(names.VLLM_REQUESTS_WAITING, 0.0), sums.get(names.VLLM_REQUESTS_RUNNING, 0.0))


def parse_counter(text: str, metric: str, labels: dict[str, str]) -> float | None:
    """Sum of the samples of counter ``metric`` (``_total``) whose labels include ``labels``."""
    return sample_sum(text, metric, labels)


@dataclass
class CounterRate:
    """Rate of a monotonic counter between two readings (a reset starts over)."""

    last_value: float | None = None
    last_wall_s: float = 0.0

    def update(self, value: float, wall_s: float) -> float | None:
        prev, prev_t = self.last_value, self.last_wall_s
        self.last_value, self.last_wall_s = value, wall_s
        if prev is None or value < prev or wall_s <= prev_t:
            return None
        return (value - prev) / (wall_s - prev_t)


def poll_error(exc: Exception) -> str:
    """A failed status poll, said plainly: the HTTP status (401/403: the token), else the error's kind."""
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        if code in (401, 403):
            return f"HTTP {code}: the gateway refused this router's bearer token (remotes[].tokenFile stale or wrong)"
        return f"HTTP {code}"
    if isinstance(exc, httpx.ConnectError):
        return "ConnectError: connection refused or host unreachable"
    if isinstance(exc, httpx.TimeoutException):
        return f"{exc.__class__.__name__}: no answer in time"
    if isinstance(exc, ValueError):
        return f"{exc.__class__.__name__}: not a gateway status"
    return exc.__class__.__name__


# --- The engines' KV events (vLLM's ZMQ publisher, ``--kv-events-config``): one SUB socket per PD engine whose
# endpoint names a ``kvEventsUrl``; each batch goes to the exact prefix index
# (:class:`~prfaas_core.policy.kv_index.KvEventIndex`, where gaps and restarts are judged). An engine is matched
# exactly from its first batch on, by the learned index before that and after its subscription ends.


class KvEventFeed:
    def __init__(self, runtime: Runtime, metrics: RouterMetrics) -> None:
        self.runtime, self.metrics = runtime, metrics
        self._subs: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._ctx: zmq.asyncio.Context | None = None

    def sync(self) -> None:
        """Subscribe to the endpoints that publish events and end the subscriptions of those gone or changed."""
        want = {e.name: e.kv_events_url for e in self.runtime.compiled.config.endpoints if e.kv_events_url}
        for name, (url, task) in list(self._subs.items()):
            if want.get(name) != url or task.done():  # gone, moved, or its subscription failed (started again)
                task.cancel()
                del self._subs[name]
                self.metrics.kv_index_blocks.labels(name).set(0)  # a worker's series stays in a multiprocess folder
                with contextlib.suppress(KeyError):
                    self.metrics.kv_index_blocks.remove(name)
        for name, url in want.items():
            if name not in self._subs:
                self._subs[name] = (url, asyncio.create_task(self._run(name, url)))
        for name in self._subs:
            self.metrics.kv_index_blocks.labels(name).set(self.runtime.pd_index.held_blocks(name))

    async def _run(self, name: str, url: str) -> None:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        decode, index = msgspec.msgpack.Decoder().decode, self.runtime.pd_index
        batches, blocks = self.metrics.kv_event_batches, self.metrics.kv_event_blocks
        try:
            sock.setsockopt(zmq.SUBSCRIBE, KV_EVENTS_TOPIC.encode())
            sock.connect(url)  # an address zmq cannot parse fails here, and the socket is still closed
            log.info("subscribed to KV events", engine=name, url=url)
            while True:
                frames = await sock.recv_multipart()
                try:
                    if len(frames) != 3 or len(frames[1]) != 8:
                        raise ValueError(f"{len(frames)} frames, not (topic, 8-byte sequence, payload)")
                    got = index.apply(name, int.from_bytes(frames[1], "big", signed=True), decode(frames[2]))
                except (ValueError, TypeError, KeyError, msgspec.DecodeError) as exc:  # decodable is not well-formed
                    batches.labels(name, "malformed").inc()
                    log.warning("KV event batch unreadable", engine=name, error=str(exc)[:200])
                    continue
                if got.resync is not None:
                    batches.labels(name, "resync").inc()
                    log.warning("KV events resynced: the engine's holdings were cleared", engine=name, why=got.resync)
                batches.labels(name, "applied").inc()
                blocks.labels(name, "stored").inc(got.stored)
                blocks.labels(name, "removed").inc(got.removed)
        except zmq.ZMQError as exc:
            log.warning("KV event subscription failed", engine=name, url=url, error=str(exc))
        finally:
            sock.close(linger=0)
            index.detach(name)

    async def close(self) -> None:
        for _, task in self._subs.values():
            task.cancel()
        await asyncio.gather(*(task for _, task in self._subs.values()), return_exceptions=True)
        self._subs.clear()
        if self._ctx is not None:  # destroy, not term: term waits forever on a socket a failed start left open
            self._ctx.destroy(linger=0)
            self._ctx = None


@dataclass
class Signals:
    runtime: Runtime
    http: httpx.AsyncClient
    metrics: RouterMetrics
    link_rates: dict[str, CounterRate] = field(default_factory=dict)
    remote_failures: dict[str, int] = field(default_factory=dict)
    """Consecutive failed status polls of each remote that answered once (two are ridden over)."""
    remote_answered: set[str] = field(default_factory=set)
    """Remotes whose status endpoint has answered since the start: a remote that never answered is not
    usable (a fresh stack's first request went to a gateway that was not listening yet)."""
    remote_scheduled: dict[str, frozenset[str]] = field(default_factory=dict)
    """Each remote's links its gateway schedules (its last status answer's ``scheduledLinks``)."""
    health: HealthBook = field(default_factory=HealthBook)
    not_ready: str | None = "starting"
    available_source: dict[str, str] = field(default_factory=dict)
    aborts: tuple[Aborts, ...] = ()
    """Whose legs in flight to cut short when their side turns unready (the proxy's, the gateway's)."""
    kv_events: KvEventFeed | None = None

    async def close(self) -> None:
        if self.kv_events is not None:
            await self.kv_events.close()

    def _abort(self, side: str, why: str) -> None:
        cut = sum(a.abort(side, why) for a in self.aborts)
        if cut:
            log.warning("legs in flight cut short", side=side, legs=cut, reason=why)

    async def _engine(self, name: str, url: str) -> tuple[str, EngineLoad]:
        """One health probe (its /metrics read), judged by :class:`HealthBook` over consecutive probes."""
        routing = self.runtime.compiled.config.routing
        started = self.runtime.clock()
        mark = self.runtime.own_mark(name)
        why = ""
        try:
            resp = await self.http.get(f"{url}/metrics", timeout=routing.health_probe_seconds)
            if resp.status_code == 200:
                load = replace(parse_engine_load(resp.text), own=self.runtime.own_seen(name, mark))
                return name, self.health.probed(name, load, self.runtime.clock() - started)
            why = f"/metrics answered {resp.status_code}"
        except httpx.HTTPError as exc:
            why = f"/metrics {exc.__class__.__name__}"
        self.metrics.probe_failures.labels(name).inc()
        return name, self.health.failed(name, why, routing.unhealthy_after_failures)

    async def _link(self, name: str, url: str) -> tuple[str, float | None]:
        """(name, its measured egress in model Gbps since the last reading, None when not known)."""
        rt = self.runtime
        try:
            resp = await self.http.get(url, timeout=2.0)
            value = parse_counter(resp.text, names.METRIC_LINK_EGRESS_BYTES, {"link": name})
        except httpx.HTTPError as exc:
            log.warning("link metrics unreadable", link=name, error=str(exc))
            return name, None
        if value is None:
            return name, None
        per_wall_s = self.link_rates.setdefault(name, CounterRate()).update(value, rt.clock())
        if per_wall_s is None:
            return name, None
        # the counter is in model bytes; a wall-clock rate is time_scale x the model rate
        return name, per_wall_s / rt.compiled.scale.time_scale * 8.0 / GBPS_BITS

    async def _remote(
        self, name: str, url: str | None, client: httpx.AsyncClient
    ) -> tuple[str, str | None, int | None]:
        """(name, why it is not usable or None, its ready instance count when the status said so)."""
        if url is None:
            return name, None, None
        try:
            resp = await client.get(url, timeout=2.0)
            resp.raise_for_status()
            status = GatewayStatus.model_validate_json(resp.content)
        except (httpx.HTTPError, ValueError) as exc:
            fails = self.remote_failures[name] = self.remote_failures.get(name, 0) + 1
            what = poll_error(exc)
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401, 403) and fails == 1:
                log.error("remote gateway refused this router's token", remote=name, url=url, error=what)
            if name not in self.remote_answered:
                return name, f"status endpoint not answered yet ({what})", None
            if fails < REMOTE_UNREACHABLE_POLLS:
                return name, None, None
            why = f"status endpoint unreachable ({what})"
            if fails == REMOTE_UNREACHABLE_POLLS:  # remote use stops now: the breaker says so (and its alert)
                self.runtime.remote_unreachable(name, f"{fails} status polls failed, last: {what}")
            return name, why, None
        self.remote_failures[name] = 0
        self.remote_answered.add(name)
        self.remote_scheduled[name] = frozenset(status.scheduled_links)
        ready = status.ready_instances
        return name, None if ready > 0 else "no ready PrFaaS instance", ready

    async def refresh(self, remote_clients: dict[str, httpx.AsyncClient]) -> Snapshot:
        """Read the engines, the links and the remotes, then the core's refresh (ledger -> link states -> t)."""
        rt = self.runtime
        c = rt.compiled
        if self.kv_events is None:
            self.kv_events = KvEventFeed(rt, self.metrics)
        self.kv_events.sync()
        engines = dict(await asyncio.gather(*(self._engine(e.name, e.url) for e in c.config.endpoints)))
        measured = await asyncio.gather(
            *(self._link(lk.name, lk.metrics_url) for lk in c.config.links if lk.metrics_url)
        )
        polled = await asyncio.gather(
            *(self._remote(r.name, r.status_url, remote_clients.get(r.name, self.http)) for r in c.remotes)
        )
        remotes = {name: why for name, why, _ in polled}
        # the ledger schedules its streams on the PrFaaS instances that prefill in parallel (its lanes)
        lanes: dict[str, int] = {}
        for remote, (_, _, ready) in zip(c.remotes, polled, strict=True):
            if ready is not None:
                lanes[remote.link] = lanes.get(remote.link, 0) + ready
        for link_name, count in lanes.items():
            rt.set_lanes(link_name, count)
        scheduled = {r.name: r.link in self.remote_scheduled.get(r.name, frozenset()) for r in c.remotes}
        done = rt.refresh(
            {name: gbps for name, gbps in measured if gbps is not None},
            frozenset(r.link for r in c.remotes if scheduled[r.name]),
        )
        self._report(done)
        for name, why in remotes.items():
            if why != rt.snapshot.remote_ready.get(name):
                log.warning("remote status changed", remote=name, ready=why is None, reason=why or "ready")
                if why is not None:
                    self._abort(remote_side(name), why)
        snap = Snapshot(done.threshold, done.links, engines, remotes, scheduled)
        rt.snapshot = snap
        self._readiness()
        return snap

    def _report(self, done: Refreshed) -> None:
        """Logs and gauges of one refresh."""
        rt, m = self.runtime, self.metrics
        c = rt.compiled
        for name in done.changed_links:
            state = done.links[name]
            log.info("link state changed", link=name, mode=state.mode, reason=state.reason)
        for name in c.links:
            state, params, avail = done.links[name], rt.link_params(name), rt.available[name]
            m.link_egress.labels(name).set(state.egress_gbps)
            m.link_cap.labels(name).set(params.cap_gbps)
            m.link_scarce.labels(name).set(1 if state.scarce else 0)
            m.link_available.labels(name).set(params.capacity_gbps)
            for source in ESTIMATE_SOURCES:
                m.link_available_source.labels(name, source).set(1 if source == avail.source else 0)
            if avail.source != self.available_source.get(name, "configured"):
                log.warning("link available bandwidth", link=name, source=avail.source, reason=avail.reason)
            self.available_source[name] = avail.source
        if done.threshold.tokens != rt.snapshot.threshold.tokens:
            log.info("threshold changed", t=done.threshold.tokens, reason=done.threshold.reason)
        m.threshold.set(done.threshold.tokens)
        m.threshold_min.set(c.bounds.min_tokens)
        if c.config.slo is not None:
            m.ttft_slo_objective.set(c.config.slo.objective_ratio)
        for remote in c.remotes:
            m.breaker_open.labels(remote.name).set(1 if rt.breaker(remote.name).is_open else 0)
        for t in rt.breaker_transitions():
            m.breaker_transitions.labels(t.remote, t.after).inc()
            log.warning("breaker transition", remote=t.remote, before=t.before, after=t.after, reason=t.reason)
        for name, healthy, why in self.health.take_transitions():
            log.warning("engine health changed", engine=name, healthy=healthy, reason=why)
            if not healthy:
                self._abort(engine_side(name), why)
        for e in c.config.endpoints:
            m.engine_healthy.labels(e.name).set(1 if self.health.healthy(e.name) else 0)

    def _readiness(self) -> None:
        """After the new snapshot: ``prfaas_router_ready`` and one log line per change of readiness."""
        why = not_ready_reason(self.runtime)
        self.metrics.ready.set(1 if why is None else 0)
        if why != self.not_ready:
            if why is None:
                log.warning("router ready again", was=self.not_ready)
            else:
                log.warning("router not ready", reason=why)
            self.not_ready = why
