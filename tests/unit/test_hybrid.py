"""Hybrid (linear-attention) models without engines: the KV geometry from a model's config (``prfaas profile``),
the bytes a pull moves (the N-1 rule, the recurrent state, whole blocks of what the decode lacks), the engine flags
a hybrid's profile implies, and ``prfaas validate``'s verdicts on hybrid configurations.

The byte figures are what vLLM 0.32 (CPU) transferred for the tiny Qwen3-Next over NixlConnector
(``vllm:nixl_bytes_transferred`` on the decode engine; ``tests/real/test_real_hybrid.py`` checks them live)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_engine_checks import PD, PFC, REMOTE, _example, _found, _validate

from prfaas_cli.main import main
from prfaas_core.api import ModelProfile
from prfaas_core.capacity.kv import kv_model_from_architecture
from prfaas_core.capacity.model_config import ModelConfigError, architecture_from_config, engine_block_tokens
from prfaas_core.launch.engines import EngineSpec
from prfaas_core.launch.kinds import engine_launch
from prfaas_core.launch.render import hybrid_fields
from prfaas_core.policy.decode_prefix import DecodeHoldings, decode_cached_header

TINY_QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "dtype": "bfloat16",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
}
"""The generated tiny hybrid's config.json (the fields the geometry reads)."""

MEASURED: list[tuple[int, int, int]] = [
    # (prompt tokens, tokens the decode held, bytes vLLM transferred)
    (100, 0, 336_896),
    (256, 0, 336_896),
    (298, 0, 467_968),
    (599, 0, 599_040),
    (1000, 0, 730_112),
    (1080, 0, 861_184),
    (1499, 0, 992_256),
    (1080, 1024, 336_896),  # the same prompt again: the decode reused 1,024 tokens, pulled 55 + the state
    (1180, 1024, 336_896),
]


def test_the_hybrid_geometry_from_its_config_is_what_vllm_lays_out() -> None:
    arch = architecture_from_config(TINY_QWEN3_NEXT, block_size=128)
    assert (arch.full_attention_layers, arch.linear_layers, arch.linear_kind) == (1, 3, "GatedDeltaNet")
    # conv (3 x (2*2*64 + 4*64) x 2 B) + recurrent state (4 x 64 x 64 x 4 B, fp32 on CPU): vLLM's (3072, 65536)
    assert arch.linear_state_bytes_per_layer == 3072 + 65_536
    assert arch.block_tokens == 256  # "Setting attention block size to 256 tokens"
    assert architecture_from_config(TINY_QWEN3_NEXT, 128, state_dtype="bf16").block_tokens == 128


@pytest.mark.parametrize(("tokens", "cached", "moved"), MEASURED)
def test_pulled_bytes_equal_what_vllm_transferred(tokens: int, cached: int, moved: int) -> None:
    kv = kv_model_from_architecture(architecture_from_config(TINY_QWEN3_NEXT, block_size=128))
    assert kv.recurrent and kv.pulled_tokens(tokens) == tokens - 1
    assert kv.pulled_kv_bytes(tokens, cached) == moved


TINY_GRANITE_4H: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "dtype": "bfloat16",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_d_state": 64,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
}
"""The generated tiny Granite-4-H's config.json (the fields the geometry reads)."""


@pytest.mark.parametrize(("tokens", "moved"), [(150, 601_344), (300, 601_344), (600, 797_952), (1000, 994_560)])
def test_a_mamba2_hybrid_pulls_what_vllm_transferred(tokens: int, moved: int) -> None:
    arch = architecture_from_config(TINY_GRANITE_4H, block_size=128)
    # vLLM: mamba_ssm_size=(3840, 131072), "Setting attention block size to 384 tokens"
    assert (arch.linear_kind, arch.linear_state_bytes_per_layer, arch.block_tokens) == ("Mamba2", 3840 + 131_072, 384)
    assert kv_model_from_architecture(arch).pulled_kv_bytes(tokens) == moved


