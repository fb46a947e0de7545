"""``prfaas router --config FILE``: the sidecar router in front of a PD cluster, or (``mode: gateway`` in the
file) the prefill gateway in front of a PrFaaS cluster. The file is a RouterConfig (JSON or YAML; schema in
``crds/router-config.schema.json``), reloaded when it changes. Exit 1 when the file is unreadable or invalid
(with ``--wait-for-config``: serve ``/ready`` 503 with the reason until it is usable), 2 on a usage error (a
malformed ``--peers``, peers without ``--peers-token-file``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import structlog
import yaml

from prfaas_local.formats import yaml_error

from .output import EXIT_OK, UsageError, error, fail, os_error


class _Stderr:
    """Standard error as it is when a line is written, not when logging was configured (a command run in-process,
    as tests do, must not leave the logs bound to a stream that is closed afterwards)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info") -> None:
    """JSON logs (structlog) on stderr, one object per line."""
    logging.basicConfig(format="%(message)s", stream=sys.stderr, level=getattr(logging, level.upper()))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


LOG_LEVELS = ("debug", "info", "warning", "error")
"""The ``--log-level`` choices of every long-running command (router, operator); case-insensitive."""


def register(sub: Any) -> None:
    p = sub.add_parser("router", help="run the router (or, by its config, the prefill gateway)", description=__doc__)
    p.add_argument("--config", required=True, metavar="FILE", help="RouterConfig file (JSON or YAML)")
    p.add_argument(
        "--settings",
        metavar="FILE",
        help="static settings (routing, timeouts, limits, scale blocks) merged over --config, e.g. a "
        "chart-owned ConfigMap; reloaded too",
    )
    p.add_argument(
        "--wait-for-config",
        action="store_true",
        help="start even when --config is absent, empty or invalid (an operator-written ConfigMap not there yet): "
        "answer /health 200, /ready and requests 503 with the reason, and serve once the file is usable "
        "(polled every second). The chart passes it. Without it such a file is an error (exit 1)",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="listen port (default 8080)")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log level (default %(default)s)")
    p.add_argument(
        "--allow-insecure-gateway",
        action="store_true",
        help="let a gateway (mode: gateway) serve without gateway.tokenFile: anyone who reaches it may prefill. "
        "It warns at start and exports prfaas_gateway_insecure 1. Without it such a gateway refuses to start",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="accept only requests naming this model (repeatable; others get OpenAI's 404 model_not_found); "
        "default: any name",
    )
    p.add_argument(
        "--peers",
        action="append",
        default=[],
        metavar="URL",
        help="another router replica in front of the same PD cluster (repeatable, or comma-separated): the "
        "replicas share their PD prefill books, so each counts the others' local prefills in its queues. This "
        "replica's own URL may be listed (it recognises itself)",
    )
    p.add_argument(
        "--peers-dns",
        default="",
        metavar="NAME:PORT",
        help="peer router replicas by DNS: every address NAME resolves to (re-resolved every few seconds), e.g. "
        "the chart's headless Service <release>-router-peers.<namespace>.svc:8080. Empty: none",
    )
    p.add_argument(
        "--peers-token-file",
        default="",
        metavar="PATH",
        help="a bearer token the replicas share (the chart's replicaSync.tokenSecret): sent with this replica's "
        "books and required on the peers' (401 without it); re-read when it changes. Required with --peers or "
        "--peers-dns (a router without peers serves no books path)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="router processes serving --port (SO_REUSEPORT), sharing their books and their /metrics, so one "
        "router uses N cores (default 1; router mode only: a gateway is one process). Stopping the parent stops "
        "them; a worker that exits stops the others",
    )
    p.add_argument("--worker-port", type=int, default=None, help=argparse.SUPPRESS)  # set by --workers
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from prfaas_router.edge.app import WORKERS_GATEWAY, check_secure
    from prfaas_router.edge.app import run as run_router
    from prfaas_router.state.config import ConfigError, load_config
    from prfaas_router.state.peers import ReplicaPeers, parse_peers_dns
    from prfaas_router.state.security import read_token

    configure_logging(args.log_level)
    peers = [u.strip() for arg in args.peers for u in arg.split(",") if u.strip()]
    try:
        if args.workers < 1:
            raise UsageError(f"--workers wants a count of 1 or more, got {args.workers}")
        if not args.wait_for_config:  # else the router judges the file itself, and waits until it is usable
            try:
                config, _ = load_config(args.config, args.settings)
            except ConfigError as exc:
                return error(config_error(exc))
            check_secure(config, args.allow_insecure_gateway)
            gw_token = config.gateway.token_file if config.mode == "gateway" and config.gateway else None
            if gw_token and read_token(gw_token) is None:  # else the app raises it, as a traceback
                raise ValueError(f"gateway.tokenFile {gw_token}: unreadable or empty (a bearer token, one line)")
        try:
            peers_dns = parse_peers_dns(args.peers_dns)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        for url in peers:
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"--peers wants base URLs (http://host:port), got {url!r}")
        token_file = args.peers_token_file or None
        if token_file is not None and read_token(token_file) is None:
            raise ValueError(f"--peers-token-file {token_file}: unreadable or empty")
        if (peers or peers_dns) and token_file is None:
            raise UsageError(
                "--peers / --peers-dns need --peers-token-file: the replicas' books steer routing and share the "
                "clients' port (chart: router.replicaSync.tokenSecret, generated when empty)"
            )
        if args.workers > 1 and not args.wait_for_config and config.mode == "gateway":
            raise UsageError(WORKERS_GATEWAY)
    except (ValueError, UsageError) as exc:  # InsecureGatewayError, an unreadable token file, a malformed peer
        return fail(exc)
    if args.workers > 1:
        from .router_workers import supervise

        return supervise(args, peers)
    try:
        settings = Path(args.settings) if args.settings else None
        models = frozenset(args.model) if args.model else None
        replicas = ReplicaPeers(tuple(peers), peers_dns, token_file)
        run_router(
            Path(args.config),
            args.host,
            args.port,
            settings,
            args.allow_insecure_gateway,
            models,
            replicas,
            args.wait_for_config,
            args.worker_port,
        )
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK


def config_error(exc: Exception) -> str:
    """A RouterConfig loading error on one line: the OS's reason without ``[Errno N]``, a YAML error's line and
    column instead of PyYAML's multi-line dump."""
    source = str(exc).split(": ", 1)[0]
    cause = exc.__cause__
    if isinstance(cause, OSError):
        return os_error(f"{source}: cannot read", cause)
    if isinstance(cause, yaml.YAMLError):
        return yaml_error(source, cause)
    return " ".join(str(exc).split())
