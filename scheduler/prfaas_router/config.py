"""Loading the RouterConfig file and watching it for changes (kubelet swaps a ConfigMap's files atomically
through a symlink, ``prfaas up`` rewrites its file): content-hash polling, so both are seen. A file that fails
to parse or validate keeps the previous configuration in force and is reported, never half-applied."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from prfaas_core.api import RouterConfig
from prfaas_core.schema.validation import model_issues


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
        raise ConfigError(f"{path}: cannot read: {exc}") from exc


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
            self.last_error = str(exc)
            self.digest = digest  # report once per bad version, keep the old config
            return None
        self.digest, self.last_error = digest, None
        return config
