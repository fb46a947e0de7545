"""``prfaas up``'s local actuator never flips an instance with requests in flight: a drain still busy at its
timeout aborts the flip (the engine stops draining in its old role, the router config drops it from
``draining``) and the decision says why. The engines' admin API is mocked; the loop is the core's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from prfaas_core.api import RouterConfig
from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.policy.roles import RolePolicyParams
from prfaas_local.local_loop import LocalCluster, LocalLoop, write_router_config


def test_a_drain_timeout_with_requests_in_flight_aborts_the_flip(tmp_path: Path) -> None:
    roles = {"pd-0": "prefill", "pd-1": "prefill", "pd-2": "decode", "pd-3": "decode"}
    posts: list[tuple[str, str, dict[str, object]]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        name = request.url.host
        if request.url.path == "/admin/state":  # every decode instance keeps 2 streams running
            return httpx.Response(200, json={"running": 2 if roles[name] == "decode" else 0, "waiting": 0})
        body = json.loads(request.content)
        posts.append((name, request.url.path, body))
        if request.url.path == "/admin/role":
            roles[name] = str(body["role"])
        return httpx.Response(200, json={})

    config = RouterConfig.model_validate(
        {
            "pdCluster": "pd",
            "thresholdMinTokens": 20_000,
            "model": builtin_model_profiles()["internal-1t"],
            "endpoints": [{"name": n, "url": f"http://{n}", "role": r} for n, r in roles.items()],
        }
    )
    path = tmp_path / "router.json"
    write_router_config(path, config)
    cluster = LocalCluster(path, config, http=httpx.Client(transport=httpx.MockTransport(engine)))
    params = RolePolicyParams(period_s=15, drain_timeout_s=20, drain_poll_s=2, override_prefill=3)
    loop = LocalLoop(cluster, params, case_study_inputs())
    now, decisions = 0.0, []
    while not any(d.undrain for d in decisions):
        decisions.append(loop.run_once(now).roles)  # type: ignore[arg-type]
        now = loop.next_due_s()
        assert now < 100, [d.reason for d in decisions]
    first, aborted = decisions[0], decisions[-1]
    assert first.action == "Drain"
    victim = first.drain[0]
    assert aborted.action == "Hold" and aborted.undrain == (victim,) and aborted.flip == ()
    assert "drain timeout" in aborted.reason and "2 in flight" in aborted.reason and "flip aborted" in aborted.reason
    # never flipped: no role change reached an engine; the victim stopped draining, in its role
    assert not [p for p in posts if p[1] == "/admin/role"] and roles[victim] == "decode"
    assert posts[-1] == (victim, "/admin/drain", {"drain": False})
    published = json.loads(path.read_text())
    assert published.get("draining", []) == [] and cluster.counts() == (2, 2)
