"""One deployment as the engine runs it: hardware, counts, how requests are routed, which policies live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..api.common import SloSpec
from ..capacity.plan_inputs import PlanInputs
from ..policy.link_admission import LaneOrder
from ..policy.link_calendar import StreamTiming
from ..policy.role_types import RolePolicyParams
from .scenario import CacheSpec, SimLinkSpec

Routing = Literal["local", "remote", "threshold", "oblivious"]
"""``local``: every prefill in the PD cluster (homogeneous PD); ``remote``: every prefill on PrFaaS (naive
heterogeneous: no length routing); ``threshold``: the production routing policy (PrFaaS-PD); ``oblivious``:
remote iff the uncached length exceeds the planner's ``t``, no cap (a PD router that ignores the link)."""


@dataclass(frozen=True)
class SimConfig:
    """Everything one run needs besides the request sequence."""

    name: str
    inputs: PlanInputs
    """KV model, hardware profiles and the declared workload (the role loop's planner inputs)."""
    routing: Routing
    n_prfaas: int
    n_prefill: int
    n_decode: int
    threshold_tokens: int
    """``t`` at the start (``t_min``); fixed unless ``live_threshold``."""
    live_threshold: bool
    live_roles: bool
    link: SimLinkSpec
    cache: CacheSpec
    slo: SloSpec
    role_params: RolePolicyParams
    threshold_window_s: float = 30.0
    flip_delay_s: float = 0.0
    observe_window_s: float = 300.0
    link_windows: bool = False
    """Remote prefills book windows in the gateway's link calendar (:mod:`prfaas_core.policy.link_calendar`)."""
    stream_timing: StreamTiming = "layer-wise"
    router_replicas: int = 1
    lane_order: LaneOrder = "deadline"
    """The gateway's lane order (:class:`~prfaas_core.policy.link_admission.AdmitTick`)."""

    def __post_init__(self) -> None:
        if self.n_decode < 1:
            raise ValueError(f"{self.name}: needs at least one decode instance")
        if self.routing != "remote" and self.n_prefill < 1:
            raise ValueError(f"{self.name}: needs at least one PD prefill instance")
        if self.routing != "local" and self.n_prfaas < 1:
            raise ValueError(f"{self.name}: needs at least one PrFaaS instance")
