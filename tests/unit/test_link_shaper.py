"""The link's fair-share scheduler: grants back to back at the rate, round-robin across flows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prfaas_link.config import Endpoint, LinkConfig, LinkConfigError
from prfaas_link.shaper import FairShare


def test_one_flow_is_paced_at_the_rate() -> None:
    fair = FairShare(rate_bytes_per_s=1000.0)
    finishes = []
    for _ in range(3):
        fair.request(1, 100)
        grant = fair.next_grant(now=0.0)
        assert grant is not None
        finishes.append(grant.finish)
    assert finishes == pytest.approx([0.1, 0.2, 0.3])


def test_an_idle_link_starts_at_now() -> None:
    fair = FairShare(1000.0)
    fair.request(1, 100)
    fair.next_grant(0.0)
    fair.request(1, 100)
    grant = fair.next_grant(5.0)
    assert grant is not None and (grant.start, grant.finish) == pytest.approx((5.0, 5.1))


def test_waiting_flows_are_served_round_robin() -> None:
    fair = FairShare(1000.0)
    served = []
    fair.request(1, 10)
    fair.request(2, 10)
    fair.request(3, 10)
    for _ in range(9):
        grant = fair.next_grant(0.0)
        assert grant is not None
        served.append(grant.flow)
        fair.request(grant.flow, 10)  # each flow asks again right after its grant
    assert served == [1, 2, 3] * 3


def test_a_cut_link_grants_nothing_until_the_rate_is_raised() -> None:
    fair = FairShare(0.0)
    fair.request(1, 10)
    assert fair.next_grant(0.0) is None
    fair.set_rate(100.0)
    grant = fair.next_grant(1.0)
    assert grant is not None and grant.finish == pytest.approx(1.1)


def test_requests_are_validated() -> None:
    fair = FairShare(10.0)
    fair.request(1, 5)
    with pytest.raises(ValueError, match="pending"):
        fair.request(1, 5)
    fair.cancel(1)
    assert fair.pending == 0 and fair.next_grant(0.0) is None
    with pytest.raises(ValueError):
        fair.request(2, 0)
    with pytest.raises(ValueError):
        FairShare(-1.0)


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 10_000)), min_size=1, max_size=60))
def test_no_flow_and_no_total_beats_bytes_over_rate(chunks: list[tuple[int, int]]) -> None:
    rate = 1e4
    fair = FairShare(rate)
    queues: dict[int, list[int]] = {}
    for flow, n in chunks:
        queues.setdefault(flow, []).append(n)
    for flow, q in queues.items():
        fair.request(flow, q.pop(0))
    last_finish: dict[int, float] = {}
    while (grant := fair.next_grant(0.0)) is not None:
        last_finish[grant.flow] = grant.finish
        if queues[grant.flow]:
            fair.request(grant.flow, queues[grant.flow].pop(0))
    per_flow = {f: sum(n for g, n in chunks if g == f) for f in last_finish}
    for flow, finish in last_finish.items():
        assert finish >= per_flow[flow] / rate - 1e-9
    assert max(last_finish.values()) == pytest.approx(sum(n for _, n in chunks) / rate)


def test_link_config_validation() -> None:
    ep = Endpoint("127.0.0.1", 1)
    with pytest.raises(LinkConfigError, match="loss"):
        LinkConfig(listen=ep, target=ep, loss=1.0)
    with pytest.raises(LinkConfigError, match="capacity"):
        LinkConfig(listen=ep, target=ep, capacity_gbps=-1)
    with pytest.raises(LinkConfigError, match="HOST:PORT"):
        Endpoint.parse("nowhere", "--target")
    assert Endpoint.parse("[::1]:80", "--listen") == Endpoint("::1", 80)
