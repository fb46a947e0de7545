"""The operator's start-up check: the kubeconfig loads and the API server answers, before kopf starts (kopf
would log a traceback and retry forever). Failures here are one line and a non-zero exit; once running,
transient API failures are retried with backoff (:class:`~prfaas_operator.kube.KubeApi`, kopf)."""

from __future__ import annotations

from .kube import ApiError, KubeApi, KubeCredentials


class PreflightError(Exception):
    """Why the operator cannot start (one line)."""


async def preflight(kubeconfig: str | None, timeout_s: float = 10.0) -> KubeCredentials:
    """Load the credentials and call ``GET /version`` once (a short retry: an API server starting up)."""
    try:
        creds = KubeCredentials.load(kubeconfig)
    except Exception as exc:  # the kubernetes loader raises several kinds (ConfigException, OSError, ...)
        where = kubeconfig or "$KUBECONFIG / ~/.kube/config / in-cluster"
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise PreflightError(f"cannot load the kubeconfig ({where}): {detail}") from None
    api = KubeApi(creds, retries=2, backoff_s=0.5, timeout_s=timeout_s)
    try:
        await api.request("GET", "/version")
    except ApiError as exc:
        if exc.status in (401, 403):
            raise PreflightError(f"the API server {creds.server} refuses the credentials: HTTP {exc.status}") from None
        if exc.status == 0 or exc.status >= 500:
            detail = " ".join(str(exc).split())
            raise PreflightError(f"the API server {creds.server} is unreachable: {detail}") from None
    finally:
        await api.aclose()
    return creds
