"""Source-side admission at the gateway: every remote prefill passes through it, so its link calendar (the
core's :mod:`prfaas_core.policy.link_calendar` on an :class:`~prfaas_core.policy.link_state.EgressLedger`) sees every
KV stream the PrFaaS cluster sends, whichever router sent the request.

Per prefill: the router's headers (:data:`~prfaas_core.names.ADMISSION_HEADERS`) give the KV bytes (default: the
gateway's own ``S_kv`` of the prompt), the longest wait it accepts (default: any), the latest predicted TTFT it
accepts (default: any; the calendar knows the stream's timing, the router does not) and the link. The earliest
window that fits under the ceiling is booked and the prefill held until it starts; a later window than the
caller accepts (its wait or, for a window that does not start now, its predicted TTFT; or the TTFT through the
instances' real queues and paced egress, whenever the window starts) is declined at once:
429, ``Retry-After`` and an :class:`~prfaas_core.api.AdmissionDecline`
(``link_window`` with the earliest start and the predicted TTFT; ``overloaded`` when ``maxWaiting`` prefills
already wait). The headers never reach the engine (the gateway forwards only the tracing headers).

**Available bandwidth.** The routers measure what the link delivers (:mod:`prfaas_core.policy.link_estimate`,
from their pulls' timing) and send it along while it bounds the configured capacity
(:data:`~prfaas_core.names.HEADER_LINK_AVAILABLE_GBPS`); the calendar books under the lowest report of the last
``REPORT_MAX_AGE_S`` (model seconds), this replica's share of it. Exported as
``prfaas_gateway_link_available_gbps{link,source}`` next to ``prfaas_gateway_admissions_total{link,result}`` and
``prfaas_gateway_admission_wait_seconds{link}``.

The pulls on the wire, the reports and the loans between replicas are :mod:`.pulls`'s (the base class).

**Several links, one site** (a fleet): the gateway schedules every link its config lists (``links[]``; a prefill
names its link in ``x-prfaas-link``, none: ``gateway.admission.link``), one :class:`LinkAdmission` each
(:class:`SiteAdmission`). With ``gateway.siteEgressCapGbps`` they book on one calendar, the site's, through the core's
:class:`~prfaas_core.policy.link_calendar.SiteCap` (each link's ceiling bounded by its share of the cap, the whole
cap until the demands pass it, then max-min fair, :func:`~prfaas_core.policy.fleet.site_shares`, over the KV offered
to each link lately; every stream under the whole cap), and a pull goes on the wire only while the site's pulls
there leave room for it (as a paced instance's). One link and no site cap: as before.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Mapping

import structlog
from aiohttp import web

from prfaas_core import names
from prfaas_core.api import GatewayAdmission, RouterConfig, RouterLink
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.fleet import LinkDemands, site_shares
from prfaas_core.policy.link_admission import CLAIMS, AdmitTick, Decline, admit, book, verify_claims
from prfaas_core.policy.link_calendar import Deadline, SiteCap, booked_gbps
from prfaas_core.policy.link_shares import EPS, LinkShares
from prfaas_core.policy.link_state import EgressLedger, LinkParams
from prfaas_core.policy.link_view import link_view_disagreement

from ..state.metrics import RouterMetrics
from ..state.peers import PeerLoans
from ..state.wire import json_error
from .pulls import Booking, PullsOnWire

log = structlog.get_logger("prfaas.router.admission")


def _params(link: RouterLink, share: float) -> LinkParams:
    return LinkParams(
        link.name, link.capacity_gbps * share, link.max_utilization, link.scarce_watermark, link.abundant_watermark
    )


class LinkAdmission(PullsOnWire):
    """One gateway replica's share of its link's calendar."""

    def __init__(
        self,
        spec: GatewayAdmission,
        link: RouterLink,
        time_scale: float,
        metrics: RouterMetrics | None = None,
        replica: str = "",
        peers: PeerLoans | None = None,
    ) -> None:
        self.metrics = metrics
        self.replica = replica or os.urandom(6).hex()
        """This replica's id: the prefix of its pulls' ids, and how it recognises itself among ``peers``."""
        self.peers = peers
        self._reports: dict[float, float] = {}
        """Routers' available-bandwidth reports: model time -> Gbps (the whole link's)."""
        self.shares = LinkShares()
        self._apply(spec, link, time_scale)
        self._loans_of: dict[str, list[tuple[str, str]]] = {}
        """A pull's borrowed loans: key -> [(lender URL, loan id)]."""
        self._held_since: dict[str, float] = {}
        """Held answers: key -> when held from, Unix time (one order across replicas and hosts: the oldest goes
        first; a clock skew between hosts shifts the turns, never stops them)."""
        self._deadlines: dict[str, Deadline] = {}
        """Each booking's place in the lanes' order (``laneOrder: deadline``; model time)."""
        self._older_peer_until = 0.0
        """Model time until which a peer holds an older answer than any here: this replica's own wait."""
        self._wire_lock = asyncio.Lock()
        if metrics is not None:  # every series of the link from the start, at 0: rates and alerts see them
            metrics.gateway_link_share.labels(self.link).set(self.shares.base)
            for result in ("booked", "link_window", "overloaded", "kv_lease"):
                metrics.gateway_admissions.labels(self.link, result)
            for end in ("reported", "lease"):
                metrics.gateway_pulls.labels(self.link, end)
            for result in ("borrowed", "lent", "refused", "unreachable", "expired"):
                metrics.gateway_loans.labels(self.link, result)
            for claim in CLAIMS:
                metrics.gateway_claims_corrected.labels(self.link, claim)
            metrics.gateway_pull_hold.labels(self.link)
            metrics.gateway_admission_wait.labels(self.link)
        self.ledger = EgressLedger(expire_s=600.0)
        self.waiting = 0
        self.holding = 0
        """Prefill answers held until their pull fits on the wire."""
        self._on_wire: dict[str, float] = {}
        """Pulls let onto the wire and not over: id -> booked Gbps."""
        self._instance_of: dict[str, str] = {}
        """The PrFaaS instance whose KV a pull on the wire moves: id -> instance (when known)."""
        self._egress_work: dict[str, dict[str, tuple[float, float | None]]] = {}
        """With paced instances: each instance's pulls from the prefill's start until they leave the wire, its
        egress's work ahead of a new pull: instance -> id -> (model Gbit, model time on the wire from or None)."""
        self._leases: dict[str, asyncio.TimerHandle] = {}
        self._min_end: dict[str, tuple[float, Callable[[], float]]] = {}
        """A pull's earliest end on the wire (its bytes at its rate; model time) and the clock it is read on."""
        self._reported: set[str] = set()
        """Pulls reported over that still count on the wire until their earliest end."""
        self._changed = asyncio.Event()
        self.claim_corrected = claim_counter(metrics, self.link)
        self.site: SiteEgress | None = None
        """The site whose egress cap this link shares (its calendar is then the site's)."""
        self._keys: set[str] = set()
        """This link's bookings on the site's calendar."""

    def join(self, site: SiteEgress) -> None:
        """Book on ``site``'s calendar from now on (a new link: nothing booked here yet)."""
        self.site, self.ledger, self._deadlines = site, site.ledger, site.deadlines
        site.links[self.link] = self

    def _instance_full(self, instance: str | None, rate: float) -> bool:
        """A full paced instance, or a full site: the site's pulls on the wire leave no room for this one (one
        faster than the site cap goes alone)."""
        if super()._instance_full(instance, rate):
            return True
        if self.site is None:
            return False
        on = self.site.on_wire_gbps()
        return on > EPS and on + rate > self.site.cap_gbps(self.share) + EPS

    def _leave(self, key: str) -> None:
        super()._leave(key)
        if self.site is not None:  # the site's other links' held answers may fit now
            self.site.changed()

    def _site_cap(self, now_s: float, gbit: float) -> SiteCap | None:
        site = self.site
        if site is None:
            return None
        site.demand.offer(self.link, now_s, gbit)
        self._keys = {k for k in self._keys if self.ledger.get(k) is not None}
        return site.cap_for(self.link, now_s, self.share, frozenset(self._keys))

    def _apply(self, spec: GatewayAdmission, link: RouterLink, time_scale: float) -> None:
        """What the spec, the link and the scale set (at start and on a reload)."""
        self.spec, self.time_scale = spec, time_scale
        self.shares.replicas, self.shares.peers = spec.replicas, bool(spec.peers)
        self.whole = _params(link, 1.0)
        self.params = _params(link, self.share)
        """This replica's base share: what its calendar plans in."""

    def reconfigure(
        self, spec: GatewayAdmission, link: RouterLink, time_scale: float, token: Callable[[], bytes | None]
    ) -> bool:
        """A reloaded config on the same link: the new spec, capacity and peers in place (the ledger, the pulls on
        the wire and the loans kept; a loan from a peer no longer listed is still given back to it). False: it is
        the same config."""
        if spec == self.spec and _params(link, 1.0) == self.whole and time_scale == self.time_scale:
            return False
        self._apply(spec, link, time_scale)
        self._changed.set()  # held answers re-check under the new ceiling
        if not spec.peers:
            if self.peers is not None:
                self.peers.close_soon()
                self.peers = None
            return True
        if self.peers is None or self.peers.ca_file != spec.peer_ca_file:
            if self.peers is not None:  # its loans out return by their leases
                self.peers.close_soon()
            self.peers = PeerLoans(spec.peers, token, spec.peer_ca_file)
        else:
            self.peers.urls = list(spec.peers)
        return True

    def set_lanes(self, lanes: int) -> None:
        self.ledger.set_lanes(lanes)

    def booked_gbps(self, now_s: float) -> float:
        return booked_gbps(self.ledger.transfers(now_s), now_s)

    def decide(
        self,
        key: str,
        headers: Mapping[str, str],
        kv_bytes: float,
        prefill_s: float,
        now_s: float,
        ready_s: float | None = None,
        slo_floor_s: float | None = None,
    ) -> Booking | web.Response:
        """Book a window (the caller then holds until :meth:`hold` returns) or the 400/429 answer. ``ready_s``: when
        the best PrFaaS instance, as the gateway sees it now, would have prefilled the request and have its egress
        free (model seconds from now; the instance pick's prediction). The calendar plans on lanes; the instances'
        real queues (requests run longer or shorter than predicted, other work) and, on paced instances, their
        egress can be later: a request whose TTFT through them passes what the caller accepts is declined even when
        the calendar's window starts now (a spill sent behind a long prefill missed by seconds). The caller's KV bytes
        and TTFT objective are verified against ``kv_bytes`` (the gateway's own count) and ``slo_floor_s`` (its
        configured SLO for this prompt) by :func:`verify_claims`; a correction is counted and logged."""
        try:
            nbytes = float(headers.get(names.HEADER_KV_BYTES, kv_bytes))
            max_wait_ms = float(headers.get(names.HEADER_MAX_WAIT_MS, "inf"))
            max_ttft_ms = float(headers.get(names.HEADER_MAX_TTFT_MS, "inf"))
            slo_ttft_ms = float(headers.get(names.HEADER_SLO_TTFT_MS, max_ttft_ms))
        except ValueError:
            return json_error(
                400,
                f"{names.HEADER_KV_BYTES}, {names.HEADER_MAX_WAIT_MS}, {names.HEADER_MAX_TTFT_MS} and "
                f"{names.HEADER_SLO_TTFT_MS} must be numbers (bytes, ms)",
            )
        if not (nbytes >= 0 and math.isfinite(nbytes)) or not min(max_wait_ms, max_ttft_ms, slo_ttft_ms) >= 0:
            return json_error(
                400,
                f"{names.HEADER_KV_BYTES} must be finite and >= 0, {names.HEADER_MAX_WAIT_MS}, "
                f"{names.HEADER_MAX_TTFT_MS} and {names.HEADER_SLO_TTFT_MS} >= 0",
            )
        verified = verify_claims(nbytes, kv_bytes, slo_ttft_ms / 1000.0, slo_floor_s)
        nbytes, slo_ttft_ms = verified.nbytes, verified.slo_ttft_s * 1000.0
        for claim in verified.corrected:
            self.claim_corrected(claim)
        link = headers.get(names.HEADER_LINK)
        if link is not None and link != self.link:
            return json_error(400, f"{names.HEADER_LINK}: this gateway schedules link {self.link!r}, not {link!r}")
        disagreement = link_view_disagreement(headers, self.link, self.whole.capacity_gbps, self.whole.max_utilization)
        if disagreement is not None:
            return json_error(400, disagreement)
        self.report(headers, now_s)
        avail = self.available(now_s)
        params = avail.bound(self.params)
        if self.metrics is not None:
            source = "configured" if avail.gbps is None else "reported"
            for s in ("configured", "reported"):
                self.metrics.gateway_link_available.labels(self.link, s).set(
                    params.capacity_gbps if s == source else 0.0
                )
        site_cap = self._site_cap(now_s, nbytes * 8.0 / GBPS_BITS)
        answer = admit(
            self.ledger,
            self._deadlines,
            AdmitTick(
                now_s,
                nbytes,
                prefill_s,
                params,
                self.spec.stream_timing,
                self.spec.lane_order,
                slo_ttft_s=slo_ttft_ms / 1000.0,
                max_wait_s=max_wait_ms / 1000.0,
                max_ttft_s=max_ttft_ms / 1000.0,
                ready_s=ready_s,
                waiting=self.waiting,
                max_waiting=self.spec.max_waiting,
                pull_gbps=self.spec.pull_gbps,
                site=site_cap,
            ),
        )
        if isinstance(answer, Decline):
            return self._decline(answer.reason, answer.window, answer.message)
        book(self.ledger, self._deadlines, key, answer)
        if self.site is not None:
            self._keys.add(key)
        if self.metrics is not None:
            self.metrics.gateway_lane_reorders.labels(self.link).inc(len(answer.moved))
        self._count("booked")
        if self.metrics is not None:
            self.metrics.gateway_admission_wait.labels(self.link).observe(answer.window.wait_s)
        return Booking(key, answer.window, answer.predicted_ttft_s)


