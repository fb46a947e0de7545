"""The operator's own settings (command line or environment), validated once at startup."""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import BaseModel, ConfigDict, Field, model_validator

RESYNC_ENV = "PRFAAS_RESYNC_SECONDS"


def _env_seconds(name: str, default: float) -> float:
    """A period from the environment. The resync period is read here, not only in :meth:`from_env`, so that the
    variable reaches every entry point: ``prfaas operator`` builds its config from flags, and its
    ``--resync-seconds`` (when given) wins over the variable."""
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


class OperatorConfig(BaseModel):
    """Everything the operator process is configured with. Times are seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: tuple[str, ...] = Field(default=(), description="Namespaces to serve; empty with all_namespaces.")
    all_namespaces: bool = Field(default=False, description="Serve every namespace (cluster-wide).")
    prometheus_url: str = Field(default="http://127.0.0.1:9090", description="Default Prometheus base URL.")
    prometheus_timeout_s: float = Field(default=5.0, gt=0, description="Timeout of one Prometheus query.")
    metrics_port: int | None = Field(default=8080, ge=0, le=65535, description="Port of /metrics; None: off.")
    metrics_host: str = Field(default="0.0.0.0", description="Address /metrics binds to.")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path; None: $KUBECONFIG or in-cluster.")
    lease_name: str = Field(default="prfaas-operator", description="coordination.k8s.io/v1 Lease name.")
    lease_namespace: str | None = Field(default=None, description="Namespace of the Lease; default: first served.")
    lease_duration_s: float = Field(
        default=15.0, gt=0, description="A leader that has not renewed for this long is presumed gone."
    )
    lease_renew_s: float = Field(default=5.0, gt=0, description="How often the leader renews (and others retry).")
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
        description="This replica's holder identity in the Lease.",
    )
    tick_s: float = Field(default=1.0, gt=0, description="How often the cycle checks what is due.")
    link_period_s: float = Field(default=15.0, gt=0, description="Period of link measurements.")
    gateway_period_s: float = Field(default=15.0, gt=0, description="Period of remote gateway status reads.")
    resync_s: float = Field(
        default_factory=lambda: _env_seconds(RESYNC_ENV, 300.0),
        gt=0,
        description="Period of the full re-list that repairs the cache after a missed watch event "
        f"(default: ${RESYNC_ENV}, else 300).",
    )
    status_heartbeat_s: float = Field(
        default=300.0,
        gt=0,
        description="A status written only to say 'still fresh' (lastMeasuredTime, lastSyncTime, a repeated "
        "Hold's time) is rewritten alone at most this often (writer.py stretches it to 20 cycles when cycles are "
        "that long, and spreads it per object over one to two intervals); any other change writes it at once.",
    )
    status_heartbeat_cycles: int = Field(
        default=20,
        ge=0,
        description="The status heartbeat is at least this many of the slowest recent cycles apart (0: "
        "status_heartbeat_s alone).",
    )
    liveness_stall_s: float = Field(
        default=120.0,
        gt=0,
        description="/healthz fails when the reconcile loop has made no progress (gone round, or finished an "
        "object's reconcile) for this long.",
    )
    api_retries: int = Field(default=5, ge=0, description="Retries of a Kubernetes API call on 409/429/5xx.")
    api_backoff_s: float = Field(default=0.2, gt=0, description="First retry delay (doubles each retry).")
    log_level: str = Field(default="INFO", description="Log level of the operator's JSON logs.")

    @model_validator(mode="after")
    def _scope(self) -> OperatorConfig:
        if self.all_namespaces and self.namespaces:
            raise ValueError("give namespaces or all_namespaces, not both")
        if not self.all_namespaces and not self.namespaces:
            raise ValueError("give at least one namespace, or all_namespaces")
        if self.lease_renew_s >= self.lease_duration_s:
            raise ValueError("lease_renew_s must be below lease_duration_s")
        if self.liveness_stall_s <= 2 * self.tick_s:
            raise ValueError("liveness_stall_s must be above two ticks (the idle loop goes round every tick_s)")
        return self

    @property
    def lease_ns(self) -> str:
        return self.lease_namespace or (self.namespaces[0] if self.namespaces else "default")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        """For ``kopf run``: PRFAAS_NAMESPACES (comma-separated; unset: all), PRFAAS_PROMETHEUS_URL,
        PRFAAS_METRICS_PORT, PRFAAS_LEASE_NAME, PRFAAS_LEASE_NAMESPACE, PRFAAS_RESYNC_SECONDS,
        PRFAAS_LIVENESS_STALL_SECONDS, KUBECONFIG."""
        e = dict(os.environ if env is None else env)
        namespaces = tuple(n for n in e.get("PRFAAS_NAMESPACES", "").split(",") if n)
        kwargs: dict[str, object] = {"namespaces": namespaces, "all_namespaces": not namespaces}
        if "PRFAAS_PROMETHEUS_URL" in e:
            kwargs["prometheus_url"] = e["PRFAAS_PROMETHEUS_URL"]
        if "PRFAAS_METRICS_PORT" in e:
            kwargs["metrics_port"] = int(e["PRFAAS_METRICS_PORT"])
        if "PRFAAS_LEASE_NAME" in e:
            kwargs["lease_name"] = e["PRFAAS_LEASE_NAME"]
        if "PRFAAS_LEASE_NAMESPACE" in e:
            kwargs["lease_namespace"] = e["PRFAAS_LEASE_NAMESPACE"]
        if e.get(RESYNC_ENV):
            kwargs["resync_s"] = float(e[RESYNC_ENV])
        if e.get("PRFAAS_LIVENESS_STALL_SECONDS"):
            kwargs["liveness_stall_s"] = float(e["PRFAAS_LIVENESS_STALL_SECONDS"])
        if e.get("KUBECONFIG"):
            kwargs["kubeconfig"] = e["KUBECONFIG"].split(os.pathsep)[0]
        return cls.model_validate(kwargs)
