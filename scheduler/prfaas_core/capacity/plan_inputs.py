"""The planner's inputs: everything Eqs. 3–8 need, gathered from the API specs (or the paper's case study).

:func:`plan_inputs_from_specs` turns a ModelProfile, a PrefillCluster, a PDCluster, an InterDCLink and a
:class:`~prfaas_core.capacity.workload.WorkloadSpec` into a frozen :class:`PlanInputs`; :func:`case_study_inputs` is
the embedded default (paper §4.1: the internal 1T model, 4×H200 PrFaaS instances, 8×H20 PD instances, a
100 Gbps link, log-normal lengths μ 9.90 σ 1.00 on [128, 131072], 1024 output tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.base import LocalObjectRef, WorkloadRef
from ..api.hardware import HardwareSpec
from ..api.inter_dc_link import InterDCLinkSpec
from ..api.model_profile import ModelProfileSpec
from ..api.pd_cluster import PDClusterSpec, PDWorkloads
from ..api.prefill_cluster import PrefillClusterSpec
from ..names import GBPS_BITS
from .hardware import HardwareProfile, hardware_from_spec
from .kv import KvModel, kv_model_from_profile
from .profiles import INTERNAL_1T
from .workload import LengthDistribution, WorkloadSpec, distribution_from_spec


class PlanInputError(ValueError):
    """Specs that cannot be planned; the message names the object and field."""


@dataclass(frozen=True)
class PlanInputs:
    """Frozen inputs of one plan (paper Table 4's fixed quantities)."""

    kv: KvModel
    prfaas_hardware: HardwareProfile
    pd_hardware: HardwareProfile
    n_prfaas: int
    n_pd: int
    link_capacity_gbps: float
    link_max_utilization: float
    lengths: LengthDistribution
    output_tokens: float
    arrival_rate_per_second: float | None = None
    homogeneous_instances: int | None = None
    """Instances of the PD hardware in the homogeneous baseline; default ``n_pd + n_prfaas`` (paper: 12)."""
    prefill_bounds: tuple[int, int] = (1, 100_000)
    decode_bounds: tuple[int, int] = (1, 100_000)
    model_name: str = ""

    @property
    def usable_egress_gbps(self) -> float:
        """``B_out`` of Eq. 3: the link's capacity × its utilisation cap (what admission lets KV use)."""
        return self.link_capacity_gbps * self.link_max_utilization

    @property
    def usable_egress_bytes_per_s(self) -> float:
        return self.usable_egress_gbps * GBPS_BITS / 8.0

    @property
    def homogeneous_count(self) -> int:
        return self.homogeneous_instances if self.homogeneous_instances is not None else self.n_pd + self.n_prfaas

    def decode_requests_per_second(self) -> float:
        """``BS_max / (T_decode·L_out)`` of one PD instance (Eq. 5 per instance)."""
        assert self.pd_hardware.decode is not None  # checked when the inputs are built
        return self.pd_hardware.decode.requests_per_second(self.output_tokens)


def plan_inputs_from_specs(
    model_profile: ModelProfileSpec,
    prefill: PrefillClusterSpec,
    pd: PDClusterSpec,
    link: InterDCLinkSpec,
    workload: WorkloadSpec,
    homogeneous_instances: int | None = None,
) -> PlanInputs:
    """Gather the planner's inputs from the four kinds and a workload.

    Raises :class:`PlanInputError` (or :class:`~prfaas_core.capacity.hardware.HardwareProfileError`, a ValueError too)
    naming the object and field: unknown hardware without overrides, a PD hardware without decode capacity.
    """
    kv = kv_model_from_profile(model_profile)
    prfaas_hw = hardware_from_spec(prefill.hardware, "PrefillCluster spec.hardware")
    pd_hw = hardware_from_spec(pd.hardware, "PDCluster spec.hardware")
    if pd_hw.decode is None:
        raise PlanInputError(
            f"PDCluster spec.hardware.decode: accelerator {pd.hardware.accelerator!r} has no built-in decode "
            "capacity; set spec.hardware.decode (maxBatchSize, stepTimeMs)"
        )
    if homogeneous_instances is not None and homogeneous_instances < 2:
        raise PlanInputError("homogeneous instances must be at least 2 (one prefill, one decode)")
    try:
        lengths = distribution_from_spec(workload.input_length)
    except ValueError as exc:
        raise PlanInputError(f"workload inputLength: {exc}") from None
    return PlanInputs(
        kv=kv,
        prfaas_hardware=prfaas_hw,
        pd_hardware=pd_hw,
        n_prfaas=prefill.instances,
        n_pd=pd.instances,
        link_capacity_gbps=link.capacity_gbps,
        link_max_utilization=link.max_utilization,
        lengths=lengths,
        output_tokens=workload.output_tokens,
        arrival_rate_per_second=workload.arrival_rate_per_second,
        homogeneous_instances=homogeneous_instances,
        prefill_bounds=(pd.roles.prefill.min, pd.roles.prefill.max),
        decode_bounds=(pd.roles.decode.min, pd.roles.decode.max),
        model_name=model_profile.served_model_name or "",
    )


def case_study_specs() -> tuple[ModelProfileSpec, PrefillClusterSpec, PDClusterSpec, InterDCLinkSpec, WorkloadSpec]:
    """The paper's case study (§4.1) as API specs."""
    profile_ref = LocalObjectRef(name="internal-1t")
    prefill = PrefillClusterSpec(
        region="region-a",
        model_profile_ref=profile_ref,
        instances=4,
        hardware=HardwareSpec(accelerator="H200"),
        workload=WorkloadRef(kind="LeaderWorkerSet", name="prfaas-prefill"),
    )
    pd = PDClusterSpec(
        region="region-b",
        model_profile_ref=profile_ref,
        instances=8,
        hardware=HardwareSpec(accelerator="H20"),
        workloads=PDWorkloads(shared=WorkloadRef(kind="LeaderWorkerSet", name="pd-engines")),
    )
    link = InterDCLinkSpec(
        prefill_cluster_ref=LocalObjectRef(name="prfaas-h200"),
        pd_cluster_ref=LocalObjectRef(name="pd-h20"),
        capacity_gbps=100.0,
    )
    return INTERNAL_1T, prefill, pd, link, WorkloadSpec()


def case_study_inputs() -> PlanInputs:
    """The embedded default: the paper's case study (Table 6 should come out of it)."""
    return plan_inputs_from_specs(*case_study_specs())
