"""The router's configuration: the RouterConfig file loaded and watched (kubelet swaps a ConfigMap's files
atomically through a symlink, ``prfaas up`` rewrites its file: content-hash polling, so both are seen; a file that
fails to parse or validate keeps the previous configuration in force and is reported, never half-applied), its
compiled form (:class:`Compiled`, rebuilt on reload) and the token counter it names."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prfaas_core.api import RemoteGateway, RouterConfig, RouterEndpoint
from prfaas_core.capacity.hardware import HardwareProfile, builtin_hardware, hardware_from_spec
from prfaas_core.capacity.kv import KvModel, kv_model_from_profile
from prfaas_core.launch.emulation import ScaleSettings
from prfaas_core.policy.breaker import BreakerParams
from prfaas_core.policy.link_state import LinkParams
from prfaas_core.policy.threshold import ThresholdBounds
from prfaas_core.request.tokens import ModelTokenizer, Tokenizer, build_tokenizer, prompt_token_ids
from prfaas_core.schema.validation import model_issues

# --- The router's token counter: the served model's own tokenizer when RouterConfig names its file, the character
# estimate only when it does not (``routing.tokenizer``).

OFFLOAD_BODY_BYTES = 64 * 1024
"""Bodies at least this large (~16K tokens) are tokenised in a worker thread: a model tokenizer takes ~40 ms for
32K tokens and releases the GIL (ModelTokenizer), so the event loop keeps serving the other requests."""

_cache: dict[tuple[Any, ...], ModelTokenizer] = {}


def _stat_key(*paths: Path | None) -> tuple[Any, ...]:
    key: list[Any] = []
    for p in paths:
        if p is not None and p.exists():
            st = p.stat()
            key.append((str(p), st.st_mtime_ns, st.st_size))
        else:
            key.append((str(p), None))
    return tuple(key)


def _template_tokens(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name in ("bos_token", "eos_token"):
        value = config.get(name)
        if isinstance(value, dict):  # older files: {"content": "<s>", ...}
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def load_model_tokenizer(tokenizer_file: str, chat_template_file: str | None = None) -> ModelTokenizer:
    """The model tokenizer from its files; ValueError names the field and the file."""
    path = Path(tokenizer_file)
    config_path = path.with_name("tokenizer_config.json")
    template_path = Path(chat_template_file) if chat_template_file else path.with_name("chat_template.jinja")
    key = _stat_key(path, config_path, template_path)
    if key in _cache:
        return _cache[key]
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"tokenizerFile {tokenizer_file!r} cannot be read: {exc.strerror or exc}") from exc
    config: dict[str, Any] = {}
    if config_path.exists():
        try:
            loaded = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{config_path} is not readable JSON: {exc}") from exc
        if isinstance(loaded, dict):
            config = loaded
    template: str | None = None
    if template_path.exists():
        template = template_path.read_text(encoding="utf-8")
    elif chat_template_file:
        raise ValueError(f"chatTemplateFile {chat_template_file!r} does not exist")
    elif isinstance(config.get("chat_template"), str):
        template = config["chat_template"]
    try:
        tokenizer = ModelTokenizer(text, template, _template_tokens(config), name=f"model:{path}")
    except ValueError as exc:
        raise ValueError(f"tokenizerFile {tokenizer_file!r}: {exc}") from exc
    _cache.clear()  # one model per router: keep only the current one
    _cache[key] = tokenizer
    return tokenizer


def router_tokenizer(config: RouterConfig) -> Tokenizer:
    """What the router counts with for ``config``."""
    if config.tokenizer_file is None:
        return build_tokenizer(config.routing.tokenizer)
    return load_model_tokenizer(config.tokenizer_file, config.chat_template_file)


async def count_prompt(body: dict[str, Any], chat: bool, tokenizer: Tokenizer, body_bytes: int) -> list[int]:
    """The prompt's token ids (:func:`prompt_token_ids`), off the event loop's thread for a large body counted by
    the model's tokenizer. ValueError names the bad field."""
    if tokenizer.exact and body_bytes >= OFFLOAD_BODY_BYTES:
        return await asyncio.to_thread(prompt_token_ids, body, chat, tokenizer)
    return prompt_token_ids(body, chat, tokenizer)


