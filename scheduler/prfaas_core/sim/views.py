"""What the simulation hands the policies per event, made once per value: immutable views, so one is shared by every
call that would have built an equal one (a view per instance per request, and a link map per arrival, were the
simulator's hot-path allocations)."""

from __future__ import annotations

from ..policy.link_state import EgressLedger, LinkParams, LinkState
from ..policy.routing import InstanceView
from ..policy.short_term import RemoteSide
from .instances import Instance


class PickerViews:
    """The instance pickers' views of each instance, made again only when what one shows changed."""

    def __init__(self) -> None:
        self._decode: dict[str, tuple[tuple[int, int, bool, bool], InstanceView]] = {}
        self._prefill: dict[str, tuple[tuple[float, int, bool, bool], InstanceView]] = {}

    def decode(self, i: Instance, now: float) -> InstanceView:
        """The decode picker's view of ``i``: its load and slots, health and draining."""
        key = (i.decode_load, i.decode_slots, now >= i.available_at_s, i.draining)
        held = self._decode.get(i.name)
        if held is not None and held[0] == key:
            return held[1]
        load, slots, healthy, draining = key
        view = InstanceView(i.name, active_decodes=load, decode_slots=slots, healthy=healthy, draining=draining)
        self._decode[i.name] = (key, view)
        return view

    def prefill(self, i: Instance, now: float, cached: int) -> InstanceView:
        """The prefill picker's view of ``i`` for a request of which it holds ``cached`` tokens."""
        key = (i.queued_prefill_s(now), cached, now >= i.available_at_s, i.draining)
        held = self._prefill.get(i.name)
        if held is not None and held[0] == key:
            return held[1]
        queued, _, healthy, draining = key
        view = InstanceView(i.name, queued, cached, healthy=healthy, draining=draining)
        self._prefill[i.name] = (key, view)
        return view


class RouteMaps:
    """One link's maps for a :class:`~prfaas_core.policy.short_term.RouteTick`, per router replica: its ledger (the
    same object throughout), the link's parameters and the replica's link state (new maps when they change), and
    the remote side by the prefix PrFaaS holds."""

    def __init__(self, link: str, ledgers: list[EgressLedger]) -> None:
        self.link = link
        self._ledgers = [{link: ledger} for ledger in ledgers]
        self._params: dict[str, LinkParams] = {}
        self._states: list[dict[str, LinkState]] = [{} for _ in ledgers]
        self._remotes: dict[int, tuple[RemoteSide, ...]] = {}

    def get(
        self, replica: int, params: LinkParams, state: LinkState, prfaas_cached: int
    ) -> tuple[dict[str, LinkParams], dict[str, LinkState], dict[str, EgressLedger], tuple[RemoteSide, ...]]:
        link = self.link
        if self._params.get(link) is not params:
            self._params = {link: params}
        if self._states[replica].get(link) is not state:
            self._states[replica] = {link: state}
        remotes = self._remotes.get(prfaas_cached)
        if remotes is None:
            remotes = self._remotes[prfaas_cached] = (RemoteSide("prfaas", link, None, prfaas_cached),)
        return self._params, self._states[replica], self._ledgers[replica], remotes
