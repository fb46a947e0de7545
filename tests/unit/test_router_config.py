"""The router's config loading: the settings file merged over the published config, errors that keep the old
config, and reloads seen through content changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster
from prfaas_core.api.engine import EngineSettingsSpec
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.policy.threshold import ThresholdBounds
from prfaas_operator.router_config import build, build_gateway, routing_for
from prfaas_router.state.config import ConfigError, ConfigWatcher, load_config

MODEL = builtin_model_profiles()["internal-1t"].model_dump(mode="json", by_alias=True, exclude_none=True)
BASE = {"pdCluster": "pd", "thresholdMinTokens": 100, "model": MODEL, "limits": {"maxInFlight": 10}}


def test_settings_blocks_merge_over_the_published_config(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(BASE))
    (tmp_path / "s.yaml").write_text("limits: {retryAfterSeconds: 7}\nrouting: {breakerOpenSeconds: 3}\n")
    config, _ = load_config(tmp_path / "c.json", tmp_path / "s.yaml")
    assert config.limits.max_in_flight == 10 and config.limits.retry_after_seconds == 7
    assert config.routing.breaker_open_seconds == 3


def test_settings_may_not_override_what_the_operator_publishes(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(BASE))
    (tmp_path / "s.yaml").write_text("thresholdMinTokens: 5\n")
    with pytest.raises(ConfigError, match="may set only"):
        load_config(tmp_path / "c.json", tmp_path / "s.yaml")


def test_invalid_config_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps({**BASE, "thresholdMinTokens": -1}))
    with pytest.raises(ConfigError, match="thresholdMinTokens"):
        load_config(tmp_path / "c.json")


def test_watcher_sees_changes_to_either_file_and_skips_bad_versions(tmp_path: Path) -> None:
    c, s = tmp_path / "c.json", tmp_path / "s.yaml"
    c.write_text(json.dumps(BASE))
    s.write_text("limits: {retryAfterSeconds: 2}\n")
    w = ConfigWatcher(c, s)
    assert w.poll() is not None and w.poll() is None  # first read, then unchanged
    s.write_text("limits: {retryAfterSeconds: 4}\n")
    new = w.poll()
    assert new is not None and new.limits.retry_after_seconds == 4
    c.write_text("{not json")
    assert w.poll() is None and w.last_error is not None and "not valid JSON" in w.last_error


def test_a_deleted_config_file_is_reported_once_per_backoff_not_every_poll(tmp_path: Path) -> None:
    """The finding: a deleted config file was logged every 0.5 s (each refresh). The app logs ``last_error``
    and clears it; here that is what a poll loop sees."""
    from prfaas_router.state.config import REPORT_BACKOFF_S

    c = tmp_path / "c.json"
    c.write_text(json.dumps(BASE))
    now = [0.0]
    w = ConfigWatcher(c, clock=lambda: now[0])
    assert w.poll() is not None
    c.unlink()
    reports = 0
    for _ in range(100):  # 50 s of polls every 0.5 s
        assert w.poll() is None
        if w.last_error is not None:
            assert "cannot read" in w.last_error
            reports += 1
            w.last_error = None  # what the app does after logging it
        now[0] += 0.5
    assert reports == 2  # at once, then after the first backoff (the next one a doubled backoff later)
    assert REPORT_BACKOFF_S < 50.0 < 3 * REPORT_BACKOFF_S
    c.write_text(json.dumps({**BASE, "thresholdMinTokens": 7}))
    new = w.poll()
    assert new is not None and new.threshold_min_tokens == 7


def test_the_operator_gives_routers_the_engines_block_size() -> None:
    """prefixBlockTokens is the engines' KV block size (``spec.engine.blockSize``), so the routers hash prefixes
    and count KV in the blocks vLLM holds and moves; the default when the engine keeps its own."""
    assert routing_for(EngineSettingsSpec.model_validate({"blockSize": 128})).prefix_block_tokens == 128
    assert routing_for(EngineSettingsSpec()).prefix_block_tokens == 16


@pytest.mark.parametrize("available", ["Measured", "Configured"])
def test_the_operator_gives_routers_the_links_available_bandwidth_mode(available: str) -> None:
    """``spec.measurement.availableBandwidth`` of an InterDCLink reaches the routers' link unchanged."""
    root = Path(__file__).parents[2] / "examples/01-two-region"
    link = yaml.safe_load((root / "region-b/inter-dc-link.yaml").read_text())
    link["spec"].setdefault("measurement", {})["availableBandwidth"] = available
    pfc = PrefillCluster.model_validate(yaml.safe_load((root / "region-b/prefill-cluster-remote.yaml").read_text()))
    config = build(
        PDCluster.model_validate(yaml.safe_load((root / "region-b/pd-cluster.yaml").read_text())),
        [],
        ModelProfile.model_validate(yaml.safe_load((root / "common/model-profile.yaml").read_text())).spec,
        [InterDCLink.model_validate(link)],
        {pfc.metadata.name: pfc},
        ThresholdBounds(0, 1_000_000),
    )
    assert [(x.name, x.available_bandwidth) for x in config.links] == [(link["metadata"]["name"], available)]


