"""A fleet: several PrFaaS sites serving several PD regions. Per request, the remote choice among the sites a
region reaches, and the rule by which a site's egress cap is shared by its links. Pure; time is a parameter.

**The choice** (:func:`choose_site`): each reachable site is a :class:`SiteOption` — the request through that
site's link, as the site's gateway would book it (:func:`~.link_admission.admit` on the site's calendar: the link's
window under its calendar and the site cap, the site's queue as ``ready_s``, the KV bytes and prefill time of what
the site does not hold of the prompt). A site is no candidate when its breaker is open (the caller keeps the
breaker, :mod:`.breaker`; the choice takes its outcome), when it or its link is drained (maintenance: no new remote
prefills; in-flight ones finish), when the request's uncached length there is not above that link's ``t``, or when
its gateway declines. Of the candidates the one with the lowest predicted TTFT wins (ties: the order given, the
caller's preference order); it is taken unless local beats it by the rule of
:func:`~.link_calendar.prefer_local` — local when no site beats it.

**A router's pick** (:func:`predicted_ttft_s`, used by :func:`~.short_term.route` when several remotes are
usable): a router sees its own ledger per link (its lanes the remote's ready instances), not the site calendars, so
it ranks the ready remotes whose breakers allow them by the TTFT its ledger predicts through each (the window under
the link's ceiling, the remote's queue, what the remote lacks of the prompt) and the lowest wins (ties: the
configured order); that remote's gateway then books or declines. One usable remote: it, as before.

**The site cap's sharing rule** (:func:`site_shares`): when the links' demands together exceed the site's egress
cap, the cap is split **max-min fair** over the links' demands (water-filling: a link that asks less than an equal
share keeps what it asks; what it leaves is split equally among the others, again and again). When the cap does not
bind, no link is held to a part of it: every link's share is the whole cap (work-conserving at every instant: a
burst on one link may use what the others leave idle; the demands fit, so no link is crowded out for long). A
link's share bounds its calendar's ceiling (:class:`~.link_calendar.SiteCap`), and each booking also fits under the
whole site cap next to all the site's streams, so the cap holds at every instant even while the shares move.
Splitting a cap that does not bind into fixed parts would halve what any one stream may take on a site two regions
share (the stream outlasts its prefill) and leave one link's part idle while the other's burst waits: measured on a
balanced fleet (2 sites, 2 regions, ``examples/02-simulate/fleet-balanced.yaml``), fleet routing lost up to 7 % of
goodput to static pairing with parts, and gains 3-9 % without them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .link_admission import AdmitTick, Booking, admit
from .link_calendar import Deadline, earliest_window, prefer_local
from .link_state import EgressLedger, LinkParams

_EPS = 1e-9
DEMAND_WINDOW_S = 10.0
"""A link's demand (for the site cap's shares): the KV offered to it over this many seconds (model time)."""


def site_shares(cap_gbps: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Each link's share of a site's egress cap (model Gbps; see the module docstring): the whole cap for every
    link while the demands together fit under it, else max-min fair over ``demands`` (the shares then sum to the
    cap). No link: empty; a negative demand or cap is an error."""
    if cap_gbps < 0 or any(d < 0 for d in demands.values()):
        raise ValueError("site cap and link demands must be >= 0")
    if sum(demands.values()) <= cap_gbps + _EPS:  # the cap does not bind: the site cap alone holds the links
        return dict.fromkeys(demands, cap_gbps)
    shares = dict.fromkeys(demands, 0.0)
    left = cap_gbps
    open_links = sorted(demands, key=lambda k: (demands[k], k))
    while open_links and left > _EPS:
        equal = left / len(open_links)
        first = open_links[0]
        need = demands[first] - shares[first]
        if need <= equal:  # the smallest asks less than an equal split: it keeps its demand
            shares[first] += need
            left -= need
            open_links.pop(0)
            continue
        for k in open_links:
            shares[k] += equal
        left = 0.0
    return shares


