"""Closed to abuse (issue 39, items 1-3), on real sockets, router and gateway apps in this process:

* replica books are served only by a router with peers, only with the replicas' token, and a book naming an
  instance outside the router's configuration, an oversized one, or one from a sender past the bound is refused,
  counted and logged (before: any router took books from anyone, and forged ones steered its routing);
* one source holding connections cannot lock others out: a client past its per-address budget is closed, and on the
  gateway connections without the token are held to their own small pool (the oldest pushed out) so the routers'
  authenticated connections keep their share; each token has its budget too (before: one client held them all);
* share loans go only to a gateway's configured peers, within the fraction and lease bounds (a 4xx naming the field),
  logged and counted (before: any token holder borrowed a peerless gateway's whole share for a day);
* a caller that goes away while its request waits for its link window frees that window at once (before: it stayed
  booked until it ran out).

Flooding sources are other loopback addresses (127.0.0.2, 127.0.0.3): the kernel routes all of 127/8 locally."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from aiohttp import web
from testbed_support import PRFAAS, await_for, free_port, metric_value, model_profile_json, prompt, serving

from prfaas_core import names
from prfaas_core.api import AdmissionDecline, RouterConfig
from prfaas_core.api.router_config import ScaleConfig
from prfaas_core.launch.emulation import ScaleSettings
from prfaas_core.policy.replica_books import MAX_BOOK_BYTES, MAX_PEER_REPLICAS
from prfaas_engine import EngineConfig
from prfaas_engine import create_app as engine_app
from prfaas_router.edge.app import HYGIENE, create_app
from prfaas_router.edge.hygiene import start_listener
from prfaas_router.state.peers import ReplicaPeers

TOKEN = "gw-s3cret"
PEERS_TOKEN = "books-s3cret"
NOWHERE = "http://127.0.0.1:9"
"""An address nothing answers on (the engines: these tests call the listeners only)."""


def router_config(**security: Any) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "pdCluster": "pd",
            "thresholdMinTokens": 1_000_000,
            "model": model_profile_json(),
            "endpoints": [
                {"name": "pd-0", "url": NOWHERE, "role": "prefill"},
                {"name": "pd-1", "url": NOWHERE, "role": "prefill"},
                {"name": "pd-2", "url": NOWHERE, "role": "decode"},
            ],
            "security": {"headerTimeoutSeconds": 30, **security},
        }
    )


def gateway_config(
    tmp: Path,
    admission: dict[str, Any] | None = None,
    engine: str = NOWHERE,
    capacity_gbps: float = 10.0,
    **security: Any,
) -> RouterConfig:
    (tmp / "gw-token").write_text(TOKEN + "\n")
    gateway: dict[str, Any] = {"prefillCluster": "prf", "tokenFile": str(tmp / "gw-token")}
    if admission is not None:
        gateway["admission"] = {"link": "a-to-b", **admission}
    return RouterConfig.model_validate(
        {
            "pdCluster": "prf",
            "mode": "gateway",
            "thresholdMinTokens": 0,
            "model": model_profile_json(),
            "endpoints": [{"name": "prf-0", "url": engine, "role": "prefill"}],
            "links": [{"name": "a-to-b", "capacityGbps": capacity_gbps}],
            "gateway": gateway,
            "security": {"headerTimeoutSeconds": 30, **security},
        }
    )


@asynccontextmanager
async def listening(app: web.Application) -> AsyncIterator[str]:
    port = free_port()
    runner, _ = await start_listener(app, app[HYGIENE], "127.0.0.1", port, None)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def metric(url: str, name: str, **labels: str) -> float:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        text = (await c.get(url + "/metrics", timeout=5)).text
    try:
        return metric_value(text, name, labels)
    except KeyError:
        return 0.0


def book(replica: str = "peer-1", **instances: float) -> dict[str, Any]:
    return {
        "replica": replica,
        "seq": 1,
        "instances": {n: {"inFlight": 9, "started": 9, "seconds": s} for n, s in instances.items()},
    }


# --- 1. replica books ---------------------------------------------------------------------------------------------
async def test_replica_books_need_peers_and_their_token_and_name_only_own_instances(tmp_path: Path) -> None:
    path = names.REPLICA_BOOKS_PATH
    # a router without peers serves no books path: a forged book changes nothing
    async with listening(create_app(router_config())) as url, httpx.AsyncClient() as c:
        forged = await c.put(url + path, json=book(**{"pd-0": 99.0}), timeout=5)
        assert forged.status_code in (404, 405), forged.text
        assert await metric(url, names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS, instance="pd-0") == 0
    # peers without the replicas' token: the router does not start (app and CLI), saying which flag
    with pytest.raises(ValueError, match="--peers-token-file"):
        create_app(router_config(), peers=ReplicaPeers((NOWHERE,)))
    (tmp_path / "router.json").write_text(router_config().model_dump_json(by_alias=True))
    cli = [*PRFAAS, "router", "--config", str(tmp_path / "router.json"), "--peers", NOWHERE]
    started = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert started.returncode == 2 and "--peers-token-file" in started.stderr, started.stderr
    assert "Traceback" not in started.stderr
    # with peers and the token: only the token's books, only naming this router's own prefill instances, bounded
    (tmp_path / "peers-token").write_text(PEERS_TOKEN + "\n")
    peers = ReplicaPeers((NOWHERE,), token_file=str(tmp_path / "peers-token"))
    good = {"Authorization": f"Bearer {PEERS_TOKEN}"}
    # the router's clock held still: a book heard expires after EXPIRY_S of it (3 s), and the 256 sends below took
    # longer than that on a loaded machine (the first senders' books expired: room for the one to be refused)
    app = create_app(router_config(), clock=lambda: 1_000.0, peers=peers)
    with structlog.testing.capture_logs() as logs:
        async with listening(app) as url, httpx.AsyncClient() as c:
            no_token = await c.put(url + path, json=book(**{"pd-0": 99.0}), timeout=5)
            assert no_token.status_code == 401
            outside = await c.put(url + path, json=book(**{"pd-0": 1.0, "evil": 99.0}), headers=good, timeout=5)
            assert outside.status_code == 422 and "instances.evil" in outside.text, outside.text
            decode = await c.put(url + path, json=book(**{"pd-2": 99.0}), headers=good, timeout=5)
            assert decode.status_code == 422  # a decode instance is no prefill target either
            big = json.dumps({**book(**{"pd-0": 1.0}), "pad": "x" * MAX_BOOK_BYTES}).encode()
            huge = await c.put(url + path, content=big, headers={**good, "Content-Type": "application/json"})
            assert huge.status_code == 413 and str(MAX_BOOK_BYTES) in huge.text
            assert await metric(url, names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS, instance="pd-0") == 0
            ok = await c.put(url + path, json=book(**{"pd-0": 2.5}), headers=good, timeout=5)
            assert ok.status_code == 204, ok.text
            assert await metric(url, names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS, instance="pd-0") == 2.5
            # at most MAX_PEER_REPLICAS senders are held: the next new one is refused
            statuses = [
                (await c.put(url + path, json=book(f"r-{k}", **{"pd-1": 0.0}), headers=good, timeout=5)).status_code
                for k in range(MAX_PEER_REPLICAS)
            ]
            assert statuses[: MAX_PEER_REPLICAS - 1] == [204] * (MAX_PEER_REPLICAS - 1) and statuses[-1] == 429
            rejected = names.METRIC_ROUTER_REPLICA_BOOKS_REJECTED
            counts = {r: await metric(url, rejected, reason=r) for r in names.BOOK_REJECTIONS}
            # its own peer answers nothing: said once in the log, however many sends fail
            sync = names.METRIC_ROUTER_REPLICA_SYNC

            async def failed_twice() -> bool:
                return await metric(url, sync, result="unreachable") >= 2

            await await_for(failed_twice, 10, "two sends to the unreachable peer")
    assert counts == {
        "unauthorized": 1, "malformed": 0, "too_large": 1, "unknown_instance": 2, "too_many_replicas": 1
    }  # fmt: skip
    gone = [e for e in logs if e["event"].startswith("router peer unreachable")]
    assert len(gone) == 1 and gone[0]["peer"] == NOWHERE and "ConnectError" in gone[0]["error"], gone
    refused = {e["reason"] for e in logs if e["event"] == "replica books refused"}
    assert refused == {"unauthorized", "unknown_instance", "too_large", "too_many_replicas"}


# --- 2. connection budgets ----------------------------------------------------------------------------------------
async def _flood(port: int, source: str, n: int) -> list[asyncio.StreamWriter]:
    """``n`` idle connections from ``source``, opened one after another (the listener may close any of them)."""
    held = []
    for _ in range(n):
        _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        held.append(writer)
    return held


async def _fresh_get(url: str, path: str, headers: dict[str, str] | None = None) -> int:
    """One request on a connection of its own."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, headers=headers) as c:
        return (await c.get(url + path, timeout=5)).status_code


