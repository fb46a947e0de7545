"""The core's long-term loop on one machine (``prfaas up``): an observation read from the emulated engines'
admin state and the gateway's status, and the effects carried out through the engines' admin API (drain,
flip) and the routers' configuration file — the same RouterConfig the operator publishes as a ConfigMap.
The decision is the core's (:func:`prfaas_core.policy.loop.step`); only the observation and the effects
differ from the operator's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prfaas_core.api import RouterConfig, RouterEndpoint
from prfaas_core.names import METRIC_ROUTER_ROUTE_DECISIONS
from prfaas_core.plan_inputs import PlanInputs
from prfaas_core.policy.loop import LoopDecision, LoopState, LoopTick, step
from prfaas_core.policy.roles import InstanceState, Role, RoleDecision, RoleObservation, RolePolicyParams, StageLoad
from prfaas_router.prom_text import sample_sum


def write_router_config(path: Path, config: RouterConfig) -> None:
    """Atomically (a reader sees the old file or the new one, never half of one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(config.model_dump_json(by_alias=True, exclude_none=True, indent=2), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class LocalCluster:
    """Observation and effects over the emulated PD engines; the one writer of the router config file."""

    config_path: Path
    config: RouterConfig
    gateway_status_url: str | None = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5.0))
    router_url: str | None = None
    time_scale: float = 1.0
    decisions: list[RoleDecision] = field(default_factory=list)
    last_observation: RoleObservation | None = None
    _requests: tuple[float, float] | None = None

    def _arrival_rate(self, now_s: float) -> float | None:
        """Requests per model second at the router since the last observation (its own counter)."""
        if self.router_url is None:
            return None
        try:
            text = self.http.get(f"{self.router_url}/metrics").text
        except httpx.HTTPError:
            return None
        total = sample_sum(text, METRIC_ROUTER_ROUTE_DECISIONS) or 0.0
        prev, self._requests = self._requests, (now_s, total)
        if prev is None or now_s <= prev[0] or total < prev[1]:
            return None
        return (total - prev[1]) / (now_s - prev[0])

    def _state(self, url: str) -> dict[str, Any]:
        resp = self.http.get(f"{url}/admin/state")
        resp.raise_for_status()
        return dict(resp.json())

    def observe(self, now_s: float) -> RoleObservation:
        instances: list[InstanceState] = []
        queue = {"prefill": 0.0, "decode": 0.0}
        for ep in self.config.endpoints:
            st = self._state(ep.url)
            role: Role = "prefill" if ep.role == "prefill" else "decode"
            in_flight = int(st["running"]) + int(st["waiting"]) + int(st.get("loading_kv", 0))
            instances.append(InstanceState(ep.name, role, in_flight, ep.name in self.config.draining))
            queue[role] += float(st["waiting"])
        prfaas = StageLoad()
        ready: int | None = None
        if self.gateway_status_url:
            try:
                g = self.http.get(self.gateway_status_url).json()
                prfaas, ready = StageLoad(float(g["queueDepth"])), int(g["readyInstances"])
            except (httpx.HTTPError, KeyError, ValueError):
                ready = 0
        obs = RoleObservation(
            tuple(instances),
            StageLoad(queue["prefill"]),
            StageLoad(queue["decode"]),
            prfaas,
            n_prfaas_ready=ready,
            arrival_rate_rps=self._arrival_rate(now_s),
        )
        self.last_observation = obs
        return obs

    def apply(self, effects: LoopDecision, now_s: float) -> None:
        """Carry out one cycle's effects: drain, flip, publish ``t_min`` (nothing under dry-run)."""
        decision = effects.roles
        if decision is None or not effects.act:
            return
        self.decisions.append(decision)
        by_name = {e.name: e for e in self.config.endpoints}
        draining = set(self.config.draining)
        for name in decision.drain:
            self.set_drain(by_name[name].url, True)
            draining.add(name)
        endpoints = list(self.config.endpoints)
        for name, role in decision.flip:
            url = by_name[name].url
            self.set_role(url, role)
            self.set_drain(url, False)
            draining.discard(name)
            label = self.label(role)
            endpoints = [RouterEndpoint(name=e.name, url=e.url, role=label) if e.name == name else e for e in endpoints]
        t_min = effects.threshold_min_tokens
        new = self.config.model_copy(
            update={
                "endpoints": endpoints,
                "draining": sorted(draining),
                "threshold_min_tokens": t_min if t_min is not None else self.config.threshold_min_tokens,
            }
        )
        if new != self.config:
            self.config = new
            write_router_config(self.config_path, new)

    def label(self, role: str) -> Any:
        """The router endpoint role that serves as ``role`` (the emulated stack: the same name)."""
        return role

    def set_drain(self, url: str, drain: bool) -> None:
        """Tell the engine at ``url`` to drain (or to stop draining): the emulator's admin API."""
        self.http.post(f"{url}/admin/drain", json={"drain": drain}).raise_for_status()

    def set_role(self, url: str, role: str) -> None:
        """Give the engine at ``url`` its new role: the emulator's admin API."""
        self.http.post(f"{url}/admin/role", json={"role": role}).raise_for_status()

    def counts(self) -> tuple[int, int]:
        p = sum(1 for e in self.config.endpoints if e.role == "prefill")
        return p, len(self.config.endpoints) - p

    def close(self) -> None:
        self.http.close()


@dataclass
class LocalLoop:
    """The driver: when due, observe, call the core's step, carry out its effects, keep its state. A failed
    observation or effect leaves the state as it was (the next call retries)."""

    cluster: LocalCluster
    params: RolePolicyParams
    inputs: PlanInputs
    state: LoopState = field(default_factory=LoopState)

    def next_due_s(self) -> float:
        return self.state.next_due_s(self.params)

    def run_once(self, now_s: float) -> LoopDecision:
        obs = self.cluster.observe(now_s)
        tick = LoopTick(
            now_s, self.params, self.inputs, self.state, obs, float(self.cluster.config.threshold_min_tokens)
        )
        decision = step(tick)
        self.cluster.apply(decision, now_s)
        self.state = decision.state
        return decision


def decision_json(d: RoleDecision) -> dict[str, Any]:
    return {
        "action": d.action,
        "reason": d.reason,
        "prefill": [d.prefill_from, d.prefill_to],
        "decode": [d.decode_from, d.decode_to],
        "threshold_min_tokens": d.threshold_min_tokens,
    }


__all__ = ["LocalCluster", "LocalLoop", "decision_json", "write_router_config"]
