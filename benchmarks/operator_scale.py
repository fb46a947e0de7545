"""Scale benchmark: N PDClusters (default 1,000) reconciled per cycle by one operator process, against the
Kubernetes API emulator and a real Prometheus. Prints wall time per cycle, Prometheus queries per cycle and
the operator's memory (RSS).

    .venv/bin/python benchmarks/operator_scale.py [--clusters 1000] [--pods 4] [--cycles 3]

Each PDCluster gets its own InterDCLink and remote PrefillCluster (one shared ModelProfile); the operator's
own metrics (``prfaas_operator_cycle_duration_seconds``, ``prfaas_operator_prometheus_queries_total``) give
the per-cycle figures.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.operator_harness import Harness
from support.prom import wait_until


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=3)
    args = ap.parse_args()
    h = Harness(Path(tempfile.mkdtemp(prefix="prfaas-bench-")))
    try:
        ns = h.namespace()
        base = h.manifests(ns, policy={"periodSeconds": 60})
        profile = next(d for d in base if d["kind"] == "ModelProfile")
        h.create(profile)
        t0 = time.monotonic()
        for i in range(args.clusters):
            pd_name, link_name, pfc_name = f"pd-{i}", f"link-{i}", f"pfc-{i}"
            for d in base:
                if d["kind"] == "ModelProfile":
                    continue
                doc = {**d, "metadata": {**d["metadata"]}, "spec": dict(d["spec"])}
                if d["kind"] == "PDCluster":
                    doc["metadata"]["name"] = pd_name
                    doc["spec"].update(
                        instances=args.pods,
                        roles={"prefill": {"min": 1, "max": args.pods - 1}, "decode": {"min": 1, "max": args.pods - 1}},
                    )
                    doc["spec"]["roleAssignment"] = {"mode": "Relabel", "initialPrefill": 1}
                elif d["kind"] == "InterDCLink":
                    doc["metadata"]["name"] = link_name
                    doc["spec"].update(prefillClusterRef={"name": pfc_name}, pdClusterRef={"name": pd_name})
                else:
                    doc["metadata"]["name"] = pfc_name
                h.create(doc)
            for j in range(args.pods):
                h.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{pd_name}-e{j}",
                            "namespace": ns,
                            "labels": {"prfaas.io/pd-cluster": pd_name},
                        },
                        "status": {"phase": "Running", "podIP": "127.0.0.1"},
                    }
                )
        print(
            f"created {args.clusters} PDClusters (+ links, prefill clusters, {args.clusters * args.pods} pods) "
            f"in {time.monotonic() - t0:.0f} s",
            flush=True,
        )
        op = h.start_operator(ns, extra=["--link-period-seconds", "60", "--gateway-period-seconds", "60"])
        pid = op.proc.pid
        seen = 0.0
        for _ in range(args.cycles):

            def next_cycle(after: float = seen) -> str | None:
                text = op.metrics()
                return text if metric(text, "prfaas_operator_cycle_duration_seconds_count") > after else None

            text = wait_until(next_cycle, 900, "a cycle", interval_s=1.0)
            count = metric(text, "prfaas_operator_cycle_duration_seconds_count")
            wall = metric(text, "prfaas_operator_cycle_duration_seconds_sum") / count
            queries = metric(text, "prfaas_operator_prometheus_queries_total") / count
            rss_kib = int(
                next(
                    line.split()[1]
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")
                )
            )
            print(
                f"cycle {int(count)}: mean wall {wall:.2f} s per cycle, {queries:.1f} Prometheus queries per cycle, "
                f"operator RSS {rss_kib / 1024:.0f} MiB",
                flush=True,
            )
            seen = count
        done = sum(1 for d in h.list("PDCluster", ns) if (d.get("status") or {}).get("lastDecision"))
        print(f"PDClusters with a recorded decision: {done} of {args.clusters}")
    finally:
        h.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