async def test_one_source_cannot_take_every_connection_of_the_router(tmp_path: Path) -> None:
    app = create_app(router_config(maxConnections=60))  # a quarter of it per client: 15
    async with listening(app) as url:
        port = int(url.rsplit(":", 1)[1])
        held = await _flood(port, "127.0.0.2", 200)
        try:
            closed = names.METRIC_ROUTER_CONNECTIONS_CLOSED
            await await_for(
                lambda: metric(url, closed, reason="client_limit"), 10, "the flood past its budget to be closed"
            )
            assert [await _fresh_get(url, "/health") for _ in range(20)] == [200] * 20
            assert await metric(url, closed, reason="client_limit") == 200 - 15
            assert await metric(url, closed, reason="limit") == 0
        finally:
            for w in held:
                w.close()


async def test_a_gateway_flood_without_the_token_leaves_the_routers_share(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, maxConnections=64, maxUnauthenticatedConnections=16, maxConnectionsPerToken=8)
    app = create_app(config)
    async with listening(app) as url:
        port = int(url.rsplit(":", 1)[1])
        closed = names.METRIC_ROUTER_CONNECTIONS_CLOSED
        # two sources, 150 idle connections each, no token: 16 at most are held, each source's oldest pushed out
        held = await _flood(port, "127.0.0.2", 150) + await _flood(port, "127.0.0.3", 150)
        try:
            await await_for(lambda: metric(url, closed, reason="unauthenticated"), 10, "the oldest to be pushed out")
            # a router's status polls, each on a new connection, all answered; a caller without the token is not
            router = {"Authorization": f"Bearer {TOKEN}"}
            assert [await _fresh_get(url, "/status", router) for _ in range(20)] == [200] * 20
            assert await _fresh_get(url, "/status") == 401
            assert await metric(url, closed, reason="limit") == 0
            assert await metric(url, closed, reason="client_limit") == 2 * (150 - 16)
            # the token's own budget (8): a ninth connection held with it is refused 503 and closed
            budget = app[HYGIENE].budget
            await await_for(lambda: not budget.by_token, 10, "the earlier requests' connections to be gone")
            keep: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
            answers = []
            request = f"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
            for _ in range(9):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                answers.append((await reader.readuntil(b"\r\n")).decode())
                keep.append((reader, writer))
            assert all(" 200 " in a for a in answers[:8]) and " 503 " in answers[8], answers
            assert await keep[8][0].read() != b"" and await keep[8][0].read() == b""  # the rest, then closed
            for _, w in keep:
                w.close()
            await await_for(lambda: not budget.by_token, 10, "the token's connections to be gone")
            assert await metric(url, closed, reason="token_limit") == 1
        finally:
            for w in held:
                w.close()


