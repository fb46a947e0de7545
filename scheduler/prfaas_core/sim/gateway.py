"""The simulated PrFaaS gateway's link calendar: the one :class:`~prfaas_core.policy.link_state.EgressLedger` that
sees every KV stream on the link (every remote prefill passes through the gateway), booked by
:func:`~prfaas_core.policy.link_admission.admit` (the lane order a scenario knob, ``policy.laneOrder``) and chosen
against the local alternative with :func:`~prfaas_core.policy.link_calendar.choose_window` — the same functions
the real gateway and routers call.

The routers' own ledgers (one per replica, :class:`~.simulation.Simulation`) stay the fast pre-filter: a request
the pre-filter sends local because of its length never asks; one it would send remote, or decline only for the
cap, asks the gateway for a window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..capacity.kv import KvModel
from ..policy.link_admission import AdmitTick, Booking, LaneOrder, admit, book
from ..policy.link_calendar import Deadline, StreamTiming, WaitChoice, Window, accepted_ttft_s, choose_window
from ..policy.link_state import EgressLedger, LinkParams
from ..policy.routing import RouteDecision, transfer_bytes
from ..request.slo import ttft_objective_s
from .config import SimConfig
from .events import EventQueue
from .instances import Instance, Job
from .results import RunResult
from .state import Req


@dataclass
class WindowStats:
    """What the run reports about waiting for the link."""

    asked: int = 0
    waited: int = 0
    wait_s_sum: float = 0.0
    wait_s_max: float = 0.0
    declined_to_local: int = 0
    reordered: int = 0
    """Held bookings moved back for a request due earlier."""


class WindowHost(Protocol):
    """What the gateway's dispatch reads and schedules on the simulation
    (:class:`~.simulation.Simulation` provides it), so that this module does not import the loop."""

    @property
    def cfg(self) -> SimConfig: ...

    @property
    def events(self) -> EventQueue: ...

    @property
    def gateway(self) -> SimGateway | None: ...

    @property
    def link_params(self) -> LinkParams: ...

    @property
    def ledgers(self) -> Sequence[EgressLedger]: ...

    @property
    def pd(self) -> list[Instance]: ...

    @property
    def prfaas(self) -> list[Instance]: ...

    @property
    def result(self) -> RunResult: ...

    @property
    def prfaas_seconds(self) -> Callable[[float], float]: ...

    @property
    def pd_seconds(self) -> Callable[[float], float]: ...

    def least_wait(self, pool: list[Instance], now: float) -> float | None: ...

    def remote_start(self, arg: tuple[Job, int]) -> None: ...

    def prefill_end(self, arg: tuple[Job, int]) -> None: ...


class SimGateway:
    """The calendar and its answers (time is the simulation's): :func:`~prfaas_core.policy.link_admission.admit`
    books, as in the real gateway; the router's choice (:func:`choose_window`) then takes the window or goes local."""

    def __init__(self, lanes: int, timing: StreamTiming, lane_order: LaneOrder = "deadline") -> None:
        self.ledger = EgressLedger(lanes=lanes, expire_s=1e9)  # bookings end when their KV has arrived
        self.timing: StreamTiming = timing
        self.lane_order: LaneOrder = lane_order
        self.stats = WindowStats()
        self.deadlines: dict[str, Deadline] = {}
        """Each booking's due time and limit: the lanes go earliest due first, as the real gateway's do."""

    def ask(
        self,
        now_s: float,
        nbytes: float,
        prefill_s: float,
        params: LinkParams,
        local_ttft_s: float,
        slo_ttft_s: float,
        spill: bool = False,
        local_wait_s: float = 0.0,
    ) -> tuple[WaitChoice, Booking | None]:
        """The gateway's booking and the router's choice (a ``spill`` waits only while it beats local)."""
        self.stats.asked += 1
        answer = admit(
            self.ledger,
            self.deadlines,
            AdmitTick(
                now_s,
                nbytes,
                prefill_s,
                params,
                self.timing,
                self.lane_order,
                slo_ttft_s=slo_ttft_s,
                accepted_ttft_s=accepted_ttft_s(local_ttft_s, slo_ttft_s, spill),
            ),
        )
        booking = answer if isinstance(answer, Booking) else None
        window = None if booking is None else booking.window
        choice = choose_window(window, local_ttft_s, slo_ttft_s, local_wait_s, spill)
        if choice.action == "local" or booking is None or window is None:
            self.stats.declined_to_local += 1
            return choice, None
        if choice.action == "wait_for_link":
            st = self.stats
            st.waited += 1
            st.wait_s_sum += window.wait_s
            st.wait_s_max = max(st.wait_s_max, window.wait_s)
        return choice, booking

    def book(self, key: str, booking: Booking) -> None:
        """Book what :meth:`ask` answered, moving back the bookings it goes ahead of."""
        book(self.ledger, self.deadlines, key, booking)
        self.stats.reordered += len(booking.moved)

    def finish(self, key: str) -> None:
        self.ledger.finish(key)
        self.deadlines.pop(key, None)


def remote_candidate(
    decision: RouteDecision, kv: KvModel, total: int, l_pd: int, l_prf: int, scarce: bool, held: int | None = None
) -> tuple[int, float, bool] | None:
    """``(uncached tokens, KV bytes, spill)`` of the remote prefill the gateway is asked about, or None: the
    pre-filter chose local by length or unavailability, or the remote would first need a cache move (legacy
    path). A long request the pre-filter declined for the cap, or spilled to local for a PrFaaS queue surge, is
    asked too (the calendar knows the real queue and link); a short one spilled to PrFaaS waits only while it
    beats local."""
    if decision.target == "remote":
        if decision.cache_transfer_tokens > 0:
            return None
        return decision.uncached_tokens, decision.transfer_bytes, decision.kind == "spill"
    if decision.kind not in ("admission", "spill") or decision.move_bytes > 0:
        return None
    held = l_pd if held is None else held  # what the decode holds (whole blocks) is not pulled
    if scarce:
        return total - l_pd, transfer_bytes(kv, total, held), False
    if l_pd > l_prf:
        return None  # PD's longer prefix would first be moved to PrFaaS: the legacy path
    return total - l_prf, transfer_bytes(kv, total, held), False


def dispatch(
    sim: WindowHost,
    req: Req,
    ask: tuple[int, float, bool],
    replica: int,
    local_tokens: int,
    local_wait_s: float | None = None,
    slo_ttft_s: float | None = None,
) -> bool:
    """Ask the gateway for a window for this remote candidate; book it and schedule the prefill at its start
    (True), or leave the request to the local side (False). ``local_wait_s``: PD's least prefill wait now, and
    ``slo_ttft_s``: the request's TTFT objective, when the caller has them (else read here)."""
    assert sim.gateway is not None
    uncached, nbytes, spill = ask
    now = sim.events.now_s
    spec = req.spec
    prefill_s = sim.prfaas_seconds(float(max(uncached, 1)))
    local_wait = (sim.least_wait(sim.pd, now) if local_wait_s is None else local_wait_s) or 0.0
    local_ttft = local_wait + sim.pd_seconds(float(max(local_tokens, 1)))
    slo = ttft_objective_s(sim.cfg.slo, spec.input_tokens) if slo_ttft_s is None else slo_ttft_s
    choice, booking = sim.gateway.ask(now, nbytes, prefill_s, sim.link_params, local_ttft, slo, spill, local_wait)
    if booking is None:
        return False
    window = booking.window
    req.remote = True
    req.uncached = uncached
    req.transfer_bytes = nbytes
    req.window = window
    key = str(spec.id)
    sim.gateway.book(key, booking)
    sim.ledgers[replica].start(key, nbytes, now, prefill_s)  # the router's own view, its pre-filter
    sim.result.link_waits += choice.action == "wait_for_link"
    sim.result.link_wait_s.append(window.wait_s)
    sim.events.at(window.start_s, lambda _a: _window_start(sim, req, window), None)
    return True


def _window_start(sim: WindowHost, req: Req, window: Window) -> None:
    now = sim.events.now_s
    assert sim.gateway is not None
    booked = sim.gateway.ledger.get(str(req.spec.id))
    if booked is not None and booked.start_s > window.start_s + 1e-9:  # moved back for a request due earlier
        later = window.later(booked.start_s - window.start_s)
        req.window = later
        sim.events.at(later.start_s, lambda _a: _window_start(sim, req, later), None)
        return
    lane = window.lane if 0 <= window.lane < len(sim.prfaas) else 0
    job = sim.prfaas[lane].enqueue_prefill(req, now, window.prefill_s)
    sim.events.at(job.start_s, sim.remote_start, (job, job.gen))
    sim.events.at(job.end_s, sim.prefill_end, (job, job.gen))
