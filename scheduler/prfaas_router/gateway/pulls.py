"""**Pulls on the wire.** The calendar plans from predicted times, but a pull starts when its router gets the
answer: the answer is held until its pull fits next to the pulls already on the wire (:meth:`LinkAdmission.release`),
and a pull counts there until its router reports it over (``POST`` :data:`~prfaas_core.names.PULL_DONE_PATH`, the id
from :data:`~prfaas_core.names.HEADER_PULL_ID`) or its lease runs out. Exported as
``prfaas_gateway_pulls_total{link,end}`` and ``prfaas_gateway_pull_hold_seconds{link}``.

**Gateway replicas.** Each of N replicas (``gateway.admission.replicas``) starts with ``1 / N`` of the link's
ceiling (:class:`~prfaas_core.policy.link_shares.LinkShares`); the calendar plans in that share. A pull that does not
fit in the replica's share on the wire borrows what it misses from the peers' idle shares (``gateway.admission.peers``,
:data:`~prfaas_core.names.LOANS_PATH`) and gives it back when the pull is over, so the replicas' pulls on the wire
never sum past the ceiling, whichever replica each passed. All or nothing: a round that gathers less than the pull
misses gives everything back at once and waits. The oldest held answer of all replicas goes first: a peer with an
older one refuses to lend and holds its own younger answers back while that peer asks. No Lease and no owner: a
replica that loses its peers keeps its own share (exact, slower). Without peers, a pull faster than the share goes
alone in it, so the replicas together may pass the cap (warned at start). Time is model time (``scale.timeScale``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog
from aiohttp import web

from prfaas_core import names
from prfaas_core.api import AdmissionDecline, GatewayAdmission
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_admission import WireTick, wire_turn
from prfaas_core.policy.link_calendar import Deadline, Window, ceiling_gbps
from prfaas_core.policy.link_estimate import Available
from prfaas_core.policy.link_shares import EPS, LinkShares
from prfaas_core.policy.link_state import EgressLedger, LinkParams, Transfer

from ..state.metrics import RouterMetrics
from ..state.peers import PeerLoans

log = structlog.get_logger("prfaas.router.admission")

REPORT_MAX_AGE_S = 10.0
"""A router's available-bandwidth report counts this long (model seconds); after it the capacity stands again."""
LEASE_FACTOR = 3.0
LEASE_GRACE_S = 2.0
LEASE_GRACE_WALL_S = 10.0
"""A pull let onto the wire counts there until reported over, or for ``LEASE_FACTOR`` x its booked span +
``LEASE_GRACE_S`` (model seconds) + ``LEASE_GRACE_WALL_S`` (wall seconds) at most: a router that never reports (or
died) cannot hold the link. The wall part covers the report's own path, which model time does not scale: the router
reports at its decode's first byte (a loaded decode instance or machine delays it) and the report may take the
router's ``PULL_REPORT_TIMEOUT_S``; under a compressed time scale the model part alone is a few wall seconds, and a
lease that ran out before a late report would free the wire while the pull still ran."""
RECHECK_S = 0.5
"""A held answer re-checks the wire at least this often (wall s): the ceiling can rise, a peer's share free up."""
LOAN_GRACE_WALL_S = 2.0
"""A lender keeps a loan out this much longer than the pull lease the borrower asked it for (wall seconds): the
borrower's pull lease starts after the loan's answer reached it."""
PEER_RECHECK_S = 0.1
"""With peers, a held answer re-checks at least this often (wall seconds): only a replica's oldest calls them."""
KV_LEASE_USE = 0.8
"""A held answer waits for the wire at most this fraction of the engine's KV lease (``kvLeaseSeconds``): the rest
covers its way to the router, the decode's start and the pull's first request (then heartbeats keep the KV)."""


class KvLeaseOver(Exception):
    """A held answer's KV lease nearly ran out before its pull fit on the wire: the caller prefills elsewhere."""

    def __init__(self, held_s: float) -> None:
        super().__init__(f"held {held_s:.1f} s for room on the link")
        self.held_s = held_s


@dataclass
class Booking:
    key: str
    window: Window
    predicted_ttft_s: float = 0.0
    """Its predicted TTFT (model s from the decision; ``Server-Timing: predicted``): its window's, or the instances'."""


