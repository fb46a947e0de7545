"""The paper's cache-aware routing rule, availability, admission and the in-cluster pick."""

from __future__ import annotations

import pytest

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.policy.link_state import LinkParams
from prfaas_core.policy.routing import (
    InstanceView,
    RouteRequest,
    RoutingView,
    decide_route,
    pick_decode_instance,
    pick_prefill_instance,
    transfer_bytes,
)

INPUTS = case_study_inputs()
KV = INPUTS.kv
PRF = INPUTS.prfaas_hardware.prefill_seconds
PD = INPUTS.pd_hardware.prefill_seconds
LINK = LinkParams("a-to-b", 100.0)


def view(mode: str = "abundant", t: int = 19_400, egress: float = 0.0, available: bool = True) -> RoutingView:
    return RoutingView(t, mode, egress, LINK, available, "" if available else "PrFaaS breaker open")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "total", "pd", "prfaas", "target", "uncached"),
    [
        ("abundant", 10_000, 0, 0, "local", 10_000),
        ("abundant", 40_000, 0, 0, "remote", 40_000),
        ("abundant", 19_400, 0, 0, "local", 19_400),  # l <= t stays local
        ("abundant", 19_401, 0, 0, "remote", 19_401),
        # abundant: the longer prefix counts, wherever it sits
        ("abundant", 40_000, 0, 30_000, "local", 10_000),
        ("abundant", 40_000, 30_000, 0, "local", 10_000),
        # scarce: only the PD cluster's own prefix counts (no cross-cluster cache moves)
        ("scarce", 40_000, 0, 30_000, "remote", 40_000),
        ("scarce", 40_000, 30_000, 0, "local", 10_000),
    ],
)
def test_paper_rule(mode: str, total: int, pd: int, prfaas: int, target: str, uncached: int) -> None:
    d = decide_route(RouteRequest(total, pd, prfaas), view(mode), KV, PRF)
    assert d.target == target and d.uncached_tokens == uncached, d.reason
    assert d.reason


def test_abundant_prefix_held_by_the_other_cluster_is_moved() -> None:
    d = decide_route(RouteRequest(40_000, 0, 30_000), view("abundant"), KV, PRF)
    assert d.target == "local" and d.cache_transfer_tokens == 30_000


def test_a_cache_move_towards_pd_is_admitted_like_a_stream() -> None:
    pd_seconds = PRF  # any monotone prefill curve: the move must be no slower than recomputing
    d = decide_route(RouteRequest(40_000, 0, 30_000), view("abundant"), KV, PRF, pd_seconds)
    assert d.target == "local" and d.cache_transfer_tokens == 30_000 and d.uncached_tokens == 10_000
    assert d.move_bytes == pytest.approx(transfer_bytes(KV, 30_000, 0))
    assert d.move_gbps == pytest.approx(d.move_bytes * 8 / PRF(30_000) / 1e9)
    # a link too busy for the move: PD prefills from its own (empty) prefix, the move is not made
    busy = decide_route(RouteRequest(40_000, 0, 30_000), view("abundant", egress=79.0), KV, PRF, pd_seconds)
    assert busy.target == "local" and busy.cache_transfer_tokens == 0 and busy.uncached_tokens == 40_000
    assert busy.kind == "admission" and "not admitted" in busy.reason and busy.move_bytes == 0
    # no reachable PrFaaS cluster: nothing to move from
    gone = decide_route(RouteRequest(40_000, 0, 30_000), view("abundant", available=False), KV, PRF, pd_seconds)
    assert gone.cache_transfer_tokens == 0 and gone.uncached_tokens == 40_000


def surged(
    local_wait: float | None, remote_wait: float | None, mode: str = "abundant", egress: float = 0.0
) -> RoutingView:
    v = view(mode, egress=egress)
    return RoutingView(
        v.threshold_tokens, v.link_mode, egress, LINK, True, local_wait_s=local_wait, remote_wait_s=remote_wait
    )


def test_a_short_request_spills_to_prfaas_when_the_pd_queue_surges() -> None:
    short = RouteRequest(8_000)
    pd_s = PD  # H20: slower than the H200 PrFaaS curve
    calm = decide_route(short, surged(local_wait=0.5, remote_wait=0.0), KV, PRF, pd_s)
    assert calm.target == "local" and calm.kind == "threshold"  # a wait shorter than its own prefill: no surge
    d = decide_route(short, surged(local_wait=20.0, remote_wait=0.0), KV, PRF, pd_s)
    assert d.target == "remote" and d.kind == "spill" and "PD prefill queue surge" in d.reason
    assert d.transfer_bytes == pytest.approx(KV.kv_bytes(8_000))
    # PrFaaS backed up even more: staying local is faster
    assert decide_route(short, surged(local_wait=20.0, remote_wait=30.0), KV, PRF, pd_s).target == "local"
    # unknown waits, a scarce link or a link at its cap: no spill to PrFaaS
    assert decide_route(short, surged(20.0, None), KV, PRF, pd_s).kind == "threshold"
    assert decide_route(short, surged(20.0, 0.0, mode="scarce"), KV, PRF, pd_s).target == "local"
    capped = decide_route(short, surged(20.0, 0.0, egress=79.0), KV, PRF, pd_s)
    assert capped.target == "local" and capped.kind == "admission"


