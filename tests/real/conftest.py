"""The real-engine tier's fixtures: one engine set for the whole tier (started once), our gateway and router in
front of it, and helpers that read the engines' own counters.

Engines (the tiny generated model, CPU vLLM, NixlConnector over UCX TCP on loopback):
``prfaas`` (a PrFaaS prefill, behind the gateway), ``pdp0`` and ``pdp1`` (PD prefill: two, so that prefix-affinity
assertions can fail), ``pdd`` (PD decode). About 10.5 GiB together.

Every test here is marked ``real_engine``; without the environment the tier skips and says why, and under
``PRFAAS_REQUIRE_REAL=1`` (``.ci/run`` sets it) it fails instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from prfaas_core.launch.engines import EngineSpec
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import EnginePool, Prompts, RealEngine, RealEnv, example_slo, example_specs
from support.otlp import OtlpReceiver
from support.real_engines import prepare_or_skip

THRESHOLD_TOKENS = 768
"""t_min of the tier's router: prompts above it (uncached) go to the PrFaaS engine."""


FIRST = ("test_real_netns.py", "test_real_up.py", "test_real_hybrid.py", "test_real_hybrid_mamba2.py")
"""Run before every other module of the tier, in this order: each ends its own engines (2, 3, the hybrids' 3 and 2)
before the next starts any, and before the loopback set starts (the machine holds one set, not two)."""


def _in_tier(item: pytest.Item | None) -> bool:
    return item is not None and Path(__file__).parent in item.path.parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [i for i, item in enumerate(items) if _in_tier(item)]
    if ours:
        tier = [items[i] for i in ours]
        rank = {name: i for i, name in enumerate(FIRST)}
        tier.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable for the rest
        for i, item in zip(ours, tier, strict=True):
            items[i] = item
    for i in ours:
        items[i].add_marker(pytest.mark.real_engine)
        # the first test also sets up the tier's engines (a minute on 2 idle cores, several when busy);
        # the engines' own start deadline (START_TIMEOUT_S) reports a stuck start first, with its log
        items[i].add_marker(pytest.mark.timeout(900))


AT_TIER_END: list[Callable[[], None]] = []
"""Closers of the tier's session resources (the router stack, then the engines), run once the tier's last test is
torn down: the engines (10.5 GiB, and CPU even when idle) do not wait out the rest of the session. Each closer is
idempotent; the fixtures close again at the session's end."""


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of this test
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _in_tier(item) and not _in_tier(nextitem):
        while AT_TIER_END:
            AT_TIER_END.pop()()


@dataclass
class Engines:
    prfaas: RealEngine
    pdp0: RealEngine
    pdp1: RealEngine
    pdd: RealEngine

    @property
    def pd_prefill(self) -> list[RealEngine]:
        return [self.pdp0, self.pdp1]


def counters(engines: Engines) -> dict[str, dict[str, float]]:
    """Every engine's ``vllm:prompt_tokens_by_source`` (local_compute, local_cache_hit, external_kv_transfer)."""
    return {e.name: e.prompt_tokens_by_source() for e in (engines.prfaas, engines.pdp0, engines.pdp1, engines.pdd)}


def delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], name: str, source: str) -> float:
    return after[name].get(source, 0.0) - before[name].get(source, 0.0)


@pytest.fixture(scope="session")
def real_env() -> RealEnv:
    return prepare_or_skip()


@pytest.fixture(scope="session")
def vllm_pool(real_env: RealEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    """The one fixture that starts real engines (through engine_launch); every group ended at the end."""
    pool = EnginePool(real_env, tmp_path_factory.mktemp("engines"))
    AT_TIER_END.append(pool.close)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def example() -> dict[str, dict[str, EngineSpec]]:
    """The engines examples/04-real-engines renders (prfaas-cpu: prfaas-prefill; pd-cpu: pd-prefill, pd-decode)."""
    return example_specs()


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpReceiver]:
    """Where the tier's engines send vLLM's own OpenTelemetry traces (a path per engine)."""
    receiver = OtlpReceiver()
    AT_TIER_END.append(receiver.close)
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture(scope="session")
def engines(otlp: OtlpReceiver, vllm_pool: EnginePool, example: dict[str, dict[str, EngineSpec]]) -> Engines:
    """The tier's engines, started from the example's rendered specs (the harness substitutes only the model's path,
    the ports and this host's address and interface: :meth:`EnginePool.on_this_host`; and it turns vLLM's tracing
    on, to ``otlp``)."""
    prfaas, pd = example["prfaas-cpu"], example["pd-cpu"]

    def start(name: str, spec: EngineSpec) -> RealEngine:
        return vllm_pool.start(name, vllm_pool.on_this_host(spec), traces_url=f"{otlp.url}/{name}")

    started = Engines(
        prfaas=start("prfaas", prfaas["prfaas-prefill"]),
        pdp0=start("pdp0", pd["pd-prefill"]),
        pdp1=start("pdp1", pd["pd-prefill"]),
        pdd=start("pdd", pd["pd-decode"]),
    )
    vllm_pool.wait_ready([started.prfaas, started.pdp0, started.pdp1, started.pdd])
    for producer in (started.prfaas, started.pdp0, started.pdp1):
        vllm_pool.warm_up(producer, started.pdd)
    return started


def current(pool: EnginePool, engines: Engines) -> Engines:
    """The engine set as it runs now (a fault test restarts engines: new processes, same names and ports)."""
    return Engines(*(pool.engines[n] for n in ("prfaas", "pdp0", "pdp1", "pdd")))


@pytest.fixture(scope="session")
def stack(engines: Engines, real_env: RealEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The gateway (token-authenticated) in front of ``prfaas``; the router in front of pdp0, pdp1 and pdd."""
    st = LocalStack.over_vllm(tmp_path_factory.mktemp("stack"), real_env)
    AT_TIER_END.append(st.close)
    try:
        st.start_router("gateway", st.make_gateway_config(engines.prfaas))
        st.wait_ready("gateway")
        config = st.make_router_config(
            engines.pd_prefill, [engines.pdd], "gateway", THRESHOLD_TOKENS, slo=example_slo()
        )
        st.start_router("router", config)
        st.wait_ready("router")
        yield st
    finally:
        st.close()


@pytest.fixture
def prompts(real_env: RealEnv) -> Prompts:
    return Prompts(real_env.tokenizer_file)