FLEET = Path(__file__).parents[2] / "examples/06-fleet"


def _fleet_region(
    region: str, drained_link: str = "", drained_site: str = ""
) -> tuple[PDCluster, list[InterDCLink], dict[str, PrefillCluster]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted((FLEET / f"region-{region}").glob("*.yaml"))]
    for d in docs:
        if d["metadata"]["name"] in (drained_link, drained_site):
            d["spec"]["drained"] = True
    pd = PDCluster.model_validate(next(d for d in docs if d["kind"] == "PDCluster"))
    links = [InterDCLink.model_validate(d) for d in docs if d["kind"] == "InterDCLink"]
    sites = {d["metadata"]["name"]: PrefillCluster.model_validate(d) for d in docs if d["kind"] == "PrefillCluster"}
    return pd, links, sites


def _build(pd: PDCluster, links: list[InterDCLink], sites: dict[str, PrefillCluster]) -> Any:
    profile = ModelProfile.model_validate(yaml.safe_load((FLEET / "common/model-profile.yaml").read_text()))
    return build(pd, [], profile.spec, links, sites, ThresholdBounds(0, 1_000_000))


def test_a_pd_cluster_reaching_two_sites_gets_one_remote_per_link_widest_first() -> None:
    """Preference order: widest cap, then shortest RTT, then name (east reaches site 1 at 80 Gbps, site 2 at 8)."""
    pd, links, sites = _fleet_region("east")
    config = _build(pd, list(reversed(links)), sites)
    assert [(r.name, r.link) for r in config.remotes] == [("site-1", "east-to-site-1"), ("site-2", "east-to-site-2")]
    assert [x.name for x in config.links] == ["east-to-site-1", "east-to-site-2"]
    pd, links, sites = _fleet_region("west")  # equal caps: the shorter RTT (site 1, 5 ms) first
    assert [r.name for r in _build(pd, links, sites).remotes] == ["site-1", "site-2"]


def test_a_drained_link_or_site_has_no_remote_but_keeps_its_link() -> None:
    """No new remote prefill crosses a drained link or goes to a drained site; the link stays so in-flight pulls
    over it finish and are counted."""
    config = _build(*_fleet_region("east", drained_link="east-to-site-1"))
    assert [r.link for r in config.remotes] == ["east-to-site-2"]
    assert [x.name for x in config.links] == ["east-to-site-2", "east-to-site-1"]  # drained last
    config = _build(*_fleet_region("east", drained_site="site-2"))
    assert [r.link for r in config.remotes] == ["east-to-site-1"]
    assert {x.name for x in config.links} == {"east-to-site-1", "east-to-site-2"}


def test_a_site_gateway_gets_every_link_it_serves_and_a_drained_site_drains_its_pods() -> None:
    doc = yaml.safe_load((FLEET / "site-1/prefill-cluster.yaml").read_text())
    profile = ModelProfile.model_validate(yaml.safe_load((FLEET / "common/model-profile.yaml").read_text()))
    pods = [
        {
            "metadata": {"name": f"p-{i}", "labels": {}},
            "spec": {"containers": [{"name": "e", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"phase": "Running", "podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        for i in (1, 2)
    ]
    config = build_gateway(PrefillCluster.model_validate(doc), pods, profile.spec)
    assert [(x.name, x.capacity_gbps) for x in config.links] == [("east-to-site-1", 100), ("west-to-site-1", 100)]
    assert config.gateway is not None and config.gateway.admission is not None
    assert config.gateway.admission.link == "east-to-site-1" and config.draining == []
    # the site's egress cap reaches the gateway, which books both links under it
    assert config.gateway.site_egress_cap_gbps == doc["spec"].get("siteEgressCapGbps")
    doc["spec"]["siteEgressCapGbps"] = 120
    config = build_gateway(PrefillCluster.model_validate(doc), pods, profile.spec)
    assert config.gateway is not None and config.gateway.site_egress_cap_gbps == 120
    doc["spec"]["drained"] = True
    config = build_gateway(PrefillCluster.model_validate(doc), pods, profile.spec)
    assert config.draining == ["p-1", "p-2"] and len(config.endpoints) == 2
