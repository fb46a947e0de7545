"""What a sized cluster's engines reported this cycle, as the core's :class:`~prfaas_core.policy.elastic.Load`,
and the core's demand from it (the model and the TTFT objective are the core's; nothing is decided here).

The series are vLLM's own (``names.VLLM_PROMPT_TOKENS``, ``VLLM_REQUEST_SUCCESS``, ``VLLM_GENERATION_TOKENS`` as
rates over ``scaling.rateWindowSeconds``; ``VLLM_REQUESTS_WAITING``), with the labels the chart's monitors add
(``namespace``, ``prefill_cluster`` or ``pd_cluster`` and ``role``): nothing only our emulators export. No series
for the cluster (or Prometheus failing) is no demand: the size holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from prfaas_core.api import PDCluster, PrefillCluster, SloSpec
from prfaas_core.capacity.hardware import HardwareProfileError, hardware_from_spec
from prfaas_core.capacity.kv import KvModelError, kv_model_from_profile
from prfaas_core.policy.elastic import Load, pd_demand, site_demand

from .elastic import Demand
from .fleet import egress_bound_gbps
from .observe import DemandQuery, Snapshot
from .registry import Entry

SITE_SLO = SloSpec()
"""A PrefillCluster carries no SLO of its own: the site plans for the default TTFT objective."""


def _sum(roles: Mapping[str, Mapping[str, float]], family: str, only: str | None = None) -> float:
    return sum(v.get(family, 0.0) for r, v in roles.items() if only is None or r == only)


def site_query(entry: Entry, url: str) -> DemandQuery:
    pfc: PrefillCluster = entry.model
    return DemandQuery(
        "prefill_cluster", (entry.namespace or "", entry.name), url, pfc.spec.scaling.rate_window_seconds
    )


def pd_query(entry: Entry, url: str) -> DemandQuery:
    pd: PDCluster = entry.model
    return DemandQuery("pd_cluster", (entry.namespace or "", entry.name), url, pd.spec.scaling.rate_window_seconds)


def site_load_demand(
    entry: Entry, pfc: PrefillCluster, profile: Entry | None, snap: Snapshot | None, url: str
) -> tuple[Demand | None, float]:
    """The site's demand (bounded by its links' caps where it schedules them, under its site cap) and the links'
    cost per hour at the KV that load sends (``scaling.linkPricePerGB``)."""
    if snap is None or url in snap.errors:
        return None, 0.0
    key = (entry.namespace or "", entry.name)
    roles = snap.demand.get(("prefill_cluster", *key))
    if not roles:
        return None, 0.0
    load = Load(_sum(roles, "prompt"), _sum(roles, "requests"), snap.prefill_queue.get(key, 0.0))
    try:
        hw = hardware_from_spec(pfc.spec.hardware)
        kv = kv_model_from_profile(profile.model.spec) if profile is not None and profile.valid else None
    except (HardwareProfileError, KvModelError):
        return None, 0.0
    cap = egress_bound_gbps(pfc)
    need, why = site_demand(load, hw, SITE_SLO, pfc.spec.scaling.target_utilization, kv, cap)
    cost = 0.0
    price = pfc.spec.scaling.link_price_per_gb
    if price and kv is not None:
        length = load.mean_prompt_tokens()
        gb_per_hour = load.prompt_tokens_per_s * kv.kv_bytes(length) / length * 3600 / 1e9
        cost = gb_per_hour * price
    return Demand(need, why), cost


def pd_load_demand(entry: Entry, pd: PDCluster, snap: Snapshot | None, url: str) -> Demand | None:
    """The PD cluster's total demand: the prefill it serves itself and the decode of everything."""
    if snap is None or url in snap.errors:
        return None
    key = (entry.namespace or "", entry.name)
    roles = snap.demand.get(("pd_cluster", *key))
    if not roles:
        return None
    metrics = snap.clusters.get(key)
    queue = metrics.queue_depth if metrics is not None else {}
    prefill = Load(_sum(roles, "prompt", "prefill"), _sum(roles, "requests", "prefill"), queue.get("prefill", 0.0))
    decode = Load(generation_tokens_per_s=_sum(roles, "generation"), decode_waiting=queue.get("decode", 0.0))
    try:
        hw = hardware_from_spec(pd.spec.hardware)
        need, why = pd_demand(prefill, decode, hw, pd.spec.slo, pd.spec.scaling.target_utilization)
    except (HardwareProfileError, ValueError):
        return None
    return Demand(need, why)
