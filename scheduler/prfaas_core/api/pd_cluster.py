"""PDCluster: a local prefill/decode cluster (e.g. H20) whose P/D split the long-term loop re-balances.

Two actuation modes (ARCHITECTURE.md, "Role flips"): *Relabel* — one shared workload whose instances run a
both-ways KV role; a flip changes the role label after a drain, no restart. *Scale* — separate prefill and
decode workloads; a flip scales one down after a drain and the other up. Exactly one writer per replica
count (the operator).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..names import (
    GROUP_VERSION,
    KIND_PD_CLUSTER,
    NO_THRESHOLD_TOKENS,
    VLLM_GENERATION_TOKENS,
    VLLM_KV_CACHE_USAGE,
    VLLM_PROMPT_TOKENS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
)
from .base import ApiModel, CelRule, Condition, LocalObjectRef, ObjectMeta, WorkloadRef, conditions_field
from .common import (
    DecisionRecord,
    KvTransportSpec,
    LoopMemory,
    PDClusterSummary,
    Region,
    RoleRange,
    RoleStatus,
    SloSpec,
)
from .engine import EngineSettingsSpec
from .hardware import HardwareSpec
from .scaling import ScalingSpec, ScalingStatus, scaling_field

_SELECTOR = 'namespace="$namespace", pd_cluster="$pd_cluster", role="$role"'


class PDWorkloads(ApiModel):
    """The workloads holding the PD cluster's engine instances."""

    shared: WorkloadRef | None = Field(
        default=None, description="Relabel mode: one workload whose instances switch role by label."
    )
    prefill: WorkloadRef | None = Field(default=None, description="Scale mode: the prefill workload.")
    decode: WorkloadRef | None = Field(default=None, description="Scale mode: the decode workload.")


class RoleBounds(ApiModel):
    """Per-role bounds on instance counts."""

    prefill: RoleRange = Field(
        default_factory=RoleRange, description="Prefill (PD-P) bounds.", json_schema_extra={"default": {}}
    )
    decode: RoleRange = Field(
        default_factory=RoleRange, description="Decode (PD-D) bounds.", json_schema_extra={"default": {}}
    )


class RoleAssignmentSpec(ApiModel):
    """How a role flip is carried out."""

    mode: Literal["Relabel", "Scale"] = Field(default="Relabel", description="Relabel or Scale.")
    initial_prefill: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="Prefill instances to start with; default: the planner's split for the declared load.",
    )


class LongTermPolicySpec(ApiModel):
    """The long-term loop: observe -> decide -> actuate every ``periodSeconds`` (paper §3.4.3)."""

    __cel_rules__ = (
        CelRule(
            rule="self.flipToPrefillRatio < self.flipToDecodeRatio",
            message="flipToPrefillRatio must be below flipToDecodeRatio (the gap is the hysteresis band)",
            check=lambda p: p.flip_to_prefill_ratio < p.flip_to_decode_ratio,
            field_path=".flipToPrefillRatio",
        ),
    )

    period_seconds: int = Field(default=60, ge=1, le=86_400, description="Seconds between cycles.")
    hysteresis_cycles: int = Field(
        default=2, ge=1, le=100, description="Cycles an imbalance must persist before a flip."
    )
    cooldown_seconds: int = Field(default=300, ge=0, le=86_400, description="Minimum time between flips.")
    drain_timeout_seconds: int = Field(
        default=120,
        ge=1,
        le=86_400,
        description="Longest wait for an instance to drain before its flip; still busy then, the flip is aborted.",
    )
    step_size: int = Field(default=1, ge=1, le=1000, description="Instances flipped per step.")
    flip_to_decode_ratio: float = Field(
        default=1.25,
        ge=1,
        le=100,
        description="Flip prefill->decode when (Θ_prfaas+Θ_pd-p)/Θ_pd-d exceeds this and decode queues grow.",
    )
    flip_to_prefill_ratio: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Flip decode->prefill when (Θ_prfaas+Θ_pd-p)/Θ_pd-d is below this and prefill queues grow.",
    )
    history_limit: int = Field(default=20, ge=1, le=100, description="Decisions kept in status.")
    suspend: bool = Field(default=False, description="Observe and report, but flip nothing.")
    dry_run: bool = Field(
        default=False,
        description="Decide every cycle and record the decisions (status, events, metrics) without acting on them.",
    )


