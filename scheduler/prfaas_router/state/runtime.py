"""The router's long-lived state: the mutable counters the data plane updates (ledgers, breakers, link
estimators, this replica's prefill books) and the immutable snapshot the hot path reads (swapped by reference by
the signals refresher), with the hot path's route over them. Per-request data is the request path's
(:class:`prfaas_router.path.call.Call`); the compiled configuration is :mod:`.config`'s.

Units: the router works in *model* time and bytes (ScaleSettings): ``model_now = wall * time_scale``, so the
same policies and profiles apply to real engines (scale 1) and to the time-scaled emulated stack.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prfaas_core.api import RemoteGateway
from prfaas_core.policy.breaker import Breaker, BreakerBoard, Transition
from prfaas_core.policy.decode_prefix import DecodeHoldings
from prfaas_core.policy.engine_load import EngineLoad, Row, instance_views, standing
from prfaas_core.policy.kv_index import KvEventIndex
from prfaas_core.policy.link_estimate import Available, LinkEstimator, Pull, StreamSample
from prfaas_core.policy.link_state import EgressLedger, LinkParams, LinkState
from prfaas_core.policy.replica_books import Book, InstanceBook, Mark, ReplicaBooks
from prfaas_core.policy.routing import InstanceView, RouteDecision, RouteRequest
from prfaas_core.policy.short_term import (
    PRODUCTION,
    SCHEDULED_LINK,
    RecentLengths,
    Refreshed,
    RefreshTick,
    RemoteSide,
    RoutePlan,
    RouteTick,
    ShortTermPolicy,
    refresh,
    route,
)
from prfaas_core.policy.threshold import ThresholdDecision
from prfaas_core.request.slo import ttft_objective_s

from .config import Compiled

GUARANTEED = Available(None, "configured", "availableBandwidth: Configured (the capacity is guaranteed)")

SLOW_PROBE_S = 0.25
"""A health probe slower than this (wall seconds) deprioritises the engine by the excess."""
PREFILL_EWMA = 0.1
"""The weight of the latest prefill in :attr:`Runtime._mean_prefill_s`."""


@dataclass(frozen=True)
class Snapshot:
    """What one decision reads; replaced whole every refresh."""

    threshold: ThresholdDecision
    links: dict[str, LinkState]
    engines: dict[str, EngineLoad]
    remote_ready: dict[str, str | None]
    """Remote name -> None when ready, else why not."""
    remote_scheduled: dict[str, bool] = field(default_factory=dict)
    """Remote name -> its gateway books this router's link to it in a calendar (``GatewayStatus.scheduledLinks``)."""


