"""The router's and the gateway's views of one link (prfaas_core.policy.link_view)."""

from __future__ import annotations

from prfaas_core import names
from prfaas_core.policy.link_view import link_view_disagreement, link_view_headers


def test_an_agreeing_view_passes_and_a_disagreeing_one_names_header_and_field() -> None:
    assert link_view_disagreement(link_view_headers(100.0, 0.8), "a-to-b", 100.0, 0.8) is None
    assert link_view_disagreement({}, "a-to-b", 100.0, 0.8) is None  # an older router sends no view
    why = link_view_disagreement(link_view_headers(50.0, 0.8), "a-to-b", 100.0, 0.8)
    assert why is not None and names.HEADER_LINK_CAPACITY_GBPS in why and "capacityGbps" in why and "a-to-b" in why
    why = link_view_disagreement(link_view_headers(100.0, 0.9), "a-to-b", 100.0, 0.8)
    assert why is not None and names.HEADER_LINK_MAX_UTILIZATION in why and "maxUtilization" in why
    why = link_view_disagreement({names.HEADER_LINK_CAPACITY_GBPS: "fast"}, "a-to-b", 100.0, 0.8)
    assert why is not None and "must be a number" in why
    # six significant digits on the wire: a rounding is not a disagreement
    assert link_view_disagreement(link_view_headers(1 / 3, 0.8), "l", 1 / 3, 0.8) is None
