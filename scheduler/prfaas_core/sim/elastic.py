"""Elastic capacity in the simulator: the PrFaaS site and the PD cluster grow and shrink on the SAME decision the
operator runs (:mod:`prfaas_core.policy.elastic`), each from what its own region would see.

Every ``period_s`` the loop reads the counters the engines keep (vLLM's per-pod ``prompt_tokens_total``,
requests, ``generation_tokens_total``; :class:`~prfaas_core.sim.instances.Instance`'s counters, summed over every
instance the cluster ever had) and the queues, turns their rates over ``rate_window_s`` into a
:class:`~prfaas_core.policy.elastic.Load`, and calls :func:`~prfaas_core.policy.elastic.site_demand` (bounded by
the link's cap where the site schedules its link) / :func:`~prfaas_core.policy.elastic.pd_demand`, the trend
:func:`~prfaas_core.policy.elastic.forecast` over ``startup_s`` and :func:`~prfaas_core.policy.elastic.decide_scale`
(tolerance, stabilisation windows, bounds). Then, as the operator does:

* **scale-out**: new instances start *not ready* for ``startup_s`` (the pickers see them unhealthy); a new PD
  instance takes the role whose demand is further above its count, and the role loop may flip it later;
* **scale-in drains first**: the instance leaves the pickers' pools at once (nothing new reaches it), finishes
  what it holds (queued prefills, decode streams) and is counted until it is empty (checked each cycle). Not-ready
  instances go first, then the least busy; a PD instance the role loop is draining for a flip is left alone.

Instance-seconds are integrated per instance from its start to its end (or the run's horizon), so the
comparison with a static deployment is over the same horizon.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..capacity.hardware import HardwareProfile
from ..policy.elastic import (
    Load,
    ScaleBehavior,
    ScaleBounds,
    ScaleMemory,
    decide_scale,
    decode_demand,
    forecast,
    pd_demand,
    seeded,
    site_demand,
)
from .instances import Instance
from .simulation import Simulation


@dataclass(frozen=True)
class ElasticParams:
    """Bounds and behaviour of both clusters' loops (the ``scaling`` blocks of the two kinds)."""

    prfaas: ScaleBounds
    pd: ScaleBounds
    behavior: ScaleBehavior = field(default_factory=ScaleBehavior)
    period_s: float = 30.0
    target_utilization: float = 0.8
    rate_window_s: float = 120.0
    forecast_samples: int = 5

    def __post_init__(self) -> None:
        if self.prfaas.min_instances < 1:
            raise ValueError("elastic: the PrFaaS site keeps at least 1 instance (prfaas.min_instances)")
        if self.pd.min_instances < 2:
            raise ValueError("elastic: the PD cluster keeps at least 2 instances (pd.min_instances)")
        if self.period_s <= 0 or self.rate_window_s <= 0:
            raise ValueError("elastic: period_s and rate_window_s must be positive")


@dataclass
class ElasticTrace:
    """What the loop did: one sample per cycle, the decisions that changed a size, instance-seconds."""

    time_s: list[float] = field(default_factory=list)
    prfaas_desired: list[int] = field(default_factory=list)
    prfaas_ready: list[int] = field(default_factory=list)
    prfaas_demand: list[float] = field(default_factory=list)
    pd_desired: list[int] = field(default_factory=list)
    pd_ready: list[int] = field(default_factory=list)
    pd_demand: list[float] = field(default_factory=list)
    decisions: list[tuple[float, str, str]] = field(default_factory=list)
    """``(t, cluster, reason)`` of every decision that moved a size."""
    prfaas_instance_s: float = 0.0
    pd_instance_s: float = 0.0


class _Cluster:
    """One cluster's loop state: its instances' lives, counters' history, demand samples, the decision's memory."""

    def __init__(self, name: str, pool: list[Instance], bounds: ScaleBounds) -> None:
        self.name = name
        self.bounds = bounds
        self.every: list[Instance] = list(pool)
        self.born: dict[str, float] = {i.name: 0.0 for i in pool}
        self.ended: dict[str, float] = {}
        self.leaving: list[Instance] = []
        self.counters: list[tuple[float, float, float, float]] = [(0.0, 0.0, 0.0, 0.0)]
        self.demand: list[tuple[float, float]] = []
        self.memory = seeded(ScaleMemory(), 0.0, len(pool))
        self.desired = len(pool)
        self.made = len(pool)

    def rates(self, now: float, window_s: float) -> tuple[float, float, float]:
        """(prompt tok/s, requests/s, generated tok/s) over the last ``window_s`` (vLLM's counters, summed)."""
        tokens = float(sum(i.prompt_tokens for i in self.every))
        reqs = float(sum(i.prefills for i in self.every))
        gen = float(sum(i.generated_tokens for i in self.every))
        self.counters.append((now, tokens, reqs, gen))
        while len(self.counters) > 2 and self.counters[1][0] <= now - window_s:
            self.counters.pop(0)
        t0, tok0, req0, gen0 = self.counters[0]
        dt = max(now - t0, 1e-9)
        return (tokens - tok0) / dt, (reqs - req0) / dt, (gen - gen0) / dt

    def instance_seconds(self, horizon_s: float) -> float:
        return sum(
            max(0.0, min(self.ended.get(name, horizon_s), horizon_s) - start) for name, start in self.born.items()
        )


