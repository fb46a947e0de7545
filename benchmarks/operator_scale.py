"""Scale benchmark: N PDClusters reconciled per cycle by one operator process, against the Kubernetes API
emulator (tests/support/k8s_emulator.py, kmock) and a real Prometheus scraping a live exporter.

    .venv/bin/python benchmarks/operator_scale.py [--clusters 100,1000] [--pods 4] [--cycles 3] [--period 30] [--smoke]

For each size N, a fresh emulator + Prometheus + operator: one shared ModelProfile and gateway-token Secret;
per cluster a PDCluster (Relabel mode, ``--pods`` engine pods), its InterDCLink and its remote
PrefillCluster (the harness's fake gateway). Objects are created through the emulator's HTTP API, many
requests in flight (``--create-concurrency``). The operator runs with every period (PD policy, links,
gateways) set to ``--period`` seconds, so each cycle covers all 3N objects: cycle 1 assigns the first roles
(4 pod patches, a router ConfigMap, an Event, a status write per cluster), later cycles are the steady state
(metrics from Prometheus, a Hold decision, and no status write: nothing changed, so nothing is written but a
heartbeat every ``--status-heartbeat-seconds``; ``status_writes_per_object`` says how quiet it is).

Per cycle it reports what the operator itself logged for that cycle (its ``cycle`` line: wall seconds,
Prometheus queries, API calls, status writes, the time per phase), the deltas of its metrics
(``prfaas_operator_cycle_duration_seconds``, ``prfaas_operator_prometheus_queries_total``), the API requests
the emulator served between two cycles by verb and resource (these include the Lease renewals and the
Prometheus exporter's pod lists, 1/s each), the operator's CPU seconds and RSS (VmRSS, and the peak VmHWM).
The harness's parts run in processes of their own (``prfaas_testbed.harness_procs``: the emulator, the
exporter, the fake gateway; Prometheus is a process anyway), so that they do not take the GIL of one another or
of this driver; their CPU seconds per cycle are reported per part beside the operator's (``harness_cpu_s``): on
a small machine they compete for the same cores. ``heartbeat_s`` is the status heartbeat interval the operator
had in force (it stretches with long cycles). Writes JSON to ``--out`` and a PNG of cycle time and RSS against N
to ``--plot``. ``--profile FILE`` runs the operator's event loop under cProfile (``PRFAAS_OPERATOR_PROFILE``)
and writes FILE.<N>.prof. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from prfaas_testbed.harness_procs import SplitHarness
from prfaas_testbed.operator_harness import GATEWAY_TOKEN, Harness
from prfaas_testbed.prom import wait_until

TICK_FIELDS = ("pd_clusters", "links", "prefill_clusters", "seconds", "queries", "api_calls", "status_writes")
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|[+-]Inf)$", re.M)


def metric(text: str, name: str) -> float:
    """The sum over every series of ``name`` (labelled or not) in a Prometheus text exposition."""
    return sum(float(m.group(3)) for m in SERIES.finditer(text) if m.group(1) == name)


def proc_status(pid: int) -> dict[str, float]:
    """RSS and peak RSS (MiB) and CPU seconds of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "peak_rss_mib": int(fields["VmHWM"].split()[0]) / 1024,
        "cpu_s": (int(stat[11]) + int(stat[12])) / ticks,
    }


def operator_metrics(op: Any) -> str:
    """The operator's /metrics; a busy operator on a loaded machine may take longer than the harness's 2 s to
    answer (a cycle over thousands of objects holds its event loop), so a timeout is retried, up to a minute."""
    return str(wait_until(lambda: op.metrics(), 60, "the operator's /metrics", interval_s=1.0))


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def harness_cpu(h: SplitHarness) -> dict[str, float]:
    """CPU seconds so far of each of the harness's processes, and of this one (the driver)."""
    out = {part: proc_status(pid)["cpu_s"] for part, pid in h.pids().items()}
    out["driver"] = self_cpu_s()
    return out