# --- 3. share loans -----------------------------------------------------------------------------------------------
async def test_share_loans_only_to_configured_peers_within_bounds(tmp_path: Path) -> None:
    loans = names.LOANS_PATH.format(link="a-to-b")
    gw = {"Authorization": f"Bearer {TOKEN}"}
    grab = {"fraction": 1.0, "leaseS": 86_399, "replica": "thief", "heldAt": 1.7e9}

    def refusals(logs: list[dict[str, Any]]) -> list[str]:
        return [e["why"] for e in logs if e["event"] == "share loan refused"]

    # a gateway without peers (prfaas up's, a single replica) lends to nobody, even to a token holder
    with structlog.testing.capture_logs() as logs:
        async with listening(create_app(gateway_config(tmp_path, {}))) as url, httpx.AsyncClient(headers=gw) as c:
            r = await c.post(url + loans, json=grab, timeout=5)
            assert r.status_code == 403 and "gateway.admission.peers" in r.text, r.text
            assert await metric(url, names.METRIC_GATEWAY_LOANS, link="a-to-b", result="not_peer") == 1
    assert len(refusals(logs)) == 1
    # two replicas, the peer at 127.0.0.1: a caller elsewhere is refused; the peer only within the bounds
    admission = {"replicas": 2, "peers": ["http://127.0.0.1:9"], "loanMaxLeaseSeconds": 60}
    with structlog.testing.capture_logs() as logs:
        async with listening(create_app(gateway_config(tmp_path, admission))) as url:
            elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(headers=gw, transport=elsewhere) as c:
                r = await c.post(url + loans, json={**grab, "fraction": 0.1, "leaseS": 1}, timeout=5)
                assert r.status_code == 403 and "127.0.0.2" in r.text, r.text
            async with httpx.AsyncClient(headers=gw) as c:
                whole = await c.post(url + loans, json=grab, timeout=5)
                assert whole.status_code == 400 and "loanMaxFraction" in whole.text, whole.text
                day = await c.post(url + loans, json={**grab, "fraction": 0.5}, timeout=5)
                assert day.status_code == 400 and "leaseS" in day.text, day.text
                fair = await c.post(url + loans, json={**grab, "fraction": 0.5, "leaseS": 10}, timeout=5)
                assert fair.status_code == 200 and fair.json()["granted"] == 0.5, fair.text
                # the borrower asks again for the same held answer (the first answer was lost on the way): the lost
                # loan comes back first and the share is lent again (before: nothing was free until its lease ran out)
                again = await c.post(url + loans, json={**grab, "fraction": 0.5, "leaseS": 10}, timeout=5)
                assert again.status_code == 200 and again.json()["granted"] == 0.5, again.text
                lost = await c.delete(url + names.LOAN_PATH.format(link="a-to-b", loan_id=fair.json()["loanId"]))
                assert lost.status_code == 404
                back = await c.delete(url + names.LOAN_PATH.format(link="a-to-b", loan_id=again.json()["loanId"]))
                assert back.status_code == 200
            count = {
                r: await metric(url, names.METRIC_GATEWAY_LOANS, link="a-to-b", result=r)
                for r in ("not_peer", "over_bounds", "lent")
            }
    assert count == {"not_peer": 1, "over_bounds": 2, "lent": 2}
    assert len(refusals(logs)) == 3
    lent = [e for e in logs if e["event"] == "share loan"]
    assert len(lent) == 2 and all(e["granted"] == 0.5 and e["borrower"] == "thief" for e in lent)


