"""Real vLLM engines (the CPU build, the tiny generated model) for the real-engine tier.

``scripts/real-engines.sh`` sets up vLLM's own virtual environment and the model (idempotent; the harness calls
it). Engines start only through the core's :func:`prfaas_core.engines.engine_launch`, each in a process group of
its own (SIGKILL of vLLM's API server leaves its EngineCore running, so the whole group is ended), optionally
inside a network namespace. Field references (``status.podIP``) resolve to the engine's address: 127.0.0.1, or
the namespace's.

Under ``PRFAAS_REQUIRE_REAL=1`` (``.ci/run`` sets it) anything that would skip the tier fails it instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prfaas_core.engines import POD_IP, EngineLaunch, EngineSpec, engine_launch

from .prom import free_port

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "real-engines.sh"
REQUIRE_REAL = os.environ.get("PRFAAS_REQUIRE_REAL") == "1"
BLOCK_SIZE = 128
"""KV block size of CPU vLLM (the router's prefixBlockTokens on this tier)."""
MAX_MODEL_LEN = 2048
START_TIMEOUT_S = 300.0
"""Engines starting together on 2 busy cores take ~1 min; the deadline is generous, the wait is on /health."""


def skip_or_fail(reason: str) -> None:
    """Skip the test (and say why), or fail it under PRFAAS_REQUIRE_REAL=1."""
    if REQUIRE_REAL:
        pytest.fail(f"real-engine tier required (PRFAAS_REQUIRE_REAL=1) but: {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class RealEnv:
    """What ``scripts/real-engines.sh`` prepared."""

    python: str
    model: str
    tokenizer_file: str
    served_model_name: str
    versions: dict[str, str]

    @classmethod
    def prepare(cls) -> RealEnv:
        """Run the setup (idempotent) and read its environment file; skip_or_fail when it cannot."""
        if os.environ.get("PRFAAS_SKIP_REAL") == "1":
            skip_or_fail("PRFAAS_SKIP_REAL=1")
        try:
            done = subprocess.run(
                ["bash", str(SETUP)], capture_output=True, text=True, timeout=1800, check=False, cwd=REPO
            )
        except subprocess.TimeoutExpired:
            skip_or_fail("scripts/real-engines.sh did not finish in 30 min")
        if done.returncode != 0:
            skip_or_fail(f"scripts/real-engines.sh failed ({done.returncode}): {done.stderr[-2000:]}")
        data = json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())
        return cls(**data)


def metric_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of ``name`` (a counter's ``_total`` sample included) by their sorted labels."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    base = name.removesuffix("_total")
    for family in text_string_to_metric_families(text):
        if family.name not in (name, base):
            continue
        for sample in family.samples:
            if sample.name in (name, f"{base}_total") or (sample.name == base and family.type == "gauge"):
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@dataclass
class RealEngine:
    """One running vLLM instance."""

    name: str
    spec: EngineSpec
    launch: EngineLaunch
    host: str
    proc: subprocess.Popen[bytes]
    log: Path
    netns: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.spec.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def metric(self, name: str, **labels: str) -> float:
        """Sum of ``name``'s samples whose labels include ``labels``."""
        total = 0.0
        for key, value in metric_values(self.metrics_text(), name).items():
            have = dict(key)
            if all(have.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def prompt_tokens_by_source(self) -> dict[str, float]:
        """vLLM's ``prompt_tokens_by_source``: local_compute, local_cache_hit, external_kv_transfer."""
        out: dict[str, float] = {}
        for key, value in metric_values(self.metrics_text(), "vllm:prompt_tokens_by_source_total").items():
            source = dict(key).get("source", "")
            out[source] = out.get(source, 0.0) + value
        return out

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the engine's whole process group (API server, EngineCore, workers)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class EnginePool:
    """Starts real engines through :func:`engine_launch` and ends them (whole process groups)."""

    env: RealEnv
    log_dir: Path
    engines: dict[str, RealEngine] = field(default_factory=dict)
    _next_core: int = 0

    def spec(self, role: str, **changes: object) -> EngineSpec:
        """An EngineSpec for the tiny model on this tier (free ports, CPU KV buffer, CPU block size)."""
        defaults: dict[str, object] = {
            "role": role,
            "model": self.env.model,
            "served_model_name": self.env.served_model_name,
            "port": free_port(),
            "side_channel_port": free_port(),
            "host": "127.0.0.1",
            "block_size": BLOCK_SIZE,
            "max_model_len": MAX_MODEL_LEN,
            "enforce_eager": True,
            "kv_buffer_device": "cpu",
            "net_device": "lo",
        }
        defaults.update(changes)
        return EngineSpec(**defaults)  # type: ignore[arg-type]

    def start(self, name: str, spec: EngineSpec, netns: str | None = None, host: str = "127.0.0.1") -> RealEngine:
        """Start ``spec``'s engine (no wait; see :meth:`wait_ready`)."""
        if name in self.engines and self.engines[name].alive():
            raise ValueError(f"engine {name} is already running")
        launch = engine_launch(spec)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))},
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": str(self._next_core % max(1, os.cpu_count() or 1)),
            "PRFAAS_NIXL_PROGRESS_DELAY_US": "1000",
            "NO_PROXY": "*",
            **launch.resolved_env({POD_IP: host}),
        }
        self._next_core += 1
        argv = [self.env.python, *launch.command[1:], *launch.argv]
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        log = self.log_dir / f"{name}.log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        engine = RealEngine(name, spec, launch, host, proc, log, netns)
        self.engines[name] = engine
        return engine

    def wait_ready(self, engines: Iterable[RealEngine], timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every engine answers /health 200; fail with its log's tail if one exits or times out."""
        pending = list(engines)
        deadline = time.monotonic() + timeout_s
        while pending:
            for engine in list(pending):
                if not engine.alive():
                    raise AssertionError(f"engine {engine.name} exited ({engine.proc.returncode}):\n{engine.tail()}")
                try:
                    if httpx.get(f"{engine.url}/health", timeout=2).status_code == 200:
                        pending.remove(engine)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                names = ", ".join(e.name for e in pending)
                raise AssertionError(f"engines not healthy after {timeout_s} s: {names}\n{pending[0].tail()}")
            if pending:
                time.sleep(0.5)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        """End ``name``'s process group (SIGTERM, then SIGKILL)."""
        engine = self.engines.pop(name, None)
        if engine is None:
            return
        engine.signal_group(sig)
        try:
            engine.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            engine.signal_group(signal.SIGKILL)
            engine.proc.wait(timeout=timeout_s)
        # the group's other members (EngineCore, workers) may outlive the API server: end them too
        engine.signal_group(signal.SIGKILL)

    def restart(self, name: str) -> RealEngine:
        """Stop ``name`` (if running) and start it again with the same spec, waiting for /health."""
        old = self.engines.get(name)
        if old is None:
            raise KeyError(name)
        self.stop(name, signal.SIGKILL)
        engine = self.start(name, old.spec, old.netns, old.host)
        self.wait_ready([engine])
        return engine

    def close(self) -> None:
        for name in list(self.engines):
            self.stop(name)
