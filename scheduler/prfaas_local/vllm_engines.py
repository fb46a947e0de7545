"""Real vLLM engines on this machine: the CPU build and the seeded tiny model ``scripts/real-engines.sh`` makes.

Used by the real-engine test tier (``tests/real``) and the benchmarks on real engines. ``scripts/real-engines.sh``
sets up vLLM's own virtual environment and the model (idempotent; :meth:`RealEnv.prepare` runs it). Engines start
only through the core's :func:`prfaas_core.launch.engines.engine_launch`, each in a process group of its own (SIGKILL of
vLLM's API server leaves its EngineCore running, so the whole group is ended), optionally inside a network
namespace. Field references (``status.podIP``) resolve to the engine's address: 127.0.0.1, or the namespace's.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from prfaas_core import names
from prfaas_core.api import ModelProfile, PDCluster
from prfaas_core.launch.engines import POD_IP, EngineLaunch, EngineSpec
from prfaas_core.launch.kinds import engine_kind, engine_launch
from prfaas_core.launch.render import engine_specs, hybrid_fields, runs_engines_here
from prfaas_core.launch.vllm import kv_events_url
from prfaas_router.state.config import load_model_tokenizer
from prfaas_router.state.metrics import sample_sum

from .manifests import load_clusters
from .ports import free_port
from .procs import spawn_process, stop_processes
from .stack_configs import BLOCK_SIZE

VLLM = engine_kind("vllm")

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "real-engines.sh"
"""KV block size of CPU vLLM (the router's prefixBlockTokens on this tier)."""
MAX_MODEL_LEN = 2048
NIXL_PROGRESS_DELAY_US = "10000"
"""NIXL's progress-thread poll delay (the vLLM environment's sitecustomize applies it) instead of busy-polling a
core per agent. Measured here with four engines on 2 cores: 100 us starved the engines' start (none healthy in
300 s), 1 ms gave first KV pulls of 8-30 s under load, 10 ms gave 1.5-3 s and 0.15-0.2 s decodes after."""
START_TIMEOUT_S = 600.0
"""Four engines starting together take ~1 min on 2 idle cores and several minutes when the cores are busy; the
deadline only catches a stuck start (the wait itself is on /health)."""


EXAMPLE = REPO / "examples" / "04-real-engines"
"""The real-engine two-region example (NIXL over TCP, TP 1) whose rendered engines the real tier runs."""


def example_specs(path: Path = EXAMPLE) -> dict[str, dict[str, EngineSpec]]:
    """``{cluster: {role: EngineSpec}}`` rendered from the example's resources (what ``prfaas engines`` prints)."""
    clusters, profiles = load_clusters([str(path)])
    return {
        c.metadata.name: {str(r): s for r, s in engine_specs(c, profiles.get(c.spec.model_profile_ref.name)).items()}
        for c in clusters
        if runs_engines_here(c)
    }


def example_slo(path: Path = EXAMPLE) -> dict[str, object]:
    """The example PDCluster's ``slo`` as the operator copies it into RouterConfig."""
    clusters, _ = load_clusters([str(path)])
    pd = next(c for c in clusters if isinstance(c, PDCluster))
    return pd.spec.slo.model_dump(mode="json", by_alias=True)


class Prompts:
    """Prompts of fresh random words (no prefix-cache hits between requests), sized in the tiny model's own
    tokens (its tokenizer, loaded as the router loads it)."""

    SYLLABLES: ClassVar[list[str]] = [a + b for a in "bdfgklmnprstvz" for b in "aeiou"]

    def __init__(self, tokenizer_file: str, seed: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.tokenizer = load_model_tokenizer(tokenizer_file)

    def word(self) -> str:
        return "".join(self.rng.choice(self.SYLLABLES) for _ in range(self.rng.randint(1, 3)))

    def text(self, tokens: int) -> str:
        """A text of about ``tokens`` tokens (within a word of it, never more)."""
        words: list[str] = []
        while True:
            word = self.word()
            if len(self.tokenizer.encode(" ".join([*words, word]))) > tokens:
                return " ".join(words)
            words.append(word)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


class RealEnginesUnavailable(RuntimeError):
    """The real-engine environment could not be set up here (the message says why)."""


@dataclass(frozen=True)
class RealEnv:
    """What ``scripts/real-engines.sh`` prepared."""

    python: str
    model: str
    tokenizer_file: str
    served_model_name: str
    versions: dict[str, str]
    model_profile: dict[str, Any] | None = None
    """The model's ModelProfile spec (camelCase JSON) when it is not the dense tiny model's (:meth:`hybrid`)."""

    def hybrid(self, kind: str = "hybrid") -> RealEnv:
        """A tiny hybrid model's environment (``hybrid-env.json``: Qwen3-Next, ``granite-env.json``: Granite-4-H,
        beside this one), its profile computed by ``prfaas profile`` from its config
        (:func:`~.model_profile.profile_from_model_dir`)."""
        from .model_profile import profile_from_model_dir
        from .stack_configs import BLOCK_SIZE

        path = Path(self.python).parents[2] / f"{kind}-env.json"
        if not path.exists():
            raise RealEnginesUnavailable(f"{path} is missing: scripts/real-engines.sh makes it")
        env = RealEnv.load(path)
        profile = profile_from_model_dir(
            Path(env.model), env.served_model_name, BLOCK_SIZE, env.served_model_name, tokenizer_file=env.tokenizer_file
        )
        return dataclasses.replace(env, model_profile=profile.spec.model_dump(mode="json", by_alias=True))

    @classmethod
    def prepare(cls) -> RealEnv:
        """Run the setup (idempotent: seconds when done before) and read its environment file."""
        if not SETUP.exists():
            raise RealEnginesUnavailable(f"{SETUP} is missing (real engines need a checkout of the repository)")
        try:
            done = subprocess.run(
                ["bash", str(SETUP)], capture_output=True, text=True, timeout=1800, check=False, cwd=REPO
            )
        except subprocess.TimeoutExpired:
            raise RealEnginesUnavailable("scripts/real-engines.sh did not finish in 30 min") from None
        if done.returncode != 0:
            raise RealEnginesUnavailable(f"scripts/real-engines.sh failed ({done.returncode}): {done.stderr[-2000:]}")
        return cls.load(Path(done.stdout.strip().splitlines()[-1]))

    @classmethod
    def load(cls, path: Path) -> RealEnv:
        """The environment file ``scripts/real-engines.sh`` wrote."""
        return cls(**json.loads(path.read_text()))


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
    access: str | None = None
    """The base URL this process reaches the engine by when it runs in a namespace (a forwarder); None: ``url``."""
    traces_url: str | None = None
    """Where it sends its OpenTelemetry traces (:meth:`EnginePool.start`); None: tracing off."""

    @property
    def url(self) -> str:
        """The engine's address as its peers (routers, other engines) see it."""
        return f"http://{self.host}:{self.spec.port}"

    @property
    def kv_events_url(self) -> str | None:
        """Where its KV events are published (None: it publishes none)."""
        return kv_events_url(self.spec, self.host)

    @property
    def reach_url(self) -> str:
        """The engine's address from the harness's own (root) namespace."""
        return self.access or self.url

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metrics_text(self) -> str:
        return httpx.get(f"{self.reach_url}/metrics", timeout=10).text

    def prompt_tokens_by_source(self) -> dict[str, float]:
        """vLLM's ``prompt_tokens_by_source``: local_compute, local_cache_hit, external_kv_transfer."""
        text = self.metrics_text()
        return {
            source: sample_sum(text, names.VLLM_PROMPT_TOKENS_BY_SOURCE, {"source": source}) or 0.0
            for source in names.PROMPT_SOURCES
        }

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the engine's whole process group (API server, EngineCore, workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started the engine dies (a killed test run
    must not leave 2.6 GiB engines behind; vLLM's own processes follow their API server)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class EnginePool:
    """Starts real engines through :func:`engine_launch` and ends them (whole process groups)."""

    env: RealEnv
    log_dir: Path
    engines: dict[str, RealEngine] = field(default_factory=dict)

    def spec(self, role: str, **changes: object) -> EngineSpec:
        """An EngineSpec for the tiny model on this tier (free ports, CPU KV buffer, CPU block size; a hybrid's
        flags from its profile, :func:`~prfaas_core.launch.render.hybrid_fields`)."""
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
            **self.hybrid_fields(),
        }
        defaults.update(changes)
        return EngineSpec(**defaults)  # type: ignore[arg-type]

    def hybrid_fields(self) -> dict[str, Any]:
        profile = self.env.model_profile
        return (
            hybrid_fields(ModelProfile.model_validate({"metadata": {"name": "tiny"}, "spec": profile}))
            if profile
            else {}
        )

    def on_this_host(self, spec: EngineSpec, host: str = "127.0.0.1", net_device: str = "lo") -> EngineSpec:
        """A rendered spec (a cluster's, from :func:`example_specs`) made to run here: the model's path on this
        machine, free ports, and this host's address and interface. Every other field stays as rendered."""
        return dataclasses.replace(
            spec,
            model=self.env.model,
            port=free_port(),
            side_channel_port=free_port(),
            kv_events_port=None if spec.kv_events_port is None else free_port(),
            host=host,
            net_device=net_device,
        )

    def start(
        self,
        name: str,
        spec: EngineSpec,
        netns: str | None = None,
        host: str = "127.0.0.1",
        access: str | None = None,
        traces_url: str | None = None,
    ) -> RealEngine:
        """Start ``spec``'s engine (no wait; see :meth:`wait_ready`), inside network namespace ``netns`` if
        given: field references resolve to ``host`` (the namespace's address) and the harness reaches it through
        ``access`` (a forwarder's URL, :meth:`prfaas_local.netns.NetnsPair.expose`). ``traces_url``: vLLM's own
        OpenTelemetry traces go there (``--otlp-traces-endpoint``, OTLP over HTTP, exported every 100 ms), outside
        the rendered launch: the harness's, not the example's."""
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
            # No core pinning: vLLM pins a worker (and so its NIXL progress thread) to its OpenMP core, and a
            # prefill engine pinned to a decode engine's core then starves while that decode polls for the very
            # KV it is pulling (pulls stalled 30 s and more). One passive OpenMP thread per engine instead.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1",
            "OMP_WAIT_POLICY": "PASSIVE",
            "PRFAAS_NIXL_PROGRESS_DELAY_US": NIXL_PROGRESS_DELAY_US,
            # ask for AMX tile state at start (the glue's sitecustomize): vLLM's AMX attention kernel would
            # otherwise die with SIGILL in a decode engine's worker on AMX machines
            "PRFAAS_AMX_PERMISSION": "1",
            "NO_PROXY": "*",
            **launch.resolved_env({POD_IP: host}),
        }
        argv = [self.env.python, *launch.command[1:], *launch.argv]
        if traces_url is not None:
            argv += ["--otlp-traces-endpoint", traces_url]
            env |= {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        if netns is not None:
            argv = ["ip", "netns", "exec", netns, *argv]
        log = self.log_dir / f"{name}.log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        engine = RealEngine(name, spec, launch, host, proc, log, netns, access, traces_url)
        self.engines[name] = engine
        return engine

    def wait_ready(self, engines: Iterable[RealEngine], timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every engine answers /health 200; fail with its log's tail if one exits or times out."""
        pending = list(engines)
        deadline = time.monotonic() + timeout_s
        while pending:
            for engine in list(pending):
                if not engine.alive():
                    raise RuntimeError(f"engine {engine.name} exited ({engine.proc.returncode}):\n{engine.tail()}")
                try:
                    if httpx.get(f"{engine.reach_url}/health", timeout=2).status_code == 200:
                        pending.remove(engine)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                names = ", ".join(e.name for e in pending)
                tails = "\n".join(f"--- {e.name}:\n{e.tail(1500)}" for e in pending)
                raise RuntimeError(f"engines not healthy after {timeout_s} s: {names}\n{tails}")
            if pending:
                time.sleep(0.5)

    def warm_up(self, prefill: RealEngine, decode: RealEngine, timeout_s: float = 120.0, attempts: int = 3) -> float:
        """One P/D exchange by hand from ``prefill`` to ``decode``, so that the pair's NIXL handshake (seconds on a
        loaded machine, once per pair) happens here and not inside a measured request. Returns its seconds.

        On a loaded machine the pair's first handshake can time out (vLLM answers 500 and stays healthy), so a
        failed exchange is tried again, ``attempts`` times in all; RuntimeError names the pair after the last."""
        started = time.monotonic()
        for attempt in range(attempts):
            try:
                self._exchange(prefill, decode, timeout_s)
                return time.monotonic() - started
            except httpx.HTTPStatusError as exc:
                if attempt == attempts - 1:
                    raise RuntimeError(f"{prefill.name} -> {decode.name}: KV exchange failed: {exc}") from None
                print(f"warm-up {prefill.name} -> {decode.name} failed ({exc}); again", file=sys.stderr)
        raise AssertionError("unreachable")

    def _exchange(self, prefill: RealEngine, decode: RealEngine, timeout_s: float) -> None:
        body = {"model": self.env.served_model_name, "prompt": "warm up " * 40, "max_tokens": 1}
        r = httpx.post(f"{prefill.reach_url}/v1/completions", json=VLLM.prefill_body(body), timeout=timeout_s)
        r.raise_for_status()
        handle = VLLM.kv_handle(r.json())
        if handle is None:
            raise RuntimeError(f"{prefill.name} answered a prefill leg with no KV handle")
        r = httpx.post(f"{decode.reach_url}/v1/completions", json=VLLM.decode_body(body, handle), timeout=timeout_s)
        r.raise_for_status()

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
        engine = self.start(name, old.spec, old.netns, old.host, old.access, old.traces_url)
        self.wait_ready([engine])
        return engine

    def close(self) -> None:
        for name in list(self.engines):
            self.stop(name)


def start_vllm_router(prefill: str, decode: str, log: Path, timeout_s: float = 60.0) -> tuple[str, Any]:
    """vllm-router 0.1.17 in PD mode (NIXL) in front of one prefill and one decode engine, the peer we compare
    with; returns its base URL and process once /health answers."""
    port = free_port()
    argv = [
        str(Path(sys.executable).parent / "vllm-router"), "--vllm-pd-disaggregation", "--prefill", prefill,
        "--decode", decode, "--kv-connector", "nixl", "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warning",
    ]  # fmt: skip
    proc = spawn_process(argv, log, env={"NO_PROXY": "*"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm-router exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_processes([proc])
            raise RuntimeError(f"vllm-router did not start in {timeout_s} s")
        time.sleep(0.2)
