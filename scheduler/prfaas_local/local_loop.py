"""The core's long-term loop on one machine (``prfaas up``): an observation read from the emulated engines'
admin state and the gateway's status, and the effects carried out through the engines' admin API (drain,
flip) and the routers' configuration file — the same RouterConfig the operator publishes as a ConfigMap.
The decision is the core's (:func:`prfaas_core.policy.long_term.step`); only the observation and the effects
differ from the operator's."""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prfaas_core.api import RouterConfig, RouterEndpoint
from prfaas_core.capacity.plan_inputs import PlanInputs
from prfaas_core.capacity.workload import LengthDistribution, TruncatedLogNormal
from prfaas_core.names import (
    METRIC_ROUTER_LINK_EGRESS_GBPS,
    METRIC_ROUTER_LINK_SCARCE,
    METRIC_ROUTER_ROUTE_DECISIONS,
    METRIC_ROUTER_UNCACHED_TOKENS,
)
from prfaas_core.policy.link_state import LinkParams
from prfaas_core.policy.long_term import LoopDecision, LoopState, LoopTick, ScarceLink, step
from prfaas_core.policy.role_types import (
    InstanceState,
    Role,
    RoleDecision,
    RoleObservation,
    RolePolicyParams,
    StageLoad,
)
from prfaas_router.state.metrics import sample_sum

MIN_MIX_REQUESTS = 20
"""Requests the window needs before its observed length mix replaces the declared one."""
MIX_WINDOW_S = 45.0
"""Model seconds of traffic the observed length mix covers."""


def _buckets(text: str) -> dict[float, float]:
    """The router's cumulative uncached-length buckets (``le`` -> count) from its /metrics text."""
    out: dict[float, float] = {}
    prefix = METRIC_ROUTER_UNCACHED_TOKENS + "_bucket{"
    for line in text.splitlines():
        if line.startswith(prefix):
            labels, _, value = line[len(prefix) :].partition("} ")
            le = float(labels.split('le="', 1)[1].split('"', 1)[0])
            out[le] = out.get(le, 0.0) + float(value)
    return out