def test_with_an_slo_a_short_request_spills_once_its_local_ttft_would_miss_it() -> None:
    n = 16_000
    wait = 0.9 * PD(n)  # shorter than its own prefill: no surge by the wait alone
    local_ttft = wait + PD(n)
    slo = local_ttft - 0.1
    no_slo = decide_route(RouteRequest(n), surged(wait, 0.0), KV, PRF, PD)
    assert no_slo.target == "local" and no_slo.kind == "threshold"
    d = decide_route(RouteRequest(n, ttft_slo_s=slo), surged(wait, 0.0), KV, PRF, PD)
    assert d.target == "remote" and d.kind == "spill" and f"misses its SLO {slo:.2f} s" in d.reason, d.reason
    # local meets its SLO: no spill
    met = decide_route(RouteRequest(n, ttft_slo_s=local_ttft + 0.1), surged(wait, 0.0), KV, PRF, PD)
    assert met.target == "local" and met.kind == "threshold"
    # PrFaaS would miss it too (though sooner than local): the request stays where t put it
    late = slo - PRF(n) + 0.05
    assert late + PRF(n) < local_ttft
    both = decide_route(RouteRequest(n, ttft_slo_s=slo), surged(wait, late), KV, PRF, PD)
    assert both.target == "local" and both.kind == "threshold"


def test_a_spill_counts_the_kv_streams_tail_on_a_thin_link() -> None:
    """PrFaaS's predicted TTFT ends when the KV has crossed: on a 0.4-Gbps cap a 16K-token request's stream
    outlasts its H200 prefill by seconds, so a PD queue that a 100-Gbps link would spill past stays local."""
    n = 16_000
    stream_s = KV.kv_bytes(n) * 8.0 / 1e9 / 0.4
    wait = PD(n) + 0.2  # past its own prefill: a surge
    thin = RoutingView(19_400, "abundant", 0.0, LinkParams("a-to-b", 0.5), True, local_wait_s=wait, remote_wait_s=0.0)
    # PrFaaS by its prefill alone would be faster than local, by its stream it is not
    assert PRF(n) < wait + PD(n) < stream_s
    assert decide_route(RouteRequest(n), thin, KV, PRF, PD).target == "local"
    wide = decide_route(RouteRequest(n), surged(wait, 0.0), KV, PRF, PD)
    assert wide.target == "remote" and wide.kind == "spill"


def test_a_long_request_spills_to_pd_when_the_prfaas_queue_surges() -> None:
    long = RouteRequest(30_000)
    assert decide_route(long, surged(local_wait=0.0, remote_wait=0.0), KV, PRF, PD).target == "remote"
    d = decide_route(long, surged(local_wait=0.0, remote_wait=120.0), KV, PRF, PD)
    assert d.target == "local" and d.kind == "spill" and "PrFaaS queue surge" in d.reason
    assert d.uncached_tokens == 30_000


def test_remote_carries_transfer_bytes_and_rate() -> None:
    d = decide_route(RouteRequest(32_768), view(), KV, PRF)
    assert d.target == "remote"
    assert d.transfer_bytes == pytest.approx(KV.kv_bytes(32_768))
    assert d.egress_gbps == pytest.approx(KV.kv_throughput_gbps(32_768, PRF(32_768)))
    assert 2.5 < d.egress_gbps < 4.0  # Table 5: 3.19 Gbps at 32K


def test_unavailable_remote_falls_back_to_local_with_reason() -> None:
    d = decide_route(RouteRequest(60_000), view(available=False), KV, PRF)
    assert d.target == "local" and "breaker open" in d.reason


def test_admission_sends_long_request_local_when_cap_would_be_exceeded() -> None:
    d = decide_route(RouteRequest(60_000), view(egress=79.0), KV, PRF)
    assert d.target == "local" and "exceed the cap" in d.reason
    assert decide_route(RouteRequest(60_000), view(egress=70.0), KV, PRF).target == "remote"


def test_transfer_bytes_skip_what_decode_already_holds() -> None:
    full = transfer_bytes(KV, 40_000, 0)
    partial = transfer_bytes(KV, 40_000, 30_000)
    assert partial < full
    assert partial >= KV.fixed_bytes  # the linear state always crosses


