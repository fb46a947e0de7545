"""The local two-datacenter stack as real processes: the one builder that ``prfaas up``, ``prfaas up --engines
vllm``, the benchmarks and the tests use.

Region A — PrFaaS engines (H200), each with its KV server behind a link emulator relay, and the prefill gateway
(the router binary in gateway mode); region B — PD engines (H20) and the router. KV bytes really cross the shaped
relays. The link's capacity is split evenly over the relays (one per PrFaaS engine; the emulator relays to one
target each), so the total never exceeds it. :meth:`LocalStack.start` lays that out with emulated engines; with
real engines (``env``: vLLM's environment, the engines started by :mod:`.vllm_engines`, possibly in network
namespaces) the caller starts the gateway and the router through :meth:`LocalStack.start_router` with the
configs of :meth:`LocalStack.make_gateway_config` and :meth:`LocalStack.make_router_config` — the same configs,
the same processes.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prfaas_core.api import RouterConfig
from prfaas_core.launch.vllm import PROMPT_TOKENS_DETAILS_FLAG
from prfaas_core.policy.link_calendar import paced_instance_gbps
from prfaas_link.config import shaper_burst_gbit

from .ports import free_port
from .procs import Processes, exit_on_sigterm
from .stack_configs import (
    LINK,
    VLLM_SPEC,
    VLLM_TOKEN,
    Endpoint,
    EngineRef,
    StackSpec,
    emulated_fields,
    kv_events_field,
    vllm_fields,
)

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]


@dataclass
class LocalStack:
    spec: StackSpec
    work_dir: Path
    env: Any = None
    """Real engines: vLLM's environment (:class:`~.vllm_engines.RealEnv`; the routers use its model and
    tokenizer); None: emulated engines."""
    procs: Processes = field(default=None)  # type: ignore[assignment]
    urls: dict[str, str] = field(default_factory=dict)
    """Where this process reaches each part (a forwarder's URL when it runs in a namespace)."""
    peer_urls: dict[str, str] = field(default_factory=dict)
    """Where the other processes of the stack reach each part (its listen address)."""
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    gateway_headers: dict[str, str] = field(default_factory=dict)
    """The gateway's bearer token header (its /status and /metrics need it)."""
    router_config: RouterConfig | None = None
    link_metric_urls: list[str] = field(default_factory=list)
    kv_ports: dict[str, int] = field(default_factory=dict)
    """Each emulated engine's KV server port (its relay's target)."""
    paced: bool = False
    """The relays run at the paced rate (:meth:`pace_relays`; the spec's ``egress_pacing`` at the start)."""
    link_gbps: float = 0.0
    """The link's capacity in force (model Gbps; :meth:`reshape_link`; the spec's at the start)."""

    def __post_init__(self) -> None:
        self.paced, self.link_gbps = self.spec.egress_pacing, self.spec.link_gbps
        if self.procs is None:
            self.procs = Processes(self.work_dir / "logs")

    @classmethod
    def over_vllm(cls, work_dir: Path, env: Any, spec: StackSpec = VLLM_SPEC) -> LocalStack:
        """The gateway and routers over real vLLM engines someone else started."""
        return cls(spec, work_dir, env)

    # -- the processes ---------------------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.work_dir / "router.json"

    @property
    def token_file(self) -> Path:
        return self.work_dir / "gateway-token"

    @property
    def tls_ca(self) -> Path | None:
        return self.spec.gateway_tls[0] if self.spec.gateway_tls else None

    def url(self, name: str) -> str:
        return self.urls[name]

    def peer_url(self, name: str) -> str:
        return self.peer_urls.get(name) or self.urls[name]

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        """Start a process that belongs to the stack (log in its process group's folder; stopped by :meth:`stop`)."""
        return self.procs.start(name, argv, env)

    def terminate(self, name: str) -> None:
        """Stop one process of the stack (SIGTERM, then SIGKILL after 5 s) and forget it."""
        self.procs.stop(name)

    def stop(self, name: str | None = None) -> None:
        """Stop ``name`` (a router), or every process of the stack."""
        if name is None:
            self.procs.stop_all()
        else:
            self.procs.stop(name)

    close = stop

    def check_alive(self) -> None:
        self.procs.check_alive()

    def engine_urls(self) -> list[str]:
        """Every engine of both regions (PrFaaS, then PD)."""
        return [url for name, url in self.urls.items() if name.startswith(("prfaas-", "pd-"))]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each running process of the stack has used so far (Linux /proc)."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for name, proc in self.procs.procs:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def start_router(
        self,
        name: str,
        config: dict[str, Any],
        prefix: Sequence[str] = (),
        host: str = "127.0.0.1",
        access: Callable[[int], str] | None = None,
        args: Sequence[str] = (),
    ) -> str:
        """Start ``prfaas router`` (or a gateway) with ``config`` (no wait; see :meth:`wait_ready`); returns the
        URL this process reaches it by. ``prefix`` runs it elsewhere (``ip netns exec NS``), listening on
        ``host``; ``access(port)`` gives the URL this process reaches it by from there (a forwarder)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.write_config(name, config)
        port = free_port()
        scheme = "https" if self.tls_ca is not None and name.startswith("gateway") else "http"
        self.peer_urls[name] = f"{scheme}://{host}:{port}"
        self.urls[name] = access(port) if access is not None else self.peer_urls[name]
        argv = [*prefix, *(self.spec.router_cmd or PRFAAS), "router", "--config", str(self.work_dir / f"{name}.json")]
        argv += ["--host", host]
        self.spawn(name, [*argv, "--port", str(port), *args], env={"NO_PROXY": "*"})
        return self.urls[name]

    def write_config(self, name: str, config: dict[str, Any]) -> None:
        """Replace a router's configuration (atomically, as kubelet swaps a ConfigMap)."""
        self.configs[name] = config
        tmp = self.work_dir / f"{name}.json.tmp"
        tmp.write_text(json.dumps(config, indent=2))
        tmp.replace(self.work_dir / f"{name}.json")

    # -- the configs -----------------------------------------------------------------------------------------

    def _kind_fields(self) -> dict[str, Any]:
        """What the engine kind changes in the routers' configs: the model, its tokenizer, scale, hardware."""
        s = self.spec
        if self.env is None:
            return emulated_fields(s.model_profile, s.time_scale, s.byte_scale)
        return vllm_fields(self.env)

    def _token(self) -> None:
        if not self.token_file.exists():
            self.work_dir.mkdir(parents=True, exist_ok=True)
            self.token_file.write_text((self.spec.gateway_token or os.urandom(16).hex()) + "\n")
        self.gateway_headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def make_gateway_config(self, prfaas: Endpoint | Sequence[Endpoint], peers: Sequence[str] = ()) -> dict[str, Any]:
        """The gateway's RouterConfig (gateway mode in front of the PrFaaS engines); ``peers``: the replicas."""
        s, kind = self.spec, self._kind_fields()
        self._token()
        engines: list[Endpoint] = [prfaas] if hasattr(prfaas, "url") else list(prfaas)  # type: ignore[list-item]
        gateway: dict[str, Any] = {"prefillCluster": s.prfaas_cluster, "tokenFile": str(self.token_file)}
        links: list[dict[str, Any]] = []
        if s.gateway_admission:
            capacity = s.link_gbps if s.gateway_link_gbps is None else s.gateway_link_gbps
            links = [{"name": LINK, "capacityGbps": capacity, "maxUtilization": s.link_max_utilization}]
            admission = {"link": LINK, **(s.admission if s.admission is not None else self._pull_rates())}
            if self.env is None:  # the lease the gateway assumes is the emulated engines' own
                admission.setdefault("kvLeaseSeconds", s.kv_lease_s)
            if len(peers) > 1:
                admission.update(replicas=len(peers), peers=list(peers))
                if self.tls_ca is not None:
                    admission["peerCaFile"] = str(self.tls_ca)
            gateway.update(admission=admission, siteEgressCapGbps=s.site_egress_cap_gbps)
        if s.gateway_tls is not None:
            gateway.update(tlsCertFile=str(s.gateway_tls[0]), tlsKeyFile=str(s.gateway_tls[1]))
        config = {
            "pdCluster": s.prfaas_cluster,
            "mode": "gateway",
            "thresholdMinTokens": 0,
            **kind["common"],
            **kind["gateway"],
            "endpoints": [{**kv_events_field(e), "name": e.name, "url": e.url, "role": "prefill"} for e in engines],
            "gateway": gateway,
            "links": links,
        }
        return {**config, **s.gateway_extra}

    def _pull_rates(self) -> dict[str, Any]:
        admission: dict[str, Any] = {"pullGbps": self.relay_gbps(self.spec.egress_pacing)}
        if self.spec.egress_pacing:  # each engine's relay runs at the paced rate: one engine's pulls share it
            admission["instanceGbps"] = admission["pullGbps"]
        return admission

    def make_router_config(
        self,
        prefill: Sequence[Endpoint],
        decode: Sequence[Endpoint],
        gateway: str | None,
        threshold_min_tokens: int,
        decode_urls: dict[str, str] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A router in front of ``prefill`` and ``decode`` engines (``decode_urls`` may put a proxy in front of
        one), sending requests whose uncached length exceeds ``threshold_min_tokens`` to the gateway process
        ``gateway`` (None: none). One logical link (total capacity) made of one relay per PrFaaS engine: the
        router admits against the total; its own in-flight egress covers every relay, its measured correction
        reads the first."""
        s, kind = self.spec, self._kind_fields()
        urls = decode_urls or {}
        endpoints = [{**kv_events_field(e), "name": e.name, "url": e.url, "role": "prefill"} for e in prefill]
        endpoints += [
            {**kv_events_field(e), "name": e.name, "url": urls.get(e.name, e.url), "role": "decode"} for e in decode
        ]
        capacity = s.router_link_gbps or s.gateway_link_gbps or s.link_gbps  # the gateway's view, but on purpose
        link: dict[str, Any] = {"name": LINK, "capacityGbps": capacity, "maxUtilization": s.link_max_utilization}
        if self.link_metric_urls:
            link["metricsUrl"] = self.link_metric_urls[0]
        config: dict[str, Any] = {
            "pdCluster": s.pd_cluster,
            "thresholdMinTokens": threshold_min_tokens,
            **kind["common"],
            **kind["router"],
            "endpoints": endpoints,
            "links": [link],
            "routing": {**s.routing, **kind["router"].get("routing", {})},
            "slo": None if s.slo is None else s.slo.model_dump(by_alias=True),
        }
        if kind.get("links") is not None:
            config["links"] = kind["links"]
        if gateway is not None:
            self._token()
            remote: dict[str, Any] = {
                "name": s.prfaas_cluster,
                "url": self.peer_url(gateway),
                "statusUrl": self.peer_url(gateway) + "/status",
                "tokenFile": str(self.token_file),
                "link": LINK,
            }
            if s.remote_timeout_s is not None:
                remote["timeoutSeconds"] = s.remote_timeout_s
            if self.tls_ca is not None:
                remote["caFile"] = str(self.tls_ca)
            config["remotes"] = [remote]
        return {**config, **s.router_extra, **extra}

    # -- the emulated layout ---------------------------------------------------------------------------------

    def start(self, wait: bool = True) -> None:
        """The PrFaaS engines behind their link relays, the PD engines, the gateway(s) and the router; then
        (``wait``) until all are ready."""
        exit_on_sigterm()
        s = self.spec
        self.work_dir.mkdir(parents=True, exist_ok=True)
        prfaas = [self._start_prfaas(i) for i in range(s.n_prfaas)]
        pd = [self._start_pd(i) for i in range(s.n_pd)]
        replicas = ["gateway", *(f"gateway-{k}" for k in range(2, s.gateway_replicas + 1))]
        ports = {r: free_port() for r in replicas}
        scheme = "https" if self.tls_ca is not None else "http"
        peers = [f"{scheme}://127.0.0.1:{ports[r]}" for r in replicas]
        gateway = self.make_gateway_config(prfaas, peers)
        for r in replicas:  # the replicas share one config file; each listens on the port its peers know
            self.write_config("gateway", gateway)
            self.peer_urls[r] = self.urls[r] = f"{scheme}://127.0.0.1:{ports[r]}"
            argv = [*(s.router_cmd or PRFAAS), "router", "--config", str(self.work_dir / "gateway.json")]
            argv += ["--port", str(ports[r])]
            self.spawn(r, argv, env={"NO_PROXY": "*"})
        n_prefill = s.initial_prefill
        config = self.make_router_config(pd[:n_prefill], pd[n_prefill:], "gateway", s.threshold_min_tokens)
        self.router_config = RouterConfig.model_validate(config)
        models = [arg for name in s.served_models for arg in ("--model", name)]
        self.start_router("router", config, args=[*models, *s.router_args])
        if wait:
            self.wait_ready()

    def _engine(self, name: str, role: str, hardware: str, kv_advertise: int | None = None) -> EngineRef:
        s = self.spec
        port, kv = free_port(), free_port()
        advertise = ["--kv-advertise", f"127.0.0.1:{kv_advertise}"] if kv_advertise else []
        self.spawn(
            name,
            [*PRFAAS, "engine", "--role", role, "--hardware", hardware, "--port", str(port),
             "--kv-listen", f"127.0.0.1:{kv}", *advertise, "--engine-id", name, "--model-profile", s.model_profile,
             PROMPT_TOKENS_DETAILS_FLAG, "--time-scale", str(s.time_scale), "--byte-scale", str(s.byte_scale),
             "--kv-timeout", str(s.kv_lease_s)],
        )  # fmt: skip
        self.peer_urls[name] = self.urls[name] = f"http://127.0.0.1:{port}"
        self.kv_ports[name] = kv
        return EngineRef(name, self.urls[name])

    def _start_prfaas(self, i: int) -> EngineRef:
        """PrFaaS engine ``i`` and its link relay (its share of the link); the engine advertises the relay as
        its KV address, so that the KV crosses the shaped link."""
        s = self.spec
        relay, admin = free_port(), free_port()
        engine = self._engine(f"prfaas-{i}", "prefill", "H200", kv_advertise=relay)
        self.spawn(
            f"link-{i}",
            [*PRFAAS, "link", "--listen", f"127.0.0.1:{relay}", "--target", f"127.0.0.1:{self.kv_ports[engine.name]}",
             "--capacity-gbps", str(self.relay_gbps(s.egress_pacing)), "--rtt-ms", str(s.rtt_ms), "--name", LINK,
             "--metrics-port", str(admin), "--time-scale", str(s.time_scale), "--byte-scale", str(s.byte_scale)],
        )  # fmt: skip
        self.urls[f"link-{i}"] = f"http://127.0.0.1:{admin}"
        self.link_metric_urls.append(f"http://127.0.0.1:{admin}/metrics")
        return engine

    def _start_pd(self, i: int) -> EngineRef:
        """PD engine ``i`` (prefill for the first ``initial_prefill``, decode after)."""
        return self._engine(f"pd-{i}", "prefill" if i < self.spec.initial_prefill else "decode", "H20")

    # -- the link --------------------------------------------------------------------------------------------

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

    def set_gateway_link(self, gbps: float) -> None:
        """The gateway's configured link capacity becomes ``gbps``, as the routers' does (one InterDCLink: their
        views agree); the gateway reloads its file."""
        if (config := self.configs.get("gateway")) is not None and config.get("links"):
            self.write_config("gateway", {**config, "links": [{**k, "capacityGbps": gbps} for k in config["links"]]})

    def _set_relays(self) -> None:
        rate = self.relay_gbps(self.paced, self.link_gbps)
        for i in range(self.spec.n_prfaas):
            resp = httpx.post(f"{self.urls[f'link-{i}']}/admin/link", json={"capacity_gbps": rate}, timeout=5.0)
            resp.raise_for_status()

    # -- readiness -------------------------------------------------------------------------------------------

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

    def wait_ready(self, name: str | None = None, timeout_s: float | None = None) -> None:
        """Until router ``name`` answers ``/ready`` 200 with every engine it fronts healthy; without a name, until
        the router sees every PD engine healthy and the gateway ready, the gateway every PrFaaS instance ready.
        The deadline (default 90 s) stretches with the machine's load (a loaded 2-core machine starts ~12
        processes slowly) and only bounds a hang; what is still missing is printed every 10 s."""
        if timeout_s is None:
            timeout_s = min(600.0, 90.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
        started = time.monotonic()
        deadline, next_note = started + timeout_s, started + 10.0
        missing = "nothing answered yet"
        check = self._stack_ready if name is None else self._router_ready
        verify = ssl.create_default_context(cafile=str(self.tls_ca)) if self.tls_ca else True
        with httpx.Client(timeout=2.0, verify=verify) as client:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    missing = check(client, name or "router")
                    if not missing:
                        return
                except (httpx.HTTPError, KeyError, ValueError, AttributeError, TypeError) as exc:
                    missing = f"not answering ({exc.__class__.__name__})"
                if time.monotonic() >= next_note:
                    waited = time.monotonic() - started
                    print(f"stack: waiting {waited:.0f}/{timeout_s:.0f} s: {missing}", file=sys.stderr)
                    next_note += 10.0
                time.sleep(0.2)
        raise RuntimeError(
            f"{name or 'the stack'} was not ready after {timeout_s:.0f} s: {missing} (logs in {self.procs.log_dir})"
        )

    def _router_ready(self, client: httpx.Client, name: str) -> str:
        want = len(self.configs[name].get("endpoints", []))
        r = client.get(self.url(name) + "/ready")
        healthy = r.json().get("healthy_engines", 0)
        return "" if r.status_code == 200 and healthy >= want else f"{name} {r.status_code}, {healthy}/{want} healthy"

    def _stack_ready(self, client: httpx.Client, name: str) -> str:
        s = self.spec
        r = client.get(self.urls["router"] + "/ready")
        g = client.get(self.urls["gateway"] + "/status", headers=self.gateway_headers)
        body = r.json()
        healthy, ready = body.get("healthy_engines", 0), g.json().get("readyInstances", 0)
        # the router has seen the gateway ready (its own status poll), so the first long request may go remote
        remotes = set((body.get("remotes") or {}).values())
        if r.status_code == 200 and healthy == s.n_pd and ready == s.n_prfaas and remotes == {"ready"}:
            return ""
        return (
            f"router {r.status_code}, {healthy}/{s.n_pd} PD engines healthy, {ready}/{s.n_prfaas} PrFaaS "
            f"instances ready, remotes {sorted(remotes) or 'unknown'}"
        )


__all__ = ["LINK", "PRFAAS", "VLLM_SPEC", "VLLM_TOKEN", "Endpoint", "EngineRef", "LocalStack", "StackSpec"]
