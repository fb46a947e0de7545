"""Per-request admission: a request whose predicted time to first token on the side it was routed to exceeds
the limit is answered 429 with ``Retry-After`` at once, before any leg, instead of waiting into its leg's timeout
(a burst of long requests then backs off instead of timing out).

The prediction is the router's own: for a local prefill, the picked instance's queued prefill work plus this
request's prefill (``InstancePick.predicted_s``); for a remote one, the link ledger's queue wait for a PrFaaS
lane (or, when more, the legs already in flight to that remote over its lanes, each as long as this one) plus
the remote prefill. The limit is ``limits.maxPredictedTtftSeconds`` when set, else the leg's timeout
(``remotes[].timeoutSeconds``, ``timeouts.prefillSeconds``): a request predicted to outlast it would fail anyway.
"""

from __future__ import annotations

import math

from prfaas_core.api import RemoteGateway
from prfaas_core.policy.short_term import RoutePlan

from .runtime import Runtime


def over_limit(
    rt: Runtime, plan: RoutePlan, remote: RemoteGateway | None, remote_legs: int = 0
) -> tuple[float, float] | None:
    """(predicted TTFT, limit) in wall seconds when the request should be turned away, else None.
    ``remote_legs``: this router's prefill legs in flight to ``remote`` (a slow remote keeps them there longer
    than the ledger's schedule predicts: they count as work ahead too)."""
    c = rt.compiled
    scale = c.scale.time_scale
    configured = c.config.limits.max_predicted_ttft_seconds
    if remote is not None:
        own = c.prfaas.prefill_seconds(float(plan.decision.uncached_tokens))
        lanes = max(1, rt.remote_lanes(remote.link))
        wait = max(rt.remote_queue_wait_s(remote.link) or 0.0, remote_legs / lanes * own)
        predicted = (wait + own) / scale
        limit = configured if configured is not None else remote.timeout_seconds
    elif plan.prefill is not None and plan.prefill.name is not None:
        predicted = plan.prefill.predicted_s / scale
        limit = configured if configured is not None else c.config.timeouts.prefill_seconds
    else:
        return None
    return (predicted, limit) if predicted > limit else None


def retry_after_s(predicted: float, limit: float) -> int:
    """When the queue ahead should have drained enough (at least a second)."""
    return max(1, math.ceil(predicted - limit))
