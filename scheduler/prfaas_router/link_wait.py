"""The router's side of the gateway's admission answer: the headers a remote prefill carries, the 429 decline
it may get back, and the choice it then makes — wait for the link window (re-submit, accepting the wait) or
prefill locally — by predicted TTFT (:func:`prfaas_core.policy.link_calendar.choose_window`, the rule the
simulator runs). Short requests reach the gateway only as spills (a PD queue surge), which wait only while the
remote still beats local.
The local ledger stays the router's fast pre-filter and its fallback when the gateway cannot be reached."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from prfaas_core import names
from prfaas_core.api import AdmissionDecline
from prfaas_core.policy.link_calendar import accepted_ttft_s, max_wait_s, prefer_local
from prfaas_core.policy.link_estimate import Available

from .legs import LegError

WAIT_SLACK = 1.25
"""A re-submission accepts this much more than the earliest start the gateway named (other routers book too)."""


class LinkDeclined(LegError):
    """The gateway declined with an :class:`AdmissionDecline` (not a failure: the breaker is not told)."""

    def __init__(self, decline: AdmissionDecline) -> None:
        super().__init__(f"gateway declined: {decline.reason} ({decline.message})", status=429, retriable=True)
        self.decline = decline


def admission_headers(
    link: str,
    kv_bytes: float,
    max_wait_s: float,
    available: Available | None = None,
    max_ttft_s: float = float("inf"),
    slo_ttft_s: float | None = None,
) -> dict[str, str]:
    """The admission headers; the TTFT bound and the SLO go along when known, the available bandwidth only while
    it bounds the configured capacity."""
    headers = {
        names.HEADER_KV_BYTES: str(int(kv_bytes)),
        names.HEADER_MAX_WAIT_MS: f"{max(0.0, max_wait_s) * 1000.0:.0f}",
        names.HEADER_LINK: link,
    }
    if max_ttft_s < float("inf"):
        headers[names.HEADER_MAX_TTFT_MS] = f"{max(0.0, max_ttft_s) * 1000.0:.0f}"
    if slo_ttft_s is not None:
        headers[names.HEADER_SLO_TTFT_MS] = f"{max(0.0, slo_ttft_s) * 1000.0:.0f}"
    if available is not None and available.gbps is not None:
        headers[names.HEADER_LINK_AVAILABLE_GBPS] = f"{available.gbps:.6g}"
    return headers


def parse_decline(status: int, body: bytes) -> AdmissionDecline | None:
    """The decline in a gateway's 429, or None (another status, or a 429 that is not the admission answer)."""
    if status != 429:
        return None
    try:
        data: Any = orjson.loads(body)
        return AdmissionDecline.model_validate(data)
    except (orjson.JSONDecodeError, ValidationError):
        return None


__all__ = [
    "LinkDeclined",
    "accepted_ttft_s",
    "admission_headers",
    "local_ttft_s",
    "max_wait_s",
    "parse_decline",
    "resubmit_wait_s",
]


def local_ttft_s(local_wait_s: float | None, local_prefill_s: float) -> float:
    return (local_wait_s or 0.0) + local_prefill_s


def resubmit_wait_s(
    decline: AdmissionDecline,
    local_ttft: float,
    slo_ttft_s: float | None = None,
    local_wait_s: float = 0.0,
    spill: bool = False,
) -> float | None:
    """After a ``link_window`` decline: the wait to accept on re-submission, or None (go local), by the core's
    rule (:func:`prefer_local`) on the gateway's predicted TTFT (its calendar: every router's streams, the real
    PrFaaS queue). With an SLO, the request goes local only when the remote misses it while local fits it and a
    PD prefill instance is idle; without one (or for a spill), when local's predicted TTFT is better."""
    if decline.reason != "link_window" or decline.earliest_start_ms is None or decline.predicted_ttft_ms is None:
        return None
    if prefer_local(decline.predicted_ttft_ms / 1000.0, local_ttft, slo_ttft_s, local_wait_s, spill):
        return None
    return decline.earliest_start_ms / 1000.0 * WAIT_SLACK + 0.001
