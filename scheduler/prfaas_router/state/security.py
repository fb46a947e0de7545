"""The gateway's edge: bearer-token authentication (every path but ``/health`` and ``/ready``), the forwarding
allow-list of a prefill leg, and live rotation of the token, certificate and key files.

* Without a token file the gateway refuses to start unless started with ``--allow-insecure-gateway``; then it
  warns at start and exports ``prfaas_gateway_insecure 1``.
* A refused caller is counted in ``prfaas_gateway_auth_failures_total{reason}`` (missing, malformed, wrong,
  expired) and logged with its peer and path, never with what it presented.
* Forwarded to the engine: only the body fields of :data:`BODY_FIELDS` (the KV handle field with only the
  keys a prefill leg asks with, :func:`prfaas_core.launch.vllm.refused_handle_field`), the ``x-request-id``
  header and a valid W3C ``traceparent`` with its ``tracestate`` (:mod:`prfaas_core.request.tracecontext`);
  the exchange's own headers (:data:`PRFAAS_HEADERS`) are read by the gateway and stripped. Any other body
  field, or any other ``x-prfaas-*`` header, is refused with a 400 naming it. Region B's routers send only
  these (:func:`gateway_body`), so a client's extra fields never make a leg fail.
* Files kubelet updates in place are polled (``security.credentialPollSeconds``): a changed token is in force at
  once and the previous one accepted ``security.tokenOverlapSeconds`` longer; a changed certificate/key pair
  is loaded into the listening TLS context (new handshakes use it). An unreadable or invalid new credential is
  reported (log, ``prfaas_router_credential_reloads_total{result="rejected"}``) and the last good one kept.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from prfaas_core import names
from prfaas_core.launch.kinds import engine_kind
from prfaas_core.request.tracecontext import trace_context

from .metrics import gauge
from .wire import json_error

ENGINE = engine_kind()

log = structlog.get_logger("prfaas.gateway")

BODY_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "stream",
        "cache_salt",
        ENGINE.KV_HANDLE_FIELD,
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "add_generation_prompt",
        "add_special_tokens",
        "continue_final_message",
    }
)
"""Body fields of a prefill leg the gateway forwards to its engines (the prompt, and what shapes its first
token); anything else (``chat_template``, ``tools``, ``logprobs``, ...) is refused."""
PRFAAS_HEADERS = frozenset(names.ADMISSION_HEADERS)
"""The exchange's admission headers (INTERFACES.md): read by the gateway, never passed to an engine."""
FORWARDED_HEADERS = ("x-request-id",)
"""Headers passed on to the engine (tracing only), besides the trace context (:func:`forwarded_headers`)."""
OPEN_PATHS = frozenset({"/health", "/ready"})


@dataclass(frozen=True, slots=True)
class RequestIds:
    """A request's ids: ``key``, made by the router, keys the egress ledger and every internal table; ``trace``
    is the client's ``x-request-id``, passed on to the legs for tracing only (the key when the client sent
    none), so that no client can make two transfers share one ledger entry. ``context``: the W3C trace headers
    every leg carries (:func:`prfaas_core.request.tracecontext.trace_context`)."""

    key: str
    client: str = ""
    context: tuple[tuple[str, str], ...] = ()

    @property
    def trace(self) -> str:
        return self.client or f"prfaas-{self.key}"

    def headers(self) -> dict[str, str]:
        """What every leg sends for tracing: ``x-request-id`` and the trace context."""
        return {"x-request-id": self.trace, **dict(self.context)}


def gateway_body(body: dict[str, Any]) -> dict[str, Any]:
    """A prefill leg's body as a router sends it to a gateway: only the allow-listed fields."""
    return {k: v for k, v in body.items() if k in BODY_FIELDS}


def refused_field(body: dict[str, Any], headers: Any) -> str | None:
    """Why a prefill leg is outside the allow-list (the field or header named), or None."""
    extra = sorted(k for k in body if k not in BODY_FIELDS)
    if extra:
        return f"field {extra[0]!r} is not forwarded by the gateway (allowed: {', '.join(sorted(BODY_FIELDS))})"
    refused = ENGINE.refused_handle_field(body)
    if refused is not None:
        return refused
    for name in headers:
        low = name.lower()
        if low.startswith("x-prfaas-") and low not in PRFAAS_HEADERS:
            return f"header {low!r} is not accepted by the gateway (allowed: {', '.join(sorted(PRFAAS_HEADERS))})"
    for name in (h for h in names.ADMISSION_HEADERS if h != names.HEADER_LINK):
        value = headers.get(name)
        if value is not None and not _non_negative_number(value):
            return f"header {name!r} must be a non-negative number, got {value[:40]!r}"
    return None


def _non_negative_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return value >= 0 and value == value and value != float("inf")


def forwarded_headers(headers: Any) -> dict[str, str]:
    """The caller's tracing headers as the gateway passes them to its engine (a valid trace context only)."""
    return {**{h: headers[h][:200] for h in FORWARDED_HEADERS if h in headers}, **dict(trace_context(headers))}


class InsecureGatewayError(ValueError):
    """Gateway mode without a token file and without the explicit insecure flag."""


