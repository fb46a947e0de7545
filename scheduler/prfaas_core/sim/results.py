"""What one run records: per-request latencies and SLO outcomes, per-second series, decisions, counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api.common import SloSpec
from ..request.slo import ttft_objective_s


@dataclass
class Series:
    """One sample per simulated second (at ``time_s``)."""

    time_s: list[float] = field(default_factory=list)
    egress_gbps: list[float] = field(default_factory=list)
    """KV bytes the link carried in the second ending at ``time_s``."""
    capacity_gbps: list[float] = field(default_factory=list)
    """The link's capacity in that second (the larger one if it changed during the second)."""
    threshold_tokens: list[int] = field(default_factory=list)
    scarce: list[int] = field(default_factory=list)
    in_system: list[int] = field(default_factory=list)
    n_prefill: list[int] = field(default_factory=list)
    n_decode: list[int] = field(default_factory=list)
    queue_prefill: list[int] = field(default_factory=list)
    queue_prfaas: list[int] = field(default_factory=list)
    queue_decode: list[int] = field(default_factory=list)

    def sample(
        self,
        now_s: float,
        egress_gbps: float,
        capacity_gbps: float,
        threshold_tokens: int,
        scarce: bool,
        in_system: int,
        roles: tuple[int, int],
        queues: tuple[int, int, int],
    ) -> None:
        """One second's sample: ``roles`` = (prefill, decode) counts, ``queues`` = (PD prefill, PrFaaS, decode)."""
        self.time_s.append(now_s)
        self.egress_gbps.append(egress_gbps)
        self.capacity_gbps.append(capacity_gbps)
        self.threshold_tokens.append(threshold_tokens)
        self.scarce.append(1 if scarce else 0)
        self.in_system.append(in_system)
        self.n_prefill.append(roles[0])
        self.n_decode.append(roles[1])
        self.queue_prefill.append(queues[0])
        self.queue_prfaas.append(queues[1])
        self.queue_decode.append(queues[2])


@dataclass
class RoleEvent:
    time_s: float
    action: str
    reason: str
    n_prefill: int
    n_decode: int
    threshold_min_tokens: int | None


@dataclass
class RunResult:
    """The raw outcome of one :class:`~prfaas_core.sim.simulation.Simulation` run."""

    name: str
    duration_s: float
    n_requests: int
    end_s: float = 0.0
    events: int = 0
    completed: int = 0
    arrival_s: list[float] = field(default_factory=list)
    """Per finished request (in completion order), like the lists below."""
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    slo_ok: list[bool] = field(default_factory=list)
    remote: list[bool] = field(default_factory=list)
    series: Series = field(default_factory=Series)
    role_events: list[RoleEvent] = field(default_factory=list)
    decisions: list[tuple[float, str, str]] = field(default_factory=list)
    flips: int = 0
    busy_prfaas_s: float = 0.0
    busy_pd_prefill_s: float = 0.0
    util_samples: int = 0
    util_prfaas_sum: float = 0.0
    util_pd_prefill_sum: float = 0.0
    util_decode_sum: float = 0.0
    transferred_bytes: float = 0.0
    cache_move_bytes: float = 0.0
    capacity_changes: list[tuple[float, float]] = field(default_factory=list)
    link_max_over_capacity_gbps: float = 0.0
    pool_hit_tokens: int = 0
    pool_block_match_tokens: int = 0
    link_waits: int = 0
    """Requests that waited for a later link window (``wait_for_link``)."""
    link_wait_s: list[float] = field(default_factory=list)
    """The window wait of every request that booked one (0 for a window that started at once)."""

    def record(self, req: object, slo: SloSpec) -> None:
        """A finished request: TTFT, TPOT and whether it met both SLOs (the TTFT objective on its whole prompt)."""
        spec = req.spec  # type: ignore[attr-defined]
        first = req.first_token_s  # type: ignore[attr-defined]
        done = req.done_s  # type: ignore[attr-defined]
        ttft = first - spec.arrival_s
        out = spec.output_tokens
        tpot = (done - first) / (out - 1) if out > 1 else done - first
        ok = ttft <= ttft_objective_s(slo, spec.input_tokens) and tpot * slo.min_decode_tokens_per_second <= 1.0 + 1e-9
        self.arrival_s.append(spec.arrival_s)
        self.ttft_s.append(ttft)
        self.tpot_s.append(tpot)
        self.slo_ok.append(ok)
        self.remote.append(req.remote)  # type: ignore[attr-defined]
