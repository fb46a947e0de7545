"""What the simulation hands the policies per event, made once per value where values repeat: views the policies
only read, so one is shared by every call that would have built an equal one (a decode view per instance per
request, and a link map per arrival, were the simulator's hot-path allocations)."""

from __future__ import annotations

from ..policy.link_state import EgressLedger, LinkParams, LinkState
from ..policy.routing import InstanceView
from ..policy.short_term import RemoteSide
from ..policy.threshold import ThresholdBounds, ThresholdDecision
from .instances import Instance


class PickerViews:
    """The instance pickers' views of each instance: a decode view made again only when what it shows changed."""

    def __init__(self) -> None:
        self._decode: dict[str, InstanceView] = {}

    def decode(self, i: Instance, now: float) -> InstanceView:
        """The decode picker's view of ``i``: its load and slots, health and draining."""
        held = self._decode.get(i.name)
        load = i.decode_load
        healthy = now >= i.available_at_s
        if (
            held is not None
            and held.active_decodes == load
            and held.decode_slots == i.decode_slots
            and held.healthy == healthy
            and held.draining == i.draining
        ):
            return held
        view = InstanceView(
            i.name, active_decodes=load, decode_slots=i.decode_slots, healthy=healthy, draining=i.draining
        )
        self._decode[i.name] = view
        return view

    @staticmethod
    def prefill(i: Instance, now: float, cached: int) -> InstanceView:
        """The prefill picker's view of ``i`` for a request of which it holds ``cached`` tokens (made every time:
        its queued work moves with the clock, so a view held from an earlier request seldom still matched)."""
        return InstanceView(
            i.name, i.queued_prefill_s(now), cached, healthy=now >= i.available_at_s, draining=i.draining
        )


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
        self._bounds: ThresholdBounds | None = None
        self._held: ThresholdDecision | None = None

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

    def refresh_values(
        self, replica: int, params: LinkParams, t_min: int, t: int, reason: str
    ) -> tuple[dict[str, LinkParams], dict[str, EgressLedger], ThresholdBounds, ThresholdDecision]:
        """What a replica's :class:`~prfaas_core.policy.short_term.RefreshTick` reads besides its state: the
        link's parameters and ledger (the route's maps), the bounds of ``t`` and the ``t`` held (new ones when
        they change)."""
        link = self.link
        if self._params.get(link) is not params:
            self._params = {link: params}
        if self._bounds is None or self._bounds.min_tokens is not t_min:
            self._bounds = ThresholdBounds(t_min)
        held = self._held
        if held is None or held.tokens is not t or held.reason is not reason:
            held = self._held = ThresholdDecision(t, 0, reason)
        return self._params, self._ledgers[replica], self._bounds, held
