"""The namespace harness's pure parts: names, addresses, the tbf arguments, counter parsing, leftover detection."""

from __future__ import annotations

import json

import pytest

from prfaas_local.netns import (
    Counters,
    LinkShape,
    addresses_for,
    leftovers,
    names_for,
    parse_link_stats,
)


def test_names_are_unique_per_process_and_pair_and_fit_interface_limits() -> None:
    seen = set()
    for pid in (1, 4_194_303, 99_999, 100_001):
        for n in (0, 1, 999, 1000, 1001):
            ns_a, ns_b, dev_a, dev_b = names_for(pid, n)
            assert ns_a.startswith("prfaas-") and ns_a.endswith("-a") and ns_b.endswith("-b")
            assert len(dev_a) <= 15 and len(dev_b) <= 15, (dev_a, dev_b)
            assert dev_a != dev_b
            seen.add(ns_a)
    assert len(seen) == 20


def test_addresses_are_a_private_slash30_per_pair() -> None:
    a, b = addresses_for(0)
    assert (a, b) == ("10.213.0.1", "10.213.0.2")
    a, b = addresses_for(70)
    assert (a, b) == ("10.213.1.25", "10.213.1.26")
    pairs = {addresses_for(n) for n in range(16_384)}
    assert len(pairs) == 16_384
    for a, b in pairs:
        assert a.startswith("10.213.") and int(a.rsplit(".", 1)[1]) % 4 == 1
        assert b.rsplit(".", 1)[0] == a.rsplit(".", 1)[0]


def test_tbf_arguments_state_rate_burst_and_latency() -> None:
    shape = LinkShape(rate_mbit=40, burst_bytes=32_768, latency_ms=200)
    assert shape.tbf_args() == ["tbf", "rate", "40000kbit", "burst", "32768", "latency", "200ms"]
    assert shape.bytes_per_s == 5_000_000
    # a full bucket leaves at once; the rest at the rate
    assert shape.min_seconds(32_768) == 0
    assert shape.min_seconds(5_032_768) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"rate_mbit": 0}, "rate_mbit"), ({"burst_bytes": 100}, "burst_bytes"), ({"latency_ms": 0}, "latency_ms")],
)
def test_bad_shapes_name_the_field(changes: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LinkShape(**changes)  # type: ignore[arg-type]


def test_link_stats_parse_and_subtract() -> None:
    shown = [{"ifname": "pfa1x0", "stats64": {"rx": {"bytes": 10, "packets": 1}, "tx": {"bytes": 5000, "packets": 4}}}]
    c = parse_link_stats(json.dumps(shown))
    assert c == Counters(tx_bytes=5000, rx_bytes=10, tx_packets=4, rx_packets=1)
    assert c - Counters(1000, 10, 1, 1) == Counters(4000, 0, 3, 0)
    with pytest.raises(ValueError, match="ip -j -s link"):
        parse_link_stats("[]")


def test_leftovers_are_only_ours_and_only_of_dead_processes() -> None:
    listing = "\n".join(
        [
            "prfaas-100-0-a (id: 3)",
            "prfaas-100-0-b (id: 4)",
            "prfaas-200-1-a",
            "prfaas-probe",  # not one of our names: left alone
            "other-100-0-a",
            "prfaas-100-0-c",
        ]
    )
    alive = {200}
    assert leftovers(listing, lambda pid: pid in alive) == ["prfaas-100-0-a", "prfaas-100-0-b"]