@dataclass
class LinkDemands:
    """Each link's demand on a site (:func:`site_shares`' input): the KV offered to it, booked or not, over the
    last :data:`DEMAND_WINDOW_S` (model Gbps). The gateway's site keeps one; time is a parameter."""

    window_s: float = DEMAND_WINDOW_S
    offered: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    """link -> (model time, Gbit offered)."""

    def offer(self, link: str, now_s: float, gbit: float) -> None:
        self.offered.setdefault(link, deque()).append((now_s, gbit))

    def demands(self, links: Iterable[str], now_s: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for link in links:
            q = self.offered.get(link, deque())
            while q and q[0][0] < now_s - self.window_s:
                q.popleft()
            out[link] = sum(g for _, g in q) / self.window_s
        return out


@dataclass(frozen=True)
class SiteOption:
    """One reachable site for one request: its link, its calendar and the request through it."""

    site: str
    link: str
    ledger: EgressLedger
    """The site's calendar (every link's bookings; lanes = its instances)."""
    deadlines: Mapping[str, Deadline]
    tick: AdmitTick
    """The request through this link (``tick.site`` the site cap with this link's share; ``ready_s`` the site's
    queue; ``nbytes``/``prefill_s`` for what the site lacks of the prompt)."""
    uncached_tokens: int
    """The prompt tokens the site does not hold (its cached prefix left out)."""
    threshold_tokens: int
    """``t`` of this link: a remote candidate's uncached length is above it."""
    breaker_open: bool = False
    drained: bool = False
    """The site or its link is drained (maintenance)."""


SiteTarget = Literal["remote", "local"]


@dataclass(frozen=True)
class SiteChoice:
    """Where the prefill goes: ``remote`` through ``site``/``link`` with its ``booking`` (apply it with
    :func:`~.link_admission.book` on that site's calendar), or ``local``; ``skipped``: each site left out, and why."""

    target: SiteTarget
    site: str | None
    link: str | None
    booking: Booking | None
    predicted_ttft_s: float
    local_ttft_s: float
    reason: str
    skipped: tuple[tuple[str, str], ...] = ()


def choose_site(
    options: Sequence[SiteOption],
    local_ttft_s: float,
    slo_ttft_s: float | None = None,
    local_wait_s: float = 0.0,
) -> SiteChoice:
    """The remote choice among ``options`` (in the caller's preference order) against the local alternative
    (its predicted TTFT ``local_ttft_s``, its queue ``local_wait_s``); see the module docstring. Reads the
    calendars; books nothing."""
    skipped: list[tuple[str, str]] = []
    best: tuple[float, SiteOption, Booking] | None = None
    for o in options:
        if o.breaker_open:
            skipped.append((o.site, "breaker open"))
            continue
        if o.drained:
            skipped.append((o.site, "drained"))
            continue
        if o.uncached_tokens <= o.threshold_tokens:
            skipped.append((o.site, f"uncached {o.uncached_tokens} <= t {o.threshold_tokens}"))
            continue
        answer = admit(o.ledger, o.deadlines, o.tick)
        if not isinstance(answer, Booking):
            skipped.append((o.site, f"{answer.reason}: {answer.message}"))
            continue
        if best is None or answer.predicted_ttft_s < best[0] - _EPS:
            best = (answer.predicted_ttft_s, o, answer)
    if best is None:
        why = "; ".join(f"{s}: {w}" for s, w in skipped) or "no site reachable"
        return SiteChoice("local", None, None, None, math.inf, local_ttft_s, f"local prefill ({why})", tuple(skipped))
    ttft, o, booking = best
    fit = f"{ttft:.2f} s via {o.site} ({o.link}) vs local {local_ttft_s:.2f} s"
    if prefer_local(ttft, local_ttft_s, slo_ttft_s, local_wait_s):
        return SiteChoice("local", None, None, None, ttft, local_ttft_s, f"local prefill: {fit}", tuple(skipped))
    return SiteChoice("remote", o.site, o.link, booking, ttft, local_ttft_s, f"remote: {fit}", tuple(skipped))


def predicted_ttft_s(ledger: EgressLedger, now_s: float, nbytes: float, prefill_s: float, params: LinkParams) -> float:
    """The TTFT a router's ledger predicts through one remote (its earliest window, layer-wise, under the link's
    ceiling; its lanes' queue included); ``inf`` when the ceiling is 0."""
    window = earliest_window(ledger, now_s, nbytes, prefill_s, params)
    return math.inf if window is None else window.ttft_s


def fastest(predicted: Sequence[float]) -> int:
    """The index of the lowest prediction (ties: the first, the configured preference order); 0 when empty."""
    best = 0
    for i, p in enumerate(predicted):
        if p < predicted[best] - _EPS:
            best = i
    return best
