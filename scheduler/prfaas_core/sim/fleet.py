"""The fleet simulation: several PrFaaS sites serving several PD regions on one virtual clock, each request's
prefill placed by the core's remote choice (:func:`~prfaas_core.policy.fleet.choose_site`) and booked on its site's
calendar by the gateway's admission (:func:`~prfaas_core.policy.link_admission.admit` /
:func:`~prfaas_core.policy.link_admission.book`: the link's ceiling, its share of the site egress cap and the site
cap together) — the same functions the routers and gateways call.

Two modes on the same request sequences: ``fleet`` (every region may use every site it has a link to) and
``static`` (each region bound to one site, ``staticPairing``: the single-pair deployment repeated). A phase holds a
condition for the whole run (a link squeezed or cut, a site lost or drained). A cut link counts as its breaker
open; a lost site is unreachable.

The model: a region's PD prefill instances are FIFO servers (``T_prefill`` of its hardware); a site's instances are
its calendar's lanes, and a remote prefill runs and streams exactly as booked (layer-wise, at the booked rate), so
the egress measured in 1-s windows per link and per site is the calendar's. TTFT = arrival -> the KV at the region
(prefill end locally) + one decode step. The decode side is not simulated (every request decodes in its own region
in both modes). Goodput: the highest common multiplier of the regions' rates at which every region meets its TTFT
objective for ``attainment`` of its requests (bisection).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..capacity.hardware import builtin_hardware
from ..capacity.kv import KvModel, kv_model_from_profile
from ..capacity.profiles import builtin_model_profiles
from ..names import GBPS_BITS
from ..policy.fleet import DEMAND_WINDOW_S, SiteOption, choose_site, site_shares
from ..policy.link_admission import AdmitTick, book
from ..policy.link_calendar import Deadline, SiteCap, accepted_ttft_s
from ..policy.link_state import EgressLedger, LinkParams
from ..policy.routing import transfer_bytes
from ..request.slo import ttft_objective_s
from .arrivals import SimRequest, generate_requests
from .events import EventQueue
from .fleet_config import FleetPhaseSpec, FleetScenario
from .scenario import ArrivalSpec

FleetMode = Literal["fleet", "static"]
FLEET_MODES: tuple[FleetMode, ...] = ("fleet", "static")


def _hardware(name: str, where: str) -> Callable[[float], float]:
    hw = builtin_hardware(name)
    if hw is None:
        raise ValueError(f"{where}: {name!r} has no built-in profile")
    return hw.prefill_seconds


@dataclass
class _Site:
    name: str
    seconds: Callable[[float], float]
    ledger: EgressLedger
    cap_gbps: float
    lost: bool
    drained: bool
    deadlines: dict[str, Deadline] = field(default_factory=dict)
    keys: dict[str, set[str]] = field(default_factory=dict)
    """Each link's bookings in the site's calendar."""
    shares: dict[str, float] = field(default_factory=dict)


@dataclass
class _Link:
    name: str
    region: str
    site: str
    params: LinkParams | None
    """None: cut (its breaker open)."""
    threshold: int
    drained: bool
    offered: deque[tuple[float, float]] = field(default_factory=deque)


@dataclass
class FleetRun:
    """One run: per region its requests and those meeting the objective; 1-s-window egress per link and site."""

    mode: FleetMode
    phase: str
    multiplier: float
    requests: dict[str, int] = field(default_factory=dict)
    met: dict[str, int] = field(default_factory=dict)
    remote: dict[str, int] = field(default_factory=dict)
    """Remote prefills by site."""
    link_bins: dict[str, dict[int, float]] = field(default_factory=dict)
    site_bins: dict[str, dict[int, float]] = field(default_factory=dict)
    link_caps: dict[str, float] = field(default_factory=dict)
    site_caps: dict[str, float] = field(default_factory=dict)
    aborted: bool = False

    def attainment(self, region: str) -> float:
        n = self.requests.get(region, 0)
        return self.met.get(region, 0) / n if n else 1.0

    @staticmethod
    def peak(bins: dict[int, float]) -> float:
        """The largest egress in any 1-s window, Gbps."""
        return max(bins.values(), default=0.0)


class FleetSimulation:
    """One fleet over one phase in one mode (see the module docstring)."""

    def __init__(
        self, scn: FleetScenario, phase: FleetPhaseSpec, mode: FleetMode, multiplier: float, duration_s: float
    ):
        if mode not in FLEET_MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(FLEET_MODES)}")
        spec = scn.fleet
        profiles = builtin_model_profiles()
        if spec.model not in profiles:
            raise ValueError(f"fleet.model: unknown model profile {spec.model!r}")
        self.kv: KvModel = kv_model_from_profile(profiles[spec.model])
        self.scn, self.mode, self.duration_s = scn, mode, duration_s
        self.events = EventQueue()
        self.sites = {
            s.name: _Site(
                s.name,
                _hardware(s.accelerator, f"fleet.sites[{s.name}].accelerator"),
                EgressLedger(lanes=s.instances, expire_s=1e9),
                s.site_egress_cap_gbps or math.inf,
                s.name in phase.lost_sites,
                s.drained or s.name in phase.drained_sites,
            )
            for s in spec.sites
        }
        self.links: dict[str, list[_Link]] = {r.name: [] for r in spec.regions}
        for ln in spec.links:
            change = phase.links.get(ln.name)
            gbps = ln.capacity_gbps if change is None or change.capacity_gbps is None else change.capacity_gbps
            drained = ln.drained if change is None or change.drained is None else change.drained
            if mode == "static" and spec.static_pairing.get(ln.region) != ln.site:
                continue
            params = LinkParams(ln.name, gbps, ln.max_utilization) if gbps > 0 else None
            self.links[ln.region].append(_Link(ln.name, ln.region, ln.site, params, ln.threshold_tokens, drained))
            self.sites[ln.site].keys[ln.name] = set()
        self.region_seconds = {r.name: _hardware(r.accelerator, f"fleet.regions[{r.name}]") for r in spec.regions}
        step = builtin_hardware(spec.regions[0].accelerator)
        self.step_s = step.decode.step_time_s if step is not None and step.decode is not None else 0.0
        self.free_at = {r.name: [0.0] * r.prefill_instances for r in spec.regions}
        self.run_result = FleetRun(mode, phase.name, multiplier)
        res = self.run_result
        for links in self.links.values():
            for link in links:
                res.link_bins[link.name] = {}
                res.link_caps[link.name] = link.params.cap_gbps if link.params is not None else 0.0
        for site in self.sites.values():
            res.site_bins[site.name] = {}
            res.site_caps[site.name] = site.cap_gbps
            self._share(site, 0.0)
        self.requests = {
            r.name: generate_requests(
                ArrivalSpec(process="poisson", rate_per_second=spec.rate_per_second),
                scn.workload,
                duration_s,
                scn.seed * 1009 + i,
                multiplier,
            )
            for i, r in enumerate(spec.regions)
        }
        self._allowed_misses = {name: (1.0 - scn.search.attainment) * len(reqs) for name, reqs in self.requests.items()}
        self._missed = dict.fromkeys(self.requests, 0)

    # --- the site cap's shares ---------------------------------------------------------------------------------

    def _share(self, site: _Site, now: float) -> None:
        demands: dict[str, float] = {}
        for links in self.links.values():
            for link in links:
                if link.site != site.name:
                    continue
                while link.offered and link.offered[0][0] < now - DEMAND_WINDOW_S:
                    link.offered.popleft()
                demands[link.name] = sum(g for _, g in link.offered) / DEMAND_WINDOW_S
        site.shares = site_shares(site.cap_gbps, demands) if math.isfinite(site.cap_gbps) else {}

    def _tick(self, _: object) -> None:
        now = self.events.now_s
        for site in self.sites.values():
            self._share(site, now)
        if now < self.duration_s:
            self.events.at(now + 1.0, self._tick, None)

    # --- running -------------------------------------------------------------------------------------------------

    def run(self) -> FleetRun:
        for region, reqs in self.requests.items():
            self.run_result.requests[region] = len(reqs)
            self.run_result.met[region] = 0
            self.events.at_all([(r.arrival_s, self._arrive, (region, r)) for r in reqs])
        self.events.at(1.0, self._tick, None)
        self.events.run_until(3.0 * self.duration_s + 600.0)
        return self.run_result

    def _record(self, region: str, spec: SimRequest, ttft_s: float) -> None:
        if ttft_s <= ttft_objective_s(self.scn.slo, spec.input_tokens) + 1e-9:
            self.run_result.met[region] += 1
            return
        self._missed[region] += 1
        if self._missed[region] > self._allowed_misses[region]:  # the objective is lost already: stop early
            self.run_result.aborted = True
            self.events.clear()

    def _arrive(self, arg: tuple[str, SimRequest]) -> None:
        region, spec = arg
        now = self.events.now_s
        total = spec.input_tokens
        free = self.free_at[region]
        lane = min(range(len(free)), key=free.__getitem__)
        local_wait = max(0.0, free[lane] - now)
        local_ttft = local_wait + self.region_seconds[region](float(total))
        slo = ttft_objective_s(self.scn.slo, total)
        accepted = accepted_ttft_s(local_ttft, slo, False)
        nbytes = transfer_bytes(self.kv, total, 0)
        options = []
        usable = [
            ln
            for ln in self.links[region]
            if ln.params is not None and not (ln.drained or self.sites[ln.site].drained or self.sites[ln.site].lost)
        ]
        for link in usable:  # its demand: the KV offered, split equally among the links it could take
            if total > link.threshold:
                link.offered.append((now, nbytes * 8.0 / GBPS_BITS / len(usable)))
        for link in self.links[region]:
            site = self.sites[link.site]
            if site.lost:
                continue
            params = link.params or LinkParams(link.name, 1.0)
            cap = SiteCap(site.cap_gbps, site.shares.get(link.name, site.cap_gbps), frozenset(site.keys[link.name]))
            tick = AdmitTick(
                now,
                nbytes,
                site.seconds(float(total)),
                params,
                slo_ttft_s=slo,
                max_ttft_s=accepted,
                accepted_ttft_s=accepted,
                site=cap,
            )
            options.append(
                SiteOption(
                    site.name,
                    link.name,
                    site.ledger,
                    site.deadlines,
                    tick,
                    total,
                    link.threshold,
                    breaker_open=link.params is None,
                    drained=link.drained or site.drained,
                )
            )
        choice = choose_site(options, local_ttft, slo, local_wait)
        if choice.target == "remote" and choice.booking is not None and choice.site and choice.link:
            site = self.sites[choice.site]
            key = f"{region}.{spec.id}"
            book(site.ledger, site.deadlines, key, choice.booking)
            site.keys[choice.link].add(key)
            self.run_result.remote[site.name] = self.run_result.remote.get(site.name, 0) + 1
            w = choice.booking.window
            self.events.at(now + w.ttft_s, self._remote_done, (region, spec, site, choice.link, key, now))
            return
        start = max(now, free[lane])
        free[lane] = start + self.region_seconds[region](float(total))
        self._record(region, spec, free[lane] - now + self.step_s)

    def _remote_done(self, arg: tuple[str, SimRequest, _Site, str, str, float]) -> None:
        region, spec, site, link, key, arrived = arg
        now = self.events.now_s
        t = site.ledger.get(key)
        assert t is not None
        end = max(t.stream_end_s, t.end_s)
        if end > now + 1e-9:  # moved back for a request due earlier
            self.events.at(end, self._remote_done, arg)
            return
        site.ledger.finish(key)
        site.keys[link].discard(key)
        site.deadlines.pop(key, None)
        res = self.run_result
        for bins in (res.link_bins[link], res.site_bins[site.name]):
            _add(bins, t.stream_start_s, t.stream_end_s, t.rate_gbps)
        self._record(region, spec, end - arrived + self.step_s)


def _add(bins: dict[int, float], a: float, b: float, gbps: float) -> None:
    """Spread a stream of ``gbps`` over ``[a, b)`` into 1-s windows (Gbit per window = Gbps)."""
    k = math.floor(a)
    while k < b:
        overlap = min(b, k + 1) - max(a, k)
        if overlap > 0:
            bins[k] = bins.get(k, 0.0) + overlap * gbps
        k += 1


def run_fleet(
    scn: FleetScenario, phase: FleetPhaseSpec, mode: FleetMode, multiplier: float, duration_s: float
) -> FleetRun:
    """One run (see :class:`FleetSimulation`)."""
    return FleetSimulation(scn, phase, mode, multiplier, duration_s).run()


def meets(run: FleetRun, attainment: float) -> bool:
    """Every region meets the TTFT objective for ``attainment`` of its requests."""
    return not run.aborted and all(run.attainment(r) >= attainment for r in run.requests)


@dataclass(frozen=True)
class Goodput:
    """The highest common rate multiplier found (``best``: the run there; None when even the lowest probe failed)."""

    multiplier: float
    best: FleetRun | None
    probes: int
    link_peaks: dict[str, float] = field(default_factory=dict)
    """Each link's largest 1-s-window egress over every probe, Gbps (``site_peaks``: each site's)."""
    site_peaks: dict[str, float] = field(default_factory=dict)


def goodput(
    scn: FleetScenario,
    phase: FleetPhaseSpec,
    mode: FleetMode,
    duration_s: float | None = None,
    precision: float | None = None,
    low: float = 1.0 / 64,
    high: float = 16.0,
) -> Goodput:
    """The highest common multiplier of the regions' rates at which every region meets the objective: doubling or
    halving from 1 to bracket it, then bisection to ``precision`` (relative)."""
    d = duration_s or scn.search.duration_seconds
    eps = precision or scn.search.relative_precision
    att = scn.search.attainment
    probes = 0
    links: dict[str, float] = {}
    sites: dict[str, float] = {}

    def probe(m: float) -> FleetRun | None:
        nonlocal probes
        probes += 1
        r = run_fleet(scn, phase, mode, m, d)
        for peaks, bins in ((links, r.link_bins), (sites, r.site_bins)):
            for name, b in bins.items():
                peaks[name] = max(peaks.get(name, 0.0), r.peak(b))
        return r if meets(r, att) else None

    m, ok = 1.0, probe(1.0)
    lo, hi = (m, None) if ok else (None, m)
    best = ok
    while lo is None and m > low:
        m /= 2
        best = probe(m)
        lo, hi = (m, hi) if best else (None, m)
    while hi is None and m < high:
        m *= 2
        r = probe(m)
        if r:
            lo, best = m, r
        else:
            hi = m
    if lo is None:
        return Goodput(0.0, None, probes, links, sites)
    if hi is None:
        return Goodput(lo, best, probes, links, sites)
    while (hi - lo) / hi > eps:
        mid = (lo + hi) / 2
        r = probe(mid)
        if r:
            lo, best = mid, r
        else:
            hi = mid
    return Goodput(lo, best, probes, links, sites)
