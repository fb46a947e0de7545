"""Glue for vLLM's NixlConnector on CPU-only machines, installed as the vLLM environment's ``sitecustomize``.

NIXL's Python API creates its agent with a zero progress-thread delay, so UCX's progress thread busy-polls a whole
core per agent. On a 2-core machine running several engines that starves the engines themselves. When
``PRFAAS_NIXL_PROGRESS_DELAY_US`` is set (the real-engine harness sets it for engines it starts), every NIXL agent
is created with that delay instead (~1000 us: ~4 % of a core instead of ~95 %, and decode latency halves).
Inert when the variable is unset.
"""

import os

_delay = os.environ.get("PRFAAS_NIXL_PROGRESS_DELAY_US")
if _delay:
    try:
        from nixl_cu12 import _bindings as _nixl_bind
    except ImportError:  # no NIXL in this environment: nothing to patch
        _nixl_bind = None
    if _nixl_bind is not None:
        _original_agent = _nixl_bind.nixlAgent

        def _agent_with_delay(name, config, *args, **kwargs):
            config.pthrDelay = int(_delay)
            return _original_agent(name, config, *args, **kwargs)

        _nixl_bind.nixlAgent = _agent_with_delay
