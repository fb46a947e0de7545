"""Our router and prefill gateway in front of real vLLM engines (the real-engine tier and its benchmark).

Region A: a PrFaaS prefill engine behind the gateway (token-authenticated). Region B: PD prefill engines and a PD
decode engine behind the router, which sends long requests to the gateway. The routers run as real processes
(``prfaas router --config FILE``) reading the same RouterConfig contract the operator writes, with the model's
own tokenizer (``tokenizerFile``) and the engines' KV block size as ``prefixBlockTokens``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from .ports import free_port
from .stack import spawn_process, stop_processes
from .vllm_engines import BLOCK_SIZE, RealEnv

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]


class Endpoint(Protocol):
    """What a router configuration needs of an engine: its name and base URL."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...


@dataclass(frozen=True)
class EngineRef:
    """An engine somebody else started."""

    name: str
    url: str


TOKEN = "real-tier-token"
LINK = "a-to-b"


def tiny_model_profile(env: RealEnv) -> dict[str, Any]:
    """The tiny model's ModelProfile spec: 2 full-attention layers, 2 KV heads of dim 32, bf16 (512 B/token)."""
    return {
        "servedModelName": env.served_model_name,
        "architecture": {"fullAttentionLayers": 2, "kvHeads": 2, "headDim": 32, "kvDtype": "bf16"},
        "tokenizer": {"file": env.tokenizer_file},
    }


@dataclass
class RealStack:
    """The gateway and router processes over a set of real engines."""

    dir: Path
    env: RealEnv
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    access: dict[str, str] = field(default_factory=dict)

    def url(self, name: str) -> str:
        """Where this process reaches ``name`` (a forwarder's URL when it runs in a namespace)."""
        return self.access.get(name) or self.peer_url(name)

    def peer_url(self, name: str) -> str:
        """Where the other processes of the stack reach ``name`` (its listen address)."""
        return f"http://{self.hosts.get(name, '127.0.0.1')}:{self.ports[name]}"

    @property
    def token_file(self) -> Path:
        return self.dir / "gateway-token"

    def gateway_config(self, prfaas: Endpoint, name: str = "prfaas") -> dict[str, Any]:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(TOKEN + "\n")
        return {
            "pdCluster": name,
            "mode": "gateway",
            "thresholdMinTokens": 0,
            "model": tiny_model_profile(self.env),
            "tokenizerFile": self.env.tokenizer_file,
            "endpoints": [{"name": prfaas.name, "url": prfaas.url, "role": "prefill"}],
            "gateway": {"prefillCluster": name, "tokenFile": str(self.token_file)},
            "routing": {"prefixBlockTokens": BLOCK_SIZE, "refreshIntervalSeconds": 0.5},
        }

    def router_config(
        self,
        prefill: Sequence[Endpoint],
        decode: Sequence[Endpoint],
        gateway: str | None,
        threshold_min_tokens: int,
        decode_urls: dict[str, str] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A router in front of ``prefill`` and ``decode`` engines (``decode_urls`` may put a proxy in front of
        one), sending requests whose uncached length exceeds ``threshold_min_tokens`` to ``gateway``."""
        urls = decode_urls or {}
        endpoints = [{"name": e.name, "url": e.url, "role": "prefill"} for e in prefill]
        endpoints += [{"name": e.name, "url": urls.get(e.name, e.url), "role": "decode"} for e in decode]
        config: dict[str, Any] = {
            "pdCluster": "pd",
            "thresholdMinTokens": threshold_min_tokens,
            "model": tiny_model_profile(self.env),
            "tokenizerFile": self.env.tokenizer_file,
            "endpoints": endpoints,
            # engines on one host: the "link" is the loopback, whose capacity is not in doubt. A KV pull a loaded
            # CPU decode engine is slow to start would otherwise read as a squeezed link and keep long prompts
            # local for ~20 s (the netns tier, a shaped veth, measures its link: it sets its own links)
            "links": [{"name": LINK, "capacityGbps": 100, "availableBandwidth": "Configured"}],
            "routing": {"prefixBlockTokens": BLOCK_SIZE, "refreshIntervalSeconds": 0.5, "breakerOpenSeconds": 3},
            # a KV pull on CPU vLLM occasionally stalls for many seconds on a loaded 2-core machine (the decode
            # engine busy-steps while it waits): only a dead producer (vLLM answers 500 within ~5 s) falls back
            "timeouts": {"kvPullSeconds": 120},
            **extra,
        }
        if gateway is not None:
            config["remotes"] = [
                {
                    "name": "prfaas",
                    "url": self.peer_url(gateway),
                    "statusUrl": self.peer_url(gateway) + "/status",
                    "tokenFile": str(self.token_file),
                    "link": LINK,
                    "timeoutSeconds": 10,
                }
            ]
        return config

    def start_router(
        self,
        name: str,
        config: dict[str, Any],
        prefix: Sequence[str] = (),
        host: str = "127.0.0.1",
        access: Callable[[int], str] | None = None,
    ) -> str:
        """Start ``prfaas router`` with ``config`` (no wait; see :meth:`wait_ready`); returns its base URL.
        ``prefix`` runs it elsewhere (``ip netns exec NS``), listening on ``host``; ``access(port)`` gives the URL
        this process reaches it by from there (a forwarder)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.configs[name] = config
        path = self.dir / f"{name}.json"
        path.write_text(json.dumps(config, indent=2))
        self.ports[name] = port = free_port()
        self.hosts[name] = host
        if access is not None:
            self.access[name] = access(port)
        argv = [*prefix, *PRFAAS, "router", "--config", str(path), "--host", host, "--port", str(port)]
        self.procs[name] = spawn_process(argv, self.dir / f"{name}.log", env={"NO_PROXY": "*"})
        return self.url(name)

    def write_config(self, name: str, config: dict[str, Any]) -> None:
        """Replace a running router's configuration (atomically, as kubelet swaps a ConfigMap)."""
        self.configs[name] = config
        tmp = self.dir / f"{name}.json.tmp"
        tmp.write_text(json.dumps(config, indent=2))
        tmp.replace(self.dir / f"{name}.json")

    def wait_ready(self, name: str, timeout_s: float = 120.0) -> None:
        """Wait until ``name`` answers ``/ready`` 200 with every engine it fronts healthy."""
        deadline = time.monotonic() + timeout_s
        want = len(self.configs[name].get("endpoints", []))
        last: object = None
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                log = (self.dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"router {name} exited ({proc.returncode}):\n{log}")
            try:
                r = httpx.get(self.url(name) + "/ready", timeout=2)
                last = r.text
                body = r.json()
                if r.status_code == 200 and body.get("healthy_engines", 0) >= want:
                    return
            except (httpx.HTTPError, ValueError) as exc:
                last = exc
            time.sleep(0.2)
        raise RuntimeError(f"router {name} not ready after {timeout_s} s (last: {last!r})")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_processes([proc])

    def close(self) -> None:
        stop_processes(list(self.procs.values()))
        self.procs.clear()


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