def test_an_empty_gateway_token_file_is_a_clear_error(tmp_path: Path) -> None:
    """Issue 39 (small): it exited with a traceback."""
    config = gateway_config(tmp_path)
    (tmp_path / "gw-token").write_text("\n")
    (tmp_path / "gateway.json").write_text(config.model_dump_json(by_alias=True))
    cli = [*PRFAAS, "router", "--config", str(tmp_path / "gateway.json"), "--port", str(free_port())]
    started = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert started.returncode == 1, started.stderr
    assert "gateway.tokenFile" in started.stderr and "empty" in started.stderr and "Traceback" not in started.stderr


# --- 4. a gateway replica whose peer is hung or gone ----------------------------------------------------------------
@asynccontextmanager
async def hung_peer() -> AsyncIterator[str]:
    """A peer that takes the connection and the request, and never answers (a frozen process)."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for w in held:
            w.close()
        server.close()


@pytest.mark.parametrize("peer", ["hung", "refused"])
async def test_a_replica_whose_peer_is_hung_or_gone_serves_on_its_own_share(
    peer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas, an 8-Gbps ceiling, 5-Gbps pulls: each pull misses part of a replica's 4-Gbps share and must
    borrow it. With the peer hung (it takes the call, never answers) or gone (connection refused) every loan call
    fails; once they all failed for PEER_DOWN_S the replica serves on its own share as a replica without peers
    does, one pull at a time (before: every held answer waited for loans until its KV lease ran out, 429
    kv_lease). The loan calls keep their timeout (PEER_TIMEOUT_S) and failures are counted as unreachable."""
    from prfaas_core.api import GatewayAdmission, RouterLink
    from prfaas_core.names import GBPS_BITS
    from prfaas_core.policy import link_shares
    from prfaas_router.gateway.admission import LinkAdmission
    from prfaas_router.gateway.pulls import Booking, KvLeaseOver
    from prfaas_router.state import peers as peers_mod
    from prfaas_router.state.metrics import RouterMetrics

    monkeypatch.setattr(link_shares, "PEER_DOWN_S", 0.5)
    monkeypatch.setattr(peers_mod, "PEER_TIMEOUT_S", 0.3)
    async with hung_peer() as hung:
        url = hung if peer == "hung" else NOWHERE
        spec = GatewayAdmission.model_validate(
            {"link": "a-to-b", "replicas": 2, "pullGbps": 5.0, "peers": [url], "kvLeaseSeconds": 10.0}
        )
        metrics = RouterMetrics()
        adm = LinkAdmission(spec, RouterLink(name="a-to-b", capacity_gbps=10.0), 1.0, metrics, "me")
        adm.peers = peers_mod.PeerLoans([url], lambda: TOKEN.encode())
        nbytes = 5.0 * GBPS_BITS / 8.0 * 0.2  # 0.2 s at 5 Gbps
        start = time.monotonic()

        def clock() -> float:
            return time.monotonic() - start

        try:
            for i in range(2):
                booking = adm.decide(f"p{i}", {}, nbytes, 0.01, clock())
                assert isinstance(booking, Booking)
                await adm.hold(booking, clock)
                try:
                    key = await asyncio.wait_for(adm.release(booking, True, clock), 8.0)
                except KvLeaseOver as over:  # the old behaviour
                    pytest.fail(f"a held answer waited for a loan from a {peer} peer until {over}")
                assert key == f"p{i}" and adm.on_wire_gbps() == 5.0  # alone on the wire: never two at once
                assert adm.pulled(key)
                await await_for(lambda: adm.on_wire_gbps() == 0.0, 5, "the pull to leave the wire")
        finally:
            await adm.peers.aclose()
        unreachable = metrics.gateway_loans.labels("a-to-b", "unreachable")._value.get()
        assert unreachable >= 2, unreachable


