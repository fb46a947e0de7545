"""The typed API: examples parse, defaults match the issue's contract, names and units follow conventions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from prfaas_core import names
from prfaas_core.api import (
    KINDS,
    InterDCLink,
    ModelProfile,
    PDCluster,
    PDClusterSpec,
    PrefillCluster,
    RouterConfig,
)
from prfaas_core.api.base import ApiModel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "01-two-region"


def load(rel: str) -> dict:
    return yaml.safe_load((EXAMPLES / rel).read_text())


def test_examples_parse_into_models() -> None:
    mp = ModelProfile.model_validate(load("common/model-profile.yaml"))
    assert mp.spec.measured is not None and len(mp.spec.measured.points) == 4
    pfc = PrefillCluster.model_validate(load("region-a/prefill-cluster.yaml"))
    assert pfc.spec.mode == "Managed" and pfc.spec.instances == 4
    remote = PrefillCluster.model_validate(load("region-b/prefill-cluster-remote.yaml"))
    assert remote.spec.mode == "Remote" and remote.spec.workload is None
    pd = PDCluster.model_validate(load("region-b/pd-cluster.yaml"))
    assert pd.spec.instances == 8 and pd.spec.hardware.accelerator == "H20"
    link = InterDCLink.model_validate(load("region-b/inter-dc-link.yaml"))
    assert link.spec.capacity_gbps == 100.0 and link.spec.max_utilization == 0.8


def test_pd_cluster_slo_defaults_are_the_contract() -> None:
    doc = load("region-b/pd-cluster.yaml")
    del doc["spec"]["slo"]
    pd = PDCluster.model_validate(doc)
    assert pd.spec.slo.ttft.base_seconds == 2.0
    assert pd.spec.slo.ttft.seconds_per_k_tokens == 0.2
    assert pd.spec.slo.min_decode_tokens_per_second == 40.0
    assert pd.spec.policy.period_seconds == 60


def test_snake_case_python_camel_case_yaml_round_trip() -> None:
    doc = load("region-b/inter-dc-link.yaml")
    link = InterDCLink.model_validate(doc)
    out = link.to_manifest()
    assert out["spec"]["capacityGbps"] == 100
    assert "capacity_gbps" not in out["spec"]
    assert InterDCLink.model_validate(out) == link


def test_models_are_strict_no_coercion_of_strings() -> None:
    doc = load("region-b/inter-dc-link.yaml")
    doc["spec"]["rttMs"] = "5"
    with pytest.raises(ValidationError):
        InterDCLink.model_validate(doc)


def _all_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        for arg in _types_in(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                _all_models(arg, seen)


def _types_in(annotation: object) -> list[object]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    out: list[object] = []
    for a in args:
        out += _types_in(a)
    return out


@pytest.mark.parametrize("root", [k.model for k in KINDS] + [RouterConfig], ids=lambda m: m.__name__)
def test_every_field_is_described(root: type[ApiModel]) -> None:
    seen: set[type[BaseModel]] = set()
    _all_models(root, seen)
    for model in seen:
        assert model.__doc__, f"{model.__name__} has no docstring"
        for name, field in model.model_fields.items():
            if name in ("metadata", "status", "spec", "api_version", "kind", "region"):
                continue
            assert field.description, f"{model.__name__}.{name} has no description"


def test_units_in_names() -> None:
    """Quantities carry their unit: seconds, ms, gbps, bytes, tokens, ratios stay unit-less by name."""
    spec_fields = set(PDClusterSpec.model_fields)
    assert "instances" in spec_fields
    link_fields = InterDCLink.model_fields["spec"].annotation.model_fields  # type: ignore[union-attr]
    for name in ("capacity_gbps", "rtt_ms", "cost_per_gb_usd"):
        assert name in link_fields


def test_names_module_is_consistent() -> None:
    assert f"{names.API_GROUP}/{names.API_VERSION}" == names.GROUP_VERSION
    assert names.LABEL_ROLE.startswith(names.API_GROUP + "/")
    metric_names = [v for k, v in vars(names).items() if k.startswith("METRIC_")]
    assert len(metric_names) == len(set(metric_names))
    assert all(m.startswith("prfaas_") for m in metric_names)


def test_router_config_rejects_inverted_threshold_bounds() -> None:
    spec = load("common/model-profile.yaml")["spec"]
    ok = RouterConfig.model_validate({"pdCluster": "pd", "thresholdMinTokens": 100, "model": spec})
    assert ok.threshold_max_tokens >= ok.threshold_min_tokens
    with pytest.raises(ValidationError, match="thresholdMinTokens must not exceed"):
        RouterConfig.model_validate(
            {"pdCluster": "pd", "thresholdMinTokens": 100, "thresholdMaxTokens": 10, "model": spec}
        )
