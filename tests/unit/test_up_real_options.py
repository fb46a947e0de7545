"""``prfaas up --engines vllm``'s options: bad input is refused before any engine starts; the emulated default is
unchanged; the real stack's trace stays inside the tiny model's context."""

from __future__ import annotations

import pytest

from prfaas_cli.main import build_parser, main
from prfaas_local import real_up


@pytest.mark.parametrize(
    ("extra", "why"),
    [(["--prfaas", "2"], "--prfaas 1"), (["--pd", "0"], "--pd >= 1"), (["--duration", "0"], "positive")],
)
def test_bad_real_options_exit_2_and_say_why(extra: list[str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--engines", "vllm", *extra]) == 2
    assert why in capsys.readouterr().err


def test_emulated_is_the_default_and_keeps_its_sizes() -> None:
    args = build_parser().parse_args(["up"])
    assert args.engines == "emulated" and not args.netns
    assert args.prfaas is None and args.pd is None and args.duration is None  # resolved per engine kind


def test_real_trace_fits_the_tiny_model() -> None:
    records = real_up.trace(2.0, 60.0, 16, seed=3)
    assert 60 < len(records) < 200
    assert all(128 <= r.input_tokens <= 1900 and r.output_tokens == 16 for r in records)
    assert [r.arrival_s for r in records] == sorted(r.arrival_s for r in records)
    assert records[-1].arrival_s <= 60.0


def test_the_readme_command_plans_a_trace_without_an_output_tokens_option() -> None:
    """``prfaas up --engines vllm`` as docs/local-stack.md gives it (no --output-tokens: the scenario's default is
    emulated-only) plans its threshold and trace: it once crashed here before any engine started."""
    args = build_parser().parse_args(["up", "--engines", "vllm"])
    args.load = 0.5  # what up's dispatch sets for --engines vllm
    t0, records, _ = real_up.planned(args, 2, 60.0)
    assert 128 < t0 < 1900
    assert records and all(r.output_tokens == real_up.OUTPUT_TOKENS for r in records)


def test_a_real_model_is_refused_with_emulated_engines(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["up", "--engines", "vllm", "--model", "hybrid"]).model == "hybrid"
    assert main(["up", "--model", "hybrid"]) == 2
    assert "--model picks a real model: it runs with --engines vllm" in capsys.readouterr().err
