"""``prfaas operator``: kopf run embedded, on its own registry with the handlers of :mod:`.handlers` (which
build the operator through :func:`.runner.build` in their startup handler). ``kopf run -m
prfaas_operator.kopf_entry`` is the same on kopf's default registry."""

from __future__ import annotations

from typing import Any

import kopf

from . import handlers
from .config import OperatorConfig
from .logs import configure


async def run_operator(config: OperatorConfig, stop_flag: Any = None, ready_flag: Any = None) -> None:
    configure(config.log_level)
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    memo = kopf.Memo()
    memo["config"] = config
    await kopf.operator(
        registry=registry,
        memo=memo,
        standalone=True,
        clusterwide=config.all_namespaces,
        namespaces=list(config.namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
