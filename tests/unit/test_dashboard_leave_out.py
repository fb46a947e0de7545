"""The dashboard picture of a system without an operator (``prfaas up``) leaves the operator's panels out,
re-flowed without holes, and names them; every panel left reads a series something in prfaas up exports."""

from __future__ import annotations

import json

from prfaas_local.dashboard_png import DASHBOARD, exporter_of, series_of, without_exporter


def test_operator_panels_are_left_out_and_the_rest_reflowed() -> None:
    doc = json.loads(DASHBOARD.read_text())
    kept, left_out = without_exporter(doc, "operator")
    assert "PD instances per role" in left_out and "Role decisions by reason" in left_out
    assert all(t.startswith(("PD instances", "Role decisions", "Operator", "Capacity")) for t in left_out)
    for panel in kept["panels"]:
        exporters = {exporter_of(m) for m in series_of(panel)}
        assert exporters - {"operator"}, panel["title"]
    # no holes: every row is full width, each panel to the right of the one before
    rows: dict[int, int] = {}
    for panel in kept["panels"]:
        g = panel["gridPos"]
        assert g["x"] == rows.get(g["y"], 0)
        rows[g["y"]] = g["x"] + g["w"]
    assert all(w == 24 for w in list(rows.values())[:-1])
