"""Two router replicas in front of one PD cluster share their PD prefill books over HTTP (``prfaas router
--peers``), as real processes on real sockets, with emulated engines: a replica that has never prefilled anything
itself sees the long prefill its peer just sent to one instance and sends its own request to the other, idle one
(without the books it would take the busy instance for idle: the engine's scraped count of another replica's work
is worth the replica's own mean prefill time, 0 before its first); a replica that lists itself recognises itself;
books without the replicas' shared token are refused (401) and change nothing; one that stops is forgotten by the
other within the books' expiry."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

from testbed_support import PRFAAS, counter, free_port, http, model_profile_json, processes, prompt, wait_for

from prfaas_core import names
from prfaas_core.launch.vllm import PROMPT_TOKENS_DETAILS_FLAG
from prfaas_core.policy.replica_books import EXPIRY_S

TIME_SCALE = 1.0
"""Model seconds per wall second: the long prefill (60K tokens on an H20, ~9 model s) stays in flight ~9 wall s
while the test routes its second request (milliseconds)."""
LONG, SHORT = 60_000, 2_000


def engine(procs: Any, name: str, role: str, port: int, kv_port: int) -> None:
    argv = [*PRFAAS, "engine", "--role", role, "--hardware", "H20", "--port", str(port)]
    argv += ["--kv-listen", f"127.0.0.1:{kv_port}", "--engine-id", name, PROMPT_TOKENS_DETAILS_FLAG]
    procs.start(name, [*argv, "--time-scale", str(TIME_SCALE)])


def test_router_replicas_see_each_others_local_prefills(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        engines = {n: (free_port(), free_port()) for n in ("pd-0", "pd-1", "pd-2")}
        for n, (port, kv) in engines.items():
            engine(procs, n, "decode" if n == "pd-2" else "prefill", port, kv)
        config = {
            "pdCluster": "pd-h20",
            "thresholdMinTokens": 1_000_000,  # nothing goes remote: there is no remote
            "model": model_profile_json(),
            "endpoints": [
                {"name": n, "url": f"http://127.0.0.1:{p}", "role": "decode" if n == "pd-2" else "prefill"}
                for n, (p, _) in engines.items()
            ],
            "pdHardware": {"accelerator": "H20"},
            "scale": {"timeScale": TIME_SCALE},
            "routing": {"refreshIntervalSeconds": 0.2},
        }
        (tmp_path / "router.json").write_text(json.dumps(config))
        ports = [free_port(), free_port()]
        routers = [f"http://127.0.0.1:{p}" for p in ports]
        (tmp_path / "peers-token").write_text("replica-s3cret\n")
        # each lists both (it recognises itself); they share a token
        peers = ["--peers", ",".join(routers), "--peers-token-file", str(tmp_path / "peers-token")]
        started = [
            procs.start(
                f"router-{i}", [*PRFAAS, "router", "--config", str(tmp_path / "router.json"), "--port", str(p), *peers]
            )
            for i, p in enumerate(ports)
        ]
        a, b = routers

        def ready() -> bool:
            procs.check_alive()
            return all(
                http("GET", r + "/ready", timeout_s=2)[0] == 200
                and counter(r, names.METRIC_ROUTER_REPLICA_PEERS) == 1
                and counter(r, names.METRIC_ROUTER_REPLICA_SYNC, result="self") >= 1
                for r in routers
            )

        wait_for(ready, 120, "two routers ready, each hearing the other and recognising itself")
        # books from anyone else (the path shares the clients' port) are refused, whatever they claim
        forged = {"replica": "intruder", "seq": 1, "instances": {"pd-0": {"inFlight": 9, "started": 9, "seconds": 99}}}
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic replica-s3cret"}):
            status, out = http("PUT", a + names.REPLICA_BOOKS_PATH, forged, timeout_s=5, headers=auth)
            assert status == 401 and "peers-token-file" in json.dumps(out), (auth, status, out)
        # the intruder was not heard: no third replica, none of its 99 s on pd-0
        assert counter(a, names.METRIC_ROUTER_REPLICA_PEERS) <= 1
        assert counter(a, names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS, instance="pd-0") == 0
        assert all(counter(r, names.METRIC_ROUTER_REPLICA_SYNC, result="unauthorized") == 0 for r in routers)
        answers: list[int] = []
        long = threading.Thread(
            target=lambda: answers.append(
                http("POST", a + "/v1/completions", {"model": "m", "prompt": prompt(LONG), "max_tokens": 2}, 60)[0]
            )
        )
        long.start()

        def peer_seconds(router: str, instance: str) -> float:
            return counter(router, names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS, instance=instance)

        def b_hears_a_prefilling() -> str | None:
            procs.check_alive()
            busy = [n for n in ("pd-0", "pd-1") if peer_seconds(b, n) > 0]
            return busy[0] if busy else None

        busy = wait_for(b_hears_a_prefilling, 30, "router B to hear router A's local prefill")
        idle = "pd-1" if busy == "pd-0" else "pd-0"
        assert peer_seconds(a, busy) == 0  # A's own: not a peer's
        before = {n: counter(f"http://127.0.0.1:{engines[n][0]}", names.VLLM_PROMPT_TOKENS) for n in ("pd-0", "pd-1")}
        status, body = http("POST", b + "/v1/completions", {"model": "m", "prompt": prompt(SHORT), "max_tokens": 2}, 60)
        assert status == 200, body
        after = {n: counter(f"http://127.0.0.1:{engines[n][0]}", names.VLLM_PROMPT_TOKENS) for n in ("pd-0", "pd-1")}
        assert after[idle] - before[idle] >= SHORT, (busy, before, after)  # B prefilled on the idle instance
        assert after[busy] == before[busy], (busy, before, after)
        long.join(60)
        assert answers == [200]
        # A's books emptied when its prefill ended: B no longer counts anything there
        wait_for(
            lambda: peer_seconds(b, busy) == 0,
            30,
            "router B to hear that router A's prefill ended",
        )
        # A stops: B forgets it within the expiry (its engines' counts stand for it again)
        started[0].send_signal(signal.SIGTERM)
        started[0].wait(10)
        wait_for(
            lambda: counter(b, names.METRIC_ROUTER_REPLICA_PEERS) == 0,
            EXPIRY_S * 10,
            "router B to forget the stopped router A",
        )
        assert counter(b, names.METRIC_ROUTER_REPLICA_SYNC, result="unreachable") >= 1


async def test_a_burst_of_changes_goes_in_few_rounds_and_dns_finds_the_peers(tmp_path: Path) -> None:
    """Over real sockets, in one process: a peer found by ``--peers-dns localhost:PORT`` gets this replica's books;
    200 prefills starting and ending 2 ms apart go in a bounded number of rounds (one body per round, rounds
    MIN_ROUND_S apart: not a PUT per change), and the last body is the final state."""
    import asyncio

    from aiohttp import web
    from testbed_support import await_for, serving

    from prfaas_core.api import ReplicaBooksWire, RouterConfig
    from prfaas_router.state.config import compile_config
    from prfaas_router.state.metrics import RouterMetrics
    from prfaas_router.state.peers import MIN_ROUND_S, ReplicaPeers, ReplicaSync
    from prfaas_router.state.runtime import Runtime

    bodies: list[ReplicaBooksWire] = []

    async def receive(request: web.Request) -> web.Response:
        assert request.headers.get("Authorization") == "Bearer tok-1"  # the shared token, stripped
        bodies.append(ReplicaBooksWire.model_validate_json(await request.read()))
        return web.Response(status=204)

    peer = web.Application()
    peer.router.add_put(names.REPLICA_BOOKS_PATH, receive)
    async with serving(peer) as url:
        port = int(url.rsplit(":", 1)[1])
        roles = {"pd-0": "prefill", "pd-1": "prefill", "pd-2": "decode"}
        doc = {
            "pdCluster": "pd",
            "thresholdMinTokens": 1_000_000,
            "model": model_profile_json(),
            "endpoints": [{"name": n, "url": f"http://{n}", "role": r} for n, r in roles.items()],
        }
        rt = Runtime(compile_config(RouterConfig.model_validate(doc)))
        token = tmp_path / "token"
        token.write_text("tok-1\n")
        sync = ReplicaSync(rt, RouterMetrics(), ReplicaPeers(dns=("localhost", port), token_file=str(token)))
        stop = asyncio.Event()
        task = asyncio.create_task(sync.run(stop))
        try:
            await await_for(lambda: bodies, 10, "the first heartbeat to reach the peer found by DNS")
            first = len(bodies)
            loop = asyncio.get_running_loop()
            started = loop.time()
            for k in range(200):
                with rt.prefill_queued(f"pd-{k % 2}", 1.0):
                    await asyncio.sleep(0.002)  # a change every 2 ms: time enough for a round after each
            burst_s = loop.time() - started
            await await_for(
                lambda: bodies and bodies[-1].seq == rt.own_book().seq, 10, "the final books to reach the peer"
            )
            rounds = len(bodies) - first
            assert 1 <= rounds <= burst_s / MIN_ROUND_S + 3, (rounds, burst_s)  # not 1000 PUTs
            final = bodies[-1].instances
            assert {n: (i.in_flight, i.started, i.seconds) for n, i in final.items()} == {
                "pd-0": (0, 100, 0.0),
                "pd-1": (0, 100, 0.0),
            }
        finally:
            stop.set()
            await task
            await sync.aclose()
