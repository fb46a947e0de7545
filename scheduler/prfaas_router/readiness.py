"""Whether the router can serve, and why not: ``/ready`` answers 503 with the reason (a load balancer then
sends its clients to a router that can), the refresher logs each change once and sets
``prfaas_router_ready``.

A router can serve when some healthy, non-draining instance can decode, and some path can prefill: a local
prefill instance (or instances that do both), or a remote PrFaaS cluster that is ready and whose breaker is
not open.
"""

from __future__ import annotations

from prfaas_core.api import RouterEndpoint

from .runtime import Runtime


def not_ready_reason(rt: Runtime) -> str | None:
    """None when the router can serve, else why not (one line)."""
    c, snap = rt.compiled, rt.snapshot
    if not snap.engines:
        return "no engine probed yet"

    def serving(e: RouterEndpoint) -> bool:
        load = snap.engines.get(e.name)
        return load is not None and load.healthy and e.name not in c.draining

    if c.config.mode == "gateway":  # prefill legs only
        if any(serving(e) for e in c.prefill or c.both):
            return None
        return "no healthy, non-draining PrFaaS prefill instance"
    decoders = c.decode or c.both
    if not decoders:
        return "no decode instance configured"
    if not any(serving(e) for e in decoders):
        return f"no healthy, non-draining decode instance (of {len(decoders)})"
    if c.both or not c.prefill or any(serving(e) for e in c.prefill):
        return None
    why = []
    for r in c.remotes:
        status = snap.remote_ready.get(r.name)
        if status is None and not rt.breaker(r.name).is_open:
            return None
        why.append(f"{r.name}: {status or rt.breaker(r.name).reason}")
    remote = "; ".join(why) or "no remote PrFaaS cluster configured"
    return f"no healthy, non-draining prefill instance (of {len(c.prefill)}) and no usable remote ({remote})"
