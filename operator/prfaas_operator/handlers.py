"""kopf registrations, and nothing else: each handler parses the object into the core's model and hands it
to the operator (``memo.operator``), whose reconcile code does the work.

* create/update/resume: parse, store, reconcile at the next tick (invalid specs and dangling references
  turn ``Ready=False`` with an Event there);
* delete: forget; a PDCluster's finalizer removes its router ConfigMap first, a Managed PrefillCluster's its
  gateway ConfigMap (the one thing each owns); other objects carry no finalizer;
* no per-object kopf timers: the periodic work is one batched cycle (:mod:`.cycle`), and kopf would put a
  finalizer on every object that has a timer;
* pod events (pods labelled ``prfaas.io/pd-cluster`` or ``prfaas.io/prefill-cluster``) keep the instance
  cache fresh; a prefill pod's event nudges its PrefillCluster (whose gateway config lists it);
* watch events can be missed: the operator also re-lists everything periodically (``Operator.resync``).
* settings, the Lease, the cycle and the metrics server start in the one startup handler.
* the handlers that only parse and store are ``async``: kopf runs a plain ``def`` handler in a thread pool,
  a hand-off per watch event (a re-listed fleet is tens of thousands of them) and cache updates (and the
  cycle's wake-up event) touched from another thread than the event loop's.

Every replica keeps its cache warm; only the Lease holder writes anything. A non-leader's delete handler
fails temporarily instead of succeeding, so that the finalizer stays until the leader has cleaned up.
"""

from __future__ import annotations

from typing import Any

import kopf

from prfaas_core.names import (
    API_GROUP,
    API_VERSION,
    KIND_PD_CLUSTER,
    KIND_PREFILL_CLUSTER,
    LABEL_PD_CLUSTER,
    LABEL_PREFILL_CLUSTER,
)

from .config import OperatorConfig
from .kube import KubeCredentials
from .registry import PLURALS
from .runner import Operator, build, configure_settings, connection_info, parse_body, plain


def _op(memo: Any) -> Operator:
    return memo["operator"]  # type: ignore[no-any-return]


def register(registry: kopf.OperatorRegistry) -> None:
    """Register every handler on ``registry`` (the CLI's own, or kopf's default for ``kopf run``)."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure_settings(settings)
        config = memo.get("config") or OperatorConfig.from_env()
        memo["operator"] = build(config)
        await memo["operator"].start()

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        # kopf logs in again only when the last credentials expired or were refused (401): the operator's exec
        # plugin then runs again rather than handing back the same token
        if "operator" in memo:
            return _op(memo).connection_info(relogin=True)
        config = memo.get("config") or OperatorConfig.from_env()
        return connection_info(KubeCredentials.load(config.kubeconfig))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if "operator" in memo:
            await _op(memo).shutdown()

    for kind, plural in PLURALS.items():
        _register_kind(registry, kind, plural)

    for label in (LABEL_PD_CLUSTER, LABEL_PREFILL_CLUSTER):
        _register_pods(registry, label)


def _register_pods(registry: kopf.OperatorRegistry, label: str) -> None:
    """One handler per label (kopf filters on the client side: still one watch of pods)."""

    @kopf.on.event("", "v1", "pods", id=f"pod-event-{label}", labels={label: kopf.PRESENT}, registry=registry)
    async def pod_event(event: Any, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        op = _op(memo)
        if event.get("type") == "DELETED":
            op.pod_gone(body.metadata.namespace, str(body.metadata.name))
        else:
            op.pod_changed(plain(body))


def _register_kind(registry: kopf.OperatorRegistry, kind: str, plural: str) -> None:
    resource = (API_GROUP, API_VERSION, plural)

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    async def changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        entry = parse_body(kind, body)
        _op(memo).accept(entry, dirty=True)

    if kind not in (KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER):

        @kopf.on.delete(*resource, optional=True, registry=registry)
        async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
            _op(memo).forget(kind, plain(body))

        return

    def owns(body: kopf.Body, **_: Any) -> bool:
        return Operator.owns_config_map(kind, plain(body))

    @kopf.on.delete(*resource, when=owns, registry=registry)
    async def owner_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        op = _op(memo)
        if not op.leader.is_leader:
            raise kopf.TemporaryError(
                "not the Lease holder; the leader removes the owned ConfigMap", delay=op.config.lease_renew_s
            )
        await op.deleted(kind, plain(body))

    @kopf.on.delete(*resource, optional=True, when=lambda body, **_: not owns(body), registry=registry)
    async def unowned_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        _op(memo).forget(kind, plain(body))