def test_prefill_pick_is_cache_affine_but_load_aware() -> None:
    t = INPUTS.pd_hardware.prefill_seconds
    a = InstanceView("a", queued_prefill_s=0.0, cached_prefix_tokens=0)
    b = InstanceView("b", queued_prefill_s=0.5, cached_prefix_tokens=15_000)
    assert pick_prefill_instance([a, b], 16_000, t).name == "b"  # prefix worth more than its queue
    b_busy = InstanceView("b", queued_prefill_s=10.0, cached_prefix_tokens=15_000)
    assert pick_prefill_instance([a, b_busy], 16_000, t).name == "a"
    assert pick_prefill_instance([InstanceView("x", draining=True)], 100, t).name is None


def test_prefill_pick_on_paced_instances_waits_for_the_later_of_the_prefill_and_the_egress() -> None:
    """A pull-after-prefill KV leaves a paced instance only when its egress is free: an idle instance still pulling
    a long KV loses to one with a short prefill queue and a free egress; an egress free before the prefill ends costs
    nothing."""
    t = INPUTS.prfaas_hardware.prefill_seconds
    prefill = t(40_000.0)
    pulling = InstanceView("a", queued_prefill_s=0.0, egress_wait_s=prefill + 8.0)
    queued = InstanceView("b", queued_prefill_s=2.0)
    pick = pick_prefill_instance([pulling, queued], 40_000, t)
    assert pick.name == "b" and pick.predicted_s == pytest.approx(2.0 + prefill)
    early = InstanceView("a", queued_prefill_s=0.0, egress_wait_s=prefill - 0.1)
    pick = pick_prefill_instance([early, queued], 40_000, t)
    assert pick.name == "a" and pick.predicted_s == pytest.approx(prefill) and "egress free in" in pick.reason


def test_decode_pick_least_loaded_and_skips_unhealthy() -> None:
    insts = [
        InstanceView("d0", active_decodes=10, decode_slots=20),
        InstanceView("d1", active_decodes=3, decode_slots=20),
        InstanceView("d2", active_decodes=0, decode_slots=20, healthy=False),
    ]
    assert pick_decode_instance(insts).name == "d1"


def test_without_cache_moves_each_cluster_is_priced_by_its_own_prefix() -> None:
    """A router cannot move a prefix between clusters: a follow-up turn whose prefix PrFaaS holds must not be
    sent to PD as if it were cached there (it would be recomputed in full)."""
    from dataclasses import replace as _replace

    from prfaas_core.capacity.plan_inputs import case_study_inputs
    from prfaas_core.policy.link_state import LinkParams
    from prfaas_core.policy.routing import RouteRequest, RoutingView, decide_route

    inputs = case_study_inputs()
    view = RoutingView(19_400, "abundant", 0.0, LinkParams("l", 100.0), True)
    req = RouteRequest(36_000, pd_cached_tokens=0, prfaas_cached_tokens=35_000)
    moved = decide_route(req, view, inputs.kv, inputs.prfaas_hardware.prefill_seconds)
    assert moved.target == "local" and moved.cache_transfer_tokens == 35_000  # the simulator moves it
    fixed = decide_route(req, _replace(view, cache_moves=False), inputs.kv, inputs.prfaas_hardware.prefill_seconds)
    assert fixed.target == "remote" and fixed.uncached_tokens == 1_000 and fixed.cache_transfer_tokens == 0
    local = decide_route(
        RouteRequest(36_000, 35_000, 0),
        _replace(view, cache_moves=False),
        inputs.kv,
        inputs.prfaas_hardware.prefill_seconds,
    )
    assert local.target == "local" and local.uncached_tokens == 1_000


def test_a_stream_faster_than_a_squeezed_cap_is_shaped_to_it_not_refused() -> None:
    """A 3 Gbps link (cap 2.4): one H200 prefill's KV (~3.2 Gbps unshaped) is admitted on the idle link at the
    cap — it lasts longer — and refused while another stream holds the link; the ledger books it at the cap."""
    from prfaas_core.policy.link_state import EgressLedger

    squeezed = LinkParams("a-to-b", 3.0)
    idle = RoutingView(19_400, "abundant", 0.0, squeezed, True)
    d = decide_route(RouteRequest(32_768), idle, KV, PRF)
    assert KV.kv_throughput_gbps(32_768, PRF(32_768)) > squeezed.cap_gbps
    assert d.target == "remote" and d.egress_gbps == pytest.approx(squeezed.cap_gbps)
    busy = RoutingView(19_400, "abundant", 0.5, squeezed, True)
    assert decide_route(RouteRequest(32_768), busy, KV, PRF).kind == "admission"
    ledger = EgressLedger()
    booked = ledger.start("r", d.transfer_bytes, 0.0, PRF(32_768), max_gbps=squeezed.cap_gbps)
    assert booked.rate_gbps == pytest.approx(squeezed.cap_gbps)
    assert booked.stream_end_s > PRF(32_768)  # longer than its prefill
    assert ledger.estimate_gbps(0.1, squeezed) == pytest.approx(squeezed.cap_gbps)