def test_a_dense_model_pulls_every_token_in_whole_blocks() -> None:
    dense = {**TINY_QWEN3_NEXT, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "head_dim": 32}
    arch = architecture_from_config(dense, block_size=128)
    assert (arch.full_attention_layers, arch.linear_layers, arch.block_tokens) == (2, 0, 128)
    kv = kv_model_from_architecture(arch)
    assert not kv.recurrent
    assert kv.pulled_kv_bytes(129) == kv.block_kv_bytes(129) == 2 * 128 * 512  # two 128-token blocks
    assert kv.pulled_kv_bytes(300, 256) == 128 * 512  # the decode lacks one block


def test_the_engine_block_is_the_smallest_multiple_whose_page_holds_a_state() -> None:
    assert engine_block_tokens(128, 512, 68_608) == 256
    assert engine_block_tokens(16, 512, 68_608) == 144
    assert engine_block_tokens(16, 512, 0) == 16


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"architectures": ["KimiLinearForCausalLM"]}, "architectures"),
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"dtype": "int4"}, "dtype"),
    ],
)
def test_a_config_it_cannot_read_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelConfigError, match=field):
        architecture_from_config({**TINY_QWEN3_NEXT, **change}, block_size=128)


def _profile(**arch: Any) -> ModelProfile:
    base = {
        "fullAttentionLayers": 1,
        "kvHeads": 2,
        "headDim": 64,
        "linearLayers": 3,
        "linearStateBytesPerLayer": 68_608,
    }
    return ModelProfile.model_validate(
        {"metadata": {"name": "h"}, "spec": {"servedModelName": "h", "architecture": {**base, **arch}}}
    )


def test_a_gated_deltanet_profile_gives_its_engines_bf16_and_the_ds_conv_layout() -> None:
    spec = EngineSpec(
        role="pd-decode", model="/m", served_model_name="h", **hybrid_fields(_profile(linearKind="GatedDeltaNet"))
    )
    launch = engine_launch(spec)
    assert launch.argv[launch.argv.index("--dtype") + 1] == "bfloat16"
    assert "--no-enable-prefix-caching" not in launch.argv  # align-mode prefix caching works (the tier uses it)
    assert ("VLLM_SSM_CONV_STATE_LAYOUT", "DS") in {(e.name, e.value) for e in launch.env}
    assert hybrid_fields(_profile()) == {}  # no linearKind: nothing assumed


def test_a_mamba2_profile_runs_without_prefix_caching_and_refuses_it_on() -> None:
    fields = hybrid_fields(_profile(linearKind="Mamba2"))
    spec = EngineSpec(role="pd-prefill", model="/m", served_model_name="h", **fields)
    assert "--no-enable-prefix-caching" in engine_launch(spec).argv
    with pytest.raises(ValueError, match="prefix_caching must be off for a Mamba2 hybrid"):
        engine_launch(dataclasses.replace(spec, prefix_caching=True))


def _hybrid_example(kind: str | None) -> dict[str, Any]:
    docs = _example()
    arch = docs["common/model-profile.yaml"]["spec"]["architecture"]
    arch.update({"linearLayers": 3, "linearStateBytesPerLayer": 68_608})
    if kind is not None:
        arch["linearKind"] = kind
    return docs


