"""The link emulator's configuration: one frozen object built by the CLI (or a test)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prfaas_core.launch.emulation import ScaleSettings
from prfaas_core.names import GBPS_BITS


class LinkConfigError(ValueError):
    """A setting that cannot work; the message names it."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, what: str) -> Endpoint:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise LinkConfigError(f"{what}: expected HOST:PORT, got {text!r}")
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


DEFAULT_CHUNK_BYTES = 64 * 1024
"""What one shaper grant carries: a 1-s window may carry one chunk above the link's rate."""


def shaper_burst_gbit(relays: int, byte_scale: float, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> float:
    """What ``relays`` shaped relays together may carry above their rates in one 1-s window, in model Gbit: one
    grant (``chunk_bytes`` of wire bytes, ``byte_scale`` wire bytes per model byte) each. The allowance every
    "egress within the cap" check adds to the cap (a window counts whole grants)."""
    return relays * chunk_bytes * 8 / byte_scale / GBPS_BITS


@dataclass(frozen=True)
class LinkConfig:
    """A relay from ``listen`` (the decode side, region B) to ``target`` (the prefill side's KV server).

    ``capacity_gbps`` and ``rtt_ms`` are model values, scaled by ``scale`` like the engines' times and bytes.
    """

    listen: Endpoint
    target: Endpoint
    capacity_gbps: float = 100.0
    rtt_ms: float = 1.0
    loss: float = 0.0
    """Probability that a chunk is lost: it is sent again (capacity charged twice) and arrives one RTT late."""
    scale: ScaleSettings = field(default_factory=ScaleSettings)
    name: str = "link"
    """The ``link`` label of the metrics (an InterDCLink's name)."""
    admin: Endpoint | None = None
    """Where /metrics and /admin listen; None: no HTTP server (in-process use)."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Scheduling granularity of fair sharing (real bytes)."""
    connect_timeout_s: float = 10.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.capacity_gbps < 0:
            raise LinkConfigError("capacity_gbps must be >= 0 (0 cuts the link)")
        if self.rtt_ms < 0:
            raise LinkConfigError("rtt_ms must be >= 0")
        if not 0 <= self.loss < 1:
            raise LinkConfigError("loss must be in [0, 1)")
        if self.chunk_bytes < 1:
            raise LinkConfigError("chunk_bytes must be >= 1")
        if not self.name:
            raise LinkConfigError("name must not be empty")