def mix_between(
    before: dict[float, float], after: dict[float, float], declared: LengthDistribution
) -> LengthDistribution | None:
    """The length mix of the requests counted between two bucket readings, as a truncated log-normal fitted
    to the buckets (each bucket's requests at its geometric middle; the declared mix's bounds), so that
    ``t_min`` moves smoothly with the mix rather than jumping between bucket edges. None: too few requests,
    or a counter reset."""
    lo_tokens, hi_tokens = declared.support()
    weights: list[tuple[float, float]] = []
    lower, below = lo_tokens, 0.0
    for le in sorted(after):
        cum = after[le] - before.get(le, 0.0)
        if cum < below:
            return None
        upper = min(le, hi_tokens)
        if cum > below:
            weights.append((math.log(max(lower, 1.0) * max(upper, lower)) / 2, cum - below))
        lower, below = upper, cum
    if below < MIN_MIX_REQUESTS:
        return None
    mu = sum(x * w for x, w in weights) / below
    var = sum(w * (x - mu) ** 2 for x, w in weights) / below
    return TruncatedLogNormal(mu, max(math.sqrt(var), 0.2), lo_tokens, hi_tokens)


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
    gateway_headers: dict[str, str] = field(default_factory=dict)
    """The gateway's bearer token (its /status needs it)."""
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5.0))
    router_url: str | None = None
    time_scale: float = 1.0
    decisions: list[RoleDecision] = field(default_factory=list)
    last_observation: RoleObservation | None = None
    _requests: tuple[float, float] | None = None
    publish_timeout_s: float = 60.0
    """Wall seconds a published drain may take to reach the router (it reloads the file every
    ``routing.refreshIntervalSeconds``; a busy machine slows that down) before the engines drain anyway."""
    declared_lengths: LengthDistribution | None = None
    """The declared length mix; with it, the split is judged by the mix the router observed over the last
    ``MIX_WINDOW_S`` (fitted, its bounds the declared mix's) once enough requests arrived."""
    _readings: deque[tuple[float, dict[float, float]]] = field(default_factory=deque)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def _observed_mix(self, now_s: float) -> LengthDistribution | None:
        if self.router_url is None or self.declared_lengths is None:
            return None
        try:
            now = _buckets(self.http.get(f"{self.router_url}/metrics").text)
        except httpx.HTTPError:
            return None
        self._readings.append((now_s, now))
        while len(self._readings) > 1 and now_s - self._readings[1][0] >= MIX_WINDOW_S:
            self._readings.popleft()
        first_s, first = self._readings[0]
        if first_s >= now_s or not now:
            return None
        return mix_between(first, now, self.declared_lengths)

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
            role: Role = "prefill" if ep.role == "prefill" else "decode"
            try:
                st = self._state(ep.url)
            except (httpx.HTTPError, ValueError):  # a dead engine is observed as such, not a failed cycle
                instances.append(InstanceState(ep.name, role, 0, ep.name in self.config.draining, healthy=False))
                continue
            in_flight = int(st["running"]) + int(st["waiting"]) + int(st.get("loading_kv", 0))
            instances.append(InstanceState(ep.name, role, in_flight, ep.name in self.config.draining))
            queue[role] += float(st["waiting"])
        prfaas = StageLoad()
        ready: int | None = None
        if self.gateway_status_url:
            try:
                g = self.http.get(self.gateway_status_url, headers=self.gateway_headers).json()
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
            lengths=self._observed_mix(now_s),
        )
        self.last_observation = obs
        return obs

    def apply(self, effects: LoopDecision, now_s: float) -> None:
        """Carry out one cycle's effects: drain, flip (or undrain, a flip aborted), publish ``t_min`` (nothing
        under dry-run)."""
        decision = effects.roles
        if decision is None or not effects.act:
            return
        self.decisions.append(decision)
        by_name = {e.name: e for e in self.config.endpoints}
        draining = set(self.config.draining)
        if decision.drain:
            # the routers first (they stop sending new work), the engines once the routers have reloaded: an
            # engine drained before its router knows answers the router's new requests with 503
            draining |= set(decision.drain)
            self._publish({"draining": sorted(draining)})
            self.wait_applied()
        for name in decision.drain:
            if name in by_name:  # (one the elastic loop took out meanwhile is gone already)
                self.set_drain(by_name[name].url, True)
        for name in decision.undrain:  # a flip aborted at its drain timeout: back in service, same role
            if name in by_name:
                self.set_drain(by_name[name].url, False)
            draining.discard(name)
        with self._lock:  # the endpoints as they are now (the elastic loop may add or remove some meanwhile)
            endpoints = list(self.config.endpoints)
            for name, role in decision.flip:
                if name not in by_name:
                    continue
                url = by_name[name].url
                self.set_role(url, role)
                self.set_drain(url, False)
                draining.discard(name)
                label = self.label(role)
                endpoints = [
                    RouterEndpoint(name=e.name, url=e.url, role=label) if e.name == name else e for e in endpoints
                ]
            t_min = effects.threshold_min_tokens
            names = {e.name for e in endpoints}
            changes: dict[str, Any] = {"endpoints": endpoints, "draining": sorted(draining & names)}
            if t_min is not None:
                changes["threshold_min_tokens"] = t_min
            self._publish(changes)

    def add_endpoints(self, added: list[RouterEndpoint]) -> None:
        """New engines into the router's configuration (elastic capacity: a scale-out)."""
        with self._lock:
            self._publish({"endpoints": [*self.config.endpoints, *added]})

    def remove_endpoints(self, names: list[str]) -> None:
        """Engines out of the router's configuration (elastic capacity: a scale-in, drain first: the router
        sends them nothing new; what they hold finishes)."""
        with self._lock:
            gone = set(names)
            endpoints = [e for e in self.config.endpoints if e.name not in gone]
            self._publish({"endpoints": endpoints, "draining": sorted(set(self.config.draining) - gone)})

    def _publish(self, changes: dict[str, Any]) -> None:
        """Change the config and write the file when it changed (the loop's thread and the phases' thread
        both publish: one at a time, each on top of the other's last change)."""
        with self._lock:
            new = self.config.model_copy(update=changes)
            if new != self.config:
                self.config = new
                write_router_config(self.config_path, new)

    def applied(self) -> bool:
        """Whether the router reports the digest of the file as written (its /ready, ready or not)."""
        if self.router_url is None:
            return False
        want = hashlib.sha256(self.config_path.read_bytes() + b"\0").hexdigest()
        try:
            return bool(self.http.get(f"{self.router_url}/ready").json().get("config_digest") == want)
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    def wait_applied(self) -> bool:
        """Until the router has applied the file as written, or the timeout."""
        if self.router_url is None:
            return False
        deadline = time.monotonic() + self.publish_timeout_s
        while time.monotonic() < deadline:
            if self.applied():
                return True
            time.sleep(0.1)
        return False

    def set_link_capacity(self, gbps: float) -> None:
        """Publish a new capacity for every link of the config (the operator does so from an InterDCLink's
        spec); the routers reload the file and admit against the new cap."""
        with self._lock:
            links = [link.model_copy(update={"capacity_gbps": gbps}) for link in self.config.links]
            self._publish({"links": links})

    def scarce_links(self) -> tuple[ScarceLink, ...]:
        """The links the router measures scarce now, with its egress estimate (the operator reads the same from
        the InterDCLink's status): their bandwidth floors raise the long-term ``t`` in force."""
        if self.router_url is None or not self.config.links:
            return ()
        try:
            text = self.http.get(f"{self.router_url}/metrics").text
        except httpx.HTTPError:
            return ()
        if not sample_sum(text, METRIC_ROUTER_LINK_SCARCE):
            return ()
        link = self.config.links[0]
        egress = sample_sum(text, METRIC_ROUTER_LINK_EGRESS_GBPS) or 0.0
        params = LinkParams(
            link.name, link.capacity_gbps, link.max_utilization, link.scarce_watermark, link.abundant_watermark
        )
        return (ScarceLink(params, egress),)

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
            now_s,
            self.params,
            self.inputs,
            self.state,
            obs,
            float(self.cluster.config.threshold_min_tokens),
            scarce_links=self.cluster.scarce_links(),
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
