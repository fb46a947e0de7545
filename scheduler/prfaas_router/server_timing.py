"""``Server-Timing`` (W3C) on the gateway's and the router's answers: where a request's time went, per phase
(:data:`~prfaas_core.names.SERVER_TIMING` names the entries). Durations are wall milliseconds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

GATEWAY_PREFIX = "gw-"
"""The router passes the gateway's entries on under this prefix."""


def entry(name: str, seconds: float) -> str:
    return f"{name};dur={max(0.0, seconds) * 1000.0:.1f}"


def header(entries: Iterable[tuple[str, float]]) -> str:
    """``name;dur=ms, ...`` from (name, wall seconds) pairs."""
    return ", ".join(entry(name, s) for name, s in entries)


def prefixed(value: str | None, prefix: str = GATEWAY_PREFIX) -> list[str]:
    """Another hop's entries, each renamed ``prefix + name`` (malformed ones dropped)."""
    out = []
    for part in (value or "").split(","):
        name, _, rest = part.strip().partition(";")
        if name and all(c.isalnum() or c in "-_" for c in name):
            out.append(prefix + name + (";" + rest if rest else ""))
    return out


def parse(value: str | None) -> dict[str, float]:
    """``{name: ms}`` of a ``Server-Timing`` value (entries without a ``dur`` are left out)."""
    out: dict[str, float] = {}
    for part in (value or "").split(","):
        name, *params = (p.strip() for p in part.split(";"))
        for param in params:
            key, _, val = param.partition("=")
            if key == "dur":
                with contextlib.suppress(ValueError):
                    out[name] = float(val)
    return out
