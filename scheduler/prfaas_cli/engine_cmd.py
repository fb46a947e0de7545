"""``prfaas engine``: run a vLLM-compatible engine emulator (prefill, decode or both) for tests and the local
stack. Every option has a default; timing comes from the hardware profile, scaled by --time-scale."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.launch.emulation import DEFAULT_BYTE_SCALE, DEFAULT_TIME_SCALE, ScaleSettings
from prfaas_core.launch.vllm import PROMPT_TOKENS_DETAILS_FLAG

from .output import EXIT_OK, EXIT_USAGE, error, os_error


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    """The scenario's one scale setting; engines and the link must be given the same values."""
    p.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help="run this many times faster than real time (default %(default)s)",
    )
    p.add_argument(
        "--byte-scale",
        type=float,
        default=DEFAULT_BYTE_SCALE,
        help="real bytes sent per model byte of KV (default %(default)s)",
    )


def scale_from(args: argparse.Namespace) -> ScaleSettings:
    return ScaleSettings(time_scale=args.time_scale, byte_scale=args.byte_scale)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "engine",
        help="run a vLLM-compatible engine emulator (OpenAI API, vLLM metrics, NIXL/SGLang KV transfer)",
        description=__doc__,
    )
    p.add_argument("--role", choices=("prefill", "decode", "both"), default="both", help="serving role")
    p.add_argument("--host", default="127.0.0.1", help="HTTP listen host (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="HTTP listen port, 0 for any (default %(default)s)")
    p.add_argument("--hardware", choices=("H200", "H20"), default=None, help="default: H200 for prefill, else H20")
    p.add_argument("--model", default=None, help="served model name (default: the model profile's name)")
    p.add_argument(
        "--model-profile",
        default="internal-1t",
        metavar="NAME|FILE",
        help=(
            f"model profile giving the KV size S_kv(l): a built-in one ({', '.join(sorted(builtin_model_profiles()))}) "
            "or a ModelProfile YAML/JSON file, e.g. one `prfaas profile` measured (default %(default)s)"
        ),
    )
    add_scale_arguments(p)
    p.add_argument("--max-batch", type=int, default=None, help="running requests at most (default: hardware BS_max)")
    p.add_argument("--max-waiting", type=int, default=4096, help="waiting requests at most (default %(default)s)")
    p.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="KV block size in tokens, as vLLM's --block-size (the router's prefixBlockTokens; default %(default)s)",
    )
    p.add_argument(
        "--kv-cache-blocks", type=int, default=65536, help="KV blocks of --block-size tokens (default %(default)s)"
    )
    p.add_argument("--prefix-cache-blocks", type=int, default=65536, help="prefix-cache capacity, blocks")
    p.add_argument("--tokenizer", choices=("chars4", "whitespace"), default="chars4", help="token estimate")
    p.add_argument("--kv-listen", default=None, metavar="HOST:PORT", help="KV server address (default: host:any)")
    p.add_argument(
        "--kv-advertise",
        default=None,
        metavar="HOST:PORT",
        help="KV address put in the KV handle, e.g. the link emulator's (default: --kv-listen)",
    )
    p.add_argument("--kv-timeout", type=float, default=480.0, help="free KV never pulled after this many seconds")
    p.add_argument("--engine-id", default=None, help="remote_engine_id to advertise (default: random)")
    p.add_argument("--seed", type=int, default=None, help="seed of the fault knobs' random draws")
    p.add_argument(
        PROMPT_TOKENS_DETAILS_FLAG,
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens, as vLLM's flag of the same name",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from prfaas_engine.config import ConfigError, EngineConfig, HostPort
    from prfaas_engine.server import serve

    try:
        extra: dict[str, Any] = {"engine_id": args.engine_id} if args.engine_id else {}
        name = args.model_profile
        if name not in builtin_model_profiles():
            try:
                name, extra["model_profile_spec"] = _profile_file(name)
            except ValueError as exc:
                return error(str(exc))  # a file that is not a ModelProfile: invalid data (1)
        config = EngineConfig(
            role=args.role,
            host=args.host,
            port=args.port,
            hardware=args.hardware,
            served_model_name=args.model,
            model_profile=name,
            scale=scale_from(args),
            max_batch=args.max_batch,
            max_waiting=args.max_waiting,
            block_size_tokens=args.block_size,
            kv_cache_blocks=args.kv_cache_blocks,
            prefix_cache_blocks=args.prefix_cache_blocks,
            tokenizer=args.tokenizer,
            kv_listen=HostPort.parse(args.kv_listen, "--kv-listen") if args.kv_listen else None,
            kv_advertise=HostPort.parse(args.kv_advertise, "--kv-advertise") if args.kv_advertise else None,
            kv_timeout_s=args.kv_timeout,
            seed=args.seed,
            enable_prompt_tokens_details=args.enable_prompt_tokens_details,
            **extra,
        )
    except (ConfigError, ValueError) as exc:
        return error(str(exc), EXIT_USAGE)  # the config is built from the flags alone
    try:
        asyncio.run(serve(config))
    except OSError as exc:  # the port is taken, the address is not ours
        return error(os_error("cannot serve", exc))
    return EXIT_OK


def _profile_file(path: str) -> tuple[str, Any]:
    """(name, spec) of the ModelProfile in ``path``; ValueError says why it is not one."""
    import yaml
    from pydantic import ValidationError

    from prfaas_core.api import ModelProfile

    known = ", ".join(sorted(builtin_model_profiles()))
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except FileNotFoundError:
        raise ValueError(f"--model-profile: {path!r} is neither a built-in profile ({known}) nor a file") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--model-profile: cannot read {path}: {exc}") from None
    try:
        profile = ModelProfile.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"--model-profile: {path} is not a ModelProfile: {where}: {first['msg']}") from None
    return profile.metadata.name, profile.spec