def _digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def read_token(path: str) -> bytes | None:
    """A token file's content, stripped (None: unreadable or empty)."""
    try:
        value = Path(path).read_bytes().strip()
    except OSError:
        return None
    return value or None


@dataclass
class SecurityMetrics:
    registry: CollectorRegistry

    def __post_init__(self) -> None:
        r = self.registry
        self.auth_failures = Counter(
            names.METRIC_GATEWAY_AUTH_FAILURES.removesuffix("_total"),
            "Requests refused for their credentials, by reason.",
            ["reason"],
            registry=r,
        )
        self.insecure = gauge(names.METRIC_GATEWAY_INSECURE, "1 while the gateway serves without a token.", registry=r)
        self.reloads = Counter(
            names.METRIC_ROUTER_CREDENTIAL_RELOADS.removesuffix("_total"),
            "Credential file changes seen, by credential and result.",
            ["credential", "result"],
            registry=r,
        )


@dataclass
class TokenAuth:
    """The bearer token in force, the previous one during the overlap, and the file they come from."""

    path: str | None
    metrics: SecurityMetrics
    overlap_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    token: bytes | None = None
    previous: bytes | None = None
    previous_until: float = 0.0
    digest: str | None = None
    source: str = "gateway.tokenFile"
    """Where the file is named (messages)."""
    credential: str = "token"
    """The credential's label on :data:`~prfaas_core.names.METRIC_ROUTER_CREDENTIAL_RELOADS`."""

    def __post_init__(self) -> None:
        if self.path is not None:
            self.token, self.digest = read_token(self.path), _digest(self.path)
            if self.token is None:
                raise InsecureGatewayError(f"{self.source} {self.path}: unreadable or empty")

    def set_path(self, path: str | None) -> None:
        """A reloaded config named another file (or the same): read it as a rotation."""
        if path != self.path:
            self.path, self.digest = path, None
        self.poll()

    def poll(self) -> bool:
        """Re-read the file if its content changed; True when a new token came into force."""
        if self.path is None:
            return False
        digest = _digest(self.path)
        if digest == self.digest:
            return False
        self.digest = digest
        new = read_token(self.path)
        if new is None:
            self.metrics.reloads.labels(self.credential, "rejected").inc()
            log.error(f"{self.source} unreadable or empty; keeping the last good token", path=self.path)
            return False
        if self.token is not None and hmac.compare_digest(new, self.token):
            return False
        self.previous, self.previous_until = self.token, self.clock() + self.overlap_s
        self.token = new
        self.metrics.reloads.labels(self.credential, "loaded").inc()
        log.info(f"{self.source}: token rotated", path=self.path, overlap_s=self.overlap_s)
        return True

    def refusal(self, authorization: str | None) -> str | None:
        """None if the header carries the token in force (or the previous one within the overlap)."""
        if self.token is None:
            return None
        if not authorization:
            return "missing"
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return "malformed"
        got = presented.strip().encode()
        if hmac.compare_digest(got, self.token):
            return None
        if self.previous is not None and hmac.compare_digest(got, self.previous):
            return None if self.clock() < self.previous_until else "expired"
        return "wrong"


@dataclass
class TlsReloader:
    """The listener's TLS context, reloaded in place when the certificate or key file changes."""

    cert: str
    key: str
    metrics: SecurityMetrics
    context: ssl.SSLContext = field(init=False)
    digest: tuple[str | None, str | None] = (None, None)

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(self.cert, self.key)
        self.digest = (_digest(self.cert), _digest(self.key))

    def poll(self) -> bool:
        digest = (_digest(self.cert), _digest(self.key))
        if digest == self.digest:
            return False
        self.digest = digest
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert, self.key)  # trial
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self.metrics.reloads.labels("tls", "rejected").inc()
            log.error("gateway certificate/key invalid; keeping the last good pair", cert=self.cert, error=str(exc))
            return False
        self.metrics.reloads.labels("tls", "loaded").inc()
        log.info("gateway certificate reloaded", cert=self.cert)
        return True


def token_key(authorization: str) -> str:
    """A short digest naming the token a header carries (the connection budgets' key; never the token)."""
    return hashlib.sha256(authorization.partition(" ")[2].strip().encode()).hexdigest()[:16]


def auth_middleware(
    auth: TokenAuth,
    metrics: SecurityMetrics,
    authenticated: Callable[[web.Request, str], bool] | None = None,
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuses requests without the token (but on ``OPEN_PATHS``). ``authenticated(request, token key)``: told of
    each request that carried it (the connection budgets); False refuses it 503 and closes its connection."""

    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        reason = auth.refusal(request.headers.get("Authorization"))
        if reason is not None:
            metrics.auth_failures.labels(reason).inc()
            log.warning("gateway refused a caller", reason=reason, peer=request.remote, path=request.path)
            return json_error(401, f"bearer token {reason}", "authentication_error", **{"WWW-Authenticate": "Bearer"})
        header = request.headers.get("Authorization")
        if authenticated is not None and header and not authenticated(request, token_key(header)):
            log.warning("gateway connections of this token at their limit", peer=request.remote, path=request.path)
            resp = json_error(
                503, "too many connections with this token (security.maxConnectionsPerToken)", "service_unavailable"
            )
            resp.force_close()
            return resp
        return await handler(request)

    return check
