"""Per-request routing (paper §3.4.3): remote (PrFaaS) iff the uncached length exceeds ``t``; which
prefix counts depends on the link's mode; admission under the link's cap; the instance inside a cluster.

The cache-aware rule (paper-spec §2.5)::

    scarce:    l = l_total - l_pd                   # caches per cluster, no cross-cluster cache moves
    abundant:  l = l_total - max(l_prfaas, l_pd)    # the longer prefix counts; move it if it sits elsewhere
    target = PrFaaS if l > t else PD-P

Then: PrFaaS unavailable (breaker open, no ready instance) -> local; remote but projected egress over the
cap -> local (admission). Every decision carries its reason; the hot path does arithmetic only.

Queue surges (paper-spec §2.5: "when utilization approaches a threshold or queuing surges, a short-term routing
adjustment is triggered"): with both clusters' predicted prefill waits known and the link abundant, a request
whose side is backed up — its wait exceeds its own prefill time there, or (a request ``t`` keeps local, with an
SLO) its predicted local TTFT misses its objective while PrFaaS's meets it — *spills* to the other cluster when
that gives it the lower predicted TTFT (wait + prefill). ``t`` balances the clusters' throughput on average; spills
absorb the bursts that a fixed split leaves queued on one side while the other idles. A spill to PrFaaS is
admitted under the cap like any remote prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..capacity.kv import KvModel
from ..names import GBPS_BITS
from .link_state import LinkMode, LinkParams, admit
from .reasons import Why, text

Target = Literal["local", "remote"]
DecisionKind = Literal["threshold", "unavailable", "admission", "spill", "wait_for_link", "no-local-prefill"]
"""Why, in one word (a metric label): the length vs ``t``; the remote side unavailable; the cap's admission; a
queue surge on the side ``t`` chose; a wait for a later link window (:mod:`.link_calendar`) that beats local; no
local prefill instance could take it (the remote prefills it)."""


# The values one routing decision makes and reads are slotted dataclasses, not frozen ones: a frozen dataclass's
# __init__ makes a call per field, which was a third of the decision's time (its budget is tens of microseconds);
# nothing mutates them once made (dataclasses.replace makes a changed copy).


@dataclass(slots=True)
class RouteRequest:
    """What the router knows about one request before sending it anywhere."""

    total_tokens: int
    pd_cached_tokens: int = 0
    """Prefix already cached in the PD cluster (best instance)."""
    prfaas_cached_tokens: int = 0
    """Prefix already cached in the PrFaaS cluster."""
    ttft_slo_s: float | None = None
    """The request's own TTFT objective, s (None: no SLO configured). With it, a request ``t`` keeps local spills
    to PrFaaS as soon as its predicted local TTFT misses the objective while PrFaaS's meets it."""
    decode_held_tokens: int | None = None
    """Prefix the PD decode side holds in whole blocks, which a remote prefill's KV need not carry (None: the PD
    prefix ``pd_cached_tokens``). A hybrid's decode reuses every whole block it holds (the state crosses in full:
    measured on vLLM 0.32) where a prefill resumes only at a checkpoint, so this may exceed ``pd_cached_tokens``."""


@dataclass(slots=True)
class RoutingView:
    """The immutable snapshot one decision reads (refreshed off the hot path)."""

    threshold_tokens: int
    link_mode: LinkMode
    egress_estimate_gbps: float
    link: LinkParams | None
    remote_available: bool
    remote_unavailable_reason: str = ""
    local_wait_s: float | None = None
    """Predicted wait before the least-loaded PD prefill instance starts a new request (None: unknown)."""
    remote_wait_s: float | None = None
    """Predicted wait before a PrFaaS instance starts a new request (None: unknown; no spills then)."""
    cache_moves: bool = True
    """Whether a cached prefix can be moved between the clusters (the simulator: yes). A router whose engines
    cannot (vLLM's connectors move a request's KV only from its prefill to its decode) prices each cluster by
    its own prefix: ``t`` is judged on the PD-uncached length, a remote prefill costs what PrFaaS does not hold."""


@dataclass(slots=True)
class RouteDecision:
    target: Target
    uncached_tokens: int
    """Tokens the chosen cluster must prefill."""
    transfer_bytes: float
    """KV bytes that cross the link (remote only)."""
    egress_gbps: float
    """This request's egress rate while its KV streams (remote only)."""
    why: Why
    """Its reason as held (formatted when read: :attr:`reason`)."""
    cache_transfer_tokens: int = 0
    """Cached prefix tokens to move between clusters first (abundant mode only)."""
    kind: DecisionKind = "threshold"
    move_bytes: float = 0.0
    """KV bytes of a PrFaaS -> PD cache move (local target only): they cross the capped link."""
    move_gbps: float = 0.0
    """That move's egress rate as admitted (its bytes over the time recomputing them locally would take)."""

    @property
    def reason(self) -> str:
        """Why, in words (every decision carries one; formatted on first read, :mod:`.reasons`)."""
        return text(self.why)