class PullsOnWire:
    """One gateway replica's pulls on the wire, the routers' bandwidth reports and the loans between replicas'
    shares: the base of :class:`~.admission.LinkAdmission`, which sets these fields."""

    metrics: RouterMetrics | None
    replica: str
    peers: PeerLoans | None
    shares: LinkShares
    spec: GatewayAdmission
    time_scale: float
    whole: LinkParams
    params: LinkParams
    ledger: EgressLedger
    waiting: int
    holding: int
    _reports: dict[float, float]
    _loans_of: dict[str, list[tuple[str, str]]]
    _held_since: dict[str, float]
    _deadlines: dict[str, Deadline]
    _older_peer_until: float
    _wire_lock: asyncio.Lock
    _on_wire: dict[str, float]
    _instance_of: dict[str, str]
    _egress_work: dict[str, dict[str, tuple[float, float | None]]]
    _leases: dict[str, asyncio.TimerHandle]
    _min_end: dict[str, tuple[float, Callable[[], float]]]
    _reported: set[str]
    _changed: asyncio.Event

    @property
    def share(self) -> float:
        """This replica's base share of the link (``1 / replicas``)."""
        return self.shares.base

    @property
    def link(self) -> str:
        return self.params.name

    def report(self, headers: Mapping[str, str], now_s: float) -> None:
        """A router's available-bandwidth header (already checked a non-negative number by the allow-list)."""
        value = headers.get(names.HEADER_LINK_AVAILABLE_GBPS)
        if value is not None:
            self._reports[now_s] = float(value)

    def available(self, now_s: float, share: float | None = None) -> Available:
        """The lowest fresh report (this replica books ``share`` of it, default its base share), or no bound."""
        for t in [t for t in self._reports if now_s - t > REPORT_MAX_AGE_S]:
            del self._reports[t]
        if not self._reports:
            return Available()
        low = min(self._reports.values())
        return Available(
            low * (self.share if share is None else share), "streams", f"routers report {low:.3g} Gbps available"
        )

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.gateway_admissions.labels(self.link, result).inc()

    def _decline(self, reason: str, window: Window | None, why: str, handle: object = None) -> web.Response:
        self._count(reason)
        body = AdmissionDecline.model_validate(
            {
                "reason": reason,
                "earliestStartMs": None if window is None else window.wait_s * 1000.0,
                "predictedTtftMs": None if window is None else window.ttft_s * 1000.0,
                "link": self.link,
                "message": why,
                "kvHandle": handle,
            }
        )
        wall_wait = (window.wait_s if window is not None else 1.0) / self.time_scale
        return web.json_response(
            body.model_dump(mode="json", by_alias=True),
            status=429,
            headers={"Retry-After": str(max(1, math.ceil(wall_wait)))},
        )

    async def hold(self, booking: Booking, clock: Callable[[], float]) -> None:
        """Wait (wall time) until the booked window starts as booked now (``clock``: model time): a request due
        earlier may have moved it back (``laneOrder: deadline``)."""
        wait = booking.window.start_s - clock()
        if wait <= 0:
            return
        self.waiting += 1
        try:
            while wait > 0:
                await asyncio.sleep(wait / self.time_scale)
                booked = self.ledger.get(booking.key)
                wait = 0.0 if booked is None else booked.start_s - clock()
        finally:
            self.waiting -= 1

    def on_wire_gbps(self) -> float:
        """The pulls let onto the wire and not yet over (their booked rates)."""
        return sum(self._on_wire.values())

    def ceiling_gbps(self, now_s: float) -> float:
        """The whole link's ceiling now (all replicas' pulls on the wire together stay under it)."""
        return ceiling_gbps(self.ledger, now_s, self.available(now_s, 1.0).bound(self.whole))

    def _instance_full(self, instance: str | None, rate: float) -> bool:
        """Whether ``instance``'s paced egress (``instanceGbps``) has no room for another pull at ``rate``: its
        pulls would only share the instance's rate, while another instance's pull could use the cap."""
        paced = self.spec.instance_gbps
        if paced is None or instance is None:
            return False
        mine = sum(self._on_wire.get(k, 0.0) for k, i in self._instance_of.items() if i == instance)
        return mine > EPS and mine + min(rate, paced) > paced + EPS

    def assign(self, key: str, instance: str, nbytes: float) -> None:
        """The prefill ``key`` (``nbytes`` of KV to pull) runs on ``instance`` (on a retry, the next one): with
        paced instances its pull joins that instance's egress work (:meth:`egress_wait_s`)."""
        if self.spec.instance_gbps is None:
            return
        self._unassign(key)
        self._egress_work.setdefault(instance, {})[key] = (nbytes * 8.0 / GBPS_BITS, None)

    def _unassign(self, key: str) -> None:
        for work in self._egress_work.values():
            work.pop(key, None)

    def egress_wait_s(self, instance: str, now_s: float) -> float:
        """Model seconds before ``instance``'s paced egress (``instanceGbps``) could start a new pull: its pulls
        to come (prefills running or queued, answers held) and the rest of those on the wire, at its paced rate.
        0 without paced instances. The gateway picks the instance by it, next to the prefill queue: a 2-Gbps
        instance busy pulling a 128K-token KV for 10 s makes a pull wait there, whichever prefill ends first."""
        paced = self.spec.instance_gbps
        if paced is None or paced <= EPS:
            return 0.0
        left = 0.0
        for gbit, since in self._egress_work.get(instance, {}).values():
            left += gbit if since is None else max(0.0, gbit - (now_s - since) * paced)
        return left / paced

    def _need(self, rate: float, now_s: float) -> float:
        """The share of the link a pull at ``rate`` misses to go on the wire now (0: it fits in this replica's
        share, next to its pulls there)."""
        return self.shares.need(self.on_wire_gbps(), rate, self.ceiling_gbps(now_s), now_s)

    def _set_share(self, now_s: float) -> None:
        for loan_id in self.shares.expire(now_s):
            self.loan_count("expired")
            log.warning("a share loan's lease ran out before its borrower gave it back", link=self.link, loan=loan_id)
        if self.metrics is not None:
            self.metrics.gateway_link_share.labels(self.link).set(self.shares.fraction(now_s))

    def loan_count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.gateway_loans.labels(self.link, result).inc()

    def _oldest_held(self) -> float | None:
        return min(self._held_since.values(), default=None)

    def lend(self, borrower: str, wanted: float, lease_s: float, held_at: float, now_s: float) -> tuple[str, float]:
        """A peer asks for up to ``wanted`` of this replica's share for a pull (lease ``lease_s``), its oldest answer
        held since ``held_at`` (Unix time): the loan's id and the granted fraction (0: refused). An older answer held
        here goes first (ties: the lower replica id); while the peer still misses some, this one's own answers wait."""
        self._set_share(now_s)
        oldest = self._oldest_held()
        if oldest is not None and (oldest, self.replica) < (held_at, borrower):
            self.loan_count("refused")
            return "", 0.0
        loan_id = f"{self.replica}.loan-{os.urandom(8).hex()}"
        until = now_s + lease_s + LOAN_GRACE_WALL_S * self.time_scale
        self.shares.asked_again(borrower, held_at)  # the same answer again: what it was lent earlier is back
        free = self.shares.free(self.on_wire_gbps(), self.ceiling_gbps(now_s), now_s)
        granted = self.shares.lend(loan_id, wanted, free, borrower, until, held_at)
        # short: the peer comes back for the rest (all or nothing); meanwhile this replica's own answers wait
        self._older_peer_until = now_s + (1.5 * RECHECK_S * self.time_scale if granted < wanted - EPS else 0.0)
        self.loan_count("lent" if granted > 0 else "refused")
        self._set_share(now_s)
        return loan_id, granted

    def repaid(self, loan_id: str, now_s: float) -> bool:
        """A borrower gave ``loan_id`` back: this replica's held answers may fit now."""
        if not self.shares.repaid(loan_id):
            return False
        self._set_share(now_s)
        self._changed.set()
        return True

    async def _borrow(self, key: str, rate: float, lease_s: float, now_s: float) -> bool:
        """Gather what the pull ``key`` misses from the peers, all or nothing: True when it now fits."""
        if self.peers is None:
            return False
        if self._need(rate, now_s) > 1.0 - self.shares.fraction(now_s) + EPS:
            return False  # more than all the peers' shares together: its own pulls must end first
        held_at = self._oldest_held() or time.time()  # this replica's turn: its oldest held answer's
        for url in self.peers.others():
            missing = self._need(rate, now_s)
            if missing <= EPS:
                break
            # within the lenders' bounds (the replicas share the spec): a pull that misses more waits for its own
            # pulls to end; a longer lease is cut to the bound (the lender takes its share back at the loan's end)
            ask = min(missing, self.spec.max_loan_fraction())
            lease = min(lease_s, self.spec.loan_max_lease_seconds * self.time_scale)
            got = await self.peers.ask(url, self.link, ask, lease, self.replica, held_at)
            if got is None:
                if url not in self.peers.self_urls:
                    self.loan_count("unreachable")
                    self.shares.peer_failed(url, time.monotonic())
                continue
            self.shares.peer_answered(url)
            loan_id, granted = got
            if granted <= EPS:
                continue
            self.shares.borrow(loan_id, granted, url)
            self._loans_of.setdefault(key, []).append((url, loan_id))
            self.loan_count("borrowed")
        if self._need(rate, now_s) <= EPS:
            self._set_share(now_s)
            return True
        self._give_back(key)
        # every peer failed every call for PEER_DOWN_S (hung, gone): its own share, as a replica without peers
        self.shares.cut_off = self.shares.is_cut_off(self.peers.others(), time.monotonic())
        go, self.shares.cut_off = self.shares.cut_off and self._need(rate, now_s) <= EPS, False
        return go

    def _give_back(self, key: str) -> None:
        """Stop using the pull ``key``'s loans now, and tell their lenders (in the background)."""
        loans = self._loans_of.pop(key, [])
        if not loans:
            return
        self.shares.give_back([loan_id for _, loan_id in loans])
        if self.peers is not None:
            peers = self.peers
            for url, loan_id in loans:
                asyncio.get_running_loop().create_task(self._return(peers, url, loan_id))

    async def _return(self, peers: PeerLoans, url: str, loan_id: str) -> None:
        if not await peers.give_back(url, self.link, loan_id):  # the loan returns to its lender by its lease
            self.loan_count("unreachable")

    async def release(
        self, booking: Booking, ok: bool, clock: Callable[[], float], instance: str | None = None
    ) -> str | None:
        """The prefill answered. A pull-after-prefill stream starts when the caller gets the answer, so the answer
        is held until its pull fits on the wire next to the pulls already there (a calendar planned from predicted
        times alone let two pulls overlap when one started late: 9.8 Gbps in 1-s windows on an 8-Gbps cap); the
        pull then counts there until the caller reports it over (:meth:`pulled`) or its lease runs out. Returns
        the pull's id for the answer's :data:`~prfaas_core.names.HEADER_PULL_ID` (None: nothing to report; a
        layer-wise stream has ended with its prefill; a failure frees the window). Raises :class:`KvLeaseOver`
        (the window freed) when the answer waited :data:`KV_LEASE_USE` of the engine's KV lease (wall time): a
        pull that late would find the KV freed, so :meth:`lease_answer` tells the caller to prefill elsewhere.
        ``instance``: the PrFaaS instance that served the prefill (with ``instanceGbps``, its pull waits while that
        instance's paced egress is full, and another instance's goes first)."""
        w, key = booking.window, booking.key
        span = w.stream_end_s - w.stream_start_s
        if not ok or self.spec.stream_timing == "layer-wise" or span <= 0:
            self.ledger.finish(key)
            self._unassign(key)
            return None
        # on the wire a pull runs at what one pull achieves, whatever rate its window was planned at in the share
        rate = max(w.rate_gbps, self.spec.pull_gbps or 0.0)
        held_from = clock()
        self.holding += 1
        self._held_since[key] = wall_from = time.time()
        lease = span * LEASE_FACTOR + LEASE_GRACE_S + LEASE_GRACE_WALL_S * self.time_scale  # model s
        kv_deadline = wall_from + self.spec.kv_lease_seconds * KV_LEASE_USE
        try:
            while not await self._onto_wire(key, rate, lease, clock, instance):
                self._changed.clear()
                left = kv_deadline - time.time()
                if left <= 0:
                    raise KvLeaseOver(time.time() - wall_from)
                # the ceiling may also rise (a fresher report), and a peer's share free up (it tells nobody)
                recheck = RECHECK_S if self.peers is None else min(RECHECK_S, PEER_RECHECK_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(recheck, left))
        except BaseException:  # the caller went away while held, or its KV lease ran out: no pull will come
            self._give_back(key)
            self.ledger.finish(key)
            self._unassign(key)
            raise
        finally:
            self.holding -= 1
            self._held_since.pop(key, None)
        now = clock()
        if self.metrics is not None:
            self.metrics.gateway_pull_hold.labels(self.link).observe(now - held_from)
        self._on_wire[key] = rate
        if instance is not None:
            self._instance_of[key] = instance
            work = self._egress_work.get(instance, {})
            if key in work:
                work[key] = (work[key][0], now)
        # it counts at least as long as its bytes take at its rate, or at the ceiling when faster (the alone
        # rule): a pull reported sooner (a faster wire than booked) must not let the next ones bunch up past the
        # cap in the link's 1-s windows
        ceiling = self.ceiling_gbps(now)
        slowest = min(rate, ceiling) if ceiling > EPS else rate
        gbit = w.bytes * 8.0 / GBPS_BITS
        self._min_end[key] = (now + gbit / slowest if slowest > EPS else now, clock)
        self.ledger.reserve(key, Transfer(w.bytes, now, 0.0, -1, 0.0, span))
        self._leases[key] = asyncio.get_running_loop().call_later(lease / self.time_scale, self._over, key, "lease")
        return key

    def lease_answer(self, over: KvLeaseOver, handle: object = None) -> web.Response:
        """The 429 ``kv_lease`` for an answer held too long for the wire, with its KV ``handle`` to release now."""
        lease = self.spec.kv_lease_seconds
        why = f"the answer was {over}, up to {KV_LEASE_USE:.0%} of the engine's {lease:g}-s KV lease: prefill elsewhere"
        log.warning("a held answer reached its KV lease before its pull fit on the wire", link=self.link, why=why)
        return self._decline("kv_lease", None, why, handle)

    async def _onto_wire(
        self, key: str, rate: float, lease_s: float, clock: Callable[[], float], instance: str | None = None
    ) -> bool:
        """Whether the pull ``key`` may go on the wire now, borrowing from the peers what it misses. One answer at a
        time; only this replica's oldest held answer borrows (the replicas take turns by their oldest answers);
        none goes while a peer with an older one still misses some of this replica's share, or while its
        ``instance``'s paced egress is full."""
        async with self._wire_lock:
            now = clock()
            self._set_share(now)
            turn = wire_turn(
                WireTick(
                    instance_full=self._instance_full(instance, rate),
                    older_peer_first=now < self._older_peer_until,  # this replica's share stays free for it
                    missing=self._need(rate, now),
                    oldest_here=self._held_since.get(key) == self._oldest_held(),
                )
            )
            if turn == "borrow":
                return await self._borrow(key, rate, lease_s, now)
            return turn == "go"

    def pull_id(self) -> str:
        """A fresh pull key: this replica's id first, so a peer can forward a report that reached it."""
        return f"{self.replica}.gw-{os.urandom(12).hex()}"

    def pulled(self, key: str) -> bool:
        """The caller reports the pull ``key`` over; False when it is not on the wire (unknown, or its lease ran
        out)."""
        return self._over(key, "reported")

    def _over(self, key: str, end: str) -> bool:
        """The pull ``key`` is over (reported, or its lease ran out): it leaves the wire, at once or, reported
        sooner than its bytes take at its rate, then."""
        if key not in self._on_wire or key in self._reported:
            return False
        lease = self._leases.pop(key, None)
        if lease is not None:
            lease.cancel()
        if self.metrics is not None:
            self.metrics.gateway_pulls.labels(self.link, end).inc()
        min_end, clock = self._min_end.get(key, (0.0, None))
        early = min_end - clock() if clock is not None and end == "reported" else 0.0
        if early > 0:
            with contextlib.suppress(RuntimeError):  # no running loop: it leaves now
                loop = asyncio.get_running_loop()
                self._reported.add(key)
                self._leases[key] = loop.call_later(early / self.time_scale, self._leave, key)
                return True
        self._leave(key)
        return True

    def _leave(self, key: str) -> None:
        self._on_wire.pop(key, None)
        self._instance_of.pop(key, None)
        self._unassign(key)
        self._reported.discard(key)
        self._min_end.pop(key, None)
        self._leases.pop(key, None)
        self.ledger.finish(key)
        self._give_back(key)
        self._changed.set()
