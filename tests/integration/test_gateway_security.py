"""The gateway's edge as a real process (``prfaas router`` in gateway mode) in front of a real emulated PrFaaS
engine: secure by default, the token on every path but health/readiness, auth failures counted and never
logged with the secret, the forwarding allow-list, and live rotation of the token and the TLS certificate."""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from testbed_support import PRFAAS, Processes, free_port, metric_value, model_profile_json, processes, wait_for

TOKEN, NEW_TOKEN = "first-s3cret", "second-s3cret"
LEG = {"model": "m", "prompt": "hello there", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def self_signed(dir: Path, name: str) -> tuple[Path, Path]:
    cert, key = dir / f"{name}.crt", dir / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@dataclass
class Gw:
    procs: Processes
    dir: Path
    url: str

    def metric(self, name: str, token: str = NEW_TOKEN, verify: object = False, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", headers=auth(token), verify=verify, timeout=5).text  # type: ignore[arg-type]
        try:
            return metric_value(text, name, labels)
        except KeyError:
            return 0.0


def gateway_config(dir: Path, engine_url: str, **gateway: object) -> Path:
    config = {
        "pdCluster": "prfaas-h200",
        "mode": "gateway",
        "thresholdMinTokens": 0,
        "model": model_profile_json(),
        "endpoints": [{"name": "prf-0", "url": engine_url, "role": "prefill"}],
        "gateway": {"prefillCluster": "prfaas-h200", **gateway},
        "prfaasHardware": {"accelerator": "H200"},
        "scale": {"timeScale": 200.0, "byteScale": 1e-3},
        "security": {"credentialPollSeconds": 0.1, "tokenOverlapSeconds": 0},
    }
    path = dir / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def start_engine(procs: Processes) -> str:
    port = free_port()
    procs.start(
        "prf",
        [*PRFAAS, "engine", "--role", "prefill", "--hardware", "H200", "--port", str(port),
         "--kv-listen", f"127.0.0.1:{free_port()}", "--time-scale", "200", "--byte-scale", "0.001"],
    )  # fmt: skip
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gw]:
    """A TLS gateway whose token and certificate files the tests rotate in place."""
    tmp = tmp_path_factory.mktemp("gateway-edge")
    cert, key = self_signed(tmp, "a")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "tls.crt").write_bytes(cert.read_bytes())
    (tmp / "tls.key").write_bytes(key.read_bytes())
    with processes(tmp) as procs:
        engine = start_engine(procs)
        config = gateway_config(
            tmp, engine, tokenFile=str(tmp / "token"), tlsCertFile=str(tmp / "tls.crt"), tlsKeyFile=str(tmp / "tls.key")
        )
        port = free_port()
        procs.start("gateway", [*PRFAAS, "router", "--config", str(config), "--port", str(port)])
        g = Gw(procs, tmp, f"https://127.0.0.1:{port}")

        def ready() -> bool:
            procs.check_alive()
            return (
                httpx.get(g.url + "/ready", verify=ssl.create_default_context(cafile=str(cert)), timeout=2).status_code
                == 200
            )

        wait_for(ready, 60, "the gateway to be ready")
        yield g


def test_a_gateway_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, "http://127.0.0.1:9")
    done = subprocess.run(
        [*PRFAAS, "router", "--config", str(config), "--port", str(free_port())], capture_output=True, timeout=60
    )
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1
    assert len(lines) == 1 and "gateway.tokenFile" in lines[0] and "--allow-insecure-gateway" in lines[0]


