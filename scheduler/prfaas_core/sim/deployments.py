"""The deployments a scenario compares, sized by the planner (paper §4.3, Table 6):

* ``homogeneous_pd`` — ``homogeneousInstances`` of the PD hardware, the planner's best static P/D split,
  every prefill local (no link);
* ``naive_heterogeneous`` — every prefill on the PrFaaS instances, every PD instance decodes, no length
  routing (the KV of every request crosses the link);
* ``prfaas_pd_static`` — the planner's ``t`` and split, both fixed (the router still tracks the link's mode
  and admits remote prefills only under the cap);
* ``prfaas_pd`` — the same start with both timescales live: ``t`` re-evaluated every second
  (:func:`~prfaas_core.policy.threshold.decide_threshold`) and the role loop flipping PD instances
  (:func:`~prfaas_core.policy.long_term.step`), which also re-optimises ``t_min``; remote prefills book windows in
  the gateway's link calendar (``policy.linkWindows``, on by default) and wait for one when that beats local
  (then ``t_bw`` keeps the recent traffic under the whole cap, not a watermark: the calendar packs the link
  up to the cap, so ``t`` rises only when the traffic above it would not fit even then);
* ``oblivious_pd`` — the planner's ``t`` and split, remote by length with no cap and no admission (a PD router
  that ignores the link): the bandwidth-oblivious baseline.

:func:`static_split_configs` gives ``prfaas_pd`` with each fixed prefill count: the same role loop with
``suspend`` set (it observes and re-optimises ``t_min`` for the observed mix every cycle, but flips
nothing) and the short-term threshold live — so the comparison with ``prfaas_pd`` isolates role flipping.
This is the "best static split" the diurnal scenario is compared with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..capacity.hardware import builtin_hardware, list_builtin_hardware
from ..capacity.kv import kv_model_from_profile
from ..capacity.plan_inputs import PlanInputs
from ..capacity.planner import Plan, compute_balanced_threshold, plan
from ..capacity.profiles import builtin_model_profiles
from ..capacity.workload import EmpiricalDistribution, LengthDistribution, distribution_from_spec
from ..names import NO_THRESHOLD_TOKENS
from ..policy.role_types import RolePolicyParams
from .arrivals import SimRequest
from .config import SimConfig
from .scenario import DeploymentName, Scenario


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the field."""


def _lengths(scenario: Scenario, requests: Sequence[SimRequest]) -> LengthDistribution:
    classes = scenario.workload
    single = len(classes) == 1 and classes[0].sessions is None and scenario.arrivals.process != "trace"
    if single:
        return distribution_from_spec(classes[0].input_length)
    if not requests:
        raise ScenarioError("workload: the scenario generates no requests (raise the rate or the duration)")
    return EmpiricalDistribution.from_lengths(max(1, r.uncached_tokens) for r in requests)


def scenario_inputs(scenario: Scenario, requests: Sequence[SimRequest]) -> PlanInputs:
    """The planner's inputs for the scenario's hardware and its workload (the sequence's incremental lengths;
    the exact distribution when there is one class without sessions)."""
    c = scenario.cluster
    profiles = builtin_model_profiles()
    if c.model not in profiles:
        raise ScenarioError(f"cluster.model: unknown model profile {c.model!r} (built-in: {', '.join(profiles)})")
    hw = {}
    for field, name in (
        ("cluster.prfaasAccelerator", c.prfaas_accelerator),
        ("cluster.pdAccelerator", c.pd_accelerator),
    ):
        profile = builtin_hardware(name)
        if profile is None:
            known = ", ".join(p.accelerator for p in list_builtin_hardware())
            raise ScenarioError(f"{field}: {name!r} has no built-in profile (built-in: {known})")
        hw[field] = profile
    pd_hw = hw["cluster.pdAccelerator"]
    if pd_hw.decode is None:
        raise ScenarioError(f"cluster.pdAccelerator: {c.pd_accelerator!r} has no decode capacity")
    if c.prefill_min + c.decode_min > c.pd_instances:
        raise ScenarioError("cluster.prefillMin: prefillMin + decodeMin exceeds pdInstances")
    outputs = [r.output_tokens for r in requests]
    output = sum(outputs) / len(outputs) if outputs else float(scenario.workload[0].output_tokens)
    rate = len(requests) / scenario.duration_seconds if requests else None
    return PlanInputs(
        kv=kv_model_from_profile(profiles[c.model]),
        prfaas_hardware=hw["cluster.prfaasAccelerator"],
        pd_hardware=pd_hw,
        n_prfaas=c.prfaas_instances,
        n_pd=c.pd_instances,
        link_capacity_gbps=scenario.link.capacity_gbps,
        link_max_utilization=scenario.link.max_utilization,
        lengths=_lengths(scenario, requests),
        output_tokens=output,
        arrival_rate_per_second=rate,
        homogeneous_instances=c.homogeneous_instances,
        prefill_bounds=(c.prefill_min, c.pd_instances),
        decode_bounds=(c.decode_min, c.pd_instances),
        model_name=c.model,
    )


