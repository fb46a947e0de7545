"""What the request path's steps outside the proxy (the prefill legs, the one retry, the KV release) need of the
proxy that runs them. A protocol: they take the proxy without importing it, and the proxy imports them."""

from __future__ import annotations

import ssl
from typing import Protocol

from .aborts import Aborts
from .http_util import LegSession
from .metrics import RouterMetrics
from .runtime import Runtime


class LegHost(Protocol):
    """The proxy as its legs see it (:class:`.proxy.Proxy` satisfies it)."""

    rt: Runtime
    metrics: RouterMetrics
    session: LegSession | None
    remote_tls: dict[str, ssl.SSLContext | bool]
    remote_tokens: dict[str, str | None]
    aborts: Aborts

    @property
    def legs(self) -> LegSession:
        """The open HTTP session of the legs (raises when the proxy's app has not opened it)."""
        ...


def remote_auth(proxy: LegHost, remote: str) -> dict[str, str]:
    """The bearer-token header for a call to ``remote``'s gateway (empty when it has no token)."""
    token = proxy.remote_tokens.get(remote)
    return {"Authorization": f"Bearer {token}"} if token else {}