def transfer_bytes(kv: KvModel, total_tokens: int, cached_at_decode_tokens: int) -> float:
    """KV bytes the decode side still needs: the uncached tail's KV plus the fixed (linear/SWA) state, in whole
    blocks where the model knows the engines' block size (:meth:`KvModel.block_kv_bytes`)."""
    if cached_at_decode_tokens <= 0:
        return kv.block_kv_bytes(total_tokens)
    cached_growing = max(0.0, kv.kv_bytes(cached_at_decode_tokens) - kv.fixed_bytes)
    return max(kv.fixed_bytes, kv.block_kv_bytes(total_tokens) - cached_growing)


def stream_gbps(nbytes: float, prefill_s: float, link: LinkParams) -> float:
    """The rate one remote prefill's KV stream is admitted (and booked) at: its prefill's production rate,
    at most the link's cap. A stream that alone would be faster than the cap (a squeezed link: ~3 Gbps of
    KV per H200 prefill against a 2.4 Gbps cap) is shaped to it and lasts longer, so it is admitted on an
    idle link instead of never (admission against its unshaped rate refused every remote prefill)."""
    return min(nbytes * 8.0 / max(prefill_s, 1e-6) / GBPS_BITS, link.cap_gbps)


def decide_route(
    req: RouteRequest,
    view: RoutingView,
    kv: KvModel,
    prfaas_prefill_seconds: Callable[[float], float],
    pd_prefill_seconds: Callable[[float], float] | None = None,
) -> RouteDecision:
    """The paper's rule, then availability and admission. Pure; O(1).

    A cross-cluster cache move is made only "when sufficient inter-cluster bandwidth is available": a move
    from PrFaaS to PD crosses the same capped link as the KV streams, so it is admitted like one, at the rate
    that makes it no slower than recomputing the moved tokens locally (``pd_prefill_seconds``; without it,
    moves towards PD are not admitted-checked, the caller's choice). Not admitted: the PD cluster prefills
    from its own prefix."""
    t = view.threshold_tokens
    l_pd = min(req.pd_cached_tokens, req.total_tokens)
    l_prfaas = min(req.prfaas_cached_tokens, req.total_tokens)
    if view.link_mode == "scarce":
        uncached_local = uncached_remote = req.total_tokens - l_pd
        length = uncached_local
        basis: Why = ("scarce: uncached {} = total {} - PD prefix {}", length, req.total_tokens, l_pd)
        move_to_pd = move_to_prfaas = 0
    elif not view.cache_moves:
        uncached_local, uncached_remote = req.total_tokens - l_pd, req.total_tokens - l_prfaas
        length = uncached_local
        basis = (
            "no cache moves: uncached {} = total {} - PD prefix {} (PrFaaS holds {})",
            length,
            req.total_tokens,
            l_pd,
            l_prfaas,
        )
        move_to_pd = move_to_prfaas = 0
    else:
        best = max(l_prfaas, l_pd)
        length = req.total_tokens - best
        basis = ("abundant: uncached {} = total {} - best prefix {}", length, req.total_tokens, best)
        # the longer prefix counts; if it sits in the other cluster it is moved there first
        uncached_local = uncached_remote = length
        move_to_pd = best - l_pd
        move_to_prfaas = best - l_prfaas
    # a spill to PD prefills from PD's own prefix (no cache move on a detour)
    local_tokens = uncached_local if length <= t else req.total_tokens - l_pd
    held = l_pd if req.decode_held_tokens is None else max(l_pd, min(req.decode_held_tokens, req.total_tokens - 1))
    nbytes = transfer_bytes(kv, req.total_tokens, held)
    spill, remote_s = _surge(
        view,
        pd_prefill_seconds,
        prfaas_prefill_seconds,
        local_tokens,
        uncached_remote,
        length <= t,
        req.ttft_slo_s,
        nbytes,
    )
    if length <= t and spill is None:
        if move_to_pd <= 0 or pd_prefill_seconds is None:
            reason: Why = ("{} <= t {}: local prefill", basis, t)
            return RouteDecision("local", uncached_local, 0.0, 0.0, reason, move_to_pd)
        return _local_with_move(req, view, kv, pd_prefill_seconds, l_pd, move_to_pd, ("{} <= t {}", basis, t))
    if length > t and spill is not None:
        reason = ("{} > t {} but {}: local prefill", basis, t, spill)
        return RouteDecision("local", local_tokens, 0.0, 0.0, reason, kind="spill")
    head = ("{} <= t {} but {}", basis, t, spill) if spill is not None else ("{} > t {}", basis, t)
    if not view.remote_available or view.link is None:
        why = view.remote_unavailable_reason or "no remote PrFaaS cluster configured"
        reason = ("{} but {}: local", head, why)
        return RouteDecision("local", req.total_tokens - l_pd, 0.0, 0.0, reason, kind="unavailable")
    seconds = max(prfaas_prefill_seconds(float(uncached_remote)) if remote_s is None else remote_s, 1e-6)
    rate = stream_gbps(nbytes, seconds, view.link)
    verdict = admit(view.egress_estimate_gbps, rate, view.link)
    if not verdict.admitted:
        reason = ("{} but {}", head, verdict.why)
        return RouteDecision("local", req.total_tokens - l_pd, 0.0, 0.0, reason, kind="admission")
    kind: DecisionKind = "spill" if spill is not None else "threshold"
    reason = ("{}: remote prefill; {}", head, verdict.why)
    return RouteDecision("remote", uncached_remote, nbytes, rate, reason, move_to_prfaas, kind)