class ElasticLoop:
    """Both clusters' elastic loops on one :class:`~prfaas_core.sim.simulation.Simulation` (install before
    :meth:`~prfaas_core.sim.simulation.Simulation.run`)."""

    def __init__(self, sim: Simulation, params: ElasticParams) -> None:
        self.sim = sim
        self.params = params
        self.trace = ElasticTrace()
        inputs = sim.cfg.inputs
        self.prf_hw: HardwareProfile = inputs.prfaas_hardware
        self.pd_hw: HardwareProfile = inputs.pd_hardware
        self.site = _Cluster("prfaas", sim.prfaas, params.prfaas)
        self.pd = _Cluster("pd", sim.pd, params.pd)
        rp = sim.cfg.role_params
        self.prefill_min, self.decode_min = rp.prefill_min, rp.decode_min

    def install(self) -> ElasticLoop:
        self.sim.events.at(self.params.period_s, self._cycle, None)
        return self

    def finish(self, horizon_s: float) -> ElasticTrace:
        """Close the books at ``horizon_s`` (instance-seconds over [0, horizon])."""
        self.trace.prfaas_instance_s = self.site.instance_seconds(horizon_s)
        self.trace.pd_instance_s = self.pd.instance_seconds(horizon_s)
        return self.trace

    # --- one cycle ---------------------------------------------------------------------------------------

    def _cycle(self, _: object) -> None:
        sim = self.sim
        now = sim.events.now_s
        p = self.params
        for cluster in (self.site, self.pd):
            self._retire_empty(cluster, now)
        if now < p.rate_window_s:  # a rate over the window needs the window: the size holds until then
            self.site.rates(now, p.rate_window_s)
            self.pd.rates(now, p.rate_window_s)
            sim.events.at(now + p.period_s, self._cycle, None)
            return
        site_need, site_why = self._site_demand(now)
        pd_need, pd_why, decode_need = self._pd_demand(now)
        site = self._decide(self.site, now, site_need, site_why, sum(1 for i in sim.prfaas if now >= i.available_at_s))
        pd = self._decide(self.pd, now, pd_need, pd_why, sum(1 for i in sim.pd if now >= i.available_at_s))
        self._resize_site(site, now)
        self._resize_pd(pd, now, pd_need, decode_need)
        tr = self.trace
        tr.time_s.append(now)
        tr.prfaas_desired.append(len(sim.prfaas))
        tr.prfaas_ready.append(sum(1 for i in sim.prfaas if now >= i.available_at_s))
        tr.prfaas_demand.append(site_need)
        tr.pd_desired.append(len(sim.pd))
        tr.pd_ready.append(sum(1 for i in sim.pd if now >= i.available_at_s))
        tr.pd_demand.append(pd_need)
        if now < sim.duration_s or sim.arrived > sim.completed:
            sim.events.at(now + p.period_s, self._cycle, None)

    def _site_demand(self, now: float) -> tuple[float, str]:
        sim, p = self.sim, self.params
        prompt, reqs, _ = self.site.rates(now, p.rate_window_s)
        waiting = float(sum(i.prefill_waiting(now) for i in sim.prfaas))
        load = Load(prompt_tokens_per_s=prompt, requests_per_s=reqs, waiting=waiting)
        cap = sim.link_params.cap_gbps if sim.cfg.link_windows else None
        kv = sim.kv if cap is not None else None
        return site_demand(load, self.prf_hw, sim.cfg.slo, p.target_utilization, kv, cap)

    def _pd_demand(self, now: float) -> tuple[float, str, float]:
        sim, p = self.sim, self.params
        prompt, reqs, gen = self.pd.rates(now, p.rate_window_s)
        prefill = Load(prompt, reqs, float(sum(i.prefill_waiting(now) for i in sim.pd)))
        decode = Load(generation_tokens_per_s=gen, decode_waiting=float(sum(len(i.waiting) for i in sim.pd)))
        need, why = pd_demand(prefill, decode, self.pd_hw, sim.cfg.slo, p.target_utilization)
        assert self.pd_hw.decode is not None  # pd_demand raised otherwise
        d_need = decode_demand(gen, self.pd_hw.decode.tokens_per_second, p.target_utilization)
        return need, why, d_need

    def _decide(self, cluster: _Cluster, now: float, need: float, why: str, ready: int) -> int:
        p = self.params
        cluster.demand.append((now, need))
        del cluster.demand[: -p.forecast_samples]
        demand = forecast(cluster.demand, p.behavior.startup_s)
        d = decide_scale(now, cluster.desired, demand, cluster.bounds, p.behavior, cluster.memory, ready, why)
        cluster.memory = d.memory
        if d.changed:
            self.trace.decisions.append((now, cluster.name, d.reason))
        cluster.desired = d.desired
        return d.desired

    # --- carrying it out -------------------------------------------------------------------------------------

    def _new(self, cluster: _Cluster, now: float, role: str, slots: int) -> Instance:
        name = f"{cluster.name}-{cluster.made}"
        cluster.made += 1
        inst = Instance(name, cluster.name, role, slots)  # type: ignore[arg-type]
        inst.available_at_s = now + self.params.behavior.startup_s
        cluster.every.append(inst)
        cluster.born[name] = now
        return inst

    def _leave(self, cluster: _Cluster, pool: list[Instance], inst: Instance, now: float) -> None:
        pool.remove(inst)
        if inst.in_flight() == 0:
            cluster.ended[inst.name] = now
        else:
            cluster.leaving.append(inst)

    @staticmethod
    def _retire_empty(cluster: _Cluster, now: float) -> None:
        for inst in [i for i in cluster.leaving if i.in_flight() == 0]:
            cluster.leaving.remove(inst)
            cluster.ended[inst.name] = now

    @staticmethod
    def _victim(pool: list[Instance], now: float) -> Instance | None:
        """Not ready first (no work yet), then the least busy; never one the role loop is draining."""
        free = [i for i in pool if not i.draining]
        if not free:
            return None
        return min(free, key=lambda i: (now >= i.available_at_s, i.in_flight(), i.queued_prefill_s(now), i.name))

    def _resize_site(self, desired: int, now: float) -> None:
        sim = self.sim
        while len(sim.prfaas) < desired:
            sim.prfaas.append(self._new(self.site, now, "prefill", 0))
        while len(sim.prfaas) > desired:
            victim = self._victim(sim.prfaas, now)
            if victim is None:
                break
            self._leave(self.site, sim.prfaas, victim, now)
        self._set_lanes(sum(1 for i in sim.prfaas if now >= i.available_at_s))

    def _set_lanes(self, ready: int) -> None:
        """The routers' ledgers and the gateway count lanes from the site's ready instances (its status)."""
        sim = self.sim
        for ledger in sim.ledgers:
            ledger.lanes = max(1, ready)
        if sim.gateway is not None:
            sim.gateway.ledger.lanes = max(1, ready)

    def _resize_pd(self, desired: int, now: float, need: float, decode_need: float) -> None:
        sim = self.sim
        decode = next((i.decode_slots for i in sim.pd if i.decode_slots), 0)
        while len(sim.pd) < desired:
            n_dec = sum(1 for i in sim.pd if i.role == "decode")
            n_pre = len(sim.pd) - n_dec
            prefill_need = max(0.0, need - decode_need)
            role = "decode" if decode_need / max(n_dec, 1e-9) >= prefill_need / max(n_pre, 1e-9) else "prefill"
            inst = self._new(self.pd, now, role, decode)
            sim.pd.append(inst)
            sim.by_name[inst.name] = inst
        while len(sim.pd) > desired:
            n_dec = sum(1 for i in sim.pd if i.role == "decode")
            n_pre = len(sim.pd) - n_dec
            prefill_need = max(0.0, need - decode_need)
            slack_pre = n_pre - prefill_need if n_pre > self.prefill_min else -1e9
            slack_dec = n_dec - decode_need if n_dec > self.decode_min else -1e9
            if slack_pre == slack_dec == -1e9:
                break
            role = "prefill" if slack_pre > slack_dec else "decode"
            victim = self._victim([i for i in sim.pd if i.role == role], now)
            if victim is None:
                break
            self._leave(self.pd, sim.pd, victim, now)
