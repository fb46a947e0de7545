"""A two-datacenter stack for the router's integration tests, as real processes on 127.0.0.1: a PrFaaS
engine (H200) behind the prefill gateway, the link emulator between its KV server and region B, a PD prefill
and a PD decode engine (H20), and the router. Time-scaled so long prompts take milliseconds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed_support import PRFAAS, Processes, free_port, http, wait_for

from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.launch.engines import PROMPT_TOKENS_DETAILS_FLAG

TIME_SCALE = 200.0
TOKEN = "s3cret-token"
GATEWAY_AUTH = {"Authorization": f"Bearer {TOKEN}"}
BYTE_SCALE = 1e-3


def model_profile_json() -> dict[str, Any]:
    spec = builtin_model_profiles()["internal-1t"]
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass
class Stack:
    procs: Processes
    dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    router_config: dict[str, Any] = field(default_factory=dict)
    tls_ca: Path | None = None
    """With TLS: the certificate the gateway replicas serve (self-signed: its own CA)."""

    def url(self, name: str) -> str:
        scheme = "https" if self.tls_ca is not None and name.startswith("gateway") else "http"
        return f"{scheme}://127.0.0.1:{self.ports[name]}"

    @property
    def router(self) -> str:
        return self.url("router")

    def write_router_config(self, **changes: Any) -> None:
        self.router_config.update(changes)
        tmp = self.dir / "router.json.tmp"
        tmp.write_text(json.dumps(self.router_config))
        tmp.replace(self.dir / "router.json")  # atomic, like kubelet's symlink swap


def start_stack(
    procs: Processes,
    tmp: Path,
    threshold_min_tokens: int = 19_634,
    gateway_admission: dict[str, Any] | None = None,
    gateway_extra: dict[str, Any] | None = None,
    wait_ready: bool = True,
    link_gbps: float = 100.0,
    gateway_replicas: int = 1,
    gateway_tls: tuple[Path, Path] | None = None,
    router_args: Sequence[str] = (),
    router_cmd: Sequence[str] = tuple(PRFAAS),
    **router_extra: Any,
) -> Stack:
    """``gateway_admission``: the gateway's ``gateway.admission`` block plus ``capacityGbps`` of its link;
    ``gateway_extra``: more top-level fields of the gateway's config; ``wait_ready=False``: return as soon as
    the processes are started (the caller waits for what it needs); ``link_gbps``: the link emulator's capacity
    (and the routers' configured one); ``gateway_replicas`` > 1: the admission's ``replicas`` and ``peers`` name
    them all (ports ``gateway``, ``gateway-2``, ...), and the stack starts them all; ``gateway_tls``: (certificate,
    key) the gateways serve, which the router's remote and the replicas' peers verify (``caFile``, ``peerCaFile``);
    ``router_args``: more command-line arguments of the router (``--peers``); ``router_cmd``: how the router and
    the gateways are run (``prfaas`` from an image: tests/integration/test_image.py)."""
    replicas = ["gateway", *(f"gateway-{k}" for k in range(2, gateway_replicas + 1))]
    names = ("prf", "prf_kv", "link", "link_admin", "pdp", "pdp_kv", "pdd", "pdd_kv", *replicas, "router")
    st = Stack(procs, tmp, {n: free_port() for n in names}, tls_ca=gateway_tls[0] if gateway_tls else None)
    p = st.ports
    scale = ["--time-scale", str(TIME_SCALE), "--byte-scale", str(BYTE_SCALE)]
    (tmp / "token").write_text(TOKEN + "\n")
    procs.start(
        "prf",
        [
            *PRFAAS,
            "engine",
            "--role",
            "prefill",
            "--hardware",
            "H200",
            "--port",
            str(p["prf"]),
            "--kv-listen",
            f"127.0.0.1:{p['prf_kv']}",
            "--kv-advertise",
            f"127.0.0.1:{p['link']}",
            "--engine-id",
            "prf-0",
            PROMPT_TOKENS_DETAILS_FLAG,
            *scale,
        ],
    )
    procs.start(
        "link",
        [
            *PRFAAS,
            "link",
            "--listen",
            f"127.0.0.1:{p['link']}",
            "--target",
            f"127.0.0.1:{p['prf_kv']}",
            "--capacity-gbps",
            str(link_gbps),
            "--name",
            "a-to-b",
            "--metrics-port",
            str(p["link_admin"]),
            *scale,
        ],
    )
    procs.start(
        "pdp",
        [
            *PRFAAS,
            "engine",
            "--role",
            "prefill",
            "--hardware",
            "H20",
            "--port",
            str(p["pdp"]),
            "--kv-listen",
            f"127.0.0.1:{p['pdp_kv']}",
            "--engine-id",
            "pd-0",
            PROMPT_TOKENS_DETAILS_FLAG,
            *scale,
        ],
    )
    procs.start(
        "pdd",
        [
            *PRFAAS,
            "engine",
            "--role",
            "decode",
            "--hardware",
            "H20",
            "--port",
            str(p["pdd"]),
            "--kv-listen",
            f"127.0.0.1:{p['pdd_kv']}",
            "--engine-id",
            "pd-1",
            PROMPT_TOKENS_DETAILS_FLAG,
            *scale,
        ],
    )
    model = model_profile_json()
    scale_cfg = {"timeScale": TIME_SCALE, "byteScale": BYTE_SCALE}
    gateway = {
        "pdCluster": "prfaas-h200",
        "mode": "gateway",
        "thresholdMinTokens": 0,
        "model": model,
        "endpoints": [{"name": "prf-0", "url": st.url("prf"), "role": "prefill"}],
        "gateway": {"prefillCluster": "prfaas-h200", "tokenFile": str(tmp / "token")},
        "prfaasHardware": {"accelerator": "H200"},
        "scale": scale_cfg,
    }
    if gateway_tls is not None:
        gateway["gateway"].update(tlsCertFile=str(gateway_tls[0]), tlsKeyFile=str(gateway_tls[1]))  # type: ignore[attr-defined]
    if gateway_admission is not None:
        adm = dict(gateway_admission)
        gateway["links"] = [{"name": "a-to-b", "capacityGbps": adm.pop("capacityGbps")}]
        gateway["gateway"]["admission"] = {"link": "a-to-b", **adm}  # type: ignore[index]
        if gateway_replicas > 1:
            peers: dict[str, Any] = {"replicas": gateway_replicas, "peers": [st.url(r) for r in replicas]}
            if gateway_tls is not None:
                peers["peerCaFile"] = str(gateway_tls[0])
            gateway["gateway"]["admission"].update(peers)  # type: ignore[index]
    gateway.update(gateway_extra or {})
    (tmp / "gateway.json").write_text(json.dumps(gateway))
    st.router_config = {
        "pdCluster": "pd-h20",
        "thresholdMinTokens": threshold_min_tokens,
        "model": model,
        "endpoints": [
            {"name": "pd-0", "url": st.url("pdp"), "role": "prefill"},
            {"name": "pd-1", "url": st.url("pdd"), "role": "decode"},
        ],
        "remotes": [
            {
                "name": "prfaas-h200",
                "url": st.url("gateway"),
                "statusUrl": st.url("gateway") + "/status",
                "tokenFile": str(tmp / "token"),
                "link": "a-to-b",
                "timeoutSeconds": 10,
                **({"caFile": str(gateway_tls[0])} if gateway_tls is not None else {}),
            }
        ],
        "links": [{"name": "a-to-b", "capacityGbps": link_gbps, "metricsUrl": st.url("link_admin") + "/metrics"}],
        "pdHardware": {"accelerator": "H20"},
        "prfaasHardware": {"accelerator": "H200"},
        "scale": scale_cfg,
        "routing": {"refreshIntervalSeconds": 0.2, "breakerOpenSeconds": 2},
        "slo": {},  # a PDCluster's default slo, as the operator copies it
        **router_extra,
    }
    st.write_router_config()
    for r in replicas:
        procs.start(r, [*router_cmd, "router", "--config", str(tmp / "gateway.json"), "--port", str(p[r])])
    router = [*router_cmd, "router", "--config", str(tmp / "router.json"), "--port", str(p["router"]), *router_args]
    procs.start("router", router)
    if not wait_ready:
        return st

    def ready() -> bool:
        procs.check_alive()
        status, body = http("GET", st.router + "/ready", timeout_s=2)
        gw_status, gw = http("GET", st.url("gateway") + "/status", timeout_s=2, headers=GATEWAY_AUTH, ca_file=st.tls_ca)
        if not (status == 200 and body.get("healthy_engines") == 2 and gw_status == 200):
            return False
        # the gateway has its engine, and the router has seen that (its own status poll), so the first long
        # request may go remote
        return bool(gw["readyInstances"] == 1 and body.get("remotes") and set(body["remotes"].values()) == {"ready"})

    wait_for(ready, 180, "the router stack to be ready")  # only bounds a hang: a loaded machine starts slowly
    return st