# --- 5. a window whose caller went away while it waited -------------------------------------------------------------
async def test_a_caller_gone_while_its_request_waits_for_its_window_frees_it(tmp_path: Path) -> None:
    """A gateway whose link (1 Mbps, time-scaled 200x) is booked for ~40 s by a pull nobody reports: a second
    caller's leg is booked behind it and held for its window; the caller disconnects during the wait and the window is
    freed at once, so a third leg is offered the second's start again (before: the hold was outside the try that frees
    a booking, and the cancelled hold left its window booked until it ran out, ~40 s more)."""
    scale = 200.0
    gw = {"Authorization": f"Bearer {TOKEN}"}
    leg = {"model": "m", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}

    def body(tokens: int) -> dict[str, Any]:
        return {**leg, "prompt": prompt(tokens)}

    engine = engine_app(EngineConfig(role="prefill", port=0, scale=ScaleSettings(time_scale=scale)))
    async with serving(engine) as engine_url:
        config = gateway_config(tmp_path, {}, engine=engine_url, capacity_gbps=0.001)
        app = create_app(config.model_copy(update={"scale": ScaleConfig(time_scale=scale)}))
        async with listening(app) as url, httpx.AsyncClient(base_url=url, headers=gw, timeout=10) as c:

            async def engine_ready() -> bool:
                return (await c.get("/status")).json()["readyInstances"] == 1

            await await_for(engine_ready, 10, "the gateway to see its PrFaaS engine healthy")
            first = await c.post("/v1/completions", json=body(40_000))  # its pull on the wire, never reported
            assert first.status_code == 200, first.text

            async def earliest_start() -> float | None:
                """A leg accepting no wait is declined with its earliest start: as model time (the test's clock
                scaled as the gateway's), None once the link is free (it was then booked)."""
                sent = time.monotonic() * scale
                r = await c.post("/v1/completions", json=body(40_000), headers={names.HEADER_MAX_WAIT_MS: "0"})
                if r.status_code == 200:
                    return None
                assert r.status_code == 429, r.text
                decline = AdmissionDecline.model_validate(r.json())
                assert decline.reason == "link_window" and decline.earliest_start_ms is not None, r.text
                return sent + decline.earliest_start_ms / 1000.0

            behind_first = await earliest_start()
            assert behind_first is not None and behind_first - time.monotonic() * scale > 1_000  # model s booked
            # the second caller's long leg, on its own connection: booked behind the first, held for its window
            port = int(url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                payload = json.dumps(body(40_000)).encode()
                writer.write(
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()

                async def second_booked() -> bool:
                    return await metric(url, names.METRIC_GATEWAY_ADMISSIONS, link="a-to-b", result="booked") == 2

                await await_for(second_booked, 10, "the second leg to be booked")
                behind_second = await earliest_start()
                assert behind_second is not None
                second_span = behind_second - behind_first
                assert second_span > 1_000, (behind_first, behind_second)  # the third is offered the second's end
                assert not reader.at_eof()  # still held, no answer yet
                writer.close()  # the second caller goes away during its wait
                await writer.wait_closed()

                async def freed() -> bool:
                    start = await earliest_start()
                    assert start is not None, "the link came free by time alone: the test's windows are too short"
                    return start < behind_first + second_span / 2

                await await_for(freed, 10, "the third leg to be offered the second's start again (its window freed)")
            finally:
                writer.close()
            done = names.PULL_DONE_PATH.format(pull_id=first.headers[names.HEADER_PULL_ID])
            assert (await c.post(done)).status_code == 200
