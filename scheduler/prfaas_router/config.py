"""Loading the RouterConfig file and watching it for changes (kubelet swaps a ConfigMap's files atomically
through a symlink, ``prfaas up`` rewrites its file): content-hash polling, so both are seen. A file that fails
to parse or validate keeps the previous configuration in force and is reported, never half-applied."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from prfaas_core.api import RouterConfig
from prfaas_core.validation import model_issues


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message names the file and the field."""


def parse_config(text: str, source: str) -> RouterConfig:
    try:
        raw = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    model, issues = model_issues(RouterConfig, raw)
    if model is None:
        detail = "; ".join(f"{i.path or '<config>'}: {i.message}" for i in issues)
        raise ConfigError(f"{source}: invalid RouterConfig: {detail}")
    assert isinstance(model, RouterConfig)
    return model


def load_config(path: str | Path) -> tuple[RouterConfig, str]:
    """The config and its content hash."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from exc
    try:
        return parse_config(data.decode("utf-8"), str(p)), hashlib.sha256(data).hexdigest()
    except (UnicodeDecodeError, ValidationError) as exc:
        raise ConfigError(f"{p}: {exc}") from exc


@dataclass
class ConfigWatcher:
    """Polls ``path``; ``poll()`` returns a new config when the content changed and is valid."""

    path: Path
    digest: str = ""
    last_error: str | None = None

    def poll(self) -> RouterConfig | None:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self.last_error = f"{self.path}: cannot read: {exc}"
            return None
        digest = hashlib.sha256(data).hexdigest()
        if digest == self.digest:
            return None
        try:
            config = parse_config(data.decode("utf-8", errors="replace"), str(self.path))
        except ConfigError as exc:
            self.last_error = str(exc)
            self.digest = digest  # report once per bad version, keep the old config
            return None
        self.digest, self.last_error = digest, None
        return config