class OverridesSpec(ApiModel):
    """Manual overrides an SRE sets; the long-term loop respects them and reports that it does."""

    threshold_tokens: int | None = Field(
        default=None,
        ge=0,
        le=NO_THRESHOLD_TOKENS,
        description="Pin the routing threshold t (routers stop adapting it).",
    )
    prefill_instances: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="Pin the number of prefill instances (the rest decode); the loop drains and flips to reach "
        "it and makes no decision of its own while set.",
    )


class PrometheusQueries(ApiModel):
    """PromQL templates; ``$namespace``, ``$pd_cluster``, ``$role`` and ``$window`` are substituted.
    Defaults use vLLM's metric names with the labels our ServiceMonitor adds."""

    queue_depth: str = Field(
        default=f"sum({VLLM_REQUESTS_WAITING}{{{_SELECTOR}}})",
        min_length=1,
        max_length=4096,
        description="Requests waiting, per role.",
    )
    running: str = Field(
        default=f"sum({VLLM_REQUESTS_RUNNING}{{{_SELECTOR}}})",
        min_length=1,
        max_length=4096,
        description="Requests running, per role.",
    )
    kv_cache_usage: str = Field(
        default=f"avg({VLLM_KV_CACHE_USAGE}{{{_SELECTOR}}})",
        min_length=1,
        max_length=4096,
        description="KV cache usage (0-1), per role.",
    )
    prompt_tokens_rate: str = Field(
        default=f"sum(rate({VLLM_PROMPT_TOKENS}{{{_SELECTOR}}}[$window]))",
        min_length=1,
        max_length=4096,
        description="Prompt tokens processed per second, per role.",
    )
    generation_tokens_rate: str = Field(
        default=f"sum(rate({VLLM_GENERATION_TOKENS}{{{_SELECTOR}}}[$window]))",
        min_length=1,
        max_length=4096,
        description="Output tokens generated per second, per role.",
    )


class PrometheusSpec(ApiModel):
    """Where and how the operator reads the PD cluster's metrics."""

    url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        pattern=r"^https?://",
        description="Prometheus base URL; default: the operator's --prometheus-url.",
    )
    window_seconds: int = Field(default=120, ge=10, le=86_400, description="Rate window, seconds.")
    queries: PrometheusQueries = Field(
        default_factory=PrometheusQueries, description="Query templates.", json_schema_extra={"default": {}}
    )


