"""Entry point of the ``prfaas`` console script.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module's handler returns the
process exit code. Exit codes (as kubectl and helm, :mod:`.output`): 0 ok, 1 an error (invalid input, a failure
at run time), 2 a usage error (argparse's, and option values the command line gets wrong).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from prfaas_core import __version__

from . import (
    crds_cmd,
    engine_cmd,
    engines_cmd,
    link_cmd,
    operator_cmd,
    plan_cmd,
    profile_cmd,
    router_cmd,
    simulate_cmd,
    up_cmd,
    validate_cmd,
)
from .output import EXIT_OK, plain_help

COMMANDS = (
    validate_cmd,
    crds_cmd,
    plan_cmd,
    simulate_cmd,
    engine_cmd,
    engines_cmd,
    profile_cmd,
    link_cmd,
    router_cmd,
    operator_cmd,
    up_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prfaas",
        description="Control plane for Prefill-as-a-Service: cross-datacenter prefill/decode disaggregation.",
    )
    parser.add_argument("--version", action="version", version=f"prfaas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    plain_help(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
