"""Source-side admission at the gateway: every remote prefill passes through it, so its link calendar (the
core's :mod:`prfaas_core.policy.link_calendar` on an :class:`~prfaas_core.policy.link_state.EgressLedger`) sees every
KV stream the PrFaaS cluster sends, whichever router sent the request.

Per prefill: the router's headers (:data:`~prfaas_core.names.ADMISSION_HEADERS`) give the KV bytes (default: the
gateway's own ``S_kv`` of the prompt), the longest wait it accepts (default: any), the latest predicted TTFT it
accepts (default: any; the calendar knows the stream's timing, the router does not) and the link. The earliest
window that fits under the ceiling is booked and the prefill held until it starts; a later window than the
caller accepts (its wait or, for a window that does not start now, its predicted TTFT) is declined at once:
429, ``Retry-After`` and an :class:`~prfaas_core.api.AdmissionDecline`
(``link_window`` with the earliest start and the predicted TTFT; ``overloaded`` when ``maxWaiting`` prefills
already wait). The headers never reach the engine (the gateway forwards only ``x-request-id``).

**Pulls on the wire.** The calendar plans from predicted times, but a pull starts when its router gets the
answer: the answer is held until its pull fits next to the pulls already on the wire (:meth:`LinkAdmission.release`),
and a pull counts there until its router reports it over (``POST`` :data:`~prfaas_core.names.PULL_DONE_PATH`, the id
from :data:`~prfaas_core.names.HEADER_PULL_ID`) or its lease runs out. Exported as
``prfaas_gateway_pulls_total{link,end}`` and ``prfaas_gateway_pull_hold_seconds{link}``.

**Available bandwidth.** The routers measure what the link delivers (:mod:`prfaas_core.policy.link_estimate`,
from their pulls' timing) and send it along while it bounds the configured capacity
(:data:`~prfaas_core.names.HEADER_LINK_AVAILABLE_GBPS`); the calendar books under the lowest report of the last
``REPORT_MAX_AGE_S`` (model seconds), this replica's share of it. Exported as
``prfaas_gateway_link_available_gbps{link,source}`` next to ``prfaas_gateway_admissions_total{link,result}`` and
``prfaas_gateway_admission_wait_seconds{link}``.

**Gateway replicas.** Each of N replicas books ``cap / N`` (``gateway.admission.replicas``): no Lease and no
forwarding on the hot path, and the replicas' bookings can never sum past the cap; the price is that one
replica cannot borrow another's idle share (a Lease-holding owner of the whole calendar would, at the cost of a
forwarding hop and a single point of failure). Time is model time (``scale.timeScale``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog
from aiohttp import web

from prfaas_core import names
from prfaas_core.api import AdmissionDecline, GatewayAdmission, RouterConfig, RouterLink
from prfaas_core.policy.link_calendar import Window, booked_gbps, ceiling_gbps, earliest_window
from prfaas_core.policy.link_estimate import Available
from prfaas_core.policy.link_state import EgressLedger, LinkParams, Transfer

from .http_util import json_error
from .metrics import RouterMetrics

log = structlog.get_logger("prfaas.router.admission")

REPORT_MAX_AGE_S = 10.0
"""A router's available-bandwidth report counts this long (model seconds); after it the capacity stands again."""
LEASE_FACTOR = 3.0
LEASE_GRACE_S = 2.0
"""A pull let onto the wire counts there until reported over, or for ``LEASE_FACTOR`` x its booked span +
``LEASE_GRACE_S`` (model seconds) at most: a router that never reports (or died) cannot hold the link."""
RECHECK_S = 0.5
"""A held answer re-checks the wire at least this often (wall seconds): the ceiling can rise without a pull ending."""


@dataclass
class Booking:
    key: str
    window: Window


