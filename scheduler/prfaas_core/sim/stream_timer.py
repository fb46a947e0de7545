"""The simulator's KV streams timed for the available-bandwidth estimate (:mod:`..policy.link_estimate`): the
same estimator the routers run on their pulls, fed here from the fluid link's streams."""

from __future__ import annotations

import math

from ..policy.link_estimate import Available, LinkEstimator, Pull, StreamSample


class StreamTimer:
    """KV streams on the link by request id: when each started, its bytes and its least duration (production or
    pacing); a stream that arrives is one sample, the ones in flight are the estimator's pulls."""

    def __init__(self) -> None:
        self.estimator = LinkEstimator()
        self._on_wire: dict[int, Pull] = {}

    def start(self, rid: int, now_s: float, nbytes: float, production_s: float, pace: float = math.inf) -> None:
        floor = max(production_s, nbytes / pace if pace < math.inf else 0.0)
        self._on_wire[rid] = Pull(now_s, nbytes, floor)

    def arrived(self, rid: int, now_s: float) -> None:
        pull = self._on_wire.pop(rid, None)
        if pull is not None:
            self.estimator.stream(StreamSample(pull.start_s, now_s, pull.bytes, pull.least_s))

    def update(self, now_s: float, capacity_gbps: float, egress_gbps: float) -> Available:
        return self.estimator.update(now_s, capacity_gbps, list(self._on_wire.values()), egress_gbps)
