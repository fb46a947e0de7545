"""The simulated PrFaaS gateway's link calendar: the one :class:`~prfaas_core.policy.link_state.EgressLedger` that
sees every KV stream on the link (every remote prefill passes through the gateway), booked with
:func:`~prfaas_core.policy.link_calendar.window_by_deadline` (lanes earliest due first) and chosen against the
local alternative with :func:`~prfaas_core.policy.link_calendar.choose_window` — the same functions the real
gateway and routers call.

The routers' own ledgers (one per replica, :class:`~.simulation.Simulation`) stay the fast pre-filter: a request
the pre-filter sends local because of its length never asks; one it would send remote, or decline only for the
cap, asks the gateway for a window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..capacity.kv import KvModel
from ..policy.link_calendar import (
    Deadline,
    StreamTiming,
    WaitChoice,
    Window,
    accepted_ttft_s,
    choose_window,
    window_by_deadline,
)
from ..policy.link_state import EgressLedger, LinkParams, Transfer
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
    """The calendar and its answers (time is the simulation's)."""

    def __init__(self, lanes: int, timing: StreamTiming) -> None:
        self.ledger = EgressLedger(lanes=lanes, expire_s=1e9)  # bookings end when their KV has arrived
        self.timing: StreamTiming = timing
        self.stats = WindowStats()
        self.deadlines: dict[str, Deadline] = {}
        """Each booking's due time and limit: the lanes go earliest due first, as the real gateway's do."""
        self._moved: dict[str, Transfer] = {}

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
    ) -> tuple[WaitChoice, Window | None]:
        """The earliest window and the router's choice (a ``spill`` waits only while it beats local)."""
        self.stats.asked += 1
        placement = window_by_deadline(
            self.ledger,
            now_s,
            nbytes,
            prefill_s,
            params,
            self.timing,
            due_s=now_s + slo_ttft_s,
            deadlines=self.deadlines,
        )
        window = None if placement is None else placement.window
        choice = choose_window(window, local_ttft_s, slo_ttft_s, local_wait_s, spill)
        self._moved = {} if placement is None else placement.moved
        if choice.action == "local" or window is None:
            self.stats.declined_to_local += 1
            return choice, None
        if choice.action == "wait_for_link":
            st = self.stats
            st.waited += 1
            st.wait_s_sum += window.wait_s
            st.wait_s_max = max(st.wait_s_max, window.wait_s)
        return choice, window

    def book(self, key: str, window: Window, due_s: float, accepted_s: float) -> None:
        """Book the window :meth:`ask` found, moving back the bookings it goes ahead of."""
        for moved, transfer in self._moved.items():
            self.ledger.reserve(moved, transfer)
        self.stats.reordered += len(self._moved)
        self._moved = {}
        self.ledger.reserve(key, window.transfer())
        self.deadlines[key] = Deadline.of(window.now_s + window.ttft_s, due_s, accepted_s)

    def finish(self, key: str) -> None:
        self.ledger.finish(key)
        self.deadlines.pop(key, None)


def remote_candidate(
    decision: RouteDecision, kv: KvModel, total: int, l_pd: int, l_prf: int, scarce: bool
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
    if scarce:
        return total - l_pd, transfer_bytes(kv, total, l_pd), False
    if l_pd > l_prf:
        return None  # PD's longer prefix would first be moved to PrFaaS: the legacy path
    return total - l_prf, transfer_bytes(kv, total, l_pd), False


def dispatch(sim: WindowHost, req: Req, ask: tuple[int, float, bool], replica: int, local_tokens: int) -> bool:
    """Ask the gateway for a window for this remote candidate; book it and schedule the prefill at its start
    (True), or leave the request to the local side (False)."""
    assert sim.gateway is not None
    uncached, nbytes, spill = ask
    now = sim.events.now_s
    spec = req.spec
    prefill_s = sim.prfaas_seconds(float(max(uncached, 1)))
    local_wait = sim.least_wait(sim.pd, now) or 0.0
    local_ttft = local_wait + sim.pd_seconds(float(max(local_tokens, 1)))
    slo = ttft_objective_s(sim.cfg.slo, spec.input_tokens)
    choice, window = sim.gateway.ask(now, nbytes, prefill_s, sim.link_params, local_ttft, slo, spill, local_wait)
    if window is None:
        return False
    req.remote = True
    req.uncached = uncached
    req.transfer_bytes = nbytes
    req.window = window
    key = str(spec.id)
    sim.gateway.book(key, window, now + slo, now + accepted_ttft_s(local_ttft, slo, spill))
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