def claim_counter(metrics: RouterMetrics | None, link: str) -> Callable[[str], None]:
    """Count (and log, at most once a second per claim) a router's claim the gateway corrected."""
    last: dict[str, float] = {}

    def corrected(claim: str) -> None:
        if metrics is not None:
            metrics.gateway_claims_corrected.labels(link, claim).inc()
        now = time.monotonic()
        if now - last.get(claim, -math.inf) >= 1.0:
            last[claim] = now
            log.warning("a router's claim corrected: the gateway books its own count", link=link, claim=claim)

    return corrected


class SiteEgress:
    """A site's egress cap shared by the links its gateway schedules: their one calendar (the site's lanes are its
    instances), the KV offered to each link lately, and each link's share of the cap (model Gbps, the whole site's;
    a replica books its share of it)."""

    def __init__(self, name: str, cap_gbps: float, metrics: RouterMetrics | None = None) -> None:
        self.name, self.whole_cap_gbps, self.metrics = name, cap_gbps, metrics
        self.ledger = EgressLedger(expire_s=600.0)
        self.deadlines: dict[str, Deadline] = {}
        self.links: dict[str, LinkAdmission] = {}
        self.demand = LinkDemands()

    def cap_gbps(self, share: float) -> float:
        return self.whole_cap_gbps * share

    def cap_for(self, link: str, now_s: float, share: float, keys: frozenset[str]) -> SiteCap:
        """``link``'s booking's :class:`SiteCap`: the cap, the link's max-min fair share of it now, its bookings."""
        cap = self.cap_gbps(share)
        demands = self.demand.demands(self.links, now_s)
        shares = site_shares(cap, demands)
        if self.metrics is not None:
            self.metrics.gateway_site_cap.labels(self.name).set(cap)
            for name, gbps in shares.items():
                self.metrics.gateway_site_share.labels(self.name, name).set(gbps)
                self.metrics.gateway_site_demand.labels(self.name, name).set(demands[name])
        return SiteCap(cap, shares.get(link, cap), keys)

    def on_wire_gbps(self) -> float:
        return sum(adm.on_wire_gbps() for adm in self.links.values())

    def changed(self) -> None:
        for adm in self.links.values():
            adm._changed.set()


