"""The engine: decode batching, pipelined transfers, determinism, drains and flips, nothing dropped."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas_core.capacity.workload import InputLengthSpec, LogNormalSpec
from prfaas_core.policy.role_types import RoleDecision, RoleState
from prfaas_core.sim.arrivals import SimRequest
from prfaas_core.sim.config import SimConfig
from prfaas_core.sim.deployments import plan_deployments
from prfaas_core.sim.scenario import RequestClassSpec, Scenario, default_scenario
from prfaas_core.sim.search import prepare, run_config
from prfaas_core.sim.simulation import Req, Simulation

SCENARIO = default_scenario()
PLANNED = plan_deployments(SCENARIO, ())
T_DECODE = 0.025


def cfg(name: str, **changes: object) -> SimConfig:
    return replace(PLANNED.configs[name], **changes)  # type: ignore[arg-type]


def req(
    k: int, arrival: float, tokens: int, out: int = 1024, session: int | None = None, shared: int = 0
) -> SimRequest:
    return SimRequest(k, arrival, tokens, out, k if session is None else session, shared)


def test_decode_batching_holds_a_slot_for_l_out_steps() -> None:
    # one decode instance with 20 slots, 40 short requests at once: 20 stream, 20 wait one full stream
    config = cfg("homogeneous_pd", n_prefill=10, n_decode=1)
    requests = [req(k, 0.0, 128) for k in range(40)]
    result = Simulation(config, requests, 10.0).run()
    assert result.completed == 40
    first = sorted(t + a for t, a in zip(result.ttft_s, result.arrival_s, strict=True))
    stream = 1024 * T_DECODE
    assert first[19] < stream  # the first 20 got a slot at once
    assert first[20] >= first[0] + stream - 1e-9  # the 21st waited for a slot to free
    assert all(tp == pytest.approx(T_DECODE) for tp in result.tpot_s)
    # the instance serves BS_max / (T_decode · L_out) = 0.78 req/s
    assert result.end_s == pytest.approx(2 * stream + max(first[:20]) - first[0] + 1, abs=3)


def test_an_idle_remote_prefill_hides_its_transfer_behind_the_prefill() -> None:
    config = cfg("naive_heterogeneous")
    inputs = config.inputs
    n = 40_000
    result = Simulation(config, [req(0, 0.0, n)], 10.0).run()
    one_way = SCENARIO.link.rtt_ms / 2000
    expected = inputs.prfaas_hardware.prefill_seconds(n) + one_way + T_DECODE
    assert result.ttft_s == [pytest.approx(expected)]
    assert result.transferred_bytes == pytest.approx(inputs.kv.kv_bytes(n))


def test_a_thin_link_delays_the_kv_beyond_the_prefill() -> None:
    thin = SCENARIO.link.model_copy(update={"capacity_gbps": 0.5})
    config = cfg("naive_heterogeneous", link=thin)
    n = 40_000
    result = Simulation(config, [req(0, 0.0, n)], 10.0).run()
    transfer = config.inputs.kv.kv_bytes(n) * 8 / 0.5e9
    assert transfer > config.inputs.prfaas_hardware.prefill_seconds(n)
    assert result.ttft_s[0] == pytest.approx(transfer + SCENARIO.link.rtt_ms / 2000 + T_DECODE)


def test_a_cached_prefix_shortens_the_prefill_and_the_transfer() -> None:
    config = cfg("naive_heterogeneous")
    first = req(0, 0.0, 30_000, session=1)
    follow = req(1, 100.0, 40_000, session=1, shared=31_024)  # the previous prompt plus its output
    result = Simulation(config, [first, follow], 200.0).run()
    assert result.completed == 2
    # the PD pool holds blocks up to 30_720 after the decode, PrFaaS's up to 29_696 after the prefill: the
    # second prefill computes 40_000 - 29_696 tokens and ships only 40_000 - 30_720 tokens' KV (+ state)
    kv = config.inputs.kv
    expected = kv.kv_bytes(30_000) + kv.kv_bytes(40_000) - (kv.kv_bytes(30_720) - kv.fixed_bytes)
    assert result.transferred_bytes == pytest.approx(expected)
    t_prf = config.inputs.prfaas_hardware.prefill_seconds
    assert result.ttft_s[1] == pytest.approx(t_prf(40_000 - 29_696) + 0.005 + T_DECODE)


def test_same_seed_same_run_and_another_seed_another() -> None:
    def run(seed: int) -> tuple[list[float], list[float]]:
        sc = SCENARIO.model_copy(update={"seed": seed, "duration_seconds": 300.0})
        prepared = prepare(sc)
        result, _, _ = run_config(prepared, prepared.planned.configs["prfaas_pd"], 1.5, 300.0)
        return result.ttft_s, result.series.egress_gbps

    a, b, c = run(4), run(4), run(5)
    assert a == b
    assert a != c


def test_a_draining_instance_gets_no_new_work_and_a_forced_flip_redispatches_its_queue() -> None:
    config = cfg("prfaas_pd_static", threshold_tokens=1 << 30)  # everything local
    sim = Simulation(config, [], 100.0)
    for inst in sim.prfaas:  # ... and no PrFaaS instance available to spill the PD queue surge to
        inst.available_at_s = float("inf")
    control = sim.control
    names = [i.name for i in sim.pd if i.role == "prefill"]
    assert names == ["pd-0", "pd-1", "pd-2"]
    reqs = [Req(req(k, 0.0, 60_000)) for k in range(9)]
    for r in reqs:
        sim.events.at(0.0, sim._arrive, r)
    sim.events.run_until(0.0)
    assert all(len(sim.by_name[n].prefill_jobs) == 3 for n in names)
    drain = RoleDecision("Drain", "test", 3, 5, 3, 5, RoleState(), drain=("pd-0",))
    control.carry_out(drain, 0.0)
    later = [Req(req(100 + k, 1.0, 1_000)) for k in range(4)]
    for r in later:
        sim.events.at(1.0, sim._arrive, r)
    sim.events.run_until(1.0)
    assert len(sim.by_name["pd-0"].prefill_jobs) == 3  # nothing new went to the draining instance
    # the drain times out with 2 jobs not started: the flip re-dispatches them; the one running finishes
    flip = RoleDecision("FlipToDecode", "test", 3, 5, 2, 6, RoleState(), flip=(("pd-0", "decode"),))
    control.carry_out(flip, 1.0)
    assert sim.by_name["pd-0"].role == "decode" and not sim.by_name["pd-0"].draining
    assert len(sim.by_name["pd-0"].prefill_jobs) == 1
    assert sim.result.flips == 1
    sim._stop_s = 10_000.0
    sim.events.run_until(10_000.0)
    assert sim.completed == 13  # nothing dropped


def test_the_role_loop_drains_then_flips_towards_decode_on_a_short_mix() -> None:
    short = RequestClassSpec(
        name="chat",
        input_length=InputLengthSpec(log_normal=LogNormalSpec(mu=7.6, sigma=0.8, min_tokens=64, max_tokens=32_768)),
    )
    roles = SCENARIO.policy.roles.model_copy(update={"period_seconds": 30, "cooldown_seconds": 60})
    sc = Scenario(
        name="short",
        duration_seconds=900.0,
        workload=[short],
        arrivals=SCENARIO.arrivals.model_copy(update={"rate_per_second": 3.0}),
        policy=SCENARIO.policy.model_copy(update={"roles": roles}),
    )
    prepared = prepare(sc)
    config = replace(prepared.planned.configs["prfaas_pd"], n_prefill=3, n_decode=5)
    result, summary, requests = run_config(prepared, config, 1.0, 900.0)
    actions = [e.action for e in result.role_events if e.action != "Hold"]
    assert "FlipToDecode" in actions
    assert actions.index("Drain") < actions.index("FlipToDecode")
    flip = next(e for e in result.role_events if e.action == "FlipToDecode")
    assert "drained" in flip.reason or "drain timeout" in flip.reason
    assert max(result.series.n_decode) > 5
    assert result.flips == summary.role_flips >= 1
    assert result.completed == len(requests)
