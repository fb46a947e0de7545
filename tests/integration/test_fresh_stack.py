"""A fresh stack's first request (issue 19): a router whose remote gateway has never answered its status poll
does not count it usable. Before, a status poll that failed was ridden over (two in a row) even when the
gateway had never answered: a fresh router, ready as soon as its local engines were, sent the first long
request to a gateway that was not listening yet (``scripts/edge_races.py first``: 1 of 11 fresh stacks'
first long request fell back after ``ClientConnectorError``; a 502 when the fallback failed too)."""

from __future__ import annotations

import json
from pathlib import Path

from router_stack import start_stack
from testbed_support import PRFAAS, free_port, http, metric_value, processes, wait_for


def test_a_remote_that_never_answered_its_status_poll_takes_no_request(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        st = start_stack(procs, tmp_path)
        dead = f"http://127.0.0.1:{free_port()}"  # a gateway that is not listening (yet)
        config = json.loads(json.dumps(st.router_config))
        config["remotes"][0].update(url=dead, statusUrl=dead + "/status")
        # one refresh before the first request: the first poll's failure is all the router knows
        config["routing"] = {**config["routing"], "refreshIntervalSeconds": 60}
        (tmp_path / "fresh.json").write_text(json.dumps(config))
        port = free_port()
        procs.start("fresh", [*PRFAAS, "router", "--config", str(tmp_path / "fresh.json"), "--port", str(port)])
        url = f"http://127.0.0.1:{port}"

        def ready() -> dict[str, object] | None:
            procs.check_alive()
            status, body = http("GET", url + "/ready", timeout_s=2)
            return body if status == 200 else None

        body = wait_for(ready, 60, "the fresh router's /ready")
        assert body["remotes"] == {"prfaas-h200": "status endpoint not answered yet (ConnectError)"}, body
        status, answer = http("POST", url + "/v1/completions", {"model": "m", "prompt": [1] * 40_000, "max_tokens": 2})
        assert status == 200, answer
        _, metrics = http("GET", url + "/metrics")
        assert "prfaas_router_fallbacks_total{" not in metrics  # no remote leg was tried
        assert metric_value(metrics, "prfaas_router_requests_total", {"route": "local"}) == 1.0
