"""The router's state: the compiled configuration, the mutable counters the data plane updates, and the
immutable snapshot the hot path reads (swapped by reference by the signals refresher).

Units: the router works in *model* time and bytes (ScaleSettings): ``model_now = wall * time_scale``, so the
same policies and profiles apply to real engines (scale 1) and to the time-scaled emulated stack.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from prfaas_core.api import RemoteGateway, RouterConfig, RouterEndpoint
from prfaas_core.hardware import HardwareProfile, builtin_hardware, hardware_from_spec
from prfaas_core.kv import KvModel, kv_model_from_profile
from prfaas_core.policy.breaker import Breaker, BreakerParams
from prfaas_core.policy.link import EgressLedger, LinkMode, LinkParams, LinkState
from prfaas_core.policy.routing import (
    InstanceView,
    RouteDecision,
    RouteRequest,
    RoutingView,
    decide_route,
    pick_decode_instance,
    pick_prefill_instance,
)
from prfaas_core.policy.threshold import ThresholdBounds, ThresholdDecision
from prfaas_core.scale import ScaleSettings
from prfaas_core.tokens import PrefixIndex, Tokenizer

from .tokenizer import router_tokenizer


def _profile(spec_hw: object, default: str) -> HardwareProfile:
    if spec_hw is not None:
        return hardware_from_spec(spec_hw)  # type: ignore[arg-type]
    profile = builtin_hardware(default)
    assert profile is not None
    return profile


@dataclass(frozen=True)
class Compiled:
    """Everything derived from one RouterConfig (rebuilt on reload, never mutated)."""

    config: RouterConfig
    kv: KvModel
    pd: HardwareProfile
    prfaas: HardwareProfile
    links: dict[str, LinkParams]
    remotes: tuple[RemoteGateway, ...]
    bounds: ThresholdBounds
    tokenizer: Tokenizer
    scale: ScaleSettings
    prefill: tuple[RouterEndpoint, ...]
    decode: tuple[RouterEndpoint, ...]
    both: tuple[RouterEndpoint, ...]
    draining: frozenset[str]
    decode_slots: int
    breaker: BreakerParams

    @cached_property
    def by_name(self) -> dict[str, RouterEndpoint]:
        """Built once per configuration (the hot path looks endpoints up on every leg)."""
        return {e.name: e for e in self.config.endpoints}


def compile_config(config: RouterConfig) -> Compiled:
    links = {
        link.name: LinkParams(
            link.name, link.capacity_gbps, link.max_utilization, link.scarce_watermark, link.abundant_watermark
        )
        for link in config.links
    }
    for remote in config.remotes:
        if remote.link not in links:
            raise ValueError(f"remotes[{remote.name}].link {remote.link!r} names no entry of links")
    pd = _profile(config.pd_hardware, "H20")
    return Compiled(
        config=config,
        kv=kv_model_from_profile(config.model),
        pd=pd,
        prfaas=_profile(config.prfaas_hardware, "H200"),
        links=links,
        remotes=tuple(config.remotes),
        bounds=ThresholdBounds(config.threshold_min_tokens, config.threshold_max_tokens),
        tokenizer=router_tokenizer(config),
        scale=ScaleSettings(config.scale.time_scale, config.scale.byte_scale),
        prefill=tuple(e for e in config.endpoints if e.role == "prefill"),
        decode=tuple(e for e in config.endpoints if e.role == "decode"),
        both=tuple(e for e in config.endpoints if e.role == "both"),
        draining=frozenset(config.draining),
        decode_slots=pd.decode.max_batch_size if pd.decode is not None else 1,
        breaker=BreakerParams(config.routing.breaker_failure_threshold, config.routing.breaker_open_seconds),
    )


@dataclass(frozen=True)
class EngineLoad:
    healthy: bool = True
    waiting: float = 0.0
    running: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """What one decision reads; replaced whole every refresh."""

    threshold: ThresholdDecision
    links: dict[str, LinkState]
    engines: dict[str, EngineLoad]
    remote_ready: dict[str, str | None]
    """Remote name -> None when ready, else why not."""


@dataclass(frozen=True)
class LocalPlan:
    prefill: str | None
    """Prefill instance (None: one instance does both)."""
    decode: str


@dataclass
class Runtime:
    """Mutable router state. Only the event loop thread touches it (no locks needed)."""

    compiled: Compiled
    clock: Callable[[], float] = time.monotonic
    snapshot: Snapshot = field(init=False)
    ledgers: dict[str, EgressLedger] = field(default_factory=dict)
    breakers: dict[str, Breaker] = field(default_factory=dict)
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    queued_prefill_s: dict[str, float] = field(default_factory=dict)
    active_decodes: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    pd_index: PrefixIndex = field(init=False)
    remote_index: PrefixIndex = field(init=False)

    def __post_init__(self) -> None:
        r = self.compiled.config.routing
        self.pd_index = PrefixIndex(r.prefix_index_blocks, r.prefix_block_tokens)
        self.remote_index = PrefixIndex(r.prefix_index_blocks, r.prefix_block_tokens)
        self.snapshot = Snapshot(
            ThresholdDecision(self.compiled.bounds.min_tokens, 0, "initial: t = t_min"),
            {name: LinkState() for name in self.compiled.links},
            {},
            {rem.name: None for rem in self.compiled.remotes},
        )
        self.reconfigure(self.compiled)

    def reconfigure(self, compiled: Compiled) -> None:
        """Apply a new config; counters and ledgers of links/remotes that remain are kept."""
        self.compiled = compiled
        for name in compiled.links:
            self.ledgers.setdefault(name, EgressLedger())
        for remote in compiled.remotes:
            self.breakers.setdefault(remote.name, Breaker())
        gone = set(self.queued_prefill_s) - set(compiled.by_name)
        self.pd_index.forget(gone)

    def model_now(self) -> float:
        return self.clock() * self.compiled.scale.time_scale

    def remember_length(self, uncached_tokens: int, now: float) -> None:
        window = self.compiled.config.routing.threshold_window_seconds
        self.recent.append((now, uncached_tokens))
        while self.recent and now - self.recent[0][0] > window:
            self.recent.popleft()

    # --- the hot path: pure arithmetic over the snapshot -------------------------------------------------
    def decide(
        self, total_tokens: int, hashes: list[bytes], pd_hits: dict[str, int] | None = None
    ) -> tuple[RouteDecision, RemoteGateway | None]:
        """The routing decision: prefix lookups (PD cluster, remote) then the core's policy call."""
        c, snap = self.compiled, self.snapshot
        if pd_hits is None:
            pd_hits = self.pd_index.match(hashes)
        l_pd = max((v for k, v in pd_hits.items() if k not in c.draining), default=0)
        remote = self._usable_remote()
        mode: LinkMode = "abundant"
        if remote is None:
            link_params, estimate, why = None, 0.0, self._why_no_remote()
            l_prfaas = 0
        else:
            link_params = c.links[remote.link]
            state = snap.links.get(remote.link, LinkState())
            mode, estimate, why = (
                state.mode,
                self.ledgers[remote.link].admission_gbps(self.model_now(), link_params),
                "",
            )
            l_prfaas = self.remote_index.match(hashes).get(remote.name, 0)
        remote_wait = None if remote is None else self.ledgers[remote.link].queue_wait_s(self.model_now())
        view = RoutingView(
            snap.threshold.tokens,
            mode,
            estimate,
            link_params,
            remote is not None,
            why,
            self._local_wait_s(),
            remote_wait,
        )
        decision = decide_route(
            RouteRequest(total_tokens, l_pd, l_prfaas), view, c.kv, c.prfaas.prefill_seconds, c.pd.prefill_seconds
        )
        return decision, remote if decision.target == "remote" else None

    def _local_wait_s(self) -> float | None:
        """Predicted prefill work queued on the least-loaded healthy, non-draining PD prefill instance."""
        c, engines = self.compiled, self.snapshot.engines
        waits = [
            self.queued_prefill_s.get(e.name, 0.0)
            for e in c.prefill
            if e.name not in c.draining and engines.get(e.name, EngineLoad()).healthy
        ]
        return min(waits) if waits else None

    def _usable_remote(self) -> RemoteGateway | None:
        now = self.clock()
        for remote in self.compiled.remotes:
            if self.snapshot.remote_ready.get(remote.name) is not None:
                continue
            allowed, breaker = self.breakers[remote.name].allows(now, self.compiled.breaker)
            self.breakers[remote.name] = breaker
            if allowed:
                return remote
        return None

    def _why_no_remote(self) -> str:
        if not self.compiled.remotes:
            return "no remote PrFaaS cluster configured"
        reasons = []
        for remote in self.compiled.remotes:
            not_ready = self.snapshot.remote_ready.get(remote.name)
            breaker = self.breakers.get(remote.name)
            if not_ready:
                reasons.append(f"{remote.name}: {not_ready}")
            elif breaker is not None and breaker.is_open:
                reasons.append(f"{remote.name}: breaker {breaker.reason}")
        return "; ".join(reasons) or "remote unavailable"

    def plan_local(
        self, total_tokens: int, hashes: list[bytes], pd_hits: dict[str, int] | None = None
    ) -> LocalPlan | None:
        """Prefill and decode instances for a local request (cache-affine prefill, least-loaded decode)."""
        c, engines = self.compiled, self.snapshot.engines
        hits = self.pd_index.match(hashes) if pd_hits is None else pd_hits

        def view(e: RouterEndpoint) -> InstanceView:
            load = engines.get(e.name, EngineLoad())
            return InstanceView(
                e.name,
                queued_prefill_s=self.queued_prefill_s.get(e.name, 0.0),
                cached_prefix_tokens=hits.get(e.name, 0),
                active_decodes=self.active_decodes.get(e.name, 0),
                decode_slots=c.decode_slots,
                healthy=load.healthy,
                draining=e.name in c.draining,
            )

        decode = pick_decode_instance([view(e) for e in (c.decode or c.both)])
        if decode.name is None:
            return None
        if not c.prefill:
            return LocalPlan(None, decode.name)
        prefill = pick_prefill_instance([view(e) for e in c.prefill], total_tokens, c.pd.prefill_seconds)
        if prefill.name is None:
            return LocalPlan(None, decode.name) if c.both else None
        return LocalPlan(prefill.name, decode.name)