@dataclass
class Runtime:
    """Mutable router state behind methods (the request path and the refresher call them; nothing reaches into
    its ledgers, breakers or counters). Only the event loop thread touches it (no locks needed)."""

    compiled: Compiled
    clock: Callable[[], float] = time.monotonic
    policy: ShortTermPolicy = PRODUCTION
    """The short-term policies (a baseline is another :class:`ShortTermPolicy`)."""
    snapshot: Snapshot = field(init=False)
    in_flight: int = 0
    pd_index: KvEventIndex = field(init=False)  # exact from the engines' KV events where they publish, else learned
    remote_index: KvEventIndex = field(init=False)
    decode_held: DecodeHoldings = field(init=False)  # what each decode instance holds of the prompts it served
    _ledgers: dict[str, EgressLedger] = field(default_factory=dict)
    _breakers: BreakerBoard = field(default_factory=BreakerBoard)
    _recent: RecentLengths = field(default_factory=RecentLengths)
    _queued_prefill_s: dict[str, float] = field(default_factory=dict)
    _mean_prefill_s: float = 0.0
    """The mean predicted prefill time of this router's recent prefills (EWMA): what one request an engine
    reports waiting or running is taken to cost (:meth:`queued_work_s`)."""
    _own_prefills: dict[str, int] = field(default_factory=dict)
    """This router's prefills in flight on each instance."""
    _own_started: dict[str, int] = field(default_factory=dict)
    """This router's prefills ever started on each instance (monotonic; with the above, :meth:`own_seen`)."""
    replica: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """This router replica's id in the books it sends its peers (new at each start)."""
    peer_books: ReplicaBooks = field(default_factory=ReplicaBooks)
    """The other router replicas' PD prefill books, as last heard (:mod:`.peers` sends and receives them)."""
    books_changed: Callable[[], None] | None = None
    """Called whenever this router's own books change (the replica sync sends them at once)."""
    _books_seq: int = 0
    _active_decodes: dict[str, int] = field(default_factory=dict)
    _estimators: dict[str, LinkEstimator] = field(default_factory=dict)
    _pulls: dict[str, tuple[str, Pull]] = field(default_factory=dict)
    """KV pulls across a link in flight: key -> (link, pull), timed for the link's estimator."""
    available: dict[str, Available] = field(default_factory=dict)
    """Each link's available bandwidth as last estimated (:mod:`prfaas_core.policy.link_estimate`)."""
    _stood: tuple[Snapshot | None, Compiled | None, tuple[tuple[Row, ...], ...]] = (None, None, ((), ()))
    """:func:`~prfaas_core.policy.engine_load.standing` of the snapshot and configuration it was built for."""

    def __post_init__(self) -> None:
        r = self.compiled.config.routing
        self.pd_index = KvEventIndex.learning(r.prefix_index_blocks, r.prefix_block_tokens)
        self.remote_index = KvEventIndex.learning(r.prefix_index_blocks, r.prefix_block_tokens)  # learned only
        self.decode_held = DecodeHoldings(self.compiled.kv, r.prefix_block_tokens)
        self.snapshot = Snapshot(
            ThresholdDecision(self.compiled.bounds.min_tokens, 0, "initial: t = t_min"),
            {name: LinkState() for name in self.compiled.links},
            {},
            {rem.name: None for rem in self.compiled.remotes},
        )
        self.reconfigure(self.compiled)

    def reconfigure(self, compiled: Compiled) -> None:
        """Apply a new config; counters and ledgers of links/remotes that remain are kept."""
        self.compiled = compiled
        for name in compiled.links:
            self._ledgers.setdefault(name, EgressLedger())
            est = self._estimators.get(name)
            if est is None or est.time_scale != compiled.scale.time_scale:
                self._estimators[name] = LinkEstimator(time_scale=compiled.scale.time_scale)
            self.available.setdefault(name, Available())
        # a remote whose address or link changed starts with a closed breaker; the others keep theirs
        self._breakers.ensure({r.name: (r.url, r.link) for r in compiled.remotes})
        self.pd_index.retarget(gone := set(self._queued_prefill_s) - set(compiled.by_name), compiled.kv.recurrent)
        self.remote_index.retarget((), compiled.kv.recurrent)  # a hybrid's hits resume only at checkpoints
        self.decode_held.retarget(compiled.kv, compiled.config.routing.prefix_block_tokens)
        self.decode_held.forget(gone)

    def model_now(self) -> float:
        return self.clock() * self.compiled.scale.time_scale

    # --- what the request path reports -------------------------------------------------------------------
    def remember_length(self, uncached_tokens: int, now: float) -> None:
        self._recent.add(now, uncached_tokens)

    def start_transfer(self, link: str, key: str, nbytes: float, duration_s: float) -> None:
        """A remote prefill's KV starts streaming over ``link`` (the ledger admits the next ones around it)."""
        cap = self.compiled.links[link].cap_gbps
        self._ledgers[link].start(key, nbytes, self.model_now(), duration_s, max_gbps=cap)

    def finish_transfer(self, key: str, pulled: bool = False) -> None:
        """The stream ``key`` is over (its decode answered, or it failed), on whichever link it was;
        ``pulled``: its KV arrived (the decode's first byte), so its pull's timing is a sample of the link."""
        pull = self._pulls.pop(key, None)
        if pulled and pull is not None:
            link, p = pull
            self._estimators[link].stream(StreamSample(p.start_s, self.clock(), p.bytes))
        for ledger in self._ledgers.values():
            ledger.finish(key)

    def link_params(self, link: str) -> LinkParams:
        """The link's parameters with its capacity bounded by the available bandwidth last estimated."""
        params = self.compiled.links[link]
        avail = self.available.get(link)
        return avail.bound(params) if avail is not None else params

    def bounded_links(self) -> dict[str, LinkParams]:
        return {name: self.link_params(name) for name in self.compiled.links}

    def ledger(self, link: str) -> EgressLedger:
        """The link's egress ledger (read-only use: status, tests)."""
        return self._ledgers[link]

    def remote_succeeded(self, remote: str) -> None:
        self._breakers.succeeded(remote)

    def remote_cancelled(self, remote: str, ticket: float | None) -> None:
        """A remote call ended without a verdict (the client went away): a probe's slot is freed."""
        if ticket is not None:
            self._breakers.cancelled(remote, ticket)

    def breaker_transitions(self) -> list[Transition]:
        """The breakers' mode changes since the last call (logged and counted by the refresher)."""
        return self._breakers.take_transitions()

    def remote_failed(self, remote: str, why: str, now: float | None = None) -> None:
        self._breakers.failed(remote, self.clock() if now is None else now, self.compiled.breaker, why)

    def remote_unreachable(self, remote: str, why: str) -> None:
        """The remote's status endpoint stopped answering (its link or gateway is down): open its breaker."""
        self._breakers.tripped(remote, self.clock(), why)

    def remote_queue_wait_s(self, link: str) -> float | None:
        """The ledger's predicted wait (model seconds) for a PrFaaS lane behind ``link``."""
        ledger = self._ledgers.get(link)
        return ledger.queue_wait_s(self.model_now()) if ledger is not None else None

    def remote_lanes(self, link: str) -> int:
        """The PrFaaS instances prefilling in parallel behind ``link`` (0 until a status said so)."""
        ledger = self._ledgers.get(link)
        return ledger.lanes if ledger is not None else 0

    def breaker(self, remote: str) -> Breaker:
        return self._breakers.get(remote)

    @contextmanager
    def prefill_queued(self, instance: str, seconds: float) -> Iterator[None]:
        """``seconds`` of predicted prefill work queued on ``instance`` while the block runs."""
        q, own, started = self._queued_prefill_s, self._own_prefills, self._own_started
        q[instance] = q.get(instance, 0.0) + seconds
        own[instance] = own.get(instance, 0) + 1
        started[instance] = started.get(instance, 0) + 1
        m = self._mean_prefill_s
        self._mean_prefill_s = seconds if m <= 0.0 else m + PREFILL_EWMA * (seconds - m)
        self._changed()
        try:
            yield
        finally:
            q[instance] = max(0.0, q.get(instance, 0.0) - seconds)
            own[instance] = max(0, own.get(instance, 0) - 1)
            self._changed()

    def _changed(self) -> None:
        self._books_seq += 1
        if self.books_changed is not None:
            self.books_changed()

    def own_book(self) -> Book:
        """This router's PD prefill books as its peers get them: on the prefill instances of its configuration now
        (a peer refuses a book naming any other; one removed by a reload is left out)."""
        q, own, known = self._queued_prefill_s, self._own_prefills, self.compiled.prefill_capable
        return Book(
            self.replica,
            self._books_seq,
            {
                name: InstanceBook(own.get(name, 0), n, q.get(name, 0.0))
                for name, n in self._own_started.items()
                if name in known
            },
        )

    def own_mark(self, instance: str) -> tuple[int, int, Mark]:
        """Where this router's prefills on ``instance``, and its peers' as last heard, stand as a scrape of it
        begins (see :meth:`own_seen`)."""
        now = self.clock()
        own = self._own_prefills.get(instance, 0), self._own_started.get(instance, 0)
        return *own, self.peer_books.mark(instance, now)

    def own_seen(self, instance: str, mark: tuple[int, int, Mark]) -> int:
        """The prefills on ``instance`` this router and its peers booked that a scrape begun at ``mark`` may have
        counted: those in flight when it began plus those started since (an upper bound: the engine's count may
        lag or lead)."""
        in_flight, started, peers = mark
        mine = in_flight + self._own_started.get(instance, 0) - started
        return mine + self.peer_books.seen(instance, peers, self.clock())

    @contextmanager
    def decoding(self, instance: str, pull_key: str | None = None) -> Iterator[None]:
        """One decode stream active on ``instance`` while the block runs; ``pull_key``: its KV crosses a link
        (the stream the ledger holds under that key), pulled from now on."""
        for name, ledger in self._ledgers.items() if pull_key is not None else ():
            booked = ledger.get(pull_key)  # type: ignore[arg-type]
            if booked is not None and pull_key is not None:
                self._pulls[pull_key] = (name, Pull(self.clock(), booked.bytes))
        a = self._active_decodes
        a[instance] = a.get(instance, 0) + 1
        try:
            yield
        finally:
            a[instance] = max(0, a.get(instance, 0) - 1)

    def queued_prefill_s(self, instance: str) -> float:
        return self._queued_prefill_s.get(instance, 0.0)

    def queued_work_s(self, instance: str, load: EngineLoad) -> float:
        """The prefill work ahead of a new request on ``instance``: this router's own bookkeeping (exact for its
        own requests, up to date), its peer replicas' books as last heard (:mod:`.replica_sync`), plus what the
        engine reported at the last scrape beyond those books then (replicas not heard from, each request at the
        mean prefill time). A booked request that the scrape saw and that has finished since is not counted twice:
        a stale scrape once sent a short follow-up turn remote as a 'queue surge' on an idle engine."""
        return self._work_at(self.clock())(instance, load.others)

    def _work_at(self, now: float) -> Callable[[str, float], float]:
        """:meth:`queued_work_s` at ``now`` of an instance given the requests no book shows (``others``)."""
        booked, peers, mean_s = self._queued_prefill_s.get, self.peer_books.seconds, self._mean_prefill_s

        def work_s(instance: str, others: float) -> float:
            return booked(instance, 0.0) + peers(instance, now) + others * mean_s

        return work_s

    def active_decodes(self, instance: str) -> int:
        return self._active_decodes.get(instance, 0)

    # --- the refresher -------------------------------------------------------------------------------------
    def set_lanes(self, link: str, lanes: int) -> None:
        """The PrFaaS instances prefilling in parallel behind ``link`` (the ledger's lanes)."""
        self._ledgers[link].set_lanes(lanes)

    def estimate_links(self, measured_gbps: dict[str, float]) -> None:
        """Each link's available bandwidth from its pulls (finished and in flight) and its measured egress.

        The estimator runs on the refresher's clock (wall seconds: its window, stall and probe rate are about
        the control loop, which runs in wall time in a time-scaled stack too); its rates are model Gbps."""
        now = self.clock()
        for name, params in self.compiled.links.items():
            if name in self.compiled.guaranteed_links:
                self.available[name] = GUARANTEED
                continue
            pulls = [p for link, p in self._pulls.values() if link == name]
            got = self._estimators[name].update(now, params.capacity_gbps, pulls, measured_gbps.get(name))
            self.available[name] = got

    def refresh(self, measured_gbps: dict[str, float], scheduled_links: frozenset[str] = frozenset()) -> Refreshed:
        """The core's refresh over this router's links (bounded by their available bandwidth), ledgers and
        recent lengths. Where a gateway schedules every link (``scheduled_links``), ``t`` is the calendar's
        (:data:`~prfaas_core.policy.short_term.SCHEDULED_LINK`, as in the simulator) unless the policy is a
        baseline."""
        self.estimate_links(measured_gbps)
        c, now = self.compiled, self.model_now()
        window = c.config.routing.threshold_window_seconds
        return refresh(
            RefreshTick(
                now,
                self.bounded_links(),
                self._ledgers,
                self.snapshot.links,
                c.bounds,
                c.kv,
                self._recent.within(now, window),
                window,
                self.snapshot.threshold,
                measured_gbps,
                scheduled=scheduled_links,
            ),
            SCHEDULED_LINK
            if self.policy is PRODUCTION and c.links and scheduled_links >= set(c.links)
            else self.policy,
        )

    # --- the hot path: pure arithmetic over the snapshot -------------------------------------------------
    def route(
        self,
        total_tokens: int,
        hashes: list[bytes],
        pd_hits: dict[str, int] | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> RoutePlan:
        """Prefix lookups (PD cluster, remote), then the core's route: decision and local instance picks
        (``exclude``: instances left out, e.g. one whose leg just failed)."""
        return self.route_prefixed(total_tokens, hashes, pd_hits, exclude)[0]

    def route_prefixed(
        self,
        total_tokens: int,
        hashes: list[bytes],
        pd_hits: dict[str, int] | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> tuple[RoutePlan, tuple[int, int]]:
        """:meth:`route`, and the prefix hits it found (tokens): (PD prefill instances, PrFaaS)."""
        c, snap = self.compiled, self.snapshot
        hits = self.pd_index.match(hashes) if pd_hits is None else pd_hits
        # the PD prefix that counts is one an instance that can prefill the next turn holds: the decode
        # instance's copy (it decoded the last turn) saves a prefill instance nothing
        l_pd, capable, draining = 0, c.prefill_capable, c.draining
        for k, v in hits.items():
            if v > l_pd and k in capable and k not in draining:
                l_pd = v
        remote_hits = self.remote_index.match(hashes) if c.remotes else {}
        remotes = [
            RemoteSide(
                r.name,
                r.link,
                snap.remote_ready.get(r.name),
                remote_hits.get(r.name, 0),
                snap.remote_scheduled.get(r.name, False),
            )
            for r in c.remotes
        ]
        prefill, decode, local_wait = self._views(hits, exclude)
        plan = route(
            RouteTick(
                self.model_now(),
                RouteRequest(
                    total_tokens,
                    l_pd,
                    ttft_slo_s=ttft_objective_s(c.config.slo, total_tokens) if c.config.slo else None,
                ),
                snap.threshold.tokens,
                c.kv,
                c.prfaas.prefill_seconds,
                c.pd.prefill_seconds,
                self.bounded_links(),
                snap.links,
                self._ledgers,
                remotes,
                local_wait_s=local_wait,
                breakers=self._breakers,
                breaker_now_s=self.clock(),
                breaker_params=c.breaker,
                prefill=prefill,
                decode=decode,
                cache_moves=False,  # the engines' connectors move KV only from a request's prefill to its decode
            ),
            self.policy,
        )
        return plan, (l_pd, max(remote_hits.values(), default=0))

    def decide(
        self, total_tokens: int, hashes: list[bytes], pd_hits: dict[str, int] | None = None
    ) -> tuple[RouteDecision, RemoteGateway | None]:
        """The routing decision and the remote gateway that prefills (None: local)."""
        plan = self.route(total_tokens, hashes, pd_hits)
        return plan.decision, self.remote_gateway(plan)

    def remote_gateway(self, plan: RoutePlan) -> RemoteGateway | None:
        if plan.remote is None:
            return None
        return self.compiled.remote_by_name[plan.remote.name]

    def _standing(self) -> tuple[tuple[Row, ...], ...]:
        """The prefill tier's and the decode side's instances as they stand until the next refresh (built once per
        snapshot and configuration)."""
        snap, c, rows = self._stood
        if snap is not self.snapshot or c is not self.compiled:
            c, snap = self.compiled, self.snapshot
            ts = c.scale.time_scale
            rows = tuple(
                standing(snap.engines, (e.name for e in tier), c.draining, SLOW_PROBE_S, ts)
                for tier in (c.prefill, c.decode or c.both)
            )
            self._stood = (snap, c, rows)
        return rows

    def _views(
        self, hits: dict[str, int], exclude: frozenset[str] = frozenset()
    ) -> tuple[list[InstanceView] | None, list[InstanceView], float | None]:
        """The prefill instances' views (None: no prefill tier), the decode instances' and the local wait
        (:meth:`local_wait_s`) in one pass over the books."""
        prefill_rows, decode_rows = self._standing()
        c, active, work_s, waits = self.compiled, self._active_decodes, self._work_at(self.clock()), list[float]()
        prefill = (
            instance_views(prefill_rows, work_s, hits, active, c.decode_slots, exclude, waits) if prefill_rows else None
        )
        decode = instance_views(decode_rows, work_s, hits, active, c.decode_slots, exclude)
        return prefill, decode, min(waits) if waits else None

    def local_wait_s(self) -> float | None:
        """Predicted prefill work queued on the least-loaded healthy, non-draining PD prefill instance (the local
        alternative's queue)."""
        return self._views({})[2]  # (once per remote request: its local alternative)