def test_the_insecure_flag_starts_it_with_a_warning_and_a_metric(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        config = gateway_config(tmp_path, start_engine(procs))
        port = free_port()
        procs.start(
            "gateway", [*PRFAAS, "router", "--config", str(config), "--port", str(port), "--allow-insecure-gateway"]
        )
        url = f"http://127.0.0.1:{port}"

        def insecure() -> float:
            procs.check_alive()
            return metric_value(httpx.get(url + "/metrics", timeout=2).text, "prfaas_gateway_insecure")

        assert wait_for(insecure, 60, "the insecure gauge") == 1.0
        assert "WITHOUT a token" in procs.log("gateway")


def test_every_path_but_health_and_ready_needs_the_token_and_failures_are_counted(gw: Gw) -> None:
    before = {r: gw.metric("prfaas_gateway_auth_failures_total", TOKEN, reason=r) for r in ("missing", "wrong")}
    for path in ("/status", "/metrics", "/v1/models"):
        assert httpx.get(gw.url + path, verify=False, timeout=5).status_code == 401
    for path in ("/health", "/ready"):
        assert httpx.get(gw.url + path, verify=False, timeout=5).status_code == 200
    assert httpx.post(gw.url + "/v1/completions", json=LEG, verify=False, timeout=5).status_code == 401
    presented = "Bearer not-the-token-xyzzy"
    resp = httpx.get(gw.url + "/status", headers={"Authorization": presented}, verify=False, timeout=5)
    assert resp.status_code == 401
    malformed = httpx.get(gw.url + "/status", headers={"Authorization": "Basic abc"}, verify=False, timeout=5)
    assert malformed.status_code == 401
    status = httpx.get(gw.url + "/status", headers=auth(TOKEN), verify=False, timeout=5)
    assert status.status_code == 200 and status.json()["readyInstances"] == 1
    assert gw.metric("prfaas_gateway_auth_failures_total", TOKEN, reason="missing") >= before["missing"] + 4
    assert gw.metric("prfaas_gateway_auth_failures_total", TOKEN, reason="wrong") == before["wrong"] + 1
    assert gw.metric("prfaas_gateway_auth_failures_total", TOKEN, reason="malformed") >= 1
    log = gw.procs.log("gateway")
    assert '"reason": "wrong"' in log and "xyzzy" not in log and TOKEN not in log


def test_only_allow_listed_fields_and_headers_pass(gw: Gw) -> None:
    ok = httpx.post(gw.url + "/v1/completions", json=LEG, headers=auth(TOKEN), verify=False, timeout=10)
    assert ok.status_code == 200, ok.text
    extra = {**LEG, "chat_template": "{{ evil }}"}
    resp = httpx.post(gw.url + "/v1/completions", json=extra, headers=auth(TOKEN), verify=False, timeout=10)
    assert resp.status_code == 400 and "'chat_template'" in resp.text
    nested = {**LEG, "kv_transfer_params": {"do_remote_decode": True, "remote_host": None, "x": 1}}
    resp = httpx.post(gw.url + "/v1/completions", json=nested, headers=auth(TOKEN), verify=False, timeout=10)
    assert resp.status_code == 400 and "kv_transfer_params.x" in resp.text
    headers = {**auth(TOKEN), "x-prfaas-kv-bytes": "1234", "x-prfaas-max-wait-ms": "50", "x-prfaas-link": "ab"}
    resp = httpx.post(gw.url + "/v1/completions", json=LEG, headers=headers, verify=False, timeout=10)
    assert resp.status_code == 200
    bad = {**auth(TOKEN), "x-prfaas-debug": "1"}
    resp = httpx.post(gw.url + "/v1/completions", json=LEG, headers=bad, verify=False, timeout=10)
    assert resp.status_code == 400 and "x-prfaas-debug" in resp.text
    nan = {**auth(TOKEN), "x-prfaas-kv-bytes": "lots"}
    resp = httpx.post(gw.url + "/v1/completions", json=LEG, headers=nan, verify=False, timeout=10)
    assert resp.status_code == 400 and "x-prfaas-kv-bytes" in resp.text


def test_token_rotation_is_live_and_a_bad_new_token_keeps_the_last_good_one(gw: Gw) -> None:
    """Runs after the tests that use the first token (file order)."""
    assert httpx.get(gw.url + "/status", headers=auth(TOKEN), verify=False, timeout=5).status_code == 200
    loaded = gw.metric("prfaas_router_credential_reloads_total", TOKEN, credential="token", result="loaded")
    tmp = gw.dir / "token.new"
    tmp.write_text(NEW_TOKEN + "\n")
    tmp.replace(gw.dir / "token")  # kubelet swaps the mounted file
    wait_for(
        lambda: (
            gw.metric("prfaas_router_credential_reloads_total", NEW_TOKEN, credential="token", result="loaded") > loaded
        ),
        30,
        "the token reload",
    )
    assert httpx.get(gw.url + "/status", headers=auth(NEW_TOKEN), verify=False, timeout=5).status_code == 200
    old = httpx.get(gw.url + "/status", headers=auth(TOKEN), verify=False, timeout=5)
    assert old.status_code == 401 and "expired" in old.text  # tokenOverlapSeconds: 0
    (gw.dir / "token").write_text("\n")  # an empty Secret value
    wait_for(
        lambda: gw.metric("prfaas_router_credential_reloads_total", credential="token", result="rejected") >= 1,
        30,
        "the bad token to be reported",
    )
    assert httpx.get(gw.url + "/status", headers=auth(NEW_TOKEN), verify=False, timeout=5).status_code == 200
    assert "keeping the last good token" in gw.procs.log("gateway")


def _served_cert(url: str) -> bytes:
    host, port = url.removeprefix("https://").split(":")
    pem = ssl.get_server_certificate((host, int(port)))
    return ssl.PEM_cert_to_DER_cert(pem)


def test_certificate_rotation_is_live_and_a_bad_pair_keeps_the_last_good_one(gw: Gw) -> None:
    b_cert, b_key = self_signed(gw.dir, "b")
    before = gw.metric("prfaas_router_credential_reloads_total", NEW_TOKEN, credential="tls", result="loaded")
    (gw.dir / "tls.key").write_bytes(b_key.read_bytes())
    (gw.dir / "tls.crt").write_bytes(b_cert.read_bytes())
    want = ssl.PEM_cert_to_DER_cert(b_cert.read_text())
    wait_for(lambda: _served_cert(gw.url) == want, 30, "the new certificate to be served")
    assert gw.metric("prfaas_router_credential_reloads_total", NEW_TOKEN, credential="tls", result="loaded") > before
    resp = httpx.get(
        gw.url + "/status", headers=auth(NEW_TOKEN), verify=ssl.create_default_context(cafile=str(b_cert)), timeout=5
    )
    assert resp.status_code == 200
    rejected = gw.metric("prfaas_router_credential_reloads_total", NEW_TOKEN, credential="tls", result="rejected")
    (gw.dir / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    wait_for(
        lambda: (
            gw.metric("prfaas_router_credential_reloads_total", NEW_TOKEN, credential="tls", result="rejected")
            > rejected
        ),
        30,
        "the bad certificate to be reported",
    )
    assert _served_cert(gw.url) == want
    resp = httpx.get(
        gw.url + "/status", headers=auth(NEW_TOKEN), verify=ssl.create_default_context(cafile=str(b_cert)), timeout=5
    )
    assert resp.status_code == 200


def test_replicas_lend_each_other_over_tls_verified_by_the_peer_ca(tmp_path: Path) -> None:
    """Two TLS gateway replicas sharing one certificate and token (the chart's one Secret each), as the chart runs
    them: a replica's peer client (``PeerLoans``, what ``linkScheduling.peerCaFile`` configures) borrows from the
    other over https, verifying it with the CA file (the certificate names the address in ``peers``); a CA that
    did not sign the peer's certificate makes the peer unreachable: the request never reaches it, it lends
    nothing."""
    import asyncio

    from prfaas_core import names
    from prfaas_router.state.peers import PeerLoans

    cert, key = self_signed(tmp_path, "gateway")
    other_ca, _ = self_signed(tmp_path, "other")
    (tmp_path / "token").write_text(TOKEN + "\n")
    ports = [free_port(), free_port()]
    peers = [f"https://127.0.0.1:{p}" for p in ports]
    with processes(tmp_path) as procs:
        engine = start_engine(procs)
        for i, port in enumerate(ports):
            admission = {"link": "a-to-b", "replicas": 2, "peers": peers, "peerCaFile": str(cert)}
            path = gateway_config(
                tmp_path, engine, tokenFile=str(tmp_path / "token"), tlsCertFile=str(cert), tlsKeyFile=str(key),
                admission=admission,
            )  # fmt: skip
            config = json.loads(path.read_text())
            config["links"] = [{"name": "a-to-b", "capacityGbps": 10, "maxUtilization": 0.8}]
            (tmp_path / f"gateway-{i}.json").write_text(json.dumps(config))
            args = ["router", "--config", str(tmp_path / f"gateway-{i}.json"), "--port", str(port)]
            procs.start(f"gateway-{i}", [*PRFAAS, *args])
        verify = ssl.create_default_context(cafile=str(cert))

        def ready() -> bool:
            procs.check_alive()
            return all(httpx.get(u + "/ready", verify=verify, timeout=2).status_code == 200 for u in peers)

        wait_for(ready, 60, "both gateway replicas to be ready")

        async def ask(ca: Path, url: str) -> tuple[str, float] | None:
            loans = PeerLoans(peers, lambda: TOKEN.encode(), str(ca))
            try:
                return await loans.ask(url, "a-to-b", 0.5, 5.0, "replica-of-the-test", 0.0)
            finally:
                await loans.aclose()

        lent = asyncio.run(ask(cert, peers[1]))
        assert lent is not None and lent[0] and 0 < lent[1] <= 0.5, lent
        text = httpx.get(peers[1] + "/metrics", headers=auth(TOKEN), verify=verify, timeout=5).text
        assert metric_value(text, names.METRIC_GATEWAY_LOANS, {"link": "a-to-b", "result": "lent"}) == 1
        assert asyncio.run(ask(other_ca, peers[0])) is None  # not verified: unreachable, lends nothing
        text = httpx.get(peers[0] + "/metrics", headers=auth(TOKEN), verify=verify, timeout=5).text
        assert (
            metric_value(text, names.METRIC_GATEWAY_LOANS, {"link": "a-to-b", "result": "lent"}) == 0
        )  # never reached


def test_the_router_reaches_tls_gateway_replicas_that_borrow_from_each_other_over_tls(tmp_path: Path) -> None:
    """The region-A install end to end on one machine: two gateway replicas serving TLS from one certificate, the
    router's remote verifying it (``caFile``), the replicas verifying each other (``peerCaFile``). One pull is
    faster than a replica's share of the cap (``pullGbps`` 60 > 80 / 2), so the replica that serves the long
    request must borrow the rest from the other one over https before its answer goes out."""
    from testbed_support import GATEWAY_AUTH, prompt, start_stack

    from prfaas_core import names

    cert, key = self_signed(tmp_path, "gateway")
    with processes(tmp_path) as procs:
        admission = {"capacityGbps": 100.0, "pullGbps": 60.0}
        st = start_stack(procs, tmp_path, gateway_admission=admission, gateway_replicas=2, gateway_tls=(cert, key))
        resp = httpx.post(st.router + "/v1/completions", json={"prompt": prompt(40_000), "max_tokens": 2}, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-prfaas-route"] == "remote"
        verify = ssl.create_default_context(cafile=str(cert))

        def loans(replica: str, result: str) -> float:
            text = httpx.get(st.url(replica) + "/metrics", headers=GATEWAY_AUTH, verify=verify, timeout=5).text
            return metric_value(text, names.METRIC_GATEWAY_LOANS, {"link": "a-to-b", "result": result})

        assert loans("gateway", "borrowed") >= 1 and loans("gateway-2", "lent") >= 1
        assert loans("gateway", "unreachable") == 0
