"""One ``prfaas up`` session over a started stack: the long-term loop's driver, the scenario's phases carried
out (the link reshaped live at a phase's start, its capacity published to the router), the samplers the view,
the summary and the plot read (link egress, the router's ``t`` and link state), and the replay itself.

The stack is anything with LocalStack's interface (``spec``, ``urls``, ``config_path``, ``router_config``,
``link_metric_urls``, ``reshape_link(gbps)``, which keeps the relays paced when they were, ``set_gateway_link(gbps)``,
``relay_burst_gbit()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from prfaas_core.capacity.plan_inputs import PlanInputs
from prfaas_core.names import (
    METRIC_ROUTER_LINK_CAP_GBPS,
    METRIC_ROUTER_LINK_EGRESS_GBPS,
    METRIC_ROUTER_LINK_SCARCE,
    METRIC_ROUTER_THRESHOLD_TOKENS,
)
from prfaas_core.policy.long_term import LoopDecision
from prfaas_core.policy.role_types import RolePolicyParams
from prfaas_core.request.trace import TraceRecord
from prfaas_router.state.metrics import sample_sum

from .load import Result, prepare_bodies, replay, sample_egress
from .local_loop import LocalCluster, LocalLoop
from .scenario import Phase, phase_at


@dataclass(frozen=True)
class RouterSample:
    """What the router exports about ``t`` and the link, at one model time."""

    model_s: float
    threshold_tokens: float | None
    scarce: bool
    egress_estimate_gbps: float | None
    cap_gbps: float | None


@dataclass(frozen=True)
class Cycle:
    """One long-term loop cycle as the view and the summary show it."""

    model_s: float
    phase: str
    action: str
    reason: str
    prefill: int
    decode: int
    t_min: int | None
    t_in_force: int | None


@dataclass
class SessionState:
    """Everything the session has seen so far (filled in place; the view reads it while it runs)."""

    phases: list[Phase]
    time_scale: float
    total: int
    started: float = field(default_factory=time.perf_counter)
    started_monotonic: float = field(default_factory=time.monotonic)
    """The same instant on the monotonic clock the link relays key their 1-s windows by."""
    results: list[Result] = field(default_factory=list)
    egress: list[float] = field(default_factory=list)
    """Model Gbps per 1-s model window, summed over the relays."""
    egress_stamps: list[float] = field(default_factory=list)
    """Wall clock (perf_counter) at the end of each egress window."""
    router: list[RouterSample] = field(default_factory=list)
    cycles: list[Cycle] = field(default_factory=list)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    """(model s, PD prefill, PD decode, t_min published)."""
    link_changes: list[tuple[float, str, float]] = field(default_factory=list)
    """(model s, phase, capacity in Gbps) each time the link was reshaped."""
    current_phase: str = ""
    link_gbps: float = 0.0
    link_max_utilization: float = 0.8

    relay_egress: list[tuple[float, float]] = field(default_factory=list)
    """(model s at the window's end, model Gbps) per 1-s model window by the relays' own accounting (summed
    over the relays; read at the end of the session)."""
    capacity: list[Any] = field(default_factory=list)
    """Elastic capacity: each region loop's :class:`~.up_elastic.CapacitySample` (desired, ready, demand)."""
    elastic_decisions: list[dict[str, Any]] = field(default_factory=list)
    shaper_burst_gbit: float = 0.0
    """What the relays together may carry above their rates in one window (``LocalStack.relay_burst_gbit``): the
    allowance a window gets above the cap before it counts as over it."""

    def egress_series(self) -> list[tuple[float, float]]:
        """(model s at the window's end, model Gbps) per 1-s model window: the relays' own accounting when it
        was read, else the live sampler's windows."""
        if self.relay_egress:
            return self.relay_egress
        pairs = zip(self.egress_stamps, self.egress, strict=False)
        return [((t - self.started) * self.time_scale, g) for t, g in pairs]

    def model_now(self) -> float:
        return (time.perf_counter() - self.started) * self.time_scale

    @property
    def cap_gbps(self) -> float:
        return self.link_gbps * self.link_max_utilization


def read_relay_windows(stack: Any, st: SessionState, client: httpx.Client) -> list[tuple[float, float]]:
    """The link's 1-s model windows since the session started, by its relays' own accounting (``GET
    /admin/egress``), summed over the relays; empty when a relay cannot say (another kind of link)."""
    scale = st.time_scale
    first = int(st.started_monotonic * scale // 1)
    total: dict[int, float] = {}
    for name in sorted(n for n in stack.urls if n.startswith("link-")):
        try:
            resp = client.get(f"{stack.urls[name]}/admin/egress", params={"since": first})
            resp.raise_for_status()
            windows = resp.json()["windows"]
        except (httpx.HTTPError, ValueError, KeyError):
            return []
        for key, nbytes in windows.items():
            total[int(key)] = total.get(int(key), 0.0) + float(nbytes)
    if not total:
        return []
    last = int(time.monotonic() * scale // 1)
    origin = st.started_monotonic * scale
    return [(k + 1 - origin, total.get(k, 0.0) * 8 / 1e9) for k in range(first, last)]


def read_router(url: str, model_s: float, client: httpx.Client) -> RouterSample | None:
    try:
        text = client.get(f"{url}/metrics").text
    except httpx.HTTPError:
        return None
    return RouterSample(
        model_s,
        sample_sum(text, METRIC_ROUTER_THRESHOLD_TOKENS),
        bool(sample_sum(text, METRIC_ROUTER_LINK_SCARCE)),
        sample_sum(text, METRIC_ROUTER_LINK_EGRESS_GBPS),
        sample_sum(text, METRIC_ROUTER_LINK_CAP_GBPS),
    )


def _settled_router(
    url: str, st: SessionState, cluster: LocalCluster, client: httpx.Client, timeout_s: float = 5.0
) -> RouterSample | None:
    """The router's sample once its ``t`` gauge shows the published ``t_min`` (the gauge follows a reload at the
    router's next signals refresh), or the last one read when ``timeout_s`` passes first: a router whose link is
    scarce or bounded keeps ``t`` above ``t_min``. (Waiting for ``t >= t_min`` only would take the gauge's value
    from before the reload whenever the last cycle lowered ``t_min``.)"""
    want = cluster.config.threshold_min_tokens
    deadline = time.monotonic() + timeout_s
    while True:
        sample = read_router(url, st.model_now(), client)
        done = sample is None or sample.threshold_tokens == want
        if done or time.monotonic() >= deadline:
            return sample
        time.sleep(0.1)


async def run_session(
    stack: Any,
    records: list[TraceRecord],
    phases: list[Phase],
    params: RolePolicyParams,
    inputs: PlanInputs,
    seed: int,
    on_tick: Callable[[SessionState, LocalCluster], None] | None = None,
    serve_until: asyncio.Event | None = None,
    elastic: Callable[[LocalCluster], Any] | None = None,
) -> tuple[SessionState, LocalCluster]:
    """Replay ``records`` (or, with ``serve_until``, serve until it is set) while the loop runs and the phases
    are carried out; ``on_tick`` is called about once a wall second (the live view). ``elastic``: makes the
    elastic capacity loops (:class:`~.up_elastic.ElasticRun`) for the cluster; after the replay the session
    goes on until they are back at their min (or their settle time)."""
    assert stack.router_config is not None
    scale = stack.spec.time_scale
    cluster = LocalCluster(
        stack.config_path,
        stack.router_config,
        stack.urls["gateway"] + "/status",
        gateway_headers=stack.gateway_headers,
        router_url=stack.urls["router"],
        time_scale=scale,
        declared_lengths=inputs.lengths,
    )
    loop = LocalLoop(cluster, params, inputs)
    sizing = elastic(cluster) if elastic is not None else None
    bodies = prepare_bodies(records, seed)
    st = SessionState(phases, scale, len(records))
    st.link_gbps, st.link_max_utilization = stack.spec.link_gbps, stack.spec.link_max_utilization
    st.shaper_burst_gbit = stack.relay_burst_gbit()
    stop = asyncio.Event()
    client = httpx.Client(timeout=5.0)

    def cycle(now: float) -> None:
        decision: LoopDecision = loop.run_once(now)
        d = decision.roles
        if d is not None:
            st.cycles.append(
                Cycle(
                    now, st.current_phase, d.action, d.reason, d.prefill_to, d.decode_to,
                    decision.threshold_min_tokens, decision.threshold_tokens,
                )
            )  # fmt: skip

    async def phases_driver() -> None:
        """The phases on time, whatever the loop is doing (a cycle can wait for the router for seconds)."""
        while not stop.is_set():
            now = st.model_now()
            phase = phase_at(phases, now)
            if phase.name != st.current_phase:
                st.current_phase = phase.name
                if phase.link_gbps != st.link_gbps or not st.link_changes:
                    await asyncio.to_thread(stack.reshape_link, phase.link_gbps)
                    await asyncio.to_thread(stack.set_gateway_link, phase.link_gbps)
                    await asyncio.to_thread(cluster.set_link_capacity, phase.link_gbps)
                    st.link_gbps = phase.link_gbps
                    st.link_changes.append((now, phase.name, phase.link_gbps))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def driver() -> None:
        while not stop.is_set():
            now = st.model_now()
            if now >= loop.next_due_s():
                try:
                    await asyncio.to_thread(cycle, now)
                except (httpx.HTTPError, RuntimeError) as exc:
                    print(f"long-term loop: cycle failed, will retry: {exc}", file=sys.stderr)
            st.timeline.append((now, *cluster.counts(), cluster.config.threshold_min_tokens))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    async def router_sampler() -> None:
        while not stop.is_set():
            sample = await asyncio.to_thread(read_router, stack.urls["router"], st.model_now(), client)
            if sample is not None:
                st.router.append(sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / scale)

    async def ticker() -> None:
        while not stop.is_set():
            if on_tick is not None:
                on_tick(st, cluster)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    st.current_phase = phases[0].name
    await asyncio.to_thread(stack.reshape_link, phases[0].link_gbps)
    st.link_gbps = phases[0].link_gbps
    st.link_changes.append((0.0, phases[0].name, phases[0].link_gbps))
    tasks = [
        asyncio.create_task(phases_driver()),
        asyncio.create_task(driver()),
        asyncio.create_task(router_sampler()),
        asyncio.create_task(ticker()),
        asyncio.create_task(sample_egress(stack.link_metric_urls, scale, stop, st.egress, stamps=st.egress_stamps)),
    ]
    if sizing is not None:
        tasks.append(asyncio.create_task(sizing.run(st, stop)))
    try:
        if serve_until is not None:
            await serve_until.wait()
        else:
            await replay(stack.urls["router"], records, scale, on_result=st.results.append, bodies=bodies)
        if sizing is not None:
            await sizing.settle(st)
    except (aiohttp.ClientError, OSError) as exc:
        raise RuntimeError(f"the replay failed: {exc}") from exc
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if sizing is not None:
            sizing.close()
        st.relay_egress = await asyncio.to_thread(read_relay_windows, stack, st, client)
        # the last cycle may have published a t_min the router has not reloaded yet: wait until it has, then
        # read the router's t once more, so that the summary compares what was published with what is in force
        if await asyncio.to_thread(cluster.wait_applied):
            last = await asyncio.to_thread(_settled_router, stack.urls["router"], st, cluster, client)
            if last is not None:
                st.router.append(last)
        client.close()
        cluster.close()
    if on_tick is not None:
        on_tick(st, cluster)
    return st, cluster


__all__ = ["Cycle", "RouterSample", "SessionState", "read_relay_windows", "read_router", "run_session"]
