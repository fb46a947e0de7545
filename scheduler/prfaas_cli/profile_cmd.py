"""``prfaas profile MODEL_DIR``: write a ModelProfile (YAML) for the model in MODEL_DIR, from its ``config.json``:
full-attention KV bytes per token, the fixed recurrent state per request of a hybrid (linear-attention) model,
its linear layers' kind, and the KV block the engine really moves (vLLM enlarges a hybrid's attention block until
a page holds a recurrent state). ``--block-size`` is the engine's ``--block-size`` (CPU vLLM: 128; GPU: 16).

``--check-prefill URL --check-decode URL``: then check it against a served P/D pair of that model (a producer and
a consumer, NixlConnector): one exchange per ``--check-lengths`` prompt length (lengths that did not build the
profile), each one's bytes as the decode engine counts them (its NIXL transferred-bytes histogram) beside the profile's
prediction; the profile's ``prfaas.io/profiled-on`` annotation names the engine and its version. Exit 1 when a
prediction is off by more than ``--tolerance``; 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import httpx

from prfaas_core.capacity.model_config import ModelConfigError
from prfaas_local.formats import render
from prfaas_local.model_profile import PROFILED_ON, check_profile, engine_version, profile_from_model_dir

from .output import EXIT_USAGE, add_output_arg, emit, error


def register(sub: Any) -> None:
    p = sub.add_parser("profile", help="write a ModelProfile from a model directory (and check it on engines)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("model_dir", metavar="MODEL_DIR", help="the model's folder (config.json, tokenizer.json)")
    p.add_argument("--name", help="the ModelProfile's metadata.name (default: the folder's name)")
    p.add_argument("--served-model-name", help="spec.servedModelName (the name clients send)")
    p.add_argument("--block-size", type=int, default=16, help="the engine's --block-size (default 16; CPU vLLM 128)")
    p.add_argument(
        "--state-dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="a hybrid's recurrent-state dtype (default fp32, as vLLM's CPU backend keeps it)",
    )
    p.add_argument("--check-prefill", metavar="URL", help="a kv_producer engine serving the model")
    p.add_argument("--check-decode", metavar="URL", help="a kv_consumer engine serving the model")
    p.add_argument("--check-lengths", default="300,700,1100", help="prompt lengths in tokens (about) to check at")
    p.add_argument("--tolerance", type=float, default=0.02, help="largest relative error allowed (default 0.02)")
    add_output_arg(p, human=None)
    p.set_defaults(output="yaml")  # a ModelProfile manifest, as kubectl apply takes it
    p.add_argument("--out", metavar="FILE", help="write the profile here (default: stdout)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").is_file():
        return error(f"{model_dir}/config.json: no such file")
    tokenizer = model_dir / "tokenizer.json"
    try:
        profile = profile_from_model_dir(
            model_dir,
            args.name or model_dir.name.lower(),
            args.block_size,
            args.served_model_name,
            args.state_dtype,
        )
    except (ModelConfigError, ValueError) as exc:
        return error(str(exc))
    rc = 0
    if (args.check_prefill is None) != (args.check_decode is None):
        return error("--check-prefill and --check-decode go together", EXIT_USAGE)
    if args.check_prefill:
        from prfaas_local.vllm_engines import Prompts

        if not tokenizer.is_file():
            return error(f"{tokenizer}: no such file (needed to size the check's prompts)")
        try:
            lengths = [int(x) for x in args.check_lengths.split(",") if x.strip()]
        except ValueError:
            return error(f"--check-lengths: not integers: {args.check_lengths!r}", EXIT_USAGE)
        prompts = Prompts(str(tokenizer), seed=len(lengths))
        model = args.served_model_name or str(model_dir)
        try:
            checked = check_profile(
                profile, args.check_prefill, args.check_decode, [prompts.text(n) for n in lengths], model
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            return error(f"the check failed: {exc}")
        meta = profile.metadata.model_copy(
            update={"annotations": {**profile.metadata.annotations, PROFILED_ON: engine_version(args.check_decode)}}
        )
        profile = profile.model_copy(update={"metadata": meta})
        for c in checked:
            ok = abs(c.error) <= args.tolerance
            rc = rc or (0 if ok else 1)
            print(
                f"{c.prompt_tokens} tokens: predicted {c.predicted_bytes:.0f} B, transferred {c.measured_bytes:.0f} B "
                f"({c.error:+.2%}){'' if ok else '  OUT OF TOLERANCE'}",
                file=sys.stderr,
            )
    data = profile.model_dump(mode="json", by_alias=True, exclude_none=True)
    if args.out:
        Path(args.out).write_text(render(data, args.output))
    else:
        emit(data, args.output)
    return rc