def _surge(
    view: RoutingView,
    pd_prefill_seconds: Callable[[float], float] | None,
    prfaas_prefill_seconds: Callable[[float], float],
    uncached_local: int,
    uncached_remote: int,
    local_by_t: bool,
    slo_s: float | None = None,
    kv_bytes: float = 0.0,
) -> tuple[Why | None, float | None]:
    """Why the request should spill to the cluster ``t`` did not choose (None: it should not), and PrFaaS's
    prefill seconds of ``uncached_remote`` where they were computed (None: not). PrFaaS's predicted TTFT counts
    its queue, its prefill and the KV stream's tail after the prefill: ``kv_bytes`` at the link's cap at best,
    overlapped with the prefill (a stream longer than the prefill delays the first token)."""
    if (
        view.link_mode != "abundant"
        or pd_prefill_seconds is None
        or view.local_wait_s is None
        or view.remote_wait_s is None
        or not view.remote_available
    ):
        return None, None
    local_prefill = pd_prefill_seconds(float(uncached_local))
    remote_prefill = prfaas_prefill_seconds(float(uncached_remote))
    cap = view.link.cap_gbps if view.link is not None else 0.0
    stream = kv_bytes * 8.0 / GBPS_BITS / cap if cap > 0 else 0.0
    local_ttft = view.local_wait_s + local_prefill
    remote_ttft = view.remote_wait_s + max(remote_prefill, stream)
    if local_by_t and remote_ttft < local_ttft:
        if view.local_wait_s > local_prefill:
            return (
                "PD prefill queue surge (wait {:.2f} s > its prefill {:.2f} s; "
                "predicted TTFT local {:.2f} s vs PrFaaS {:.2f} s)",
                view.local_wait_s,
                local_prefill,
                local_ttft,
                remote_ttft,
            ), remote_prefill
        if slo_s is not None and local_ttft > slo_s >= remote_ttft:
            return (
                "PD prefill queue surge (wait {:.2f} s: predicted TTFT local {:.2f} s "
                "misses its SLO {:.2f} s, PrFaaS {:.2f} s meets it)",
                view.local_wait_s,
                local_ttft,
                slo_s,
                remote_ttft,
            ), remote_prefill
    if not local_by_t and view.remote_wait_s > remote_prefill and local_ttft < remote_ttft:
        return (
            "PrFaaS queue surge (wait {:.2f} s > its prefill {:.2f} s; "
            "predicted TTFT PrFaaS {:.2f} s vs local {:.2f} s)",
            view.remote_wait_s,
            remote_prefill,
            remote_ttft,
            local_ttft,
        ), remote_prefill
    return None, remote_prefill