@pytest.mark.parametrize(("kind", "warned"), [("GatedDeltaNet", False), ("Mamba2", False), ("KDA", True), (None, True)])
def test_validate_warns_only_where_the_tier_has_not_proven_the_hybrid(
    kind: str | None, warned: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _validate(tmp_path, _hybrid_example(kind), capsys)
    assert code == 0, report
    warnings = _found(report, "PDCluster", "warnings")
    assert any(p == "spec.kvTransport.connector" for p, _ in warnings) == warned, warnings


def test_validate_refuses_a_mamba2_hybrid_with_prefix_caching_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _hybrid_example("Mamba2")
    docs[PD]["spec"]["engine"].setdefault("extraArgs", []).append("--enable-prefix-caching")
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1
    assert any(p == "spec.engine.extraArgs" and "Mamba2" in m for p, m in _found(report, "PDCluster")), report


def test_validate_refuses_unequal_block_sizes_for_a_hybrid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = _hybrid_example("GatedDeltaNet")
    for where, size in ((PD, 128), (PFC, 256), (REMOTE, 256)):
        docs[where]["spec"]["engine"]["blockSize"] = size
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1
    assert any(p == "spec.engine.blockSize" and "hybrid" in m for p, m in _found(report, "PDCluster")), report


def test_prfaas_profile_writes_a_model_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "tiny-qwen3next"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_QWEN3_NEXT))
    assert main(["profile", str(model), "--block-size", "128", "--served-model-name", "tiny-hybrid"]) == 0
    profile = ModelProfile.model_validate(yaml.safe_load(capsys.readouterr().out))
    assert profile.metadata.name == "tiny-qwen3next" and profile.spec.served_model_name == "tiny-hybrid"
    assert profile.spec.architecture == architecture_from_config(TINY_QWEN3_NEXT, 128)
    (model / "config.json").write_text(json.dumps({**TINY_QWEN3_NEXT, "architectures": ["Nope"]}))
    assert main(["profile", str(model)]) == 1
    assert "architectures" in capsys.readouterr().err


def _kv(**change: Any) -> Any:
    return kv_model_from_architecture(architecture_from_config({**TINY_QWEN3_NEXT, **change}, block_size=128))


def test_a_hybrid_decode_holds_every_whole_block_of_n_minus_1_tokens() -> None:
    """Measured on vLLM 0.32 (tests/real/test_real_hybrid.py's parity case): a decode that pulls a hybrid's KV
    reuses every whole block it holds (it pulls the recurrent state in full, so it needs none at the hit)."""
    held = DecodeHoldings(_kv(), block_tokens=128)
    first = list(range(1080))
    assert held.held_tokens(first, "pdd") == 0
    held.learn(first, "pdd")
    assert held.held_tokens(first, "pdd") == 1024  # the repeat reused 1,024 tokens (4 blocks of 256)
    assert held.held_tokens([*first, *range(5000, 5100)], "pdd") == 1024  # extended: the same
    for shared, reused in ((300, 256), (600, 512), (800, 768), (1000, 768), (1050, 1024)):
        assert held.held_tokens(first[:shared] + [7] * (1080 - shared), "pdd") == reused, shared
    assert held.held_tokens(first, "other") == held.held_tokens(first, None) == 0
    held.forget({"pdd"})
    assert held.held_tokens(first, "pdd") == 0


def test_a_dense_decode_holds_every_whole_block_but_never_the_last_token() -> None:
    dense = _kv(architectures=["LlamaForCausalLM"], num_hidden_layers=2, head_dim=32)
    held = DecodeHoldings(dense, block_tokens=128)
    held.learn(list(range(300)), "pdd")
    assert held.held_tokens(list(range(200)) + [9] * 100, "pdd") == 128
    assert held.held_tokens(list(range(257)), "pdd") == 256
    assert held.held_tokens(list(range(256)), "pdd") == 128  # 256 would leave the engine nothing to compute


