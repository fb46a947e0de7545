"""``prfaas operator``: run the Kubernetes operator (kopf, embedded) against the current kubeconfig.

It reconciles PDClusters, PrefillClusters, InterDCLinks and ModelProfiles; only the holder of the Lease
``--lease-name`` acts, so several replicas may run. Stops cleanly on SIGINT/SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from prfaas_core.schema.validation import validation_message

from .output import EXIT_OK, EXIT_USAGE, error
from .router_cmd import LOG_LEVELS


def register(sub: Any) -> None:
    p = sub.add_parser("operator", help="run the PrFaaS Kubernetes operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], metavar="NS", help="namespace to serve (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace")
    p.add_argument("--prometheus-url", default="http://127.0.0.1:9090", help="default Prometheus base URL")
    p.add_argument("--metrics-port", type=int, default=8080, help="port of the operator's /metrics (0: off)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    p.add_argument("--lease-name", default="prfaas-operator", help="coordination.k8s.io Lease for leader election")
    p.add_argument("--lease-namespace", default=None, help="namespace of the Lease (default: the first served)")
    p.add_argument("--lease-duration-seconds", type=float, default=15.0, help="Lease duration")
    p.add_argument("--lease-renew-seconds", type=float, default=5.0, help="Lease renewal period")
    p.add_argument("--identity", default=None, help="this replica's holder identity (default: host + random)")
    p.add_argument("--link-period-seconds", type=float, default=15.0, help="period of link measurements")
    p.add_argument("--gateway-period-seconds", type=float, default=15.0, help="period of remote gateway reads")
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=None,
        help="period of the full re-list that repairs the cache after a missed watch event "
        "(default: $PRFAAS_RESYNC_SECONDS, else 300)",
    )
    p.add_argument(
        "--status-heartbeat-seconds",
        type=float,
        default=300.0,
        help="a status that only says 'still fresh' (lastMeasuredTime, lastSyncTime, a repeated Hold) is "
        "rewritten alone at most this often (each object between one and two of these, or of 20 cycles when "
        "a cycle is that long); any other change is written at once (default 300)",
    )
    p.add_argument(
        "--status-heartbeat-cycles",
        type=int,
        default=20,
        help="the heartbeat is at least this many of the slowest recent cycles apart, so that at most about one "
        "object in this many heartbeats per cycle when cycles are long (0: the heartbeat seconds alone; default 20)",
    )
    p.add_argument(
        "--liveness-stall-seconds",
        type=float,
        default=120.0,
        help="/healthz answers 503 when the reconcile loop has made no progress for this long (default 120)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=LOG_LEVELS,
        help="log level of the JSON logs on stderr (default %(default)s)",
    )
    p.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from prfaas_operator.config import OperatorConfig

    values: dict[str, Any] = {
        "namespaces": tuple(args.namespace),
        "all_namespaces": bool(args.all_namespaces or not args.namespace),
        "prometheus_url": args.prometheus_url,
        "metrics_port": args.metrics_port or None,
        "kubeconfig": args.kubeconfig,
        "lease_name": args.lease_name,
        "lease_namespace": args.lease_namespace,
        "lease_duration_s": args.lease_duration_seconds,
        "lease_renew_s": args.lease_renew_seconds,
        "link_period_s": args.link_period_seconds,
        "gateway_period_s": args.gateway_period_seconds,
        "status_heartbeat_s": args.status_heartbeat_seconds,
        "status_heartbeat_cycles": args.status_heartbeat_cycles,
        "log_level": args.log_level.upper(),
        "liveness_stall_s": args.liveness_stall_seconds,
    }
    if args.resync_seconds is not None:
        values["resync_s"] = args.resync_seconds
    if args.identity:
        values["identity"] = args.identity
    return OperatorConfig.model_validate(values)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from prfaas_operator.embedded import run_operator
    from prfaas_operator.preflight import PreflightError, preflight

    try:
        config = config_from_args(args)
    except ValidationError as exc:  # a combination of flags the config refuses
        return error(validation_message("prfaas operator", exc), EXIT_USAGE)
    try:  # an unreadable kubeconfig or an unreachable API server: one line, exit 1 (not kopf's retry loop)
        asyncio.run(preflight(config.kubeconfig))
    except PreflightError as exc:
        return error(str(exc))
    asyncio.run(run_operator(config))
    return EXIT_OK
