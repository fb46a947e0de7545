"""The PD decode side of :class:`~prfaas_core.sim.simulation.Simulation`: the policy's decode picker, decode
slots, and a request's end (its SLO recorded). A mixin: the simulation provides the attributes declared here."""

from __future__ import annotations

from collections.abc import Sequence

from ..policy.link_state import EgressLedger
from ..policy.short_term import ShortTermPolicy
from .cache import HybridPrefixPool
from .config import SimConfig
from .events import EventQueue
from .instances import Instance
from .results import RunResult
from .state import Req
from .views import PickerViews


class DecodeSide:
    """Decode picking and streaming (see the module docstring)."""

    cfg: SimConfig
    policy: ShortTermPolicy
    events: EventQueue
    pd: list[Instance]
    by_name: dict[str, Instance]
    ledgers: Sequence[EgressLedger]
    pd_pool: HybridPrefixPool
    result: RunResult
    step_s: float
    completed: int
    views: PickerViews

    def _to_decode(self, req: Req) -> None:
        now = self.events.now_s
        decode_view = self.views.decode
        views = [decode_view(i, now) for i in self.pd if i.role == "decode"]
        pick = self.policy.pick_decode(views)
        if pick.name is None:
            candidates = [i for i in self.pd if i.role == "decode"] or self.pd
            inst = min(candidates, key=lambda i: (i.decode_load, i.name))
        else:
            inst = self.by_name[pick.name]
        self.admit_decode(inst, req)

    def admit_decode(self, inst: Instance, req: Req) -> None:
        if inst.active < inst.decode_slots:
            self._start_stream(inst, req)
        else:
            inst.waiting.append(req)

    def _start_stream(self, inst: Instance, req: Req) -> None:
        now = self.events.now_s
        inst.active += 1
        if req.remote:  # like the router: the ledger entry ends when the decode answers (its first token)
            self.ledgers[req.replica].finish(str(req.spec.id))
        req.first_token_s = now + self.step_s
        self.events.at(now + req.spec.output_tokens * self.step_s, self._stream_end, (inst, req))

    def _stream_end(self, arg: tuple[Instance, Req]) -> None:
        inst, req = arg
        now = self.events.now_s
        inst.active -= 1
        req.done_s = now
        spec = req.spec
        inst.generated_tokens += spec.output_tokens
        if self.cfg.cache.enabled:
            ctx = spec.input_tokens + spec.output_tokens
            self.pd_pool.store(spec.session, ctx, ctx)
        self.completed += 1
        self.result.record(req, self.cfg.slo)
        if inst.waiting and inst.active < inst.decode_slots:
            self._start_stream(inst, inst.waiting.popleft())  # type: ignore[arg-type]