def test_holdings_learnt_from_the_routing_hashes_are_those_it_hashes_itself() -> None:
    from prfaas_core.request.tokens import block_hashes

    dense = _kv(architectures=["LlamaForCausalLM"], num_hidden_layers=2, head_dim=32)
    ids = list(range(300))
    own, given, wrong_block = (DecodeHoldings(dense, block_tokens=128) for _ in range(3))
    own.learn(ids, "pdd")
    given.learn(ids, "pdd", block_hashes(ids, 128), 128)
    wrong_block.learn(ids, "pdd", block_hashes(ids, 16), 16)  # another block size: hashed again
    probe = list(range(257))
    assert own.held_tokens(probe, "pdd") == given.held_tokens(probe, "pdd") == wrong_block.held_tokens(probe, "pdd")
    assert own.held_tokens(probe, "pdd") == 256
    # the routing's hashes of the probe, given: the same answer, never the last token's block
    for n in (257, 256, 300):
        ids_n = list(range(n))
        given_hashes = block_hashes(ids_n, 128)
        assert own.held_tokens(ids_n, "pdd", given_hashes, 128) == own.held_tokens(ids_n, "pdd"), n
    assert own.held_tokens(list(range(256)), "pdd", block_hashes(list(range(256)), 128), 128) == 128


def test_holdings_are_bounded_oldest_first() -> None:
    held = DecodeHoldings(_kv(), block_tokens=128, capacity=4)
    prompts = [[i] * 600 for i in range(4)]
    for p in prompts[:3]:
        held.learn(p, "pdd")
    assert [held.held_tokens(p, "pdd") for p in prompts[:3]] == [0, 512, 512]  # 2 blocks each: the first went
    held.learn(prompts[1], "pdd")  # served again: it stays, the one unused longest goes
    held.learn(prompts[3], "pdd")
    assert [held.held_tokens(p, "pdd") for p in prompts] == [0, 512, 0, 512]


@pytest.mark.parametrize(("value", "tokens"), [(None, 0), ("0", 0), ("1024", 1024)])
def test_the_gateway_reads_the_decode_cached_header(value: str | None, tokens: int) -> None:
    assert decode_cached_header(value) == tokens


@pytest.mark.parametrize("value", ["-1", "1.5", "x", ""])
def test_a_bad_decode_cached_header_names_itself(value: str) -> None:
    with pytest.raises(ValueError, match="x-prfaas-decode-cached-tokens"):
        decode_cached_header(value)


def test_the_engine_emulator_takes_a_measured_profile_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prfaas_cli.engine_cmd import _profile_file
    from prfaas_engine.config import EngineConfig

    arch = architecture_from_config(TINY_QWEN3_NEXT, block_size=128)
    doc = {"apiVersion": "prfaas.io/v1alpha1", "kind": "ModelProfile", "metadata": {"name": "tiny-hybrid"}}
    good = tmp_path / "profile.yaml"
    good.write_text(yaml.safe_dump({**doc, "spec": {"architecture": arch.model_dump(by_alias=True)}}))
    name, spec = _profile_file(str(good))
    config = EngineConfig(model_profile=name, model_profile_spec=spec, block_size_tokens=128)
    assert (config.model_name, config.block_tokens, config.kv_model.recurrent) == ("tiny-hybrid", 256, True)
    assert config.kv_model.pulled_kv_bytes(1080, 1024) == 336_896
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**doc, "spec": {"architecture": {"fullAttentionLayers": "x"}}}))
    assert main(["engine", "--model-profile", str(bad)]) == 1
    assert "not a ModelProfile: spec.architecture.fullAttentionLayers" in capsys.readouterr().err
    assert main(["engine", "--model-profile", str(tmp_path / "absent.yaml")]) == 1
    assert "neither a built-in profile (internal-1t" in capsys.readouterr().err


def test_a_decode_holds_the_last_block_of_a_prompt_that_fills_it() -> None:
    """Measured on vLLM 0.32: a 1,024-token prompt (4 blocks of 256) sent again reuses 768 tokens (a hit never
    covers the last token), extended by 50 tokens it reuses 1,024 (the decode computed the 1,024th itself)."""
    held = DecodeHoldings(_kv(), block_tokens=128)
    b = list(range(1024))
    held.learn(b, "pdd")
    assert held.held_tokens(b, "pdd") == 768
    assert held.held_tokens([*b, *range(3000, 3050)], "pdd") == 1024
