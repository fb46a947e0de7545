"""A small asynchronous Kubernetes API client (httpx) with the retries the operator needs.

Why not the official client: it is synchronous, and the operator's few verbs (get, list, merge-patch, create,
delete, the scale subresource, Leases, Events) fit in one class whose retry rules are explicit: a 409 on an
unconditional merge patch, a 429, a 5xx and a dropped connection are retried with exponential backoff; a 409
on a conditional write (``metadata.resourceVersion`` in the patch, as Lease renewals use) is returned to the
caller, who owns the conflict. A 401 refreshes the credentials once and retries (an expired exec-plugin token;
a rotated service-account token is read afresh for every request anyway). Credentials come from a kubeconfig
(:mod:`~prfaas_operator.kubeconfig`: tokens, client certificates, exec plugins) or the in-cluster service account;
kopf logs in with the same credentials, and again when its token expires or is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import kubeconfig as kubeconfig_loader

RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})
MERGE_PATCH = "application/merge-patch+json"

JsonDict = dict[str, Any]


class ApiError(Exception):
    """A Kubernetes API error with its HTTP status and the server's reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class KubeCredentials(kubeconfig_loader.Loaded):
    """How to reach and authenticate to one API server (the fields :func:`~.kubeconfig.load` finds)."""

    def bearer(self) -> str | None:
        """The token to send now: a token file read afresh (projected service-account tokens rotate), an exec
        plugin's current token (run again when it is about to expire), else the static token."""
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        if self.exec_plugin is not None:
            return self.exec_plugin.token()
        return self.token

    @property
    def refreshable(self) -> bool:
        """Whether asking again can give another token (a token file, an exec plugin)."""
        return bool(self.token_file) or self.exec_plugin is not None

    def needs_refresh(self) -> bool:
        """Whether :meth:`bearer` will run the exec plugin (then call it off the event loop)."""
        return self.exec_plugin is not None and self.exec_plugin.stale()

    def refused(self) -> None:
        """The API server answered 401: the next :meth:`bearer` runs the exec plugin again."""
        if self.exec_plugin is not None:
            self.exec_plugin.invalidate()

    def expires(self) -> dt.datetime | None:
        """When kopf should log in again: ahead of the exec plugin's expirationTimestamp by the margin the
        operator's own client renews at (so kopf's next login runs the plugin and gets a fresh token)."""
        when = self.exec_plugin.expires if self.exec_plugin is not None else None
        if when is None:
            return None
        return dt.datetime.fromtimestamp(when - kubeconfig_loader.REFRESH_EARLY_S, dt.UTC)

    @classmethod
    def load(cls, kubeconfig: str | None = None) -> KubeCredentials:
        """From ``kubeconfig`` (or $KUBECONFIG, ~/.kube/config), else the in-cluster service account."""
        found = kubeconfig_loader.load(kubeconfig)
        return cls(**{f.name: getattr(found, f.name) for f in dataclasses.fields(found)})


def api_path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
) -> str:
    """``/api/v1/namespaces/ns/pods/name/status`` and the like."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if sub:
        parts.append(sub)
    return "/".join(parts)


def labels_match(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class KubeApi:
    """One long-lived HTTP client for the operator's API calls; ``on_retry`` counts retries (metrics)."""

    def __init__(
        self,
        creds: KubeCredentials,
        retries: int = 5,
        backoff_s: float = 0.2,
        timeout_s: float = 10.0,
        on_retry: Callable[[int], None] | None = None,
    ) -> None:
        verify: bool | str = False if creds.insecure else (creds.ca_path or True)
        cert = (creds.cert_path, creds.key_path) if creds.cert_path and creds.key_path else None
        self._creds = creds
        self._client = httpx.AsyncClient(
            base_url=creds.server.rstrip("/"),
            verify=verify,
            cert=cert,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=20, max_keepalive_connections=10),
        )
        self.retries = retries
        self.backoff_s = backoff_s
        self._on_retry = on_retry
        self.calls = 0
        self.reauthentications = 0

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _authorize(self, headers: dict[str, str]) -> None:
        """Set the Authorization header from the current token; an exec plugin due to run runs in a thread."""
        if self._creds.needs_refresh():
            token = await asyncio.to_thread(self._creds.bearer)
        else:
            token = self._creds.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        else:
            headers.pop("Authorization", None)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        retry_conflicts: bool = True,
    ) -> JsonDict:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        attempt = 0
        reauthenticated = False
        while True:
            await self._authorize(headers)
            self.calls += 1
            try:
                resp = await self._client.request(method, path, json=body, params=params, headers=headers)
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise ApiError(0, "ConnectionError", str(exc) or type(exc).__name__) from exc
                status = 0
            else:
                status = resp.status_code
                if status < 400:
                    return resp.json() if resp.content else {}
                if status == 401 and self._creds.refreshable and not reauthenticated:
                    self._creds.refused()  # an expired token: ask the plugin (or the file) again, once
                    reauthenticated = True
                    self.reauthentications += 1
                    continue
                retryable = status in RETRYABLE and (status != 409 or retry_conflicts)
                if not retryable or attempt >= self.retries:
                    raise _error(resp)
            attempt += 1
            if self._on_retry is not None:
                self._on_retry(status)
            delay = self.backoff_s * (2 ** (attempt - 1))
            await asyncio.sleep(delay * (0.5 + random.random() / 2))

    async def get(self, path: str) -> JsonDict | None:
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, path: str, selector: Mapping[str, str] | None = None) -> list[JsonDict]:
        """List objects; the label selector is sent *and* applied here (servers that ignore it still work)."""
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())} if selector else None
        items = (await self.request("GET", path, params=params)).get("items") or []
        return [i for i in items if not selector or labels_match(i, selector)]

    async def patch(self, path: str, body: JsonDict, *, retry_conflicts: bool = True) -> JsonDict:
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH, retry_conflicts=retry_conflicts)

    async def create(self, path: str, body: JsonDict) -> JsonDict:
        return await self.request("POST", path, body=body, retry_conflicts=False)

    async def delete(self, path: str) -> bool:
        """Delete; False when it was already gone."""
        try:
            await self.request("DELETE", path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _error(resp: httpx.Response) -> ApiError:
    try:
        data = resp.json()
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    return ApiError(resp.status_code, str(data.get("reason") or resp.reason_phrase), str(data.get("message") or ""))


async def list_labelled(api: KubeApi, path: str, label_key: str) -> list[JsonDict]:
    """List the objects carrying ``label_key`` with any value: an existence selector, sent to the server and
    applied here too (``KubeApi.list`` takes equality selectors only)."""
    items = (await api.request("GET", path, params={"labelSelector": label_key})).get("items") or []
    return [i for i in items if label_key in ((i.get("metadata") or {}).get("labels") or {})]
