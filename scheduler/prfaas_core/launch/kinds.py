"""The engine kinds, one module each, behind one interface: :func:`engine_kind` gives the module of an
:data:`~.engines.EngineKind` — its launch (flags and environment), its request bodies and KV handle, its metric
names and health path. A new kind is a module here and an entry in :data:`ENGINE_KINDS` (and its value in the
``EngineKind`` literal)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from . import vllm
from .engines import EngineKind, EngineLaunch, EngineSpec


class EngineKindModule(Protocol):
    """What the control plane needs of an engine kind."""

    KIND: str
    KV_HANDLE_FIELD: str
    RELEASE_MODEL: str
    HEALTH_PATH: str
    METRICS_PATH: str
    METRICS: Mapping[str, str]
    PROMPT_TOKENS_DETAILS_FLAG: str

    def launch(self, spec: EngineSpec) -> EngineLaunch: ...

    def prefill_body(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def decode_body(self, body: Mapping[str, Any], handle: Mapping[str, Any] | None) -> dict[str, Any]: ...

    def release_body(self, handle: Mapping[str, Any]) -> dict[str, Any]: ...

    def kv_handle(self, response: Any) -> dict[str, Any] | None: ...

    def is_prefill_leg(self, body: Mapping[str, Any]) -> bool: ...

    def runs_in(self, container: Mapping[str, Any]) -> bool: ...

    def check_body(self, body: Mapping[str, Any]) -> None: ...

    def refused_handle_field(self, body: Mapping[str, Any]) -> str | None: ...


ENGINE_KINDS: Mapping[EngineKind, EngineKindModule] = {"vllm": vllm}
DEFAULT_ENGINE_KIND: EngineKind = "vllm"


def engine_kind(kind: EngineKind = DEFAULT_ENGINE_KIND) -> EngineKindModule:
    """The module of engine kind ``kind``; ValueError names the kinds there are."""
    try:
        return ENGINE_KINDS[kind]
    except KeyError:
        raise ValueError(f"engine kind must be one of {', '.join(ENGINE_KINDS)}, got {kind!r}") from None


def engine_launch(spec: EngineSpec) -> EngineLaunch:
    """The command, arguments and environment that start ``spec``'s engine (its kind's module renders them).
    ValueError names the bad field."""
    return engine_kind(spec.kind).launch(spec)