def documents(h: Harness, ns: str, n: int, pods: int, period: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The Secret, then per cluster its PDCluster, InterDCLink, PrefillCluster and pods; and the ModelProfile."""
    base = h.manifests(ns, policy={"periodSeconds": period})
    profile = next(d for d in base if d["kind"] == "ModelProfile")
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "region-a-gateway-token", "namespace": ns},
            "data": {"token": base64.b64encode(GATEWAY_TOKEN.encode()).decode()},
        }
    ]
    for i in range(n):
        pd_name, link_name, pfc_name = f"pd-{i}", f"link-{i}", f"pfc-{i}"
        for d in base:
            if d["kind"] == "ModelProfile":
                continue
            doc = {**d, "metadata": {**d["metadata"]}, "spec": dict(d["spec"])}
            if d["kind"] == "PDCluster":
                doc["metadata"]["name"] = pd_name
                doc["spec"].update(
                    instances=pods,
                    roles={"prefill": {"min": 1, "max": pods - 1}, "decode": {"min": 1, "max": pods - 1}},
                    workloads={"shared": {"kind": "Deployment", "name": f"{pd_name}-engines"}},
                    roleAssignment={"mode": "Relabel", "initialPrefill": 1},
                )
            elif d["kind"] == "InterDCLink":
                doc["metadata"]["name"] = link_name
                doc["spec"].update(prefillClusterRef={"name": pfc_name}, pdClusterRef={"name": pd_name})
            else:
                doc["metadata"]["name"] = pfc_name
            docs.append(doc)
        for j in range(pods):
            docs.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{pd_name}-e{j}",
                        "namespace": ns,
                        "labels": {"prfaas.io/pd-cluster": pd_name},
                    },
                    "status": {
                        "phase": "Running",
                        "podIP": "127.0.0.1",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
    return docs, profile


CREATE_TRIES = 5


async def create_all(h: Harness, docs: list[dict[str, Any]], concurrency: int) -> None:
    """POST every document through the emulator's HTTP API, ``concurrency`` requests in flight."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(
        base_url=h.emu.url, timeout=120, limits=httpx.Limits(max_connections=concurrency)
    ) as client:

        async def one(doc: dict[str, Any]) -> None:
            ns = doc["metadata"].get("namespace") if doc["kind"] != "Namespace" else None
            for attempt in range(CREATE_TRIES):  # a busy emulator may drop a connection: the create is retried
                try:
                    async with sem:
                        resp = await client.post(h.path(doc["kind"], ns), json=doc)
                except httpx.TransportError:
                    if attempt == CREATE_TRIES - 1:
                        raise
                    continue
                if resp.status_code == 409 and attempt > 0:  # the dropped try had created it
                    return
                resp.raise_for_status()
                return

        await asyncio.gather(*(one(d) for d in docs))


