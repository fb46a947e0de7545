"""The scenario a simulation runs: deployments to compare, arrivals, the length mix (which may shift over
time), the link and its capacity schedule, the prefix cache, SLOs, the policies' knobs and the search.

YAML fields are camelCase (``rateCurve``, ``capacityGbps``); unknown fields are errors. Every default is
the paper's case study (§4.1): 4 × H200 PrFaaS instances, 8 × H20 PD instances, 12 × H20 for the
homogeneous baseline, the internal 1T model, a 100 Gbps link capped at 80 %, log-normal uncached lengths
(μ 9.90, σ 1.00 on [128, 131072]), 1024 output tokens, TTFT SLO 2 s + 0.2 s per 1K prompt tokens, decode
SLO 40 tokens/s. :func:`default_scenario` is that scenario (``examples/02-simulate/case-study.yaml``).

Lengths are the *uncached increment* of each request: without sessions a request's whole prompt; with
multi-turn sessions, the tokens a turn adds to the session's context (its prompt is the context so far plus
the increment, and shares the context with the previous turn — so the prefix cache matters).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..api.base import ApiModel, CelRule
from ..api.common import SloSpec
from ..api.inter_dc_link import WATERMARK_ORDER
from ..api.pd_cluster import LongTermPolicySpec
from ..capacity.workload import InputLengthSpec, LogNormalSpec

DeploymentName = Literal["homogeneous_pd", "naive_heterogeneous", "prfaas_pd_static", "prfaas_pd", "oblivious_pd"]
ALL_DEPLOYMENTS: tuple[DeploymentName, ...] = ("homogeneous_pd", "naive_heterogeneous", "prfaas_pd_static", "prfaas_pd")
"""The default comparison; ``oblivious_pd`` (remote by length with no cap, like a PD router that ignores the
link) is named explicitly where a scenario wants it."""
StreamTimingName = Literal["layer-wise", "pull-after-prefill"]


class CurvePoint(ApiModel):
    """One knot of a piecewise-linear curve of time."""

    at_seconds: float = Field(ge=0, description="Time of the knot, s (within the period when one is set).")
    value: float = Field(ge=0, description="Value at that time (a rate multiplier or a class weight).")


class TimeCurveSpec(ApiModel):
    """A piecewise-linear function of time, flat before the first and after the last knot, optionally
    repeating every ``periodSeconds`` (a day, or a compressed day)."""

    __cel_rules__ = (
        CelRule(
            rule="self.points.all(p, !has(self.periodSeconds) || p.atSeconds <= self.periodSeconds)",
            message="every point must lie within the period",
            check=lambda c: c.period_seconds is None or all(p.at_seconds <= c.period_seconds for p in c.points),
            field_path=".points",
        ),
    )

    points: list[CurvePoint] = Field(min_length=1, description="Knots, in any order.")
    period_seconds: float | None = Field(default=None, gt=0, description="Repeat the curve with this period, s.")


class BurstSpec(ApiModel):
    """On-off modulation of the rate (a two-state Markov-modulated Poisson process)."""

    high_multiplier: float = Field(default=3.0, gt=0, le=1000, description="Rate multiplier in a burst.")
    low_multiplier: float = Field(default=0.5, ge=0, le=1000, description="Rate multiplier between bursts.")
    mean_high_seconds: float = Field(default=20.0, gt=0, description="Mean length of a burst, s (exponential).")
    mean_low_seconds: float = Field(default=60.0, gt=0, description="Mean gap between bursts, s (exponential).")


class ArrivalSpec(ApiModel):
    """How requests arrive: Poisson, deterministic intervals (``uniform``, the paper's model), on-off
    bursts, or a trace replayed (``traceFile``, JSONL, relative to the scenario file)."""

    __cel_rules__ = (
        CelRule(
            rule="self.process != 'trace' || has(self.traceFile)",
            message="process 'trace' needs traceFile",
            check=lambda a: a.process != "trace" or a.trace_file is not None,
            field_path=".traceFile",
        ),
    )

    process: Literal["poisson", "uniform", "bursty", "trace"] = Field(default="poisson", description="Process.")
    rate_per_second: float = Field(default=1.8, gt=0, le=1_000_000, description="Base arrival rate, req/s.")
    rate_curve: TimeCurveSpec | None = Field(default=None, description="Multiplier of the base rate over time.")
    burst: BurstSpec = Field(default_factory=BurstSpec, description="Burst shape (process 'bursty').")
    trace_file: str | None = Field(default=None, min_length=1, description="JSONL trace (process 'trace').")


class SessionSpec(ApiModel):
    """Multi-turn sessions: a request continues an open session of its class with some probability."""

    continue_probability: float = Field(default=0.0, ge=0, le=1, description="P(a request is a later turn).")
    min_gap_seconds: float = Field(default=30.0, ge=0, description="Think time: least gap between turns, s.")
    diverge_probability: float = Field(
        default=0.0, ge=0, le=1, description="P(a turn rewrites history: shares only a random part of it)."
    )
    max_turns: int = Field(default=20, ge=1, le=100_000, description="Turns after which a session closes.")
    max_context_tokens: int = Field(default=131_072, ge=1, description="A session closes before exceeding this.")


def _default_input() -> InputLengthSpec:
    return InputLengthSpec(log_normal=LogNormalSpec())


class RequestClassSpec(ApiModel):
    """One kind of traffic (e.g. short interactive chat, long-context agents)."""

    name: str = Field(min_length=1, max_length=63, description="Class name (reports).")
    input_length: InputLengthSpec = Field(
        default_factory=_default_input, description="Uncached input tokens per request (per turn)."
    )
    output_tokens: int = Field(default=1024, ge=1, le=1_000_000, description="Output tokens per request.")
    weight: float = Field(default=1.0, ge=0, description="Share of arrivals (relative), when no weightCurve.")
    weight_curve: TimeCurveSpec | None = Field(default=None, description="Share of arrivals over time.")
    sessions: SessionSpec | None = Field(default=None, description="Multi-turn sessions (default: none).")


def _default_classes() -> list[RequestClassSpec]:
    return [RequestClassSpec(name="case-study")]


class SimClusterSpec(ApiModel):
    """The hardware compared (built-in hardware classes and model profiles)."""

    __cel_rules__ = (
        CelRule(
            rule="self.pdInstances >= 2 && self.homogeneousInstances >= 2",
            message="the PD cluster and the homogeneous baseline need at least 2 instances",
            check=lambda c: c.pd_instances >= 2 and c.homogeneous_instances >= 2,
            field_path=".pdInstances",
        ),
    )

    model: str = Field(default="internal-1t", min_length=1, description="Built-in model profile (KV size).")
    prfaas_accelerator: str = Field(default="H200", min_length=1, description="PrFaaS hardware class.")
    prfaas_instances: int = Field(default=4, ge=1, le=10_000, description="PrFaaS instances (8 GPUs each).")
    pd_accelerator: str = Field(default="H20", min_length=1, description="PD cluster hardware class.")
    pd_instances: int = Field(default=8, ge=2, le=10_000, description="PD instances (N_p + N_d).")
    homogeneous_instances: int = Field(default=12, ge=2, le=10_000, description="Homogeneous baseline size.")
    prefill_min: int = Field(default=1, ge=1, description="Fewest PD prefill instances the role loop keeps.")
    decode_min: int = Field(default=1, ge=1, description="Fewest PD decode instances the role loop keeps.")


class CapacityStepSpec(ApiModel):
    at_seconds: float = Field(ge=0, description="When the link's capacity changes, s.")
    capacity_gbps: float = Field(gt=0, le=1_000_000, description="The new capacity, Gbps.")


class SimLinkSpec(ApiModel):
    """The PrFaaS -> PD link (fields as InterDCLink's) and its capacity over time."""

    __cel_rules__ = (WATERMARK_ORDER,)

    capacity_gbps: float = Field(default=100.0, gt=0, le=1_000_000, description="Capacity at the start, Gbps.")
    max_utilization: float = Field(default=0.8, gt=0, le=1, description="Cap admission enforces (fraction).")
    scarce_watermark: float = Field(default=0.9, gt=0, le=1, description="Scarce above this fraction of the cap.")
    abundant_watermark: float = Field(default=0.7, gt=0, le=1, description="Abundant again below this fraction.")
    rtt_ms: float = Field(default=10.0, ge=0, le=10_000, description="Round-trip time, ms.")
    schedule: list[CapacityStepSpec] = Field(default_factory=list, description="Capacity changes (e.g. a cut).")


class CacheSpec(ApiModel):
    """The per-cluster hybrid prefix cache pools (see ``prfaas_core.sim.cache``)."""

    enabled: bool = Field(default=True, description="Model the prefix cache (sessions need it to matter).")
    block_tokens: int = Field(default=512, ge=1, le=1_000_000, description="Full-attention block size, tokens.")
    pool_capacity_gib: float = Field(default=4096.0, gt=0, description="Pool size per cluster, GiB.")
    checkpoints_per_session: int = Field(default=4, ge=1, le=1000, description="Linear-state checkpoints kept.")


class ThresholdPolicySpec(ApiModel):
    window_seconds: float = Field(default=30.0, gt=0, le=86_400, description="Window of recent traffic for t_bw.")


class SimPolicySpec(ApiModel):
    """Knobs of the production policies the simulator drives."""

    threshold: ThresholdPolicySpec = Field(default_factory=ThresholdPolicySpec, description="Short term.")
    roles: LongTermPolicySpec = Field(default_factory=LongTermPolicySpec, description="Long-term role loop.")
    queue_per_instance: float = Field(default=2.0, gt=0, description="Standing queue per instance (role policy).")
    observe_window_seconds: float = Field(
        default=300.0, gt=0, le=86_400, description="Window of the observed length mix and arrival rate, s."
    )
    flip_delay_seconds: float = Field(default=0.0, ge=0, description="Instance unavailable after a flip, s.")
    link_windows: bool = Field(
        default=True,
        description="prfaas_pd books link windows at the gateway's calendar (wait for a window when that beats "
        "local prefill); false: the routers' own admission only.",
    )
    stream_timing: StreamTimingName = Field(
        default="layer-wise", description="When a remote prefill's KV streams: with its prefill, or after it."
    )
    router_replicas: int = Field(
        default=1, ge=1, le=64, description="Router replicas behind a round-robin front, each with its own ledger."
    )
    lane_order: Literal["deadline", "arrival"] = Field(
        default="deadline",
        description="The gateway's lane order (as gateway.admission.laneOrder): deadline, a request due sooner may "
        "take a lane ahead of held bookings due later; arrival, first booked, first served.",
    )


class SearchSpec(ApiModel):
    """The rate searches behind throughput and goodput."""

    enabled: bool = Field(default=True, description="Search throughput and goodput (off: reference runs only).")
    duration_seconds: float = Field(default=1200.0, gt=0, description="Simulated length of one probe, s.")
    relative_precision: float = Field(default=0.03, gt=0, lt=1, description="Bisection stops at this width.")
    attainment: float = Field(default=0.9, gt=0, le=1, description="Goodput: share meeting both SLOs.")
    max_queue_growth: float = Field(
        default=0.02, gt=0, lt=1, description="Unbounded queues: in-system growth above this share of arrivals."
    )
    compare_static_splits: bool = Field(
        default=False, description="Also run prfaas_pd with every fixed prefill count (no role loop)."
    )


class SimElasticSpec(ApiModel):
    """Elastic capacity (``prfaas simulate --elastic``): both clusters sized by the operator's decision
    (``prfaas_core.policy.elastic``) against the planner's static sizes for the peak; fields as the ``scaling``
    block's."""

    __cel_rules__ = (
        CelRule(
            rule="self.prfaasMinInstances <= self.prfaasMaxInstances && self.pdMinInstances <= self.pdMaxInstances",
            message="each cluster's minInstances must not exceed its maxInstances",
            check=lambda e: (
                e.prfaas_min_instances <= e.prfaas_max_instances and e.pd_min_instances <= e.pd_max_instances
            ),
            field_path=".prfaasMinInstances",
        ),
    )

    enabled: bool = Field(default=False, description="Run the elastic comparison (as --elastic) instead.")
    prfaas_min_instances: int = Field(default=1, ge=1, le=10_000, description="Fewest PrFaaS instances.")
    prfaas_max_instances: int = Field(default=8, ge=1, le=10_000, description="Most PrFaaS instances.")
    pd_min_instances: int = Field(default=2, ge=2, le=10_000, description="Fewest PD instances.")
    pd_max_instances: int = Field(default=16, ge=2, le=10_000, description="Most PD instances.")
    period_seconds: float = Field(default=30.0, gt=0, le=86_400, description="How often each loop decides, s.")
    startup_seconds: float = Field(default=120.0, ge=0, le=86_400, description="A new instance's start-up time, s.")
    scale_down_stabilization_seconds: float = Field(
        default=120.0, ge=0, le=86_400, description="Scale-in window, s (default: the start-up time)."
    )
    tolerance: float = Field(default=0.1, ge=0, lt=1, description="No change within this share of the size.")
    target_utilization: float = Field(default=0.8, gt=0, le=1, description="Plan for this share of throughput.")
    prfaas_price_per_instance_hour: float = Field(default=40.0, ge=0, description="Price of a PrFaaS instance-hour.")
    pd_price_per_instance_hour: float = Field(default=16.0, ge=0, description="Price of a PD instance-hour.")
    link_price_per_gb: float = Field(default=0.002, ge=0, description="Price of one GB over the link.")


class Scenario(ApiModel):
    """A simulation scenario (see the module docstring)."""

    name: str = Field(default="case-study", min_length=1, max_length=253, description="Scenario name.")
    description: str = Field(default="", description="What the scenario shows.")
    seed: int = Field(default=1, ge=0, description="Seed of every random choice.")
    duration_seconds: float = Field(default=3600.0, gt=0, le=30 * 86_400, description="Simulated time, s.")
    deployments: list[DeploymentName] = Field(
        default_factory=lambda: list(ALL_DEPLOYMENTS), min_length=1, description="Deployments to compare."
    )
    cluster: SimClusterSpec = Field(default_factory=SimClusterSpec, description="Hardware.")
    link: SimLinkSpec = Field(default_factory=SimLinkSpec, description="The inter-datacenter link.")
    arrivals: ArrivalSpec = Field(default_factory=ArrivalSpec, description="Arrival process.")
    workload: list[RequestClassSpec] = Field(
        default_factory=_default_classes, min_length=1, description="Request classes (the length mix)."
    )
    cache: CacheSpec = Field(default_factory=CacheSpec, description="Prefix cache pools.")
    slo: SloSpec = Field(default_factory=SloSpec, description="TTFT and decode SLOs.")
    policy: SimPolicySpec = Field(default_factory=SimPolicySpec, description="Policy knobs.")
    search: SearchSpec = Field(default_factory=SearchSpec, description="Throughput/goodput search.")
    elastic: SimElasticSpec = Field(default_factory=SimElasticSpec, description="Elastic capacity comparison.")


def default_scenario() -> Scenario:
    """The paper's case study (the embedded default of ``prfaas simulate``)."""
    return Scenario(
        name="case-study",
        description="The paper's case study (§4.1): 4×H200 PrFaaS + 8×H20 PD vs 12×H20 homogeneous and naive "
        "heterogeneous PD, 100 Gbps link, log-normal lengths, Poisson arrivals at 1.8 req/s.",
    )