def _local_with_move(
    req: RouteRequest,
    view: RoutingView,
    kv: KvModel,
    pd_prefill_seconds: Callable[[float], float],
    l_pd: int,
    move_tokens: int,
    basis: Why,
) -> RouteDecision:
    """Local prefill of what neither cluster holds, after moving PrFaaS's longer prefix, if the link admits it."""
    uncached = req.total_tokens - l_pd - move_tokens
    if not view.remote_available or view.link is None:
        why = view.remote_unavailable_reason or "no remote PrFaaS cluster configured"
        reason: Why = ("{}: local prefill; PrFaaS's prefix not moved ({})", basis, why)
        return RouteDecision("local", req.total_tokens - l_pd, 0.0, 0.0, reason, kind="unavailable")
    nbytes = transfer_bytes(kv, l_pd + move_tokens, l_pd)
    rate = nbytes * 8.0 / max(pd_prefill_seconds(float(move_tokens)), 1e-6) / GBPS_BITS
    verdict = admit(view.egress_estimate_gbps, rate, view.link)
    if not verdict.admitted:
        template = "{}: local prefill; moving PrFaaS's {}-token prefix not admitted: {}"
        reason = (template, basis, move_tokens, verdict.why)
        return RouteDecision("local", req.total_tokens - l_pd, 0.0, 0.0, reason, kind="admission")
    reason = ("{}: local prefill after moving PrFaaS's {}-token prefix; {}", basis, move_tokens, verdict.why)
    return RouteDecision("local", uncached, 0.0, 0.0, reason, move_tokens, move_bytes=nbytes, move_gbps=rate)


@dataclass(slots=True)
class InstanceView:
    """One engine instance as the picker sees it."""

    name: str
    queued_prefill_s: float = 0.0
    """Predicted prefill work already queued on it, seconds."""
    cached_prefix_tokens: int = 0
    """Prefix of this request it already holds."""
    active_decodes: int = 0
    decode_slots: int = 1
    healthy: bool = True
    draining: bool = False
    egress_wait_s: float = 0.0
    """Predicted wait before its paced egress can start a new KV pull, seconds: the pulls of its queued
    prefills, its held answers and the rest of those on the wire, at its paced rate (0: its egress is not paced
    apart from the link's). A pull-after-prefill request's KV leaves it only then, whatever its prefill's end."""


@dataclass(slots=True)
class InstancePick:
    name: str | None
    predicted_s: float
    why: Why
    """Its reason as held (formatted when read: :attr:`reason`)."""

    @property
    def reason(self) -> str:
        return text(self.why)


def pick_prefill_instance(
    instances: Sequence[InstanceView], total_tokens: int, prefill_seconds: Callable[[float], float]
) -> InstancePick:
    """Least predicted TTFT = queued work + prefill of what it does not hold (cache-affine, Mooncake-style); on
    instances whose egress is paced apart, its KV's pull cannot start before their egress is free either, so the
    later of the two counts (the pull's own time is the same on every instance)."""
    best: InstanceView | None = None
    best_ttft = 0.0
    last: int | None = None  # (instances holding the same prefix, often all of them: one prefill time for them)
    seconds = 0.0
    for inst in instances:
        if not inst.healthy or inst.draining:
            continue
        uncached = total_tokens - inst.cached_prefix_tokens
        if uncached != last:
            last, seconds = uncached, prefill_seconds(float(uncached if uncached > 0 else 0))
        ttft = inst.queued_prefill_s + seconds
        if inst.egress_wait_s > ttft:
            ttft = inst.egress_wait_s
        if best is None or ttft < best_ttft or (ttft == best_ttft and inst.name < best.name):
            best, best_ttft = inst, ttft
    if best is None:
        return InstancePick(None, 0.0, "no healthy, non-draining prefill instance")
    if best.egress_wait_s > 0:
        template = "least predicted TTFT {:.3f} s (cached prefix {}, its egress free in {:.3f} s)"
        reason: Why = (template, best_ttft, best.cached_prefix_tokens, best.egress_wait_s)
        return InstancePick(best.name, best_ttft, reason)
    reason = ("least predicted TTFT {:.3f} s (cached prefix {})", best_ttft, best.cached_prefix_tokens)
    return InstancePick(best.name, best_ttft, reason)


def pick_decode_instance(instances: Sequence[InstanceView]) -> InstancePick:
    """Least loaded by occupied decode slots; ties by name (deterministic)."""
    best: InstanceView | None = None
    best_load = 0.0
    for inst in instances:
        if not inst.healthy or inst.draining:
            continue
        load = inst.active_decodes / max(inst.decode_slots, 1)
        if best is None or load < best_load or (load == best_load and inst.name < best.name):
            best, best_load = inst, load
    if best is None:
        return InstancePick(None, 0.0, "no healthy, non-draining decode instance")
    reason = ("least loaded decode instance ({}/{})", best.active_decodes, best.decode_slots)
    return InstancePick(best.name, best_load, reason)
