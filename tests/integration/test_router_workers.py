"""``prfaas router --workers 2``: two router processes on one port, as real processes on real sockets in front of
emulated engines. One scrape reads both workers' series (requests summed, the workers gauge 2); each worker hears
its sibling's books: while a long local prefill holds one instance, short requests on fresh connections — the kernel
spreads them over both workers — all prefill on the idle one; SIGTERM stops the whole router (exit 0); a worker
that dies takes the router down with it (exit 1, the pod restarts whole); a gateway and ``--workers 0`` are usage
errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from testbed_support import PRFAAS, counter, free_port, http, model_profile_json, processes, prompt, wait_for

from prfaas_cli.main import main
from prfaas_core import names
from prfaas_core.launch.vllm import PROMPT_TOKENS_DETAILS_FLAG

LONG, SHORT = 60_000, 2_000


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def start_router(procs: Any, tmp_path: Path, engines: dict[str, tuple[int, int]]) -> tuple[str, subprocess.Popen[Any]]:
    config = {
        "pdCluster": "pd-h20",
        "thresholdMinTokens": 1_000_000,  # nothing goes remote: there is no remote
        "model": model_profile_json(),
        "endpoints": [
            {"name": n, "url": f"http://127.0.0.1:{p}", "role": "decode" if n == "pd-2" else "prefill"}
            for n, (p, _) in engines.items()
        ],
        "pdHardware": {"accelerator": "H20"},
        "routing": {"refreshIntervalSeconds": 0.2},
    }
    (tmp_path / "router.json").write_text(json.dumps(config))
    port = free_port()
    argv = [*PRFAAS, "router", "--config", str(tmp_path / "router.json"), "--port", str(port), "--workers", "2"]
    return f"http://127.0.0.1:{port}", procs.start("router", argv)


def start_engines(procs: Any) -> dict[str, tuple[int, int]]:
    engines = {n: (free_port(), free_port()) for n in ("pd-0", "pd-1", "pd-2")}
    for n, (port, kv) in engines.items():
        role = "decode" if n == "pd-2" else "prefill"
        argv = [*PRFAAS, "engine", "--role", role, "--hardware", "H20", "--port", str(port)]
        procs.start(n, [*argv, "--kv-listen", f"127.0.0.1:{kv}", "--engine-id", n, PROMPT_TOKENS_DETAILS_FLAG])
    return engines


def wait_ready(router: str, procs: Any) -> None:
    def ready() -> bool:
        procs.check_alive()
        return (
            http("GET", router + "/ready", timeout_s=2)[0] == 200
            and counter(router, names.METRIC_ROUTER_WORKERS) == 2
            and counter(router, names.METRIC_ROUTER_REPLICA_PEERS) == 1
        )

    wait_for(ready, 120, "two workers ready, each hearing the other's books")


def test_workers_share_one_port_their_books_and_their_metrics(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        engines = start_engines(procs)
        router, parent = start_router(procs, tmp_path, engines)
        wait_ready(router, procs)
        before = counter(router, names.METRIC_ROUTER_REQUESTS, outcome="ok", route="local")
        for _ in range(20):  # each on a connection of its own: the kernel spreads them over the workers
            status, body = http("POST", router + "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 1}, 30)
            assert status == 200, body
        # one scrape, whichever worker answers it, counts every worker's requests
        assert counter(router, names.METRIC_ROUTER_REQUESTS, outcome="ok", route="local") == before + 20
        answers: list[int] = []
        long = threading.Thread(
            target=lambda: answers.append(
                http("POST", router + "/v1/completions", {"model": "m", "prompt": prompt(LONG), "max_tokens": 2}, 60)[0]
            )
        )
        long.start()

        def sibling_heard() -> str | None:  # a worker's own prefills are not its peers': only the sibling's book
            procs.check_alive()
            busy = [
                n
                for n in ("pd-0", "pd-1")
                if counter(router, names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS, instance=n) > 0
            ]
            return busy[0] if busy else None

        busy = wait_for(sibling_heard, 30, "the other worker to hear the long local prefill")
        idle = "pd-1" if busy == "pd-0" else "pd-0"
        tokens = {n: counter(f"http://127.0.0.1:{engines[n][0]}", names.VLLM_PROMPT_TOKENS) for n in ("pd-0", "pd-1")}
        for _ in range(6):  # whichever worker takes each, it counts the long prefill on the busy instance
            status, body = http(
                "POST", router + "/v1/completions", {"model": "m", "prompt": prompt(SHORT), "max_tokens": 2}, 60
            )
            assert status == 200, body
        after = {n: counter(f"http://127.0.0.1:{engines[n][0]}", names.VLLM_PROMPT_TOKENS) for n in ("pd-0", "pd-1")}
        assert after[busy] == tokens[busy], (busy, tokens, after)
        assert after[idle] - tokens[idle] >= 6 * SHORT, (busy, tokens, after)
        long.join(60)
        assert answers == [200]
        workers = children(parent.pid)
        assert len(workers) == 2, workers
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 0
        wait_for(lambda: not any(alive(w) for w in workers), 10, "both workers to stop with the router")


def test_a_worker_that_dies_takes_the_router_down(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:  # no engine needed: the workers serve /metrics (not /ready) without one
        router, parent = start_router(procs, tmp_path, {n: (free_port(), 0) for n in ("pd-0", "pd-1", "pd-2")})

        def both_up() -> bool:
            procs.check_alive()
            return counter(router, names.METRIC_ROUTER_WORKERS) == 2

        wait_for(both_up, 120, "two workers serving")
        first, second = children(parent.pid)
        os.kill(first, signal.SIGKILL)
        assert parent.wait(30) == 1  # the pod restarts whole rather than serve on with half its workers
        wait_for(lambda: not alive(second), 10, "the surviving worker to stop")


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_workers_count_is_checked(capsys: pytest.CaptureFixture[str], tmp_path: Path, workers: str) -> None:
    (tmp_path / "r.json").write_text(json.dumps({"pdCluster": "pd", "endpoints": []}))
    assert main(["router", "--config", str(tmp_path / "r.json"), "--workers", workers]) == 2
    assert f"--workers wants a count of 1 or more, got {workers}" in capsys.readouterr().err


def test_a_gateway_refuses_workers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = {
        "pdCluster": "prfaas-h200",
        "mode": "gateway",
        "thresholdMinTokens": 0,
        "model": model_profile_json(),
        "endpoints": [{"name": "prf-0", "url": "http://127.0.0.1:9", "role": "prefill"}],
        "gateway": {"prefillCluster": "prfaas-h200"},
    }
    (tmp_path / "g.json").write_text(json.dumps(config))
    argv = ["router", "--config", str(tmp_path / "g.json"), "--workers", "2", "--allow-insecure-gateway"]
    assert main(argv) == 2  # refused before any process starts
    assert "a gateway (mode: gateway) runs as one process" in capsys.readouterr().err
