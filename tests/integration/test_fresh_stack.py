"""A fresh stack's first request (issue 19): a router whose remote gateway has never answered its status poll
does not count it usable. Before, a status poll that failed was ridden over (two in a row) even when the
gateway had never answered: a fresh router, ready as soon as its local engines were, sent the first long
request to a gateway that was not listening yet (``scripts/edge_races.py first``: 2 of 13 fresh stacks' first
long request fell back after ``ClientConnectorError``; a 502 had the fallback failed too)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed_support import (
    BYTE_SCALE,
    PRFAAS,
    TIME_SCALE,
    free_port,
    http,
    metric_value,
    model_profile_json,
    processes,
    wait_for,
)


def test_a_remote_that_never_answered_its_status_poll_takes_no_request(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        ports = {n: free_port() for n in ("pdp", "pdd", "router", "dead")}
        scale = ["--time-scale", str(TIME_SCALE), "--byte-scale", str(BYTE_SCALE)]
        for name, role in (("pdp", "prefill"), ("pdd", "decode")):
            procs.start(name, [*PRFAAS, "engine", "--role", role, "--hardware", "H20", "--port", str(ports[name]),
                               "--kv-listen", f"127.0.0.1:{free_port()}", "--engine-id", name, *scale])  # fmt: skip
        dead = f"http://127.0.0.1:{ports['dead']}"  # a gateway that is not listening (yet)
        (tmp_path / "token").write_text("t\n")
        config = {
            "pdCluster": "pd-h20",
            "thresholdMinTokens": 19_634,
            "model": model_profile_json(),
            "endpoints": [
                {"name": "pd-0", "url": f"http://127.0.0.1:{ports['pdp']}", "role": "prefill"},
                {"name": "pd-1", "url": f"http://127.0.0.1:{ports['pdd']}", "role": "decode"},
            ],
            "remotes": [
                {
                    "name": "prfaas-h200",
                    "url": dead,
                    "statusUrl": dead + "/status",
                    "tokenFile": str(tmp_path / "token"),
                    "link": "a-to-b",
                }
            ],
            "links": [{"name": "a-to-b", "capacityGbps": 100}],
            "pdHardware": {"accelerator": "H20"},
            "prfaasHardware": {"accelerator": "H200"},
            "scale": {"timeScale": TIME_SCALE, "byteScale": BYTE_SCALE},
            # a slow refresh: what the router knows when the first request comes is its first polls' answers
            "routing": {"refreshIntervalSeconds": 60},
        }
        (tmp_path / "router.json").write_text(json.dumps(config))
        url = f"http://127.0.0.1:{ports['router']}"

        def ready() -> dict[str, object] | None:
            procs.check_alive()
            status, body = http("GET", url + "/ready", timeout_s=2)
            return body if status == 200 else None

        # the engines must answer the router's first probe: start it once they do
        for name in ("pdp", "pdd"):
            health = f"http://127.0.0.1:{ports[name]}/health"
            wait_for(lambda h=health: http("GET", h, timeout_s=2)[0] == 200, 60, f"{name}'s health")
        procs.start("router", [*PRFAAS, "router", "--config", str(tmp_path / "router.json"), "--port",
                               str(ports["router"])])  # fmt: skip
        body = wait_for(ready, 60, "the router's /ready")
        assert body["remotes"] == {
            "prfaas-h200": "status endpoint not answered yet (ConnectError: connection refused or host unreachable)"
        }, body
        status, answer = http("POST", url + "/v1/completions", {"model": "m", "prompt": [1] * 40_000, "max_tokens": 2})
        assert status == 200, answer
        _, metrics = http("GET", url + "/metrics")
        fallbacks = [line for line in metrics.splitlines() if line.startswith("prfaas_router_fallbacks_total{")]
        assert fallbacks and all(float(line.rsplit(" ", 1)[1]) == 0 for line in fallbacks)  # no remote leg tried
        assert metric_value(metrics, "prfaas_router_requests_total", {"route": "local"}) == 1.0
