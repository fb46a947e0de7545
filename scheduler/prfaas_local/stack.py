"""The local two-datacenter stack as real processes on 127.0.0.1 (``prfaas up``, benchmarks):

region A — PrFaaS engines (H200), each with its KV server behind a link emulator relay, and the prefill
gateway (the router binary in gateway mode); region B — PD engines (H20) and the router. KV bytes really
cross the shaped relays. The link's capacity is split evenly over the relays (one per PrFaaS engine; the
emulator relays to one target each), so the total never exceeds it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prfaas_core.api import RouterConfig, SloSpec
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.launch.engines import PROMPT_TOKENS_DETAILS_FLAG
from prfaas_core.policy.link_calendar import paced_instance_gbps
from prfaas_link.config import shaper_burst_gbit

from .local_loop import write_router_config
from .ports import free_port

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]


@dataclass(frozen=True)
class StackSpec:
    n_prfaas: int = 2
    n_pd: int = 4
    initial_prefill: int = 1
    link_gbps: float = 100.0
    link_max_utilization: float = 0.8
    rtt_ms: float = 5.0
    time_scale: float = 4.0
    byte_scale: float = 1e-3
    threshold_min_tokens: int = 19_634
    model_profile: str = "internal-1t"
    with_gateway_token: bool = True
    served_models: tuple[str, ...] = ()
    """The model names the router accepts (others get OpenAI's 404); empty: any."""
    gateway_admission: bool = False
    """The gateway schedules the link (``gateway.admission``; pull-after-prefill, one pull at a relay's rate)."""
    egress_pacing: bool = False
    """Each PrFaaS instance's egress paced to cap / instances (what ``linkScheduling.egressPacing: PerInstance``
    asks of the CNI in a cluster): its relay runs at that rate, and the gateway books each pull at it."""
    slo: SloSpec | None = field(default_factory=SloSpec)
    """The SLO the router routes by (spills, link waits): what the operator passes from a PDCluster's
    ``spec.slo``, its defaults here; None: a router with no SLO configured."""


@dataclass
class LocalStack:
    spec: StackSpec
    work_dir: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)
    gateway_headers: dict[str, str] = field(default_factory=dict)
    """The gateway's bearer token header (its /status needs it)."""
    router_config: RouterConfig | None = None
    link_metric_urls: list[str] = field(default_factory=list)
    paced: bool = False
    """The relays run at the paced rate (:meth:`pace_relays`; the spec's ``egress_pacing`` at the start)."""
    link_gbps: float = 0.0
    """The link's capacity in force (model Gbps; :meth:`reshape_link`; the spec's at the start)."""

    def __post_init__(self) -> None:
        self.paced, self.link_gbps = self.spec.egress_pacing, self.spec.link_gbps

    @property
    def config_path(self) -> Path:
        return self.work_dir / "router.json"

    def _start(self, name: str, args: list[str]) -> None:
        self.spawn(name, [*PRFAAS, *args])

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a process that belongs to the stack (log in logs/NAME.log; stopped by :meth:`stop`)."""
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        proc = spawn_process(argv, self.work_dir / "logs" / f"{name}.log", env)
        self.procs.append((name, proc))
        return proc

    def terminate(self, name: str) -> None:
        """Stop one process of the stack (SIGTERM, then SIGKILL after 5 s) and forget it."""
        for entry in [e for e in self.procs if e[0] == name]:
            stop_processes([entry[1]])
            self.procs.remove(entry)

    def engine_urls(self) -> list[str]:
        """Every engine of both regions (PrFaaS, then PD)."""
        return [url for name, url in self.urls.items() if name.startswith(("prfaas-", "pd-"))]

    def wait_idle(self, timeout_s: float = 300.0) -> bool:
        """Until no engine has a request running, waiting or loading KV; False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                busy = 0
                for url in self.engine_urls():
                    try:
                        st = client.get(f"{url}/admin/state").json()
                    except (httpx.HTTPError, ValueError):
                        busy += 1
                        continue
                    busy += int(st["running"]) + int(st["waiting"]) + int(st.get("loading_kv", 0))
                if busy == 0:
                    return True
                time.sleep(0.2)
        return False

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each running process of the stack has used so far (Linux /proc)."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for name, proc in self.procs:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def start(self) -> None:
        """The PrFaaS engines behind their link relays, the PD engines, the gateway and the router; then wait."""
        exit_on_sigterm()
        s = self.spec
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        scale = ["--time-scale", str(s.time_scale), "--byte-scale", str(s.byte_scale)]
        model_json = builtin_model_profiles()[s.model_profile].model_dump(mode="json", by_alias=True, exclude_none=True)
        prfaas_eps = [self._start_prfaas(i, scale) for i in range(s.n_prfaas)]
        pd_eps = [self._start_pd(i, scale) for i in range(s.n_pd)]
        token = self.work_dir / "gateway-token"
        token.write_text(os.urandom(16).hex())
        self.gateway_headers = {"Authorization": f"Bearer {token.read_text()}"}
        gw_port, router_port = free_port(), free_port()
        gw_url = f"http://127.0.0.1:{gw_port}"
        self.urls["gateway"], self.urls["router"] = gw_url, f"http://127.0.0.1:{router_port}"
        gateway = self._gateway_config(model_json, prfaas_eps, token)
        (self.work_dir / "gateway.json").write_text(json.dumps(gateway, indent=2))
        self.router_config = self._router_config(model_json, pd_eps, gw_url, token)
        write_router_config(self.config_path, self.router_config)
        self._start("gateway", ["router", "--config", str(self.work_dir / "gateway.json"), "--port", str(gw_port)])
        models = [arg for name in s.served_models for arg in ("--model", name)]
        self._start("router", ["router", "--config", str(self.config_path), "--port", str(router_port), *models])
        self.wait_ready()

    def _start_prfaas(self, i: int, scale: list[str]) -> dict[str, str]:
        """PrFaaS engine ``i`` and its link relay (its share of the link); the engine advertises the relay as
        its KV address, so that the KV crosses the shaped link. Returns its gateway endpoint."""
        s = self.spec
        port, kv, relay, admin = free_port(), free_port(), free_port(), free_port()
        name = f"prfaas-{i}"
        self._start(
            name,
            ["engine", "--role", "prefill", "--hardware", "H200", "--port", str(port),
             "--kv-listen", f"127.0.0.1:{kv}", "--kv-advertise", f"127.0.0.1:{relay}", "--engine-id", name,
             "--model-profile", s.model_profile, PROMPT_TOKENS_DETAILS_FLAG, *scale],
        )  # fmt: skip
        self._start(
            f"link-{i}",
            ["link", "--listen", f"127.0.0.1:{relay}", "--target", f"127.0.0.1:{kv}",
             "--capacity-gbps", str(self.relay_gbps(s.egress_pacing)), "--rtt-ms", str(s.rtt_ms), "--name", "a-to-b",
             "--metrics-port", str(admin), *scale],
        )  # fmt: skip
        self.urls[name] = f"http://127.0.0.1:{port}"
        self.urls[f"link-{i}"] = f"http://127.0.0.1:{admin}"
        self.link_metric_urls.append(f"http://127.0.0.1:{admin}/metrics")
        return {"name": name, "url": f"http://127.0.0.1:{port}", "role": "prefill"}

    def _start_pd(self, i: int, scale: list[str]) -> dict[str, str]:
        """PD engine ``i`` (prefill for the first ``initial_prefill``, decode after). Returns its endpoint."""
        s = self.spec
        port = free_port()
        name, role = f"pd-{i}", "prefill" if i < s.initial_prefill else "decode"
        self._start(
            name,
            ["engine", "--role", role, "--hardware", "H20", "--port", str(port),
             "--kv-listen", f"127.0.0.1:{free_port()}", "--engine-id", name, "--model-profile", s.model_profile,
             PROMPT_TOKENS_DETAILS_FLAG, *scale],
        )  # fmt: skip
        self.urls[name] = f"http://127.0.0.1:{port}"
        return {"name": name, "url": f"http://127.0.0.1:{port}", "role": role}

    def _scale_config(self) -> dict[str, float]:
        return {"timeScale": self.spec.time_scale, "byteScale": self.spec.byte_scale}

    def _gateway_config(
        self, model_json: dict[str, Any], endpoints: list[dict[str, str]], token: Path
    ) -> dict[str, Any]:
        """The gateway's RouterConfig (gateway mode in front of the PrFaaS engines)."""
        return {
            "pdCluster": "prfaas-h200",
            "mode": "gateway",
            "thresholdMinTokens": 0,
            "model": model_json,
            "endpoints": endpoints,
            "gateway": {"prefillCluster": "prfaas-h200", "tokenFile": str(token), **self._admission()},
            "links": [
                {
                    "name": "a-to-b",
                    "capacityGbps": self.spec.link_gbps,
                    "maxUtilization": self.spec.link_max_utilization,
                }
            ]
            if self.spec.gateway_admission
            else [],
            "prfaasHardware": {"accelerator": "H200"},
            "scale": self._scale_config(),
        }

    def _admission(self) -> dict[str, Any]:
        s = self.spec
        if not s.gateway_admission:
            return {}
        admission: dict[str, Any] = {"link": "a-to-b", "pullGbps": self.relay_gbps(s.egress_pacing)}
        if s.egress_pacing:  # each engine's relay runs at the paced rate: one engine's pulls share it
            admission["instanceGbps"] = admission["pullGbps"]
        return {"admission": admission}

    def relay_gbps(self, paced: bool, link_gbps: float | None = None) -> float:
        """One PrFaaS instance's relay rate on a ``link_gbps`` link (the spec's by default): its share of the
        link, or with egress pacing, of the cap (:func:`~prfaas_core.policy.link_calendar.paced_instance_gbps`)."""
        s = self.spec
        gbps = s.link_gbps if link_gbps is None else link_gbps
        share = gbps / s.n_prfaas
        return min(share, paced_instance_gbps(gbps, s.link_max_utilization, s.n_prfaas)) if paced else share

    def relay_burst_gbit(self) -> float:
        """What the relays (one per PrFaaS engine) may carry above their rates in one 1-s window, in model Gbit."""
        return shaper_burst_gbit(self.spec.n_prfaas, self.spec.byte_scale)

    def pace_relays(self, paced: bool) -> None:
        """Every relay to :meth:`relay_gbps` now (a peer that does not pace runs on the unpaced link)."""
        self.paced = paced
        self._set_relays()

    def reshape_link(self, gbps: float) -> None:
        """The link's capacity becomes ``gbps`` (model): every relay its share, still paced if it was."""
        self.link_gbps = gbps
        self._set_relays()

    def _set_relays(self) -> None:
        rate = self.relay_gbps(self.paced, self.link_gbps)
        for i in range(self.spec.n_prfaas):
            resp = httpx.post(f"{self.urls[f'link-{i}']}/admin/link", json={"capacity_gbps": rate}, timeout=5.0)
            resp.raise_for_status()

    def _router_config(
        self, model_json: dict[str, Any], endpoints: list[dict[str, str]], gw_url: str, token: Path
    ) -> RouterConfig:
        """The router's RouterConfig: the PD engines, the gateway as its remote, the link.

        One logical link (total capacity) made of one relay per PrFaaS engine: the router admits against the
        total; its own in-flight egress covers every relay, its measured correction reads the first."""
        s = self.spec
        return RouterConfig.model_validate(
            {
                "pdCluster": "pd-h20",
                "thresholdMinTokens": s.threshold_min_tokens,
                "model": model_json,
                "endpoints": endpoints,
                "remotes": [
                    {
                        "name": "prfaas-h200",
                        "url": gw_url,
                        "statusUrl": gw_url + "/status",
                        "tokenFile": str(token),
                        "link": "a-to-b",
                    }
                ],
                "links": [
                    {
                        "name": "a-to-b",
                        "capacityGbps": s.link_gbps,
                        "maxUtilization": s.link_max_utilization,
                        "metricsUrl": self.link_metric_urls[0],
                    }
                ],
                "pdHardware": {"accelerator": "H20"},
                "prfaasHardware": {"accelerator": "H200"},
                "scale": self._scale_config(),
                "routing": {"refreshIntervalSeconds": 0.5},
                "slo": None if s.slo is None else s.slo.model_dump(by_alias=True),
            }
        )

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                log = (self.work_dir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with status {proc.returncode}:\n{log}")

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until the router sees every PD engine healthy and the gateway every PrFaaS instance ready. The
        deadline (default 90 s) stretches with the machine's load (a loaded 2-core machine starts ~12 processes
        slowly) and only bounds a hang; what is still missing is printed every 10 s."""
        if timeout_s is None:
            timeout_s = min(600.0, 90.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
        started = time.monotonic()
        deadline, next_note = started + timeout_s, started + 10.0
        missing = "nothing answered yet"
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    r = client.get(self.urls["router"] + "/ready")
                    g = client.get(self.urls["gateway"] + "/status", headers=self.gateway_headers)
                    healthy, ready = r.json().get("healthy_engines", 0), g.json().get("readyInstances", 0)
                    if r.status_code == 200 and healthy == self.spec.n_pd and ready == self.spec.n_prfaas:
                        return
                    missing = (
                        f"router {r.status_code}, {healthy}/{self.spec.n_pd} PD engines healthy, "
                        f"{ready}/{self.spec.n_prfaas} PrFaaS instances ready"
                    )
                except (httpx.HTTPError, KeyError, ValueError, AttributeError) as exc:
                    missing = f"not answering ({exc.__class__.__name__})"
                if time.monotonic() >= next_note:
                    waited = time.monotonic() - started
                    print(f"stack: waiting {waited:.0f}/{timeout_s:.0f} s: {missing}", file=sys.stderr)
                    next_note += 10.0
                time.sleep(0.2)
        raise RuntimeError(
            f"the stack was not ready after {timeout_s:.0f} s: {missing} (logs in {self.work_dir / 'logs'})"
        )

    def stop(self) -> None:
        stop_processes([proc for _, proc in self.procs])


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` (in the main thread), so the ``finally`` that stops a stack runs when
    the process itself is terminated, not only on Ctrl-C or an error."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def spawn_process(
    argv: list[str], log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a child with its output in ``log`` (discarded without one) and ``env`` over this environment."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child keeps its descriptor
    try:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every one, then SIGKILL whichever has not exited 5 s later."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
