"""Elastic capacity in ``prfaas up``: the PrFaaS site (region A) and the PD cluster (region B) each grow and
shrink with demand, as two separate loops, each seeing only what its own region would see.

* **Region A's loop** reads the PrFaaS engines' own counters (vLLM's ``prompt_tokens_total`` and
  ``request_success_total`` at their ``/metrics``) and its gateway's ``/status`` (queue, ready instances); it
  sizes the site with the core's :func:`~prfaas_core.policy.elastic.site_demand` (bounded by its link's cap) and
  grows it by starting an engine with its link relay (the link's capacity re-split over the relays) and adding it
  to the gateway's configuration; it shrinks it by taking the newest engine out of the gateway's configuration
  (no new prefill reaches it), waiting until it holds nothing (no request, no KV left to pull) and stopping it.
* **Region B's loop** reads the PD engines' counters (prompt and generation tokens) and ``/admin/state`` queues
  and its router's ``/ready`` (healthy engines); it sizes the PD cluster's total with
  :func:`~prfaas_core.policy.elastic.pd_demand` and grows it by starting an engine in the role further behind its
  demand (the long-term loop may flip it later), shrinks it drain-first through the router's configuration (the
  same file, under :class:`~.local_loop.LocalCluster`'s lock).

The decision is the core's (:func:`~prfaas_core.policy.elastic.forecast`,
:func:`~prfaas_core.policy.elastic.decide_scale`: tolerance, stabilisation windows, bounds), the one the operator
and the simulator run. Desired vs ready is reported, never assumed: desired is what the loop asked for, ready what
the region's gateway or router sees healthy. Times are model seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from prfaas_core.api import RouterEndpoint, SloSpec
from prfaas_core.capacity.plan_inputs import PlanInputs
from prfaas_core.names import VLLM_GENERATION_TOKENS, VLLM_PROMPT_TOKENS, VLLM_REQUEST_SUCCESS
from prfaas_core.policy.elastic import (
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
from prfaas_router.state.metrics import sample_sums

from .local_loop import LocalCluster

HELD = ("running", "waiting", "loading_kv", "kv_handles")
"""What an engine still holds (its ``/admin/state``): it is stopped once all are 0."""
COUNTERS = (VLLM_PROMPT_TOKENS, VLLM_REQUEST_SUCCESS, VLLM_GENERATION_TOKENS)


@dataclass(frozen=True)
class ElasticSettings:
    """Both loops' bounds and behaviour (the scenario's ``elastic`` block; min = the sizes the stack starts at)."""

    prfaas: ScaleBounds
    pd: ScaleBounds
    behavior: ScaleBehavior
    period_s: float
    rate_window_s: float
    prfaas_target_utilization: float
    pd_target_utilization: float
    """Each cluster's share of its throughput to plan for (the two kinds' ``scaling.targetUtilization``)."""
    drain_timeout_s: float
    settle_s: float
    """After the replay: model seconds the session goes on until both clusters are back at their min."""


@dataclass(frozen=True)
class CapacitySample:
    model_s: float
    cluster: str
    desired: int
    ready: int
    demand: float


@dataclass
class _Region:
    """One cluster's loop state."""

    name: str
    bounds: ScaleBounds
    desired: int
    memory: ScaleMemory
    counters: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Each engine's last (prompt tokens, requests, generated tokens) reading."""
    totals: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """Increments since the start, summed: prompt tokens and requests of the prefill role, generated tokens (an
    engine's increment counts for the role it has when read: a flip moves no history; a restarted counter
    counts from 0; a stopped engine's counts stay)."""
    history: list[tuple[float, float, float, float]] = field(default_factory=list)
    demand: list[tuple[float, float]] = field(default_factory=list)
    leaving: dict[str, float] = field(default_factory=dict)
    starting: dict[str, RouterEndpoint] = field(default_factory=dict)
    """Engines started and not yet answering: they join the configuration once they do (as a Service lists only
    ready pods), so no request reaches one still starting."""
    """Engines drained out of service -> when; stopped once they hold nothing (or at the drain timeout)."""
    made: int = 0

    def count(self, name: str, reading: tuple[float, float, float], prefill: bool) -> None:
        last = self.counters.get(name, (0.0, 0.0, 0.0))
        delta = [v - w if v >= w else v for v, w in zip(reading, last, strict=True)]
        self.counters[name] = reading
        if prefill:
            self.totals[0] += delta[0]
            self.totals[1] += delta[1]
        self.totals[2] += delta[2]

    def rates(self, now: float, window_s: float) -> tuple[float, float, float] | None:
        """(prompt tok/s, requests/s, generated tok/s) over the window (None: not enough of it yet)."""
        tot = (self.totals[0], self.totals[1], self.totals[2])
        self.history.append((now, *tot))
        while len(self.history) > 2 and self.history[1][0] <= now - window_s:
            self.history.pop(0)
        t0, *first = self.history[0]
        if now - t0 < window_s * 0.5:
            return None  # not enough of the window yet: the size holds
        dt = now - t0
        return ((tot[0] - first[0]) / dt, (tot[1] - first[1]) / dt, (tot[2] - first[2]) / dt)