def cycle_lines(log: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if '"event": "cycle"' not in line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    h = SplitHarness(Path(tempfile.mkdtemp(prefix="prfaas-bench-")), scrape_s=args.scrape_seconds)
    try:
        ns = h.namespace()
        # the exporter lists the namespace's pods at every scrape: not while thousands are being created
        h.prom.exporter.enabled_namespaces.discard(ns)
        docs, profile = documents(h, ns, n, args.pods, args.period)
        h.create(profile)
        harness_cpu0 = harness_cpu(h)
        t0 = time.monotonic()
        asyncio.run(create_all(h, docs, args.create_concurrency))
        creation_s = time.monotonic() - t0
        creation_cpu = harness_cpu(h)
        creation_cpu_s = {k: round(v - harness_cpu0[k], 1) for k, v in creation_cpu.items()}
        h.prom.exporter.enabled_namespaces.add(ns)
        print(
            f"[{n}] created {n} PDClusters + {n} links + {n} prefill clusters + {n * args.pods} pods "
            f"({len(docs) + 1} objects) in {creation_s:.1f} s, {args.create_concurrency} requests in flight",
            flush=True,
        )
        if args.profile:
            os.environ["PRFAAS_OPERATOR_PROFILE"] = f"{args.profile}.{n}.prof"
        period = str(args.period)
        started = time.monotonic()
        # (smoke: a 2-s re-list, so that a watch event the emulator delivers late does not hold the run a minute)
        op = h.start_operator(
            ns,
            extra=["--link-period-seconds", period, "--gateway-period-seconds", period],
            resync_s=2.0 if args.smoke else None,
            watch_timeout_s=args.timeout,
        )
        os.environ.pop("PRFAAS_OPERATOR_PROFILE", None)
        pid = op.proc.pid
        requests_before = Counter(h.emu.k8s.requests)
        text = operator_metrics(op)
        prev = {
            "count": metric(text, "prfaas_operator_cycle_duration_seconds_count"),
            "sum": metric(text, "prfaas_operator_cycle_duration_seconds_sum"),
            "queries": metric(text, "prfaas_operator_prometheus_queries_total"),
            "harness_cpu_s": harness_cpu(h),
            **proc_status(pid),
        }
        cycles: list[dict[str, Any]] = []
        partial: list[dict[str, Any]] = []
        seen = 0
        while len(cycles) < args.cycles:

            def full_cycle(after: int = seen) -> list[dict[str, Any]] | None:
                lines = cycle_lines(op.logs())
                return lines if len(lines) > after else None

            lines = wait_until(full_cycle, args.timeout, f"cycle {len(cycles) + 1} at {n} clusters", interval_s=0.5)
            requests_now = Counter(h.emu.k8s.requests)
            text = operator_metrics(op)
            now = {
                "count": metric(text, "prfaas_operator_cycle_duration_seconds_count"),
                "sum": metric(text, "prfaas_operator_cycle_duration_seconds_sum"),
                "queries": metric(text, "prfaas_operator_prometheus_queries_total"),
                "harness_cpu_s": harness_cpu(h),
                **proc_status(pid),
            }
            for line in lines[seen:]:
                if line.get("pd_clusters") != n:  # links/gateways only, or a partial tick (cache still filling)
                    partial.append({k: line.get(k) for k in TICK_FIELDS})
                    continue
                ticks = max(now["count"] - prev["count"], 1)
                requests = requests_now - requests_before
                cycle = {
                    "cycle": len(cycles) + 1,
                    "completed_after_start_s": round(time.monotonic() - started, 1),
                    "wall_s": line.get("seconds"),
                    "phases_s": {k: line[k] for k in line if k.endswith("_s")},
                    "metric_cycle_duration_s": round((now["sum"] - prev["sum"]) / ticks, 3),
                    "metric_ticks": int(now["count"] - prev["count"]),
                    "prometheus_queries": line.get("queries"),
                    "metric_prometheus_queries": now["queries"] - prev["queries"],
                    "operator_api_calls": line.get("api_calls"),
                    "status_writes": line.get("status_writes"),
                    "status_writes_per_object": round((line.get("status_writes") or 0) / (3 * n), 4),
                    "status_moved": line.get("status_moved"),
                    "emulator_requests": sum(requests.values()),
                    "emulator_requests_by_verb": dict(sorted(requests.items(), key=lambda kv: -kv[1])),
                    "operator_cpu_s": round(now["cpu_s"] - prev["cpu_s"], 2),
                    "harness_cpu_s": {
                        k: round(v - prev["harness_cpu_s"][k], 2) for k, v in now["harness_cpu_s"].items()
                    },
                    "heartbeat_s": line.get("heartbeat_seconds"),
                    "rss_mib": round(now["rss_mib"], 1),
                    "peak_rss_mib": round(now["peak_rss_mib"], 1),
                    "other_ticks": partial,  # since the previous cycle: links and gateways, partial PD ticks
                }
                partial = []
                cycles.append(cycle)
                print(
                    f"[{n}] cycle {cycle['cycle']}: {cycle['wall_s']} s wall ({cycle['phases_s']}), "
                    f"{cycle['prometheus_queries']} Prometheus queries, {cycle['operator_api_calls']} operator API "
                    f"calls ({cycle['status_writes']} status writes, {cycle['status_writes_per_object']} per object), "
                    f"operator CPU {cycle['operator_cpu_s']} s, "
                    f"harness CPU {cycle['harness_cpu_s']} s, heartbeat {cycle['heartbeat_s']} s, "
                    f"RSS {cycle['rss_mib']} MiB "
                    f"(peak {cycle['peak_rss_mib']} MiB); writes moved by {cycle['status_moved']}",
                    flush=True,
                )
                break
            seen = len(lines)
            requests_before, prev = requests_now, now
        done = sum(1 for d in h.list("PDCluster", ns) if (d.get("status") or {}).get("lastDecision"))
        print(f"[{n}] PDClusters with a recorded decision: {done} of {n}", flush=True)
        steady = cycles[1:] or cycles
        return {
            "clusters": n,
            "pods_per_cluster": args.pods,
            "objects": len(docs) + 1,
            "creation_s": round(creation_s, 1),
            "creation_concurrency": args.create_concurrency,
            "scrape_seconds": args.scrape_seconds,
            "creation_harness_cpu_s": creation_cpu_s,
            "period_s": args.period,
            "cycles": cycles,
            "steady_wall_s": round(sum(c["wall_s"] for c in steady) / len(steady), 2),
            "steady_prometheus_queries": steady[-1]["prometheus_queries"],
            "steady_operator_api_calls": steady[-1]["operator_api_calls"],
            "steady_status_writes_per_object": steady[-1]["status_writes_per_object"],
            "rss_mib": cycles[-1]["rss_mib"],
            "peak_rss_mib": cycles[-1]["peak_rss_mib"],
            "pd_clusters_with_decision": done,
        }
    finally:
        h.close()


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["clusters"] for r in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(xs, [r["cycles"][0]["wall_s"] for r in results], "o-", label="cycle 1 (first roles)")
    ax1.plot(xs, [r["steady_wall_s"] for r in results], "s-", label="steady cycle")
    ax1.set_xlabel("PDClusters")
    ax1.set_ylabel("wall seconds per cycle")
    ax1.set_title("Cycle time")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(xs, [r["rss_mib"] for r in results], "o-", label="RSS")
    ax2.plot(xs, [r["peak_rss_mib"] for r in results], "s--", label="peak RSS")
    ax2.set_xlabel("PDClusters")
    ax2.set_ylabel("MiB")
    ax2.set_title("Operator memory")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default="1000", help="comma-separated sizes, e.g. 100,300,1000 (default 1000)")
    ap.add_argument("--pods", type=int, default=4, help="engine pods per PDCluster (default 4)")
    ap.add_argument("--cycles", type=int, default=3, help="full cycles to measure per size (default 3)")
    ap.add_argument("--period", type=int, default=30, help="PD policy, link and gateway period, s (default 30)")
    ap.add_argument("--create-concurrency", type=int, default=32, help="creation requests in flight (default 32)")
    ap.add_argument(
        "--scrape-seconds",
        type=float,
        default=1.0,
        help="Prometheus scrape interval, s (default 1; the exporter lists every engine pod per scrape, so at "
        "thousands of clusters a real-cluster interval such as 10 keeps it from crowding the API emulator)",
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for one cycle (default 1800)")
    ap.add_argument("--profile", default=None, help="cProfile the operator; stats to PROFILE.<N>.prof")
    ap.add_argument("--out", default="out/bench/operator_scale.json")
    ap.add_argument("--plot", default="out/bench/operator_scale.png", help="PNG path ('' : none)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the real code path on a tiny input (2 clusters, 1 cycle, a 2-s period, no plot): what the test suite "
        "runs so that the benchmark never rots; its figures mean nothing",
    )
    args = ap.parse_args()
    if args.smoke:
        args.clusters, args.cycles, args.period, args.plot, args.timeout = "2", 1, 2, "", 240.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the harness's processes are stopped
    sizes = [int(s) for s in args.clusters.split(",") if s.strip()]
    results = []
    for n in sizes:
        results.append(run_size(n, args))
        out = {
            "benchmark": "operator_scale",
            "load_average": os.getloadavg(),
            "cpus": os.cpu_count(),
            "results": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    if args.plot:
        plot(results, Path(args.plot))
        print(f"plot: {args.plot}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
