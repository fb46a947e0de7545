"""The router's replan (``Proxy._replan``): a plan made before a long leg (a remote prefill, a link wait) may
name an instance the routers have since been told drains or changed role (a flip in progress, or one reloaded
meanwhile). Before each leg the router re-picks those instances from the configuration in force, keeps the
others, and after a prefill has run never moves it (its KV is there). Real Runtime and Proxy, no sockets."""

from __future__ import annotations

from typing import Any

import httpx

from prfaas_core.api import RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_router.path.call import LocalPlan, plan_local
from prfaas_router.path.proxy import Proxy
from prfaas_router.state.config import compile_config
from prfaas_router.state.metrics import RouterMetrics
from prfaas_router.state.runtime import Runtime

ROLES = {"pd-0": "prefill", "pd-1": "prefill", "pd-2": "decode", "pd-3": "decode"}


def config(roles: dict[str, str] = ROLES, draining: tuple[str, ...] = ()) -> RouterConfig:
    doc: dict[str, Any] = {
        "pdCluster": "pd",
        "thresholdMinTokens": 20_000,
        "model": builtin_model_profiles()["internal-1t"],
        "endpoints": [{"name": n, "url": f"http://{n}", "role": r} for n, r in roles.items()],
        "draining": list(draining),
    }
    return RouterConfig.model_validate(doc)


def proxy() -> Proxy:
    return Proxy(Runtime(compile_config(config())), httpx.AsyncClient(), RouterMetrics())


def test_a_plan_naming_nothing_stale_is_kept_as_it_is() -> None:
    p = proxy()
    plan = LocalPlan("pd-0", "pd-2")
    assert p._replan(plan, 1000, []) is plan


def test_a_decode_instance_drained_during_the_remote_leg_is_re_picked_and_the_prefill_kept() -> None:
    p = proxy()
    plan = plan_local(p.rt, 1000, [])
    assert plan is not None and plan.decode in ("pd-2", "pd-3")
    p.rt.reconfigure(compile_config(config(draining=(plan.decode,))))  # the loop started draining it
    fresh = p._replan(plan, 1000, [])
    other = "pd-3" if plan.decode == "pd-2" else "pd-2"
    assert fresh == LocalPlan(plan.prefill, other)


def test_an_instance_flipped_meanwhile_is_re_picked_for_its_old_role() -> None:
    """pd-0 flipped prefill -> decode while the request waited: the prefill moves to pd-1; pd-0 may decode."""
    p = proxy()
    plan = LocalPlan("pd-0", "pd-2")
    flipped = {**ROLES, "pd-0": "decode"}
    p.rt.reconfigure(compile_config(config(flipped)))
    assert p._replan(plan, 1000, []) == LocalPlan("pd-1", "pd-2")


def test_after_the_prefill_ran_only_the_decode_may_move() -> None:
    """keep_prefill: the KV sits on the prefill instance, even one now draining; a draining decode moves."""
    p = proxy()
    plan = LocalPlan("pd-0", "pd-2")
    p.rt.reconfigure(compile_config(config(draining=("pd-0", "pd-2"))))
    assert p._replan(plan, 1000, [], keep_prefill=True) == LocalPlan("pd-0", "pd-3")
    assert p._replan(plan, 1000, []) == LocalPlan("pd-1", "pd-3")


def test_with_nowhere_else_to_go_the_plan_stands() -> None:
    """Every decode instance draining: no fresh plan, the old one is kept (its engine still answers a drain)."""
    p = proxy()
    plan = LocalPlan("pd-0", "pd-2")
    p.rt.reconfigure(compile_config(config(draining=("pd-2", "pd-3"))))
    assert p._replan(plan, 1000, []) is plan