def role_params(scenario: Scenario) -> RolePolicyParams:
    p, c = scenario.policy.roles, scenario.cluster
    return RolePolicyParams.from_policy(
        p,
        prefill_min=c.prefill_min,
        prefill_max=c.pd_instances - c.decode_min,
        decode_min=c.decode_min,
        decode_max=c.pd_instances - c.prefill_min,
        queue_per_instance=scenario.policy.queue_per_instance,
    )


@dataclass(frozen=True)
class PlannedDeployments:
    inputs: PlanInputs
    plan: Plan
    configs: dict[str, SimConfig]
    planner_rps: dict[str, float]
    """The planner's ``Λ_max`` per deployment (Eq. 6)."""
    planner_binding: dict[str, str]


def _config(scenario: Scenario, inputs: PlanInputs, name: str, **kw: object) -> SimConfig:
    kw.setdefault("role_params", role_params(scenario))
    return SimConfig(
        name=name,
        inputs=inputs,
        link=scenario.link,
        cache=scenario.cache,
        slo=scenario.slo,
        threshold_window_s=scenario.policy.threshold.window_seconds,
        flip_delay_s=scenario.policy.flip_delay_seconds,
        observe_window_s=scenario.policy.observe_window_seconds,
        stream_timing=scenario.policy.stream_timing,
        router_replicas=scenario.policy.router_replicas,
        lane_order=scenario.policy.lane_order,
        **kw,  # type: ignore[arg-type]
    )


def plan_deployments(scenario: Scenario, requests: Sequence[SimRequest]) -> PlannedDeployments:
    """Size every deployment of the scenario with the planner."""
    inputs = scenario_inputs(scenario, requests)
    result = plan(inputs)
    pf, homog, naive = result.prfaas_pd.point, result.homogeneous_pd.point, result.naive_heterogeneous.point
    t = round(pf.split.threshold_tokens)
    c = scenario.cluster
    base = {"n_prfaas": c.prfaas_instances, "n_prefill": pf.n_prefill, "n_decode": pf.n_decode, "threshold_tokens": t}
    specs: dict[DeploymentName, dict[str, object]] = {
        "homogeneous_pd": {
            "routing": "local",
            "n_prfaas": 0,
            "n_prefill": homog.n_prefill,
            "n_decode": homog.n_decode,
            "threshold_tokens": NO_THRESHOLD_TOKENS,
            "live_threshold": False,
            "live_roles": False,
        },
        "naive_heterogeneous": {
            "routing": "remote",
            "n_prfaas": c.prfaas_instances,
            "n_prefill": 0,
            "n_decode": c.pd_instances,
            "threshold_tokens": 0,
            "live_threshold": False,
            "live_roles": False,
        },
        "prfaas_pd_static": {"routing": "threshold", **base, "live_threshold": False, "live_roles": False},
        "prfaas_pd": {
            "routing": "threshold",
            **base,
            "live_threshold": True,
            "live_roles": True,
            "link_windows": scenario.policy.link_windows,
        },
        "oblivious_pd": {"routing": "oblivious", **base, "live_threshold": False, "live_roles": False},
    }
    points = {
        "homogeneous_pd": homog,
        "naive_heterogeneous": naive,
        "prfaas_pd_static": pf,
        "prfaas_pd": pf,
        "oblivious_pd": pf,
    }
    configs: dict[str, SimConfig] = {
        name: _config(scenario, inputs, name, **specs[name]) for name in scenario.deployments
    }
    return PlannedDeployments(
        inputs,
        result,
        configs,
        {n: points[n].throughput_rps for n in scenario.deployments},
        {n: points[n].binding for n in scenario.deployments},
    )


def static_split_configs(scenario: Scenario, inputs: PlanInputs) -> dict[int, SimConfig]:
    """``prfaas_pd`` with each fixed prefill count (role loop suspended: ``t_min`` still re-optimised)."""
    c = scenario.cluster
    out: dict[int, SimConfig] = {}
    suspended = replace(role_params(scenario), suspend=True)
    for n_p in range(c.prefill_min, c.pd_instances - c.decode_min + 1):
        t_bal = compute_balanced_threshold(inputs, n_p)
        t = t_bal if t_bal is not None else NO_THRESHOLD_TOKENS
        out[n_p] = _config(
            scenario,
            inputs,
            f"static_{n_p}p{c.pd_instances - n_p}d",
            routing="threshold",
            n_prfaas=c.prfaas_instances,
            n_prefill=n_p,
            n_decode=c.pd_instances - n_p,
            threshold_tokens=t,
            live_threshold=True,
            live_roles=True,
            role_params=suspended,
            link_windows=scenario.policy.link_windows,
        )
    return out
