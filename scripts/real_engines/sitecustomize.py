"""Glue for vLLM's NixlConnector on CPU-only machines, installed as the vLLM environment's ``sitecustomize``.

NIXL's Python API creates its agent with a zero progress-thread delay, so UCX's progress thread busy-polls a whole
core per agent. On a 2-core machine running several engines that starves the engines themselves. When
``PRFAAS_NIXL_PROGRESS_DELAY_US`` is set (the real-engine harness sets it for engines it starts), every NIXL agent
is created with that delay instead (~1000 us: ~4 % of a core instead of ~95 %, and decode latency halves).
Inert when the variable is unset.

AMX: on a CPU with AMX tiles vLLM's CPU attention takes its AMX kernel for bf16 (``cpu_attn._get_attn_isa``), and
Linux raises SIGILL on a tile instruction unless the process asked for the tile state first
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``). Nothing in the P/D decode path asks before that kernel
runs: a decode engine's worker died with SIGILL on its first pulled KV (vLLM 0.32, Sapphire Rapids under KVM),
while a plain engine got by. When ``PRFAAS_AMX_PERMISSION`` is set (the harness sets it), every process asks at
start, before NIXL's threads exist; where the CPU has no AMX the request fails and nothing changes.
"""

import os
import platform

if os.environ.get("PRFAAS_AMX_PERMISSION") and platform.system() == "Linux" and platform.machine() == "x86_64":
    import ctypes

    _SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
    ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)

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