class PDClusterSpec(ApiModel):
    """Desired state of a local PD cluster."""

    __cel_rules__ = (
        CelRule(
            rule="self.roleAssignment.mode != 'Relabel' || has(self.workloads.shared)",
            message="Relabel mode needs workloads.shared (one workload whose instances switch role)",
            check=lambda s: s.role_assignment.mode != "Relabel" or s.workloads.shared is not None,
            field_path=".workloads.shared",
            reason="FieldValueRequired",
        ),
        CelRule(
            rule="self.roleAssignment.mode != 'Scale' || (has(self.workloads.prefill) && has(self.workloads.decode))",
            message="Scale mode needs both workloads.prefill and workloads.decode",
            check=lambda s: (
                s.role_assignment.mode != "Scale"
                or (s.workloads.prefill is not None and s.workloads.decode is not None)
            ),
            field_path=".workloads",
            reason="FieldValueRequired",
        ),
        CelRule(
            rule="self.roles.prefill.min + self.roles.decode.min <= self.instances",
            message="roles.prefill.min + roles.decode.min exceeds instances",
            check=lambda s: s.roles.prefill.min + s.roles.decode.min <= s.instances,
            field_path=".roles",
        ),
        CelRule(
            rule="self.roles.prefill.max + self.roles.decode.max >= self.instances",
            message="roles.prefill.max + roles.decode.max is below instances: some instances could hold no role",
            check=lambda s: s.roles.prefill.max + s.roles.decode.max >= s.instances,
            field_path=".roles",
        ),
        CelRule(
            rule="!has(self.roleAssignment.initialPrefill) || (self.roleAssignment.initialPrefill >= "
            "self.roles.prefill.min && self.roleAssignment.initialPrefill <= self.roles.prefill.max && "
            "self.instances - self.roleAssignment.initialPrefill >= self.roles.decode.min && "
            "self.instances - self.roleAssignment.initialPrefill <= self.roles.decode.max)",
            message="roleAssignment.initialPrefill puts prefill or decode outside roles' min/max",
            check=lambda s: (
                s.role_assignment.initial_prefill is None
                or (
                    s.roles.prefill.min <= s.role_assignment.initial_prefill <= s.roles.prefill.max
                    and s.roles.decode.min <= s.instances - s.role_assignment.initial_prefill <= s.roles.decode.max
                )
            ),
            field_path=".roleAssignment.initialPrefill",
        ),
        CelRule(
            rule="!has(self.overrides.prefillInstances) || (self.overrides.prefillInstances >= "
            "self.roles.prefill.min && self.overrides.prefillInstances <= self.roles.prefill.max && "
            "self.instances - self.overrides.prefillInstances >= self.roles.decode.min && "
            "self.instances - self.overrides.prefillInstances <= self.roles.decode.max)",
            message="overrides.prefillInstances puts prefill or decode outside roles' min/max",
            check=lambda s: (
                s.overrides.prefill_instances is None
                or (
                    s.roles.prefill.min <= s.overrides.prefill_instances <= s.roles.prefill.max
                    and s.roles.decode.min <= s.instances - s.overrides.prefill_instances <= s.roles.decode.max
                )
            ),
            field_path=".overrides.prefillInstances",
        ),
        CelRule(
            rule="self.scaling.mode == 'Fixed' || self.roleAssignment.mode == 'Relabel'",
            message="scaling.mode Operator or External sizes the shared workload: it needs roleAssignment.mode "
            "Relabel (Scale mode's two workloads are sized by hand)",
            check=lambda s: s.scaling.mode == "Fixed" or s.role_assignment.mode == "Relabel",
            field_path=".scaling.mode",
        ),
        CelRule(
            rule="self.scaling.mode == 'Fixed' || self.scaling.minInstances >= self.roles.prefill.min + "
            "self.roles.decode.min",
            message="scaling.minInstances is below roles.prefill.min + roles.decode.min",
            check=lambda s: (
                s.scaling.mode == "Fixed" or s.scaling.min_instances >= s.roles.prefill.min + s.roles.decode.min
            ),
            field_path=".scaling.minInstances",
        ),
        CelRule(
            rule="self.scaling.mode != 'External' || (self.instances >= self.scaling.minInstances && "
            "self.instances <= self.scaling.maxInstances)",
            message="External scaling: instances (what /scale writes) must lie within scaling.minInstances and "
            "scaling.maxInstances",
            check=lambda s: (
                s.scaling.mode != "External" or s.scaling.min_instances <= s.instances <= s.scaling.max_instances
            ),
            field_path=".instances",
        ),
        CelRule(
            rule="self.scaling.mode != 'Operator' || !has(self.overrides.prefillInstances) || "
            "self.overrides.prefillInstances + self.roles.decode.min <= self.scaling.minInstances",
            message="overrides.prefillInstances leaves fewer than roles.decode.min decode instances at "
            "scaling.minInstances",
            check=lambda s: (
                s.scaling.mode != "Operator"
                or s.overrides.prefill_instances is None
                or s.overrides.prefill_instances + s.roles.decode.min <= s.scaling.min_instances
            ),
            field_path=".overrides.prefillInstances",
        ),
    )

    region: Region
    datacenter: str | None = Field(default=None, min_length=1, max_length=63, description="Datacenter or zone.")
    model_profile_ref: LocalObjectRef = Field(description="The ModelProfile (cluster-scoped) it serves.")
    instances: int = Field(
        ge=1,
        le=100_000,
        description="PD instances in all (N_p + N_d): the size (Fixed), the starting size (Operator) or what an "
        "HPA/KEDA writes through /scale (External).",
    )
    hardware: HardwareSpec = Field(description="Hardware of one instance.")
    role_assignment: RoleAssignmentSpec = Field(
        default_factory=RoleAssignmentSpec,
        description="How roles are assigned and flipped.",
        json_schema_extra={"default": {}},
    )
    workloads: PDWorkloads = Field(description="Workloads holding the instances.")
    kv_transport: KvTransportSpec = Field(
        default_factory=KvTransportSpec,
        description="KV transport of the PD engines: the same connector as the PrefillClusters that send to it.",
        json_schema_extra={"default": {}},
    )
    engine: EngineSettingsSpec = Field(
        default_factory=EngineSettingsSpec,
        description="How the engines start (model path, ports, block size); `prfaas engines` renders them.",
        json_schema_extra={"default": {}},
    )
    roles: RoleBounds = Field(
        default_factory=RoleBounds, description="Min/max per role.", json_schema_extra={"default": {}}
    )
    policy: LongTermPolicySpec = Field(
        default_factory=LongTermPolicySpec, description="Long-term policy.", json_schema_extra={"default": {}}
    )
    slo: SloSpec = Field(default_factory=SloSpec, description="SLOs.", json_schema_extra={"default": {}})
    prometheus: PrometheusSpec = Field(
        default_factory=PrometheusSpec, description="Metrics source.", json_schema_extra={"default": {}}
    )
    overrides: OverridesSpec = Field(
        default_factory=OverridesSpec,
        description="Manual overrides of t and the split.",
        json_schema_extra={"default": {}},
    )
    scaling: ScalingSpec = scaling_field()


