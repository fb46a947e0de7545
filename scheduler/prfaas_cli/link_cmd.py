"""``prfaas link``: run the inter-datacenter link emulator, a TCP relay shaped to a capacity, an RTT and a
loss rate, with /metrics and a live admin API (squeeze or cut the link mid-run)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .engine_cmd import add_scale_arguments, scale_from
from .output import EXIT_OK, EXIT_USAGE, error, os_error


def register(sub: Any) -> None:
    p = sub.add_parser(
        "link",
        help="run the inter-datacenter link emulator (shaped TCP relay with metrics and live reconfiguration)",
        description=__doc__,
    )
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="where decode engines connect")
    p.add_argument("--target", required=True, metavar="HOST:PORT", help="the prefill engine's KV server")
    p.add_argument("--capacity-gbps", type=float, default=100.0, help="capacity, model Gbps (default %(default)s)")
    p.add_argument("--rtt-ms", type=float, default=1.0, help="round-trip time, model ms (default %(default)s)")
    p.add_argument(
        "--loss", type=float, default=0.0, help="chunk loss probability: a lost chunk is resent, one RTT late"
    )
    add_scale_arguments(p)
    p.add_argument("--name", default="link", help="the link label of the metrics (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=None, help="port of /metrics and /admin (default: none)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="host of /metrics and /admin (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="seed of loss and fault draws")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from prfaas_link.config import Endpoint, LinkConfig, LinkConfigError
    from prfaas_link.server import serve

    try:
        config = LinkConfig(
            listen=Endpoint.parse(args.listen, "--listen"),
            target=Endpoint.parse(args.target, "--target"),
            capacity_gbps=args.capacity_gbps,
            rtt_ms=args.rtt_ms,
            loss=args.loss,
            scale=scale_from(args),
            name=args.name,
            admin=Endpoint(args.metrics_host, args.metrics_port) if args.metrics_port is not None else None,
            seed=args.seed,
        )
    except (LinkConfigError, ValueError) as exc:
        return error(str(exc), EXIT_USAGE)  # the config is built from the flags alone
    try:
        asyncio.run(serve(config))
    except OSError as exc:  # the port is taken, the address is not ours
        return error(os_error("cannot serve", exc))
    return EXIT_OK
