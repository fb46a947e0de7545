"""The decisions of both timescales, as pure functions and small state machines over frozen inputs.

Short term (per request): :mod:`.link_state` (egress estimate, scarce/abundant with hysteresis, admission under
the cap), :mod:`.threshold` (``t`` raised to the bandwidth-feasible bound when scarce, never below
``t_min``), :mod:`.routing` (the paper's cache-aware rule; the instance inside a cluster), :mod:`.breaker`;
composed once by :mod:`.short_term` (``refresh``: ledger -> link states -> ``t``; ``route``: view ->
decision -> instance picks), which the router, the gateway and the simulator call.
Long term (per cycle): :mod:`.roles` (prefill/decode counts, one step at a time, with hysteresis, cooldown,
bounds and a drain phase; ``t`` re-optimised after each change) and :mod:`.long_term` (one pure step from a tick's
input — observation, persisted state, SRE controls, scarce links — to its effects: roles to assign, drain or
flip, ``t_min``, the ``t`` in force and its bounds, the desired counts, the record and the next state; the
bounds on ``t`` themselves are :mod:`.threshold`'s). Every decision carries its reason. The router,
the operator, ``prfaas up`` and the simulator all call these; none re-implements them.
"""
