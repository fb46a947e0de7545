"""Compatibility proofs: real peers and clients, as real processes, against the emulators.

* the openai Python SDK against ``prfaas engine`` (completions and chat, streamed and not);
* vllm-router 0.1.17 (``--vllm-pd-disaggregation --kv-connector nixl``) in front of a prefill and a decode
  engine, the KV crossing ``prfaas link``;
* sglang-router 0.3.2 (``--pd-disaggregation``) in front of the same engines, the bootstrap port being the
  link's;
* a real Prometheus scraping the engines and the link.

Every process is started by the test and killed in teardown; readiness is polled with deadlines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from testbed_support import OFFLINE_ENV, PRFAAS, Processes, free_port, http, metric_value, processes, wait_for

BIN = Path(sys.executable).parent
SCALE_ARGS = ["--time-scale", "100", "--byte-scale", "0.001"]
MODEL = "internal-1t"


def start_engine(procs: Processes, name: str, role: str, *extra: str) -> str:
    port = free_port()
    procs.start(name, [*PRFAAS, "engine", "--role", role, "--port", str(port), *SCALE_ARGS, *extra])
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: procs.check_alive() or http("GET", f"{url}/health")[0] == 200, 30, f"{name} healthy")
    return url


def metrics(url: str) -> str:
    status, text = http("GET", f"{url}/metrics")
    assert status == 200
    return str(text)


@dataclass
class Stack:
    """A prefill engine (region A) whose KV is advertised at the link, the link, and a decode engine (B)."""

    procs: Processes
    prefill: str
    decode: str
    link_port: int
    link_admin: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with processes(tmp_path_factory.mktemp("stack")) as procs:
        kv_port, link_port, admin_port = free_port(), free_port(), free_port()
        procs.start(
            "link",
            [
                *PRFAAS, "link", "--listen", f"127.0.0.1:{link_port}", "--target", f"127.0.0.1:{kv_port}",
                "--capacity-gbps", "100", "--rtt-ms", "2", "--metrics-port", str(admin_port), "--name", "a-to-b",
                *SCALE_ARGS,
            ],
        )  # fmt: skip
        admin = f"http://127.0.0.1:{admin_port}"
        wait_for(lambda: procs.check_alive() or http("GET", f"{admin}/health")[0] == 200, 30, "link up")
        prefill = start_engine(
            procs,
            "prefill",
            "prefill",
            "--kv-listen",
            f"127.0.0.1:{kv_port}",
            "--kv-advertise",
            f"127.0.0.1:{link_port}",
        )
        decode = start_engine(procs, "decode", "decode")
        yield Stack(procs, prefill, decode, link_port, admin)


def kv_counters(stack: Stack) -> tuple[float, float, float]:
    sent = metric_value(metrics(stack.prefill), "prfaas_engine_kv_bytes_sent_total")
    received = metric_value(metrics(stack.decode), "prfaas_engine_kv_bytes_received_total")
    egress = metric_value(metrics(stack.link_admin), "prfaas_link_egress_bytes_total", {"link": "a-to-b"})
    return sent, received, egress


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0, timeout=30)


def exercise(client: openai.OpenAI) -> None:
    """Completions and chat, whole and streamed, through whatever ``client`` points at."""
    done = client.completions.create(model=MODEL, prompt="The capital of France is " * 50, max_tokens=5)
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 5
    assert len(done.choices[0].text.split()) == 5
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story. " * 40}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert len("".join(pieces).split()) == 7
    assert usage is not None and usage.completion_tokens == 7


def test_openai_sdk_against_an_engine(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        url = start_engine(procs, "engine", "both")
        client = client_for(url)
        assert [m.id for m in client.models.list()] == [MODEL]
        exercise(client)
        text = client.completions.create(model="whatever", prompt="hi", max_tokens=3, stream=False)
        assert text.model == "whatever"
        with pytest.raises(openai.BadRequestError, match="prompt"):
            client.completions.create(model=MODEL, prompt="", max_tokens=3)


def router_ready(procs: Processes, url: str) -> bool:
    procs.check_alive()
    return bool(client_for(url).completions.create(model=MODEL, prompt="ping", max_tokens=1).choices)


def test_vllm_router_pd_disaggregation(stack: Stack, tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        port = free_port()
        procs.start(
            "vllm-router",
            [
                str(BIN / "vllm-router"), "--vllm-pd-disaggregation", "--prefill", stack.prefill,
                "--decode", stack.decode, "--kv-connector", "nixl", "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warning",
            ],
            env=OFFLINE_ENV,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        before = kv_counters(stack)
        wait_for(lambda: router_ready(procs, url), 60, "vllm-router serving")
        exercise(client_for(url))
        sent, received, egress = kv_counters(stack)
        assert received > before[1] and sent - before[0] == received - before[1]
        assert egress - before[2] >= received - before[1]  # every KV byte crossed the link


def test_sglang_router_pd_disaggregation(stack: Stack, tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        port = free_port()
        procs.start(
            "sglang-router",
            [
                str(BIN / "sglang-router"), "launch", "--pd-disaggregation",
                "--prefill", stack.prefill, str(stack.link_port), "--decode", stack.decode,
                "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn",
            ],
            env=OFFLINE_ENV,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        before = kv_counters(stack)
        wait_for(lambda: router_ready(procs, url), 60, "sglang-router serving")
        exercise(client_for(url))
        sent, received, egress = kv_counters(stack)
        assert received > before[1] and sent - before[0] == received - before[1]
        assert egress - before[2] >= received - before[1]


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed; scripts/system-deps.sh installs it")
        pytest.skip("prometheus is not installed (run scripts/system-deps.sh)")
    return found


def test_prometheus_scrapes_engines_and_link(stack: Stack, tmp_path: Path) -> None:
    binary = prometheus_binary()
    # some KV must have crossed the link: one disaggregated request by hand, as a router would send it
    prefill_leg = {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
    status, pre = http(
        "POST", f"{stack.prefill}/v1/completions", {"prompt": "p" * 4096, "max_tokens": 1, **prefill_leg}
    )
    assert status == 200
    decode_leg = {"prompt": "p" * 4096, "max_tokens": 2, "kv_transfer_params": pre["kv_transfer_params"]}
    assert http("POST", f"{stack.decode}/v1/completions", decode_leg)[0] == 200

    targets = [urllib.parse.urlsplit(u).netloc for u in (stack.prefill, stack.decode, stack.link_admin)]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: engines\n    static_configs: [{{targets: ['{targets[0]}', '{targets[1]}']}}]\n"
        f"  - job_name: link\n    static_configs: [{{targets: ['{targets[2]}']}}]\n"
    )
    port = free_port()
    with processes(tmp_path) as procs:
        procs.start(
            "prometheus",
            [
                binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            ],
        )  # fmt: skip
        api = f"http://127.0.0.1:{port}/api/v1/query?query="

        def query(expr: str) -> list[dict[str, object]]:
            procs.check_alive()
            status, body = http("GET", api + urllib.parse.quote(expr))
            assert status == 200, body
            return list(body["data"]["result"])

        up = wait_for(lambda: len(r := query("up == 1")) == 3 and r, 30, "three targets up")
        assert {s["metric"]["job"] for s in up} == {"engines", "link"}  # type: ignore[index]
        running = wait_for(lambda: query("vllm:num_requests_running"), 30, "vllm:num_requests_running scraped")
        assert {s["metric"]["model_name"] for s in running} == {MODEL}  # type: ignore[index]
        egress = wait_for(lambda: query('prfaas_link_egress_bytes_total{link="a-to-b"} > 0'), 30, "link egress")
        assert float(egress[0]["value"][1]) > 0  # type: ignore[index]
        assert wait_for(lambda: query("vllm:time_to_first_token_seconds_count > 0"), 30, "TTFT histogram")
        assert wait_for(lambda: query("prfaas_engine_kv_bytes_received_total > 0"), 30, "KV received")


def test_cli_refuses_bad_options_with_exit_2() -> None:
    result = subprocess.run(
        [*PRFAAS, "link", "--listen", "nowhere", "--target", "127.0.0.1:1"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "HOST:PORT" in result.stderr
    result = subprocess.run(
        [*PRFAAS, "engine", "--kv-advertise", "x:y", "--port", "0"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "port must be a number" in result.stderr


def test_engine_die_fault_kills_the_process(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        url = start_engine(procs, "engine", "both")
        status, _ = http("POST", f"{url}/admin/faults", {"die": True})
        assert status == 200
        proc = procs.procs[0][1]
        assert proc.wait(timeout=10) == 137
