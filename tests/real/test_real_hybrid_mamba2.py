"""A Mamba2 hybrid on real vLLM: the tiny Granite-4-H (3 Mamba2 layers + 1 full attention) that
``scripts/real-engines.sh`` generates, its engines started from its profile (``prfaas profile`` from its config:
``linearKind: Mamba2``, so prefix caching off, which vLLM 0.32 needs for it), P/D with NixlConnector over UCX TCP.
Oracles: the N-1 rule on the decode engine, and the profile's predicted bytes against ``vllm:nixl_bytes_transferred``
at lengths that did not build it.

Its own pair of engines (~5 GiB), ended when the module ends, before the tier's loopback set starts (conftest orders
it). Marked ``slow`` (``scripts/test.sh --full``): the default run's hybrid time goes to the gated-DeltaNet module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prfaas_core.api import ModelProfile
from prfaas_core.launch.render import hybrid_fields
from prfaas_local.model_profile import check_profile
from prfaas_local.vllm_engines import EnginePool, Prompts, RealEngine, RealEnginesUnavailable, RealEnv
from support.real_engines import skip_or_fail

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def granite(
    real_env: RealEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RealEnv, ModelProfile, RealEngine, RealEngine]]:
    try:
        env = real_env.hybrid("granite")
    except RealEnginesUnavailable as exc:
        skip_or_fail(str(exc))
        raise
    profile = ModelProfile.model_validate({"metadata": {"name": "tiny-granite"}, "spec": env.model_profile})
    pool = EnginePool(env, tmp_path_factory.mktemp("granite-engines"))
    try:
        fields = hybrid_fields(profile)
        pdp = pool.start("pdp", pool.spec("pd-prefill", **fields))
        pdd = pool.start("pdd", pool.spec("pd-decode", **fields))
        pool.wait_ready([pdp, pdd])
        pool.warm_up(pdp, pdd)
        yield env, profile, pdp, pdd
    finally:
        pool.close()


def test_a_mamba2_hybrid_runs_pd_with_prefix_caching_off_and_its_profile_predicts_the_bytes(
    granite: tuple[RealEnv, ModelProfile, RealEngine, RealEngine],
) -> None:
    env, profile, pdp, pdd = granite
    arch = profile.spec.architecture
    assert arch is not None and (arch.linear_kind, arch.linear_layers, arch.block_tokens) == ("Mamba2", 3, 384)
    assert "--no-enable-prefix-caching" in pdd.launch.argv
    prompts = Prompts(env.tokenizer_file, seed=4)
    before = pdd.prompt_tokens_by_source()
    checked = check_profile(
        profile, pdp.url, pdd.url, [prompts.text(n) for n in (150, 600, 1400)], env.served_model_name
    )
    after = pdd.prompt_tokens_by_source()
    for c in checked:
        print(f"\n{c.prompt_tokens} tokens: predicted {c.predicted_bytes:.0f} B, transferred {c.measured_bytes:.0f} B")
    assert all(abs(c.error) <= 0.02 for c in checked), checked
    total = sum(c.prompt_tokens for c in checked)
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == total - len(checked)  # N-1 each
    assert after["local_compute"] - before["local_compute"] == len(checked)  # the last token each
