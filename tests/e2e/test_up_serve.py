"""End to end: ``prfaas up --serve`` as a user runs it in one shell, the ``openai`` SDK in another process
(this test) — models listed, a completion and a streamed chat answered, an unknown model refused with
OpenAI's 404 — and, when Prometheus is installed, the local Prometheus holding the router's series; then
SIGTERM stops everything cleanly."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from test_up import stack_processes

from prfaas_router.state.metrics import sample_sum

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]


def wait_for(path: Path, proc: subprocess.Popen[bytes], err: Path, timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, err.read_text(errors="replace")[-3000:]
        if path.exists():
            return dict(json.loads(path.read_text()))
        time.sleep(0.2)
    raise AssertionError(f"{path} never appeared: {err.read_text(errors='replace')[-2000:]}")


@pytest.mark.timeout(240)
def test_serve_answers_the_openai_sdk_until_sigterm(tmp_path: Path) -> None:
    work = tmp_path / "up"
    err = tmp_path / "stderr.txt"
    argv = [*PRFAAS, "up", "--serve", "--work-dir", str(work), "--time-scale", "4", "--output-tokens", "8"]
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
    try:
        info = wait_for(work / "endpoints.json", proc, err, 150)
        printed = err.read_text()
        base = str(info["openai_base_url"])
        assert f"OpenAI base URL {base}" in printed
        assert str(info["router_metrics"]) in printed and str(info["gateway_metrics"]) in printed
        assert "model seconds" in str(info["time_note"])

        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=60)
        model = str(info["model"])
        assert [m.id for m in client.models.list().data] == [model] == ["internal-1t"]
        done = client.completions.create(model=model, prompt="x " * 3000, max_tokens=8)
        assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens == 8
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello " * 50}], max_tokens=8, stream=True
        )
        pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        assert len(pieces) >= 1
        with pytest.raises(openai.NotFoundError) as refused:
            client.completions.create(model="gpt-nonexistent", prompt="hi", max_tokens=4)
        assert refused.value.code == "model_not_found"

        metrics = httpx.get(str(info["router_metrics"]), timeout=5).text
        # the router counted the SDK's two answers (no built-in load mixes into its series)
        assert sample_sum(metrics, "prfaas_router_requests_total", {"outcome": "ok"}) == 2
        if shutil.which("prometheus"):
            prom = str(info["prometheus"])
            deadline = time.monotonic() + 30
            series: list[object] = []
            while time.monotonic() < deadline and not series:
                body = httpx.get(f"{prom}/api/v1/query", params={"query": "prfaas_router_requests_total"}).json()
                series = body["data"]["result"]
                time.sleep(0.5)
            assert series, "the local Prometheus has no router series"
            rules = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
            assert any(g["name"].startswith("prfaas.") for g in rules)
        else:
            assert info["prometheus"] is None and "not started" in printed
        assert len(stack_processes(work)) >= 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, err.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 60  # bounds a hang only: on a loaded machine the children take a while
    while stack_processes(work) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stack_processes(work) == []
    summary = json.loads((work / "summary.json").read_text())
    # no built-in load: the requests are the router's count of the client's own (issue 39: it said 0)
    assert summary["requests"]["requests"] == 2 and summary["requests"]["ok"] == 2, summary["requests"]
    assert summary["loop"]["cycles"] >= 1