class LinkAdmission:
    """One gateway replica's share of its link's calendar."""

    def __init__(
        self, spec: GatewayAdmission, link: RouterLink, time_scale: float, metrics: RouterMetrics | None = None
    ) -> None:
        self.spec = spec
        self.time_scale = time_scale
        self.metrics = metrics
        self._reports: dict[float, float] = {}
        """Routers' available-bandwidth reports: model time -> Gbps (the whole link's)."""
        share = self.share = 1.0 / spec.replicas
        self.params = LinkParams(
            link.name,
            link.capacity_gbps * share,
            link.max_utilization,
            link.scarce_watermark,
            link.abundant_watermark,
        )
        self.ledger = EgressLedger(expire_s=600.0)
        self.waiting = 0
        self.holding = 0
        """Prefill answers held until their pull fits on the wire."""
        self._on_wire: dict[str, float] = {}
        """Pulls let onto the wire and not over: id -> booked Gbps."""
        self._leases: dict[str, asyncio.TimerHandle] = {}
        self._changed = asyncio.Event()

    @property
    def link(self) -> str:
        return self.params.name

    def set_lanes(self, lanes: int) -> None:
        self.ledger.set_lanes(lanes)

    def booked_gbps(self, now_s: float) -> float:
        return booked_gbps(self.ledger.transfers(now_s), now_s)

    def report(self, headers: Mapping[str, str], now_s: float) -> None:
        """A router's available-bandwidth header (already checked a non-negative number by the allow-list)."""
        value = headers.get(names.HEADER_LINK_AVAILABLE_GBPS)
        if value is not None:
            self._reports[now_s] = float(value)

    def available(self, now_s: float) -> Available:
        """The lowest fresh report (this replica books its share of it), or no bound."""
        for t in [t for t in self._reports if now_s - t > REPORT_MAX_AGE_S]:
            del self._reports[t]
        if not self._reports:
            return Available()
        low = min(self._reports.values())
        return Available(low * self.share, "streams", f"routers report {low:.3g} Gbps available")

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.gateway_admissions.labels(self.link, result).inc()

    def decide(
        self, key: str, headers: Mapping[str, str], kv_bytes: float, prefill_s: float, now_s: float
    ) -> Booking | web.Response:
        """Book a window (the caller then holds until :meth:`hold` returns) or the 400/429 answer."""
        try:
            nbytes = float(headers.get(names.HEADER_KV_BYTES, kv_bytes))
            max_wait_ms = float(headers.get(names.HEADER_MAX_WAIT_MS, "inf"))
            max_ttft_ms = float(headers.get(names.HEADER_MAX_TTFT_MS, "inf"))
        except ValueError:
            return json_error(
                400,
                f"{names.HEADER_KV_BYTES}, {names.HEADER_MAX_WAIT_MS} and {names.HEADER_MAX_TTFT_MS} must be "
                "numbers (bytes, ms)",
            )
        if not (nbytes >= 0 and math.isfinite(nbytes)) or not max_wait_ms >= 0 or not max_ttft_ms >= 0:
            return json_error(
                400,
                f"{names.HEADER_KV_BYTES} must be finite and >= 0, {names.HEADER_MAX_WAIT_MS} and "
                f"{names.HEADER_MAX_TTFT_MS} >= 0",
            )
        link = headers.get(names.HEADER_LINK)
        if link is not None and link != self.link:
            return json_error(400, f"{names.HEADER_LINK}: this gateway schedules link {self.link!r}, not {link!r}")
        self.report(headers, now_s)
        avail = self.available(now_s)
        params = avail.bound(self.params)
        if self.metrics is not None:
            source = "configured" if avail.gbps is None else "reported"
            for s in ("configured", "reported"):
                self.metrics.gateway_link_available.labels(self.link, s).set(
                    params.capacity_gbps if s == source else 0.0
                )
        window = earliest_window(
            self.ledger,
            now_s,
            nbytes,
            prefill_s,
            params,
            self.spec.stream_timing,
            pull_gbps=self.spec.pull_gbps,
        )
        if window is None:
            return self._decline("overloaded", None, "the link's ceiling is 0")
        if window.wait_s * 1000.0 > max_wait_ms:
            return self._decline("link_window", window, f"earliest window in {window.wait_s:.3f} s")
        if window.wait_s > 0 and window.ttft_s * 1000.0 > max_ttft_ms:
            why = f"earliest window in {window.wait_s:.3f} s gives a predicted TTFT of {window.ttft_s:.3f} s"
            return self._decline("link_window", window, f"{why} > {max_ttft_ms / 1000.0:.3f} s accepted")
        if window.wait_s > 0 and self.waiting >= self.spec.max_waiting:
            return self._decline("overloaded", window, f"{self.waiting} prefills already wait for a window")
        self.ledger.reserve(key, window.transfer())
        self._count("booked")
        if self.metrics is not None:
            self.metrics.gateway_admission_wait.labels(self.link).observe(window.wait_s)
        return Booking(key, window)

    def _decline(self, reason: str, window: Window | None, why: str) -> web.Response:
        self._count(reason)
        body = AdmissionDecline.model_validate(
            {
                "reason": reason,
                "earliestStartMs": None if window is None else window.wait_s * 1000.0,
                "predictedTtftMs": None if window is None else window.ttft_s * 1000.0,
                "link": self.link,
                "message": why,
            }
        )
        wall_wait = (window.wait_s if window is not None else 1.0) / self.time_scale
        return web.json_response(
            body.model_dump(mode="json", by_alias=True),
            status=429,
            headers={"Retry-After": str(max(1, math.ceil(wall_wait)))},
        )

    async def hold(self, booking: Booking, now_s: float) -> None:
        """Wait (wall time) until the booked window starts."""
        wait = booking.window.start_s - now_s
        if wait <= 0:
            return
        self.waiting += 1
        try:
            await asyncio.sleep(wait / self.time_scale)
        finally:
            self.waiting -= 1

    def on_wire_gbps(self) -> float:
        """The pulls let onto the wire and not yet over (their booked rates)."""
        return sum(self._on_wire.values())

    def _fits(self, rate: float, now_s: float) -> bool:
        """A pull at ``rate`` fits on the wire now: next to the pulls there, under the ceiling; alone, always
        (a ceiling below one pull's speed lets one at a time, or none would ever run)."""
        ceiling = ceiling_gbps(self.ledger, now_s, self.available(now_s).bound(self.params))
        return not self._on_wire or self.on_wire_gbps() + rate <= ceiling + 1e-9

    async def release(self, booking: Booking, ok: bool, clock: Callable[[], float]) -> str | None:
        """The prefill answered. A pull-after-prefill stream starts when the caller gets the answer, so the answer
        is held until its pull fits on the wire next to the pulls already there (a calendar planned from predicted
        times alone let two pulls overlap when one started late: 9.8 Gbps in 1-s windows on an 8-Gbps cap); the
        pull then counts there until the caller reports it over (:meth:`pulled`) or its lease runs out. Returns
        the pull's id for the answer's :data:`~prfaas_core.names.HEADER_PULL_ID` (None: nothing to report; a
        layer-wise stream has ended with its prefill; a failure frees the window)."""
        w, key = booking.window, booking.key
        span = w.stream_end_s - w.stream_start_s
        if not ok or self.spec.stream_timing == "layer-wise" or span <= 0:
            self.ledger.finish(key)
            return None
        held_from = clock()
        self.holding += 1
        try:
            while not self._fits(w.rate_gbps, clock()):
                self._changed.clear()
                with contextlib.suppress(TimeoutError):  # the ceiling may also rise (a fresher report)
                    await asyncio.wait_for(self._changed.wait(), RECHECK_S)
        except BaseException:  # the caller went away while held: no pull will come
            self.ledger.finish(key)
            raise
        finally:
            self.holding -= 1
        now = clock()
        if self.metrics is not None:
            self.metrics.gateway_pull_hold.labels(self.link).observe(now - held_from)
        self._on_wire[key] = w.rate_gbps
        self.ledger.reserve(key, Transfer(w.bytes, now, 0.0, -1, 0.0, span))
        lease = span * LEASE_FACTOR + LEASE_GRACE_S
        self._leases[key] = asyncio.get_running_loop().call_later(lease / self.time_scale, self._over, key, "lease")
        return key

    def pulled(self, key: str) -> bool:
        """The caller reports the pull ``key`` over; False when it is not on the wire (unknown, or its lease ran
        out)."""
        return self._over(key, "reported")

    def _over(self, key: str, end: str) -> bool:
        if self._on_wire.pop(key, None) is None:
            return False
        lease = self._leases.pop(key, None)
        if lease is not None:
            lease.cancel()
        self.ledger.finish(key)
        self._changed.set()
        if self.metrics is not None:
            self.metrics.gateway_pulls.labels(self.link, end).inc()
        return True


def admission_for(
    config: RouterConfig, current: LinkAdmission | None, metrics: RouterMetrics | None = None
) -> LinkAdmission | None:
    """The gateway's admission for ``config`` (None: not configured); the current one (and its calendar) is
    kept while its spec, link and scale are unchanged."""
    gw = config.gateway
    if gw is None or gw.admission is None:
        return None
    spec = gw.admission
    links = {link.name: link for link in config.links}
    if spec.link not in links:
        raise ValueError(f"gateway.admission.link: {spec.link!r} is not one of links[].name")
    link = links[spec.link]
    fresh = LinkAdmission(spec, link, config.scale.time_scale, metrics)
    if current is not None and current.spec == spec and current.params == fresh.params:
        return current
    share = fresh.params.cap_gbps
    if spec.replicas > 1 and spec.pull_gbps is not None and spec.pull_gbps > share:
        log.warning(
            "one pull is faster than this replica's share of the cap: each replica lets one pull at a time, so "
            "the replicas together can pass the cap; run one gateway replica on this link",
            link=spec.link,
            pull_gbps=spec.pull_gbps,
            share_gbps=round(share, 3),
            replicas=spec.replicas,
        )
    return fresh
