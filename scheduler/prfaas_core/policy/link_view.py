"""Whether a router and a gateway see one link alike (a fleet's links are configured in two regions: the
InterDCLink where the PD cluster runs, the Managed PrefillCluster's ``linkScheduling`` where the site runs). A
router sends its view with each remote prefill (:data:`~prfaas_core.names.LINK_VIEW_HEADERS`); a gateway whose own
differs refuses the prefill with a 400 naming the field, since the two would otherwise keep one link under two caps.
Pure: the router's side writes the headers, the gateway's reads them back; ``prfaas validate`` checks the same
agreement over both regions' files before anything runs."""

from __future__ import annotations

import math
from collections.abc import Mapping

from .. import names

TOLERANCE = 1e-5
"""Relative: the headers carry six significant digits."""


def link_view_headers(capacity_gbps: float, max_utilization: float) -> dict[str, str]:
    """The router's view of the link it sends a prefill over."""
    return {
        names.HEADER_LINK_CAPACITY_GBPS: f"{capacity_gbps:.6g}",
        names.HEADER_LINK_MAX_UTILIZATION: f"{max_utilization:.6g}",
    }


def _differs(a: float, b: float) -> bool:
    return not math.isclose(a, b, rel_tol=TOLERANCE)


def link_view_disagreement(
    headers: Mapping[str, str], link: str, capacity_gbps: float, max_utilization: float
) -> str | None:
    """Why the caller's view of ``link`` (its headers; absent ones are not compared) disagrees with this one
    (``capacity_gbps``, ``max_utilization``), naming the header and the field; None when it agrees."""
    for header, field, mine in (
        (names.HEADER_LINK_CAPACITY_GBPS, "capacityGbps", capacity_gbps),
        (names.HEADER_LINK_MAX_UTILIZATION, "maxUtilization", max_utilization),
    ):
        text = headers.get(header)
        if text is None:
            continue
        try:
            theirs = float(text)
        except ValueError:
            return f"{header}: the link's {field} must be a number, got {text[:40]!r}"
        if not math.isfinite(theirs) or _differs(theirs, mine):
            return (
                f"{header}: the caller's view of link {link!r} disagrees with this gateway's: {field} {text} there, "
                f"{mine:.6g} here (the InterDCLink and the site's linkScheduling must agree)"
            )
    return None