class SiteAdmission:
    """The gateway's admission: one :class:`LinkAdmission` per link it schedules, the site's cap shared by them
    (``site``, with ``gateway.siteEgressCapGbps``). ``primary``: ``gateway.admission.link``, a prefill's link when
    it names none."""

    def __init__(self, links: dict[str, LinkAdmission], primary: str, site: SiteEgress | None) -> None:
        self.links, self.primary, self.site = links, primary, site

    def of(self, link: str | None) -> LinkAdmission | web.Response:
        """The admission of a prefill's link (its ``x-prfaas-link``), or the 400 naming the links scheduled here."""
        adm = self.links.get(self.primary if link is None else link)
        if adm is not None:
            return adm
        scheduled = ", ".join(repr(n) for n in self.links)
        return json_error(400, f"{names.HEADER_LINK}: this gateway schedules links {scheduled}, not {link!r}")

    def all(self) -> list[LinkAdmission]:
        return list(self.links.values())


def admission_for(
    config: RouterConfig,
    current: SiteAdmission | None,
    metrics: RouterMetrics | None = None,
    replica: str = "",
    token: Callable[[], bytes | None] = lambda: None,
) -> SiteAdmission | None:
    """The gateway's admission for ``config`` (None: not configured): every link of ``links[]``, the primary
    ``gateway.admission.link``. A current link admission is kept while its link stays, reconfigured in place: its
    calendar, its pulls on the wire and its loans outlive a reload (with a site cap, while the cap stays set: a cap
    set or dropped starts every link's calendar afresh). ``replica``: this gateway's id among its peers; ``token``:
    its bearer token now (its peers accept the same)."""
    gw = config.gateway
    if gw is None or gw.admission is None:
        return None
    spec = gw.admission
    links = {link.name: link for link in config.links}
    if spec.link not in links:
        raise ValueError(f"gateway.admission.link: {spec.link!r} is not one of links[].name")
    cap = gw.site_egress_cap_gbps
    site = None
    if cap is not None:
        site = current.site if current is not None and current.site is not None else None
        site = site or SiteEgress(gw.prefill_cluster, cap, metrics)
        site.whole_cap_gbps = cap
        site.links = {}
    keep = current is not None and (current.site is None) == (site is None)
    out: dict[str, LinkAdmission] = {}
    for name, link in links.items():
        old = current.links.get(name) if current is not None and keep else None
        out[name] = _link_admission(spec, link, config.scale.time_scale, old, metrics, replica, token)
        if site is not None:
            if out[name] is old:
                site.links[name] = old
            else:
                out[name].join(site)
    return SiteAdmission(out, spec.link, site)


def _link_admission(
    spec: GatewayAdmission,
    link: RouterLink,
    time_scale: float,
    current: LinkAdmission | None,
    metrics: RouterMetrics | None,
    replica: str,
    token: Callable[[], bytes | None],
) -> LinkAdmission:
    """One link's admission: ``current`` reconfigured in place, or a fresh one."""
    if current is not None:
        if not current.reconfigure(spec, link, time_scale, token):
            return current
        fresh = current
    else:
        fresh = LinkAdmission(spec, link, time_scale, metrics, replica)
        if spec.peers:
            fresh.peers = PeerLoans(spec.peers, token, spec.peer_ca_file)
    share = fresh.params.cap_gbps
    if spec.replicas > 1 and not spec.peers and spec.pull_gbps is not None and spec.pull_gbps > share:
        log.warning(
            "one pull is faster than this replica's share of the cap and no peers are configured to lend theirs: "
            "each replica lets one pull at a time, so the replicas together can pass the cap; list the replicas "
            "in gateway.admission.peers, or run one gateway replica on this link",
            link=link.name,
            pull_gbps=spec.pull_gbps,
            share_gbps=round(share, 3),
            replicas=spec.replicas,
        )
    return fresh
