"""The available-bandwidth estimator (prfaas_core.policy.link_estimate): a squeezed link bounds the capacity from
the streams' own timing within one window, a cut is seen from a stalled pull well before any pull timeout, and a
restored link is probed back up to the configured capacity."""

from __future__ import annotations

import itertools

import pytest

from prfaas_core.policy.link_estimate import (
    Available,
    EstimateParams,
    LinkEstimator,
    Pull,
    StreamSample,
    busy_gbps,
)
from prfaas_core.policy.link_state import LinkParams

GBIT = 1e9 / 8  # bytes


def test_streams_on_time_leave_the_configured_capacity() -> None:
    est = LinkEstimator()
    for k in range(10):
        est.stream(StreamSample(k, k + 0.1, 8 * GBIT))  # 80 Gbps each, one after another
        assert est.update(k + 0.5, 100.0).gbps is None
    assert est.current.source == "configured"


def test_a_squeeze_bounds_the_capacity_to_what_the_busy_link_delivered() -> None:
    est = LinkEstimator()
    est.stream(StreamSample(0.0, 0.1, 8 * GBIT))  # 80 Gbps: the uncontended rate
    assert est.update(1.0, 100.0).gbps is None
    # squeezed to 5 Gbps: two overlapping 8-Gbit streams take 3.2 s together
    est.stream(StreamSample(2.0, 5.2, 8 * GBIT))
    est.stream(StreamSample(2.0, 5.2, 8 * GBIT))
    got = est.update(5.5, 100.0)
    assert got.source == "streams"
    assert got.gbps == pytest.approx(5.0)
    params = got.bound(LinkParams("l", 100.0, max_utilization=0.8))
    assert params.capacity_gbps == pytest.approx(5.0) and params.cap_gbps == pytest.approx(4.0)


def test_a_measured_total_above_the_own_streams_counts_the_other_routers() -> None:
    est = LinkEstimator()
    est.stream(StreamSample(0.0, 0.1, 8 * GBIT))
    est.stream(StreamSample(2.0, 6.0, 8 * GBIT))  # 2 Gbps: held back
    assert est.update(6.5, 100.0, measured_gbps=6.0).gbps == pytest.approx(6.0)


def test_a_cut_is_seen_from_a_stalled_pull_then_probed_back_up() -> None:
    p = EstimateParams(stall_s=2.0, probe_per_s=0.5)
    est = LinkEstimator(p)
    est.stream(StreamSample(0.0, 0.1, 8 * GBIT))
    pull = Pull(10.0, 8 * GBIT)  # expected 0.08 s at 100 Gbps
    assert est.update(11.0, 100.0, [pull], measured_gbps=0.0).gbps is None
    got = est.update(12.5, 100.0, [pull], measured_gbps=0.0)
    assert got.source == "stalled" and got.gbps == 0.0
    assert "stalled" in got.reason
    assert got.bound(LinkParams("l", 100.0)).cap_gbps < 1e-5
    # the stalled pull gave up (its timeout): probing starts at the floor and grows until the bound lifts
    seen = [est.update(12.5 + k, 100.0).gbps for k in range(1, 20)]
    assert seen[0] == pytest.approx(5.0 * 1.5)
    assert all(a is None or (b is None or b >= a) for a, b in itertools.pairwise(seen))
    assert seen[-1] is None and est.current.source == "configured"


def test_a_slow_pull_still_delivering_is_not_a_cut() -> None:
    est = LinkEstimator(EstimateParams(stall_s=2.0))
    pull = Pull(0.0, 8 * GBIT)
    got = est.update(3.0, 100.0, [pull], measured_gbps=2.0)  # overdue, but the link carries 2 Gbps
    assert got.source == "streams"
    assert got.gbps == pytest.approx(8.0 / 3.0)  # at most its bytes in its age


def test_busy_rate_is_bytes_over_the_union_of_intervals() -> None:
    samples = [StreamSample(0, 1, GBIT), StreamSample(0.5, 1.5, GBIT), StreamSample(3, 4, GBIT)]
    assert busy_gbps(samples) == pytest.approx(3.0 / 2.5)


def test_available_without_a_bound_keeps_the_params() -> None:
    params = LinkParams("l", 10.0)
    assert Available().bound(params) is params
    assert Available(50.0, "streams").bound(params) is params


@pytest.mark.parametrize("field", ["slowdown", "window_s", "probe_floor"])
def test_bad_params_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EstimateParams(**{field: 0.0})


def test_a_time_scaled_clock_gives_model_rates() -> None:
    """The router's clock is wall time; in a stack running 200x, a stream of 8 model Gbit in 0.01 wall s ran at
    4 model Gbps."""
    est = LinkEstimator(time_scale=200.0)
    est.stream(StreamSample(-10.0, -9.9995, 8 * GBIT))  # 80 model Gbps, before the window
    est.stream(StreamSample(1.0, 1.5, 8 * GBIT))
    est.stream(StreamSample(1.0, 1.5, 8 * GBIT))  # two together in 0.5 wall s = 100 model s: 0.16 model Gbps
    got = est.update(2.0, 100.0)
    assert got.source == "streams" and got.gbps == pytest.approx(0.16)
    assert "0.16 Gbps" in got.reason
