"""The simulator's side of the long-term loop: the observation for :func:`~prfaas_core.policy.long_term.step`, and
its effects carried out on the simulated instances.

*Observe* (what a Prometheus observer would read): per-stage queue depth and utilisation averaged over the
samples since the last cycle (one per simulated second), every PD instance's role, work in flight and
draining flag, and the observed mix — a histogram of incremental lengths (buckets ~1.5 % wide) and the
arrival rate over ``observeWindowSeconds`` (default 300 s: a one-minute window holds ~100 requests at the
case study's rates, and the model ratio and ``t_min`` computed from so few swing by ±15 % on a stationary
workload).

*Apply* (the effects, unless dry-run): ``drain`` sets the instance's draining flag (the pickers send it no
new work; its queue and streams finish); ``flip`` gives it the new role (after ``flipDelaySeconds`` of
warm-up). A flip forced by the drain timeout re-dispatches the work that had not started (prefill jobs,
waiting streams) — nothing is dropped; work already running finishes where it is. ``t_min`` published
with the decision becomes the threshold policy's lower bound.
"""

from __future__ import annotations

from collections import deque

from ..capacity.workload import EmpiricalDistribution
from ..policy.long_term import LoopDecision
from ..policy.role_types import InstanceState, Role, RoleDecision, RoleObservation, StageLoad
from .instances import Instance
from .results import RoleEvent
from .state import Req, SimState

MIN_LENGTH_SAMPLES = 20


def _bucket(length: int) -> float:
    """The observed length as a histogram bucket ~1.5 % wide (a Prometheus observer sees histogram
    buckets, not single requests; exact below 128 tokens)."""
    if length < 128:
        return float(max(1, length))
    width = 1 << (length.bit_length() - 7)
    return float((length // width) * width + width // 2)


class SimControl:
    """Observation and effects over one simulation (:class:`~prfaas_core.sim.state.SimState`)."""

    def __init__(self, sim: SimState) -> None:
        self.sim = sim
        self.lengths: deque[tuple[float, float]] = deque()
        """``(arrival, the histogram bucket of its incremental length)`` of recent requests (:meth:`record`)."""
        self._counts: dict[float, int] = {}
        """How many of :attr:`lengths` are in each bucket (kept as they come and go)."""
        self._sums = [0.0] * 6
        self._n = 0
        self.last_queues = (0, 0, 0)
        self.n_prefill = self.n_decode = 0

    def record(self, now: float, uncached: int) -> None:
        """A request's incremental length, as the observer's histogram will count it (bucketed once, here)."""
        b = _bucket(uncached)
        self.lengths.append((now, b))
        counts = self._counts
        counts[b] = counts.get(b, 0) + 1

    def sample(self, now: float) -> None:
        """One per-second sample of queues and utilisation (also feeds the run's utilisation)."""
        sim = self.sim
        q_pdp = q_dec = busy_pdp = n_pdp = active = slots = 0
        for i in sim.pd:
            jobs = i.prefill_jobs
            started = bool(jobs) and jobs[0].start_s <= now
            q_pdp += len(jobs) - started
            q_dec += len(i.waiting)
            if i.role == "prefill":
                n_pdp += 1
                busy_pdp += started
            else:
                active += i.active
                slots += i.decode_slots
        q_prf = busy_prf = 0
        for i in sim.prfaas:
            jobs = i.prefill_jobs
            started = bool(jobs) and jobs[0].start_s <= now
            q_prf += len(jobs) - started
            busy_prf += started
        self.last_queues = (q_pdp, q_prf, q_dec)
        u_pdp = busy_pdp / n_pdp if n_pdp else 0.0
        u_prf = busy_prf / len(sim.prfaas) if sim.prfaas else 0.0
        u_dec = active / slots if slots else 0.0
        self.n_prefill, self.n_decode = n_pdp, len(sim.pd) - n_pdp
        sums = self._sums  # (each its own running sum, as in a loop over the six)
        sums[0] += q_pdp
        sums[1] += q_prf
        sums[2] += q_dec
        sums[3] += u_pdp
        sums[4] += u_prf
        sums[5] += u_dec
        self._n += 1
        if now <= sim.duration_s:
            r = sim.result
            r.util_samples += 1
            r.util_pd_prefill_sum += u_pdp
            r.util_prfaas_sum += u_prf
            r.util_decode_sum += u_dec

    # --- Observation ------------------------------------------------------------------------------------------

    def observe(self, now_s: float) -> RoleObservation:
        sim = self.sim
        n = max(self._n, 1)
        q_pdp, q_prf, q_dec, u_pdp, u_prf, u_dec = (s / n for s in self._sums)
        self._sums = [0.0] * 6
        self._n = 0
        window = min(sim.cfg.observe_window_s, max(now_s, 1.0))
        lengths, counts = self.lengths, self._counts
        while lengths and lengths[0][0] < now_s - window:
            b = lengths.popleft()[1]
            if counts[b] == 1:
                del counts[b]
            else:
                counts[b] -= 1
        n_seen = len(lengths)
        # (a whole count as a float is the same weight as 1.0 summed once per request)
        dist = EmpiricalDistribution.from_histogram(counts.items()) if n_seen >= MIN_LENGTH_SAMPLES else None
        instances = tuple(InstanceState(i.name, i.role, i.in_flight(), i.draining) for i in sim.pd)
        return RoleObservation(
            instances,
            prefill=StageLoad(q_pdp, u_pdp),
            decode=StageLoad(q_dec, u_dec),
            prfaas=StageLoad(q_prf, u_prf),
            n_prfaas_ready=sum(1 for i in sim.prfaas if now_s >= i.available_at_s),  # the gateway's ready count
            lengths=dist,
            arrival_rate_rps=n_seen / window if window > 0 else None,
        )

    # --- Effects -------------------------------------------------------------------------------------------

    def apply(self, decision: LoopDecision, now_s: float) -> None:
        """Carry out one cycle's effects (when ``act``), publish ``t_min``, record the decision."""
        sim = self.sim
        d = decision.roles
        if d is None:
            return
        if decision.act:
            self.carry_out(d, now_s)
            if decision.threshold_min_tokens is not None:
                sim.t_min = decision.threshold_min_tokens
                if not sim.cfg.live_threshold:
                    sim.t = decision.threshold_min_tokens
        if decision.recorded:
            sim.result.role_events.append(
                RoleEvent(now_s, d.action, d.reason, d.prefill_to, d.decode_to, decision.threshold_min_tokens)
            )

    def carry_out(self, d: RoleDecision, now_s: float) -> None:
        """The role effects: drain, then flip (counted once per flipping decision), or undrain (a flip aborted
        at its drain timeout)."""
        sim = self.sim
        for name in d.drain:
            sim.by_name[name].draining = True
        for name in d.undrain:
            sim.by_name[name].draining = False
        for name, role in d.flip:
            self._flip(sim.by_name[name], role, now_s)
        if d.flip:
            sim.result.flips += 1

    def _flip(self, inst: Instance, role: Role, now_s: float) -> None:
        sim = self.sim
        old = inst.role
        inst.role = role
        inst.draining = False
        inst.available_at_s = now_s + sim.cfg.flip_delay_s
        if old == "prefill" and role == "decode":
            for job in inst.withdraw_unstarted(now_s):
                req: Req = job.req  # type: ignore[assignment]
                sim.redispatch_prefill(req)
        elif old == "decode" and role == "prefill":
            waiting = list(inst.waiting)
            inst.waiting.clear()
            for stream in waiting:
                sim.redispatch_decode(stream)  # type: ignore[arg-type]