# --- loading the configuration


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message names the file and the field."""


REPORT_BACKOFF_S = 30.0
REPORT_BACKOFF_MAX_S = 600.0

SETTINGS_KEYS = frozenset({"routing", "timeouts", "limits", "scale", "security"})
"""What a static settings file (``--settings``, a chart-owned ConfigMap) may set over the published config."""


def _mapping(text: str, source: str) -> dict[str, object]:
    try:
        raw = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    return raw


def parse_settings(text: str, source: str) -> dict[str, object]:
    raw = _mapping(text, source)
    unknown = sorted(set(raw) - SETTINGS_KEYS)
    if unknown:
        raise ConfigError(f"{source}: a settings file may set only {sorted(SETTINGS_KEYS)}, not {unknown}")
    return raw


def parse_config(text: str, source: str, settings: dict[str, object] | None = None) -> RouterConfig:
    raw = _mapping(text, source)
    for key, value in (settings or {}).items():
        base = raw.get(key)
        raw[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    model, issues = model_issues(RouterConfig, raw)
    if model is None:
        detail = "; ".join(f"{i.path or '<config>'}: {i.message}" for i in issues)
        raise ConfigError(f"{source}: invalid RouterConfig: {detail}")
    assert isinstance(model, RouterConfig)
    return model


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def load_config(path: str | Path, settings_path: str | Path | None = None) -> tuple[RouterConfig, str]:
    """The config (with the settings file's blocks merged over it) and the content hash of both."""
    p = Path(path)
    data = _read(p)
    extra = _read(Path(settings_path)) if settings_path else b""
    try:
        settings = parse_settings(extra.decode("utf-8"), str(settings_path)) if settings_path else None
        config = parse_config(data.decode("utf-8"), str(p), settings)
    except (UnicodeDecodeError, ValidationError) as exc:
        raise ConfigError(f"{p}: {exc}") from exc
    return config, hashlib.sha256(data + b"\0" + extra).hexdigest()


@dataclass
class ConfigWatcher:
    """Polls ``path`` (and the settings file); ``poll()`` returns a new config when the content changed and
    is valid. An unreadable file (deleted, permissions) is reported in ``last_error`` once, then again only
    after a backoff (``REPORT_BACKOFF_S``, doubling up to ``REPORT_BACKOFF_MAX_S``) while it stays so: the
    refresher polls every refresh interval and must not log the same line each time."""

    path: Path
    settings_path: Path | None = None
    digest: str = ""
    last_error: str | None = None
    applied: str = ""
    """The digest of the configuration in force (``/ready``'s ``config_digest``): the caller sets it when it has
    applied what :meth:`poll` returned."""
    rejected: str | None = None
    """Why the file's current version is not in force (invalid, or refused when applied), until one is applied."""
    clock: Callable[[], float] = time.monotonic
    _unreadable: tuple[str, float, float] | None = None
    """(the error, when it is next reported, the backoff after that)."""

    def _report_unreadable(self, error: str) -> None:
        now = self.clock()
        seen = self._unreadable
        if seen is None or seen[0] != error:
            self.last_error, self._unreadable = error, (error, now + REPORT_BACKOFF_S, REPORT_BACKOFF_S)
        elif now >= seen[1]:
            backoff = min(seen[2] * 2, REPORT_BACKOFF_MAX_S)
            self.last_error, self._unreadable = error, (error, now + backoff, backoff)

    def poll(self) -> RouterConfig | None:
        try:
            data = _read(self.path)
            extra = _read(self.settings_path) if self.settings_path else b""
        except ConfigError as exc:
            self._report_unreadable(str(exc))
            return None
        self._unreadable = None
        digest = hashlib.sha256(data + b"\0" + extra).hexdigest()
        if digest == self.digest:
            return None
        try:
            settings = (
                parse_settings(extra.decode("utf-8", errors="replace"), str(self.settings_path))
                if self.settings_path
                else None
            )
            config = parse_config(data.decode("utf-8", errors="replace"), str(self.path), settings)
        except ConfigError as exc:
            self.last_error = self.rejected = str(exc)
            self.digest = digest  # report once per bad version, keep the old config
            return None
        self.digest, self.last_error = digest, None
        return config


# --- the compiled configuration


def _profile(spec_hw: object, default: str) -> HardwareProfile:
    if spec_hw is not None:
        return hardware_from_spec(spec_hw)  # type: ignore[arg-type]
    profile = builtin_hardware(default)
    assert profile is not None
    return profile


@dataclass(frozen=True)
class Compiled:
    """Everything derived from one RouterConfig (rebuilt on reload, never mutated)."""

    config: RouterConfig
    kv: KvModel
    pd: HardwareProfile
    prfaas: HardwareProfile
    links: dict[str, LinkParams]
    remotes: tuple[RemoteGateway, ...]
    bounds: ThresholdBounds
    tokenizer: Tokenizer
    scale: ScaleSettings
    prefill: tuple[RouterEndpoint, ...]
    decode: tuple[RouterEndpoint, ...]
    both: tuple[RouterEndpoint, ...]
    draining: frozenset[str]
    decode_slots: int
    breaker: BreakerParams

    @cached_property
    def prefill_capable(self) -> frozenset[str]:
        """The instances that prefill (role prefill, or both when there is no prefill tier)."""
        return frozenset(e.name for e in (self.prefill or self.both))

    @cached_property
    def guaranteed_links(self) -> frozenset[str]:
        """The links whose capacity is guaranteed (``availableBandwidth: Configured``): never estimated lower."""
        return frozenset(link.name for link in self.config.links if link.available_bandwidth == "Configured")

    @cached_property
    def remote_by_name(self) -> dict[str, RemoteGateway]:
        return {r.name: r for r in self.remotes}

    @cached_property
    def by_name(self) -> dict[str, RouterEndpoint]:
        """Built once per configuration (the hot path looks endpoints up on every leg)."""
        return {e.name: e for e in self.config.endpoints}


def compile_config(config: RouterConfig) -> Compiled:
    links = {
        link.name: LinkParams(
            link.name, link.capacity_gbps, link.max_utilization, link.scarce_watermark, link.abundant_watermark
        )
        for link in config.links
    }
    for remote in config.remotes:
        if remote.link not in links:
            raise ValueError(f"remotes[{remote.name}].link {remote.link!r} names no entry of links")
    adm = config.gateway.admission if config.gateway else None
    if adm is not None and adm.link not in links:
        raise ValueError(f"gateway.admission.link: {adm.link!r} is not one of links[].name")
    pd = _profile(config.pd_hardware, "H20")
    return Compiled(
        config=config,
        # the engines hold and move whole KV blocks of prefixBlockTokens (the engines' block size)
        kv=kv_model_from_profile(config.model).with_default_blocks(config.routing.prefix_block_tokens),
        pd=pd,
        prfaas=_profile(config.prfaas_hardware, "H200"),
        links=links,
        remotes=tuple(config.remotes),
        bounds=ThresholdBounds(config.threshold_min_tokens, config.threshold_max_tokens),
        tokenizer=router_tokenizer(config),
        scale=ScaleSettings(config.scale.time_scale, config.scale.byte_scale),
        prefill=tuple(e for e in config.endpoints if e.role == "prefill"),
        decode=tuple(e for e in config.endpoints if e.role == "decode"),
        both=tuple(e for e in config.endpoints if e.role == "both"),
        draining=frozenset(config.draining),
        decode_slots=pd.decode.max_batch_size if pd.decode is not None else 1,
        breaker=BreakerParams(
            config.routing.breaker_failure_threshold,
            config.routing.breaker_open_seconds,
            config.routing.breaker_probes,
            # a probe reports back within its leg's timeouts; past them its slot is freed
            max((r.timeout_seconds for r in config.remotes), default=0.0) + config.timeouts.kv_pull_seconds,
        ),
    )