class PDClusterStatus(ApiModel):
    """Observed state and the long-term loop's decisions."""

    observed_generation: int | None = Field(default=None, ge=0, description="Generation last processed.")
    prefill: RoleStatus = Field(default_factory=RoleStatus, description="Prefill (PD-P) counts.")
    decode: RoleStatus = Field(default_factory=RoleStatus, description="Decode (PD-D) counts.")
    threshold_tokens: int | None = Field(default=None, ge=0, description="Routing threshold t in force.")
    threshold_min_tokens: int | None = Field(
        default=None, ge=0, description="Lower bound on t published to routers (compute-balanced t)."
    )
    threshold_max_tokens: int | None = Field(default=None, ge=0, description="Upper bound on t for routers.")
    last_decision: DecisionRecord | None = Field(default=None, description="The latest decision.")
    decisions: list[DecisionRecord] = Field(
        default_factory=list, max_length=100, description="Recent decisions, newest last (bounded)."
    )
    router_config_map: str | None = Field(default=None, description="ConfigMap holding the routers' config.")
    loop: LoopMemory | None = Field(default=None, description="The long-term loop's memory across restarts.")
    summary: PDClusterSummary = Field(default_factory=PDClusterSummary, description="Printer-column strings.")
    replicas: int = Field(default=0, ge=0, description="Instances ready, both roles (/scale's status.replicas).")
    selector: str | None = Field(default=None, description="Label selector of the instances' pods (/scale's).")
    scaling: ScalingStatus | None = Field(default=None, description="Elastic capacity in force (Operator mode).")
    conditions: list[Condition] = conditions_field("Ready, Progressing, Degraded.")


class PDCluster(ApiModel):
    """A local prefill/decode cluster."""

    api_version: Literal["prfaas.io/v1alpha1"] = Field(default=GROUP_VERSION, description="API version.")
    kind: Literal["PDCluster"] = Field(default=KIND_PD_CLUSTER, description="Kind.")
    metadata: ObjectMeta
    spec: PDClusterSpec
    status: PDClusterStatus | None = None