class ElasticRun:
    """Both regions' loops over a started :class:`~.stack.LocalStack` (emulated engines)."""

    def __init__(self, stack: Any, cluster: LocalCluster, inputs: PlanInputs, settings: ElasticSettings) -> None:
        self.stack, self.cluster, self.inputs, self.s = stack, cluster, inputs, settings
        self.slo = SloSpec()
        self.http = httpx.Client(timeout=5.0)
        n_prf, n_pd = stack.spec.n_prfaas, len(cluster.config.endpoints)
        self.site = _Region("prfaas", settings.prfaas, n_prf, seeded(ScaleMemory(), 0.0, n_prf), made=n_prf)
        self.pd = _Region("pd", settings.pd, n_pd, seeded(ScaleMemory(), 0.0, n_pd), made=n_pd)
        self._gateway_endpoints: dict[str, dict[str, Any]] = {}
        self._relays_stale = False
        self.samples: list[CapacitySample] = []
        self.decisions: list[dict[str, Any]] = []

    # --- what each region sees ----------------------------------------------------------------------------

    def _read(self, region: _Region, names: list[str], prefill: set[str] | None = None) -> dict[str, dict[str, Any]]:
        """Each engine's counters (into the region's totals; prompts and requests from ``prefill`` engines only
        where given: a PD decode engine counts the prompts it was handed too) and its ``/admin/state`` (absent
        when it does not answer)."""
        states: dict[str, dict[str, Any]] = {}
        for name in names:
            url = self.stack.urls.get(name)
            if url is None:
                continue
            try:
                sums = sample_sums(self.http.get(f"{url}/metrics").text, COUNTERS)
                states[name] = dict(self.http.get(f"{url}/admin/state").json())
            except (httpx.HTTPError, ValueError):
                continue
            reading = (sums.get(COUNTERS[0], 0.0), sums.get(COUNTERS[1], 0.0), sums.get(COUNTERS[2], 0.0))
            region.count(name, reading, prefill is None or name in prefill)
        return states

    def _prfaas_names(self) -> list[str]:
        return [f"prfaas-{i}" for i in range(self.stack.spec.n_prfaas)]

    def _gateway(self) -> tuple[float, int]:
        """The gateway's queue and ready instances (its ``/status``)."""
        try:
            g = self.http.get(self.stack.urls["gateway"] + "/status", headers=self.stack.gateway_headers).json()
            return float(g["queueDepth"]), int(g["readyInstances"])
        except (httpx.HTTPError, KeyError, ValueError):
            return 0.0, 0

    def _router_ready(self) -> int:
        try:
            return int(self.http.get(self.stack.urls["router"] + "/ready").json().get("healthy_engines", 0))
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0

    # --- region A: the PrFaaS site --------------------------------------------------------------------------

    def site_cycle(self, now: float) -> None:
        r, s = self.site, self.s
        self._reshape()
        states = self._read(r, self._prfaas_names())
        if self._started(r, states):
            self._publish_gateway()
        self._retire(r, states, now, self._stop_prfaas)
        queue, ready = self._gateway()
        rates = r.rates(now, s.rate_window_s)
        if rates is None:
            return
        load = Load(prompt_tokens_per_s=rates[0], requests_per_s=rates[1], waiting=queue)
        cap = self.stack.link_gbps * self.stack.spec.link_max_utilization
        hw = self.inputs.prfaas_hardware
        need, why = site_demand(load, hw, self.slo, s.prfaas_target_utilization, self.inputs.kv, cap)
        desired = self._decide(r, now, need, why, ready)
        self.samples.append(CapacitySample(now, r.name, desired, ready, need))
        while self.stack.spec.n_prfaas - len(r.leaving) < desired:
            self._add_prfaas()
        # a scale-in waits until every engine in service is ready (the region's own view): an engine is never
        # stopped before it has come up and served, so a scale-out that a quick fall overtook still lands first
        serving = self.stack.spec.n_prfaas - len(r.leaving)
        if serving > desired and ready >= serving and not r.starting:
            for _ in range(serving - desired):
                self._drain_prfaas(now)

    def _add_prfaas(self) -> None:
        """Back into service the newest one leaving, or a new engine with its relay; the relays re-split."""
        stack, r = self.stack, self.site
        if r.leaving:
            name = max(r.leaving, key=lambda n: int(n.split("-")[1]))
            del r.leaving[name]
        else:
            i = stack.spec.n_prfaas
            stack.spec = _with(stack.spec, n_prfaas=i + 1)
            ref = stack._start_prfaas(i)  # the stack's own builder
            r.starting[ref.name] = RouterEndpoint(name=ref.name, url=stack.peer_url(ref.name), role="prefill")
            r.made += 1
        self._publish_gateway()

    def _drain_prfaas(self, now: float) -> None:
        """The newest engine in service out of the gateway's configuration (it finishes what it holds)."""
        serving = [n for n in self._prfaas_names() if n not in self.site.leaving]
        self.site.leaving[serving[-1]] = now
        self._publish_gateway()

    def _publish_gateway(self) -> None:
        stack = self.stack
        serving = [n for n in self._prfaas_names() if n not in self.site.leaving and n not in self.site.starting]
        config = dict(stack.configs["gateway"])
        known = {e["name"]: e for e in config["endpoints"]}
        self._gateway_endpoints.update(known)
        config["endpoints"] = [
            self._gateway_endpoints.get(n) or {"name": n, "url": stack.peer_url(n), "role": "prefill"} for n in serving
        ]
        admission = config["gateway"].get("admission")
        if admission is not None:  # each engine's pull rate: its relay's share of the link
            config["gateway"] = {**config["gateway"], "admission": {**admission, **stack._pull_rates()}}
        stack.write_config("gateway", config)
        self._relays_stale = True
        self._reshape()

    def _reshape(self) -> None:
        """The link re-split over the relays running (retried next cycle while a new relay does not listen)."""
        if self._relays_stale:
            with contextlib.suppress(httpx.HTTPError):
                self.stack.reshape_link(self.stack.link_gbps)
                self._relays_stale = False

    def _stop_prfaas(self, name: str) -> None:
        """Stop a drained PrFaaS engine and its relay (always the newest: the relays stay numbered 0..n-1)."""
        stack = self.stack
        i = int(name.split("-")[1])
        if i != stack.spec.n_prfaas - 1:
            return  # a newer one still runs: this one goes after it
        for part in (name, f"link-{i}"):
            stack.terminate(part)
        metrics = stack.urls.pop(f"link-{i}") + "/metrics"
        stack.urls.pop(name)
        self._gateway_endpoints.pop(name, None)
        if metrics in stack.link_metric_urls:
            stack.link_metric_urls.remove(metrics)
        stack.spec = _with(stack.spec, n_prfaas=i)
        self._publish_gateway()

    # --- region B: the PD cluster ---------------------------------------------------------------------------

    def pd_cycle(self, now: float) -> None:
        r, s = self.pd, self.s
        endpoints = list(self.cluster.config.endpoints)
        in_prefill = {e.name for e in endpoints if e.role == "prefill"}
        states = self._read(r, [e.name for e in endpoints] + list(r.leaving) + list(r.starting), in_prefill)
        up = self._started(r, states)
        if up:
            self.cluster.add_endpoints(up)
            endpoints = list(self.cluster.config.endpoints)
        self._retire(r, states, now, self._stop_pd)
        ready = self._router_ready()
        rates = r.rates(now, s.rate_window_s)
        if rates is None:
            return
        roles = {e.name: e.role for e in endpoints}
        waiting = {"prefill": 0.0, "decode": 0.0}
        for name, st in states.items():
            if name in roles:
                waiting["prefill" if roles[name] == "prefill" else "decode"] += float(st.get("waiting", 0))
        prefill = Load(rates[0], rates[1], waiting["prefill"])
        decode = Load(generation_tokens_per_s=rates[2], decode_waiting=waiting["decode"])
        hw = self.inputs.pd_hardware
        need, why = pd_demand(prefill, decode, hw, self.slo, s.pd_target_utilization)
        assert hw.decode is not None  # pd_demand raised otherwise
        decode_need = decode_demand(rates[2], hw.decode.tokens_per_second, s.pd_target_utilization)
        desired = self._decide(r, now, need, why, ready)
        self.samples.append(CapacitySample(now, r.name, desired, ready, need))
        serving = [e for e in endpoints if e.name not in r.leaving] + list(r.starting.values())
        if len(serving) < desired:
            self._add_pd(serving, desired - len(serving), need - decode_need, decode_need)
        elif len(serving) > desired and ready >= len(serving):  # as the site: every engine ready first
            self._drain_pd(serving, len(serving) - desired, need - decode_need, decode_need, now)

    def _add_pd(self, serving: list[RouterEndpoint], n: int, prefill_need: float, decode_need: float) -> None:
        """``n`` new engines, each in the role further behind its demand (the long-term loop may flip it later)."""
        added: list[RouterEndpoint] = []
        for _ in range(n):
            everyone = serving + added
            n_dec = sum(1 for e in everyone if e.role != "prefill")
            n_pre = len(everyone) - n_dec
            role = "decode" if decode_need / max(n_dec, 1e-9) >= prefill_need / max(n_pre, 1e-9) else "prefill"
            name = f"pd-{self.pd.made}"
            self.pd.made += 1
            ref = self.stack._engine(name, role, "H20")  # the stack's own engine builder
            added.append(RouterEndpoint(name=name, url=ref.url, role=self.cluster.label(role)))
            self.pd.starting[name] = added[-1]

    def _drain_pd(
        self, serving: list[RouterEndpoint], n: int, prefill_need: float, decode_need: float, now: float
    ) -> None:
        """``n`` engines out of the router's configuration, from the role with the most to spare (each role keeps
        one; never one the long-term loop is draining for a flip), the newest first."""
        busy = set(self.cluster.config.draining)
        pool = [e for e in serving if e.name not in busy and e.name not in self.pd.starting]
        gone: list[str] = []
        for _ in range(n):
            left = [e for e in pool if e.name not in gone]
            by_role = {"prefill": [e for e in left if e.role == "prefill"]}
            by_role["decode"] = [e for e in left if e.role != "prefill"]
            spare = {
                "prefill": len(by_role["prefill"]) - prefill_need,
                "decode": len(by_role["decode"]) - decode_need,
            }
            choices = [role for role in ("prefill", "decode") if len(by_role[role]) > 1]
            if not choices:
                break
            role = max(choices, key=lambda x: spare[x])
            victim = max(by_role[role], key=lambda e: int(e.name.split("-")[1]))
            gone.append(victim.name)
            self.pd.leaving[victim.name] = now
        if gone:
            self.cluster.remove_endpoints(gone)

    def _stop_pd(self, name: str) -> None:
        self.stack.terminate(name)
        self.stack.urls.pop(name, None)

    # --- shared ---------------------------------------------------------------------------------------------

    def _decide(self, r: _Region, now: float, need: float, why: str, ready: int) -> int:
        r.demand.append((now, need))
        del r.demand[:-5]
        b = self.s.behavior
        d = decide_scale(now, r.desired, forecast(r.demand, b.startup_s), r.bounds, b, r.memory, ready, why)
        r.memory, r.desired = d.memory, d.desired
        if d.changed or d.blocked:
            self.decisions.append(
                {"model_s": round(now, 1), "cluster": r.name, "direction": d.direction, "desired": d.desired,
                 "ready": ready, "blocked": d.blocked, "reason": d.reason}
            )  # fmt: skip
        return d.desired

    @staticmethod
    def _started(r: _Region, states: dict[str, dict[str, Any]]) -> list[RouterEndpoint]:
        """The engines starting that answer now (out of ``r.starting``)."""
        up = [r.starting.pop(n) for n in list(r.starting) if n in states]
        return up

    def _retire(self, r: _Region, states: dict[str, dict[str, Any]], now: float, stop: Any) -> None:
        """Stop each engine leaving that holds nothing any more (or has drained past the timeout)."""
        for name, since in sorted(r.leaving.items(), key=lambda kv: -int(kv[0].split("-")[1])):
            st = states.get(name)
            held = 1 if st is None else sum(int(st.get(k, 0)) for k in HELD)
            if held == 0 or now - since >= self.s.drain_timeout_s:
                before = name in self.stack.urls
                stop(name)
                if before and name not in self.stack.urls:
                    del r.leaving[name]

    def at_min(self) -> bool:
        """Both clusters back at their min, nothing left draining."""
        return (
            self.stack.spec.n_prfaas == self.site.bounds.min_instances
            and len(self.cluster.config.endpoints) == self.pd.bounds.min_instances
            and self.site.desired == self.site.bounds.min_instances
            and self.pd.desired == self.pd.bounds.min_instances
            and not (self.site.leaving or self.site.starting)
            and not (self.pd.leaving or self.pd.starting)
        )

    async def run(self, st: Any, stop: asyncio.Event) -> None:
        """Both loops, each on its own period, until ``stop``; ``st.capacity`` gets their samples."""

        async def loop(cycle: Any, name: str) -> None:
            due = self.s.period_s
            while not stop.is_set():
                now = st.model_now()
                if now >= due:
                    due = now + self.s.period_s
                    try:
                        await asyncio.to_thread(cycle, now)
                    except Exception as exc:  # a failed cycle keeps the sizes; never kill the loop
                        print(f"elastic loop ({name}): cycle failed, will retry: {exc}", file=sys.stderr)
                    st.capacity = list(self.samples)
                    st.elastic_decisions = list(self.decisions)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)

        await asyncio.gather(loop(self.site_cycle, "region A, PrFaaS site"), loop(self.pd_cycle, "region B, PD"))

    async def settle(self, st: Any) -> None:
        """After the replay: until both clusters are back at their min, or ``settle_s`` model seconds."""
        deadline = time.perf_counter() + self.s.settle_s / st.time_scale
        while not self.at_min() and time.perf_counter() < deadline:
            await asyncio.sleep(0.2)

    def close(self) -> None:
        self.http.close()


def _with(spec: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(spec, **changes)


__all__ = ["CapacitySample", "ElasticRun", "ElasticSettings"]
