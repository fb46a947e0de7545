"""Shared names: the API group, label and annotation keys, and metric names.

Every part (router, operator, charts, dashboards, tests) takes these from here, so that a rename is one
change. The README's "Names" section documents them.
"""

from typing import Final

API_GROUP: Final = "prfaas.io"
API_VERSION: Final = "v1alpha1"
GROUP_VERSION: Final = "prfaas.io/v1alpha1"
assert f"{API_GROUP}/{API_VERSION}" == GROUP_VERSION

KIND_PREFILL_CLUSTER: Final = "PrefillCluster"
KIND_PD_CLUSTER: Final = "PDCluster"
KIND_INTER_DC_LINK: Final = "InterDCLink"
KIND_MODEL_PROFILE: Final = "ModelProfile"

# --- Label keys (on engine pods / instances and on objects the operator owns) ---------------------------
LABEL_ROLE: Final = f"{API_GROUP}/role"
"""The serving role of an engine instance: one of ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH."""
LABEL_DRAINING: Final = f"{API_GROUP}/draining"
"""Present with value "true" while an instance drains before a role flip; routers send it no new work."""
LABEL_PD_CLUSTER: Final = f"{API_GROUP}/pd-cluster"
"""Name of the PDCluster an instance or an owned object belongs to."""
LABEL_PREFILL_CLUSTER: Final = f"{API_GROUP}/prefill-cluster"
"""Name of the PrefillCluster an instance or an owned object belongs to."""
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "prfaas-operator"

ROLE_PREFILL: Final = "prefill"
ROLE_DECODE: Final = "decode"
ROLE_BOTH: Final = "both"

# --- Annotation keys ------------------------------------------------------------------------------------
ANNOTATION_LAST_FLIP: Final = f"{API_GROUP}/last-role-flip"
"""RFC 3339 time of the last role flip of an instance (cooldown is measured from it)."""
ANNOTATION_SCALE_TARGETS: Final = f"{API_GROUP}/scale-targets"
"""Scale mode: the absolute replica counts a flip writes, stamped on the retired pod with its retirement and
removed once written, so that a flip interrupted between the two is finished by the next reconcile."""
ANNOTATION_ROUTER_CONFIG_HASH: Final = f"{API_GROUP}/router-config-hash"
"""Hash of the router configuration an object was rendered from (pods roll when it changes)."""
ANNOTATION_DRAIN_STARTED: Final = f"{API_GROUP}/drain-started"
"""RFC 3339 time a drain began (the drain timeout is measured from it)."""

ANNOTATION_PAUSED: Final = f"{API_GROUP}/paused"
"""Set to "true" on a PrFaaS object to pause its reconciliation (the operator records that it is paused)."""

ANNOTATION_POD_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
"""Kubernetes' annotation: a Deployment scaling down removes the pod with the lowest cost first."""
ANNOTATION_EGRESS_BANDWIDTH: Final = "kubernetes.io/egress-bandwidth"
"""Kubernetes' pod annotation (the CNI bandwidth plugin's): the pod's egress limit, e.g. ``2000M`` (bits/s).
``linkScheduling.egressPacing: PerInstance`` sets it on a Managed PrefillCluster's pod template."""
ANNOTATION_EGRESS_PACED: Final = f"{API_GROUP}/egress-paced"
"""On a workload whose pod template the operator paced: the rate it set, so that it removes only its own."""

FINALIZER: Final = f"{API_GROUP}/finalizer"

# --- The gateway's admission answer (headers of a remote prefill; the 429 body is api.AdmissionDecline) ----
HEADER_KV_BYTES: Final = "x-prfaas-kv-bytes"
"""The KV bytes the request's stream will carry over the link (the router's ``S_kv``)."""
HEADER_MAX_WAIT_MS: Final = "x-prfaas-max-wait-ms"
"""The longest wait for a link window the router accepts, ms (from its local alternative's predicted TTFT)."""
HEADER_MAX_TTFT_MS: Final = "x-prfaas-max-ttft-ms"
"""The latest predicted time to first token the router accepts through a window, ms from now (model time): the
gateway's calendar knows the stream's timing (a pull after the prefill, at what one pull achieves), so it judges
the whole TTFT where the router could only bound the wait."""
HEADER_SLO_TTFT_MS: Final = "x-prfaas-slo-ttft-ms"
"""The request's TTFT objective, ms from now (model time; the router's SLO for its length): the gateway serves the
prefills held for a PrFaaS lane earliest due first (``laneOrder: deadline``), keeping every held one that is
predicted to make its objective within it."""
HEADER_LINK: Final = "x-prfaas-link"
"""The link the stream crosses."""
HEADER_LINK_AVAILABLE_GBPS: Final = "x-prfaas-link-available-gbps"
"""The link's available bandwidth as the sending router estimates it (model Gbps; sent only while the estimate
bounds the configured capacity): the gateway's calendar books under the lowest fresh report."""
ADMISSION_HEADERS: Final = (
    HEADER_KV_BYTES,
    HEADER_MAX_WAIT_MS,
    HEADER_MAX_TTFT_MS,
    HEADER_SLO_TTFT_MS,
    HEADER_LINK,
    HEADER_LINK_AVAILABLE_GBPS,
)
"""Stripped by the gateway before the engine (its forwarding allow-list passes them to it, no further)."""
HEADER_PULL_ID: Final = "x-prfaas-pull-id"
"""In the gateway's answer to a prefill whose pull it booked: the pull's id. The gateway answers only once the
pull fits on the wire next to the pulls already there, and counts it there until the caller reports it over
(:data:`PULL_DONE_PATH`, when its decode holds the KV) or its lease runs out."""
PULL_DONE_PATH: Final = "/v1/prfaas/pulls/{pull_id}/done"
"""The gateway path (POST, bearer token) a router reports a pull over on: the link's next pull may start. A replica
that did not let the pull on forwards the report to its peer that did (the id names it)."""
SERVER_TIMING: Final = "Server-Timing"
"""W3C Server-Timing on answers (durations in wall ms). The gateway's prefill answer: ``hold`` (waiting for the
link window), ``prefill`` (the PrFaaS instance, its queue included), ``release`` (the answer held until its pull
fits on the wire) and ``predicted`` (the TTFT the gateway predicted at admission). The router's answer: ``prefill``
(from arrival until the KV handle, the remote leg's waits included), ``first`` (until the decode's first bytes:
the KV pull and the first token) and the gateway's entries prefixed ``gw-``. To see where a request's time went."""
HEADER_FORWARDED: Final = "x-prfaas-forwarded"
"""On a pull report one gateway replica forwards to another: that one answers itself, never forwards it again."""
LOANS_PATH: Final = "/v1/prfaas/links/{link}/loans"
"""Between gateway replicas (POST, bearer token): lend the caller a fraction of this replica's share of ``link``
(:class:`~prfaas_core.policy.link_shares.LinkShares`); ``DELETE`` :data:`LOAN_PATH` gives it back."""
LOAN_PATH: Final = "/v1/prfaas/links/{link}/loans/{loan_id}"
REPLICA_BOOKS_PATH: Final = "/v1/prfaas/replicas/books"
"""Between router replicas in front of one PD cluster (PUT): the sender's PD prefill books
(:class:`~prfaas_core.api.replica_books.ReplicaBooksWire`), so each replica counts the others' local prefills."""
REASON_WAIT_FOR_LINK: Final = "wait_for_link"
"""The routing decision kind of a request that waited for a later link window."""

# --- Metric names: our own components -------------------------------------------------------------------
METRIC_ROUTER_REQUESTS: Final = "prfaas_router_requests_total"
METRIC_ROUTER_ROUTE_DECISIONS: Final = "prfaas_router_route_decisions_total"
METRIC_ROUTER_THRESHOLD_TOKENS: Final = "prfaas_router_threshold_tokens"
METRIC_ROUTER_THRESHOLD_MIN_TOKENS: Final = "prfaas_router_threshold_min_tokens"
"""(router) ``t_min``, the floor of the threshold (RouterConfig.routing.thresholdMinTokens, the operator's): ``t`` never
goes below it and is raised above it under link pressure."""
METRIC_ROUTER_TTFT_SECONDS: Final = "prfaas_router_ttft_seconds"
METRIC_ROUTER_BREAKER_OPEN: Final = "prfaas_router_breaker_open"
METRIC_ROUTER_E2E_SECONDS: Final = "prfaas_router_e2e_seconds"
METRIC_ROUTER_TPOT_SECONDS: Final = "prfaas_router_tpot_seconds"
METRIC_ROUTER_FALLBACKS: Final = "prfaas_router_fallbacks_total"
METRIC_ROUTER_DECISION_SECONDS: Final = "prfaas_router_decision_seconds"
METRIC_ROUTER_IN_FLIGHT: Final = "prfaas_router_in_flight"
METRIC_ROUTER_LINK_EGRESS_GBPS: Final = "prfaas_router_link_egress_estimate_gbps"
METRIC_ROUTER_LINK_CAP_GBPS: Final = "prfaas_router_link_cap_gbps"
METRIC_ROUTER_LINK_SCARCE: Final = "prfaas_router_link_scarce"
METRIC_ROUTER_REMOTE_BYTES: Final = "prfaas_router_remote_kv_bytes_total"
"""KV bytes (``S_kv`` of the whole ``prefixBlockTokens`` blocks that hold the prompt tokens the remote engine
reported: what a decode without any of the prompt cached pulls) of the remote prefills a router admitted
and got a KV handle for, by ``link``: region B's default egress source (region B's Prometheus cannot read region
A's)."""
METRIC_ROUTER_TTFT_SLO: Final = "prfaas_router_ttft_slo_total"
"""Requests by ``route`` and ``result`` (``met``/``missed``): TTFT within the request's own objective
(RouterConfig.slo: base + per-1K-tokens slope x its prompt length). The SLO-burn alerts read its ratio."""
METRIC_ROUTER_TTFT_SLO_OBJECTIVE: Final = "prfaas_router_ttft_slo_objective_ratio"
"""The PDCluster's slo.objectiveRatio as the router has it (the burn alerts' error budget is 1 minus it)."""
TTFT_SLO_RESULTS: Final = ("met", "missed")
METRIC_GATEWAY_KV_EGRESS_BYTES: Final = "prfaas_gateway_kv_egress_bytes_total"
"""KV bytes (``S_kv`` of the whole ``prefixBlockTokens`` blocks of the engine's reported prompt tokens) of the
remote prefills a gateway served, by ``link``
(the router's ``x-prfaas-link`` header); also on the gateway's status endpoint (``kvEgressBytes``)."""
METRIC_ROUTER_OPEN_CONNECTIONS: Final = "prfaas_router_open_connections"
"""Client connections open on the listener (router and gateway)."""
METRIC_ROUTER_CONNECTIONS_CLOSED: Final = "prfaas_router_connections_closed_total"
"""Client connections the listener closed on its own, by ``reason`` (limit, header_timeout, body_timeout)."""
METRIC_ROUTER_CREDENTIAL_RELOADS: Final = "prfaas_router_credential_reloads_total"
"""Token/certificate file changes seen, by ``credential`` and ``result`` (loaded, rejected)."""
METRIC_GATEWAY_AUTH_FAILURES: Final = "prfaas_gateway_auth_failures_total"
"""Requests the gateway refused for their credentials, by ``reason`` (missing, malformed, wrong, expired)."""
METRIC_GATEWAY_INSECURE: Final = "prfaas_gateway_insecure"
"""1 while a gateway serves without a token (started with --allow-insecure-gateway)."""
METRIC_ROUTER_UNCACHED_TOKENS: Final = "prfaas_router_uncached_prompt_tokens"
"""(router) Histogram of routed requests' uncached prompt tokens (the observed length mix the long-term loop may
judge the split by, ``prfaas up``'s local loop does)."""
UNCACHED_TOKEN_BUCKETS: Final = (
    512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 98304, 131072,
)  # fmt: skip
METRIC_ROUTER_BREAKER_TRANSITIONS: Final = "prfaas_router_breaker_transitions_total"
"""A remote's breaker changing mode, by ``remote`` and ``to`` (closed, open, half-open)."""
METRIC_ROUTER_PREFILL_RETRIES: Final = "prfaas_router_prefill_retries_total"
"""Failed local prefill legs tried once more, by ``to`` (local, remote, none) and ``outcome``."""
METRIC_ROUTER_ENGINE_HEALTHY: Final = "prfaas_router_engine_healthy"
"""1 while the router counts an engine healthy (after consecutive failed probes it is 0), by ``engine``."""
METRIC_ROUTER_HEALTH_PROBE_FAILURES: Final = "prfaas_router_health_probe_failures_total"
"""Failed health probes (an engine's /metrics read: an error or a timeout), by ``engine``."""
METRIC_ROUTER_PREFIX_QUERY_TOKENS: Final = "prfaas_router_prefix_query_tokens_total"
"""Prompt tokens the router looked up in its prefix indexes, by ``cluster`` (pd, prfaas)."""
METRIC_ROUTER_PREFIX_HIT_TOKENS: Final = "prfaas_router_prefix_hit_tokens_total"
"""Of those, the tokens a cluster's instances hold (PD: only instances that can prefill), by ``cluster``."""
METRIC_ROUTER_ABANDONED_KV: Final = "prfaas_router_abandoned_kv_handles_total"
"""KV handles a prefill produced that no decode pulled (the decode leg failed), by ``cluster``. The router tells
the producer to free each one (:data:`METRIC_ROUTER_RELEASED_KV`); one it cannot release is freed at the
producer's lease (vLLM 0.32 NixlConnector: ``kv_lease_duration``, 30 s; the emulator's ``--kv-timeout``)."""
METRIC_ROUTER_RELEASED_KV: Final = "prfaas_router_released_kv_handles_total"
"""Of the abandoned handles, those the router had a decode instance release at once (a rejected decode leg that
carries the handle: vLLM frees the producer's blocks by a notification-only read), by ``cluster``."""
METRIC_ROUTER_READY: Final = "prfaas_router_ready"
"""1 while the router can serve (a decode instance and a prefill path), 0 while its /ready says why not."""
METRIC_ROUTER_LINK_WAITS: Final = "prfaas_router_link_waits_total"
"""(router) Gateway declines by ``link`` and what the router did: ``result`` = waited or local."""
METRIC_ROUTER_LINK_WAIT_SECONDS: Final = "prfaas_router_link_wait_seconds"
"""(router) Histogram of the link-window waits a router accepted (model seconds) on a gateway's decline, by ``link``."""
METRIC_ROUTER_LINK_AVAILABLE_GBPS: Final = "prfaas_router_link_available_gbps"
"""(router) The link's available bandwidth as estimated from its KV pulls' timing (model Gbps; the configured
capacity when nothing bounds it), by ``link``: the capacity its cap, watermarks and ``t`` use now."""
METRIC_ROUTER_LINK_AVAILABLE_SOURCE: Final = "prfaas_router_link_available_source"
METRIC_ROUTER_REPLICA_PEERS: Final = "prfaas_router_replica_peers"
"""(router) Other router replicas whose PD prefill books this one heard within the expiry (they count in its queues)."""
METRIC_ROUTER_REPLICA_SYNC: Final = "prfaas_router_replica_sync_total"
METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS: Final = "prfaas_router_replica_peer_prefill_seconds"
"""(router) The other replicas' local prefills in flight on each PD prefill ``instance`` as this one last heard them
(their predicted seconds, model time): what it adds to its own books there."""
"""(router) Books sent to peer replicas, by ``result``: sent, unreachable, refused (another status), unauthorized
(the peer refused this replica's ``--peers-token-file`` token, or it has none), self."""
"""(router) 1 for the estimate's current ``source`` (configured, streams, stalled), 0 for the others, by ``link``."""
METRIC_GATEWAY_ADMISSIONS: Final = "prfaas_gateway_admissions_total"
"""(gateway) Remote prefills the link calendar answered, by ``link`` and ``result``: booked, or the decline's reason
(link_window, overloaded; kv_lease: booked, prefilled, then held for the wire until the engine's KV lease nearly ran
out)."""
METRIC_GATEWAY_ADMISSION_WAIT_SECONDS: Final = "prfaas_gateway_admission_wait_seconds"
"""(gateway) Histogram of the booked windows' waits (model seconds) before their prefill starts, by ``link``."""
METRIC_GATEWAY_LANE_REORDERS: Final = "prfaas_gateway_lane_reorders_total"
"""(gateway) Held prefills moved back on their PrFaaS lane so that a request with an earlier deadline goes first
(``laneOrder: deadline``; each still within the TTFT its caller accepts), by ``link``."""
METRIC_GATEWAY_LINK_AVAILABLE_GBPS: Final = "prfaas_gateway_link_available_gbps"
"""(gateway) The available bandwidth the calendar books under (model Gbps; its replica's share of the capacity when
nothing bounds it), by ``link`` and ``source`` (configured, or the routers' reports: reported)."""
METRIC_GATEWAY_PULLS: Final = "prfaas_gateway_pulls_total"
"""(gateway) Pulls the gateway let onto the wire that are over, by ``link`` and ``end``: ``reported`` (the caller said
so) or ``lease`` (no report in time: a router that does not report, or died)."""
METRIC_GATEWAY_PULL_HOLD_SECONDS: Final = "prfaas_gateway_pull_hold_seconds"
"""(gateway) Histogram of how long prefill answers were held (model seconds) until their pull fit on the wire next
to the pulls already there, by ``link``."""
METRIC_GATEWAY_LINK_SHARE: Final = "prfaas_gateway_link_share"
"""(gateway) This replica's share of the link's ceiling now (0-1: its ``1 / replicas``, less what it lent to its
peers, plus what it borrowed), by ``link``."""
METRIC_GATEWAY_LOANS: Final = "prfaas_gateway_loans_total"
"""(gateway) Share loans between gateway replicas, by ``link`` and ``result``: ``borrowed``, ``lent``, ``refused``
(the peer had nothing free), ``unreachable`` (a peer did not answer), ``expired`` (a loan's lease ran out before the
borrower gave it back)."""
METRIC_LINK_EGRESS_BYTES: Final = "prfaas_link_egress_bytes_total"
METRIC_LINK_UTILIZATION: Final = "prfaas_link_utilization_ratio"
METRIC_LINK_SCARCE: Final = "prfaas_link_scarce"
METRIC_LINK_WIRE_BYTES: Final = "prfaas_link_wire_bytes_total"
"""Real bytes the link emulator delivered towards the decode side (the egress counter is in model bytes)."""
METRIC_LINK_REVERSE_BYTES: Final = "prfaas_link_reverse_bytes_total"
"""Model bytes the link emulator carried the other way (decode side to prefill side: requests, acks)."""
METRIC_LINK_ACTIVE_TRANSFERS: Final = "prfaas_link_active_transfers"
METRIC_LINK_CAPACITY_GBPS: Final = "prfaas_link_capacity_gbps"
METRIC_LINK_RTT_SECONDS: Final = "prfaas_link_rtt_seconds"
METRIC_LINK_CONNECTIONS: Final = "prfaas_link_connections_total"
METRIC_LINK_DROPPED: Final = "prfaas_link_dropped_connections_total"
METRIC_ENGINE_KV_BYTES_SENT: Final = "prfaas_engine_kv_bytes_sent_total"
"""KV bytes (model bytes, ``S_kv(l)``) an engine served to decode engines that pulled them."""
METRIC_ENGINE_KV_BYTES_RECEIVED: Final = "prfaas_engine_kv_bytes_received_total"
"""KV bytes (model bytes) an engine pulled from prefill engines."""
METRIC_ENGINE_KV_HANDLES: Final = "prfaas_engine_kv_handles"
"""KV caches an engine holds for decodes that have not pulled them yet."""
METRIC_ENGINE_KV_EXPIRED: Final = "prfaas_engine_kv_expired_total"
"""KV caches freed because no decode pulled them before the timeout."""
METRIC_ENGINE_INFO: Final = "prfaas_engine_info"
METRIC_ENGINE_DRAINING: Final = "prfaas_engine_draining"
METRIC_OPERATOR_DECISIONS: Final = "prfaas_operator_decisions_total"
METRIC_OPERATOR_RECONCILE_SECONDS: Final = "prfaas_operator_reconcile_duration_seconds"
METRIC_OPERATOR_PROMETHEUS_ERRORS: Final = "prfaas_operator_prometheus_errors_total"
METRIC_OPERATOR_API_RETRIES: Final = "prfaas_operator_api_retries_total"
METRIC_OPERATOR_LEADER: Final = "prfaas_operator_leader"
METRIC_OPERATOR_CYCLE_SECONDS: Final = "prfaas_operator_cycle_duration_seconds"
METRIC_OPERATOR_PROMETHEUS_QUERIES: Final = "prfaas_operator_prometheus_queries_total"
METRIC_OPERATOR_ROLE_INSTANCES: Final = "prfaas_operator_role_instances"
METRIC_OPERATOR_RESYNCS: Final = "prfaas_operator_resyncs_total"
"""Periodic full re-lists of the served objects, by ``result``."""
METRIC_OPERATOR_RESYNC_REPAIRS: Final = "prfaas_operator_resync_repairs_total"
"""Cache entries a re-list repaired (a watch event the operator missed), by ``kind`` and ``action``."""

# --- Metric names: vLLM's, which the engines (and our emulator) export -----------------------------------
VLLM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
VLLM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
VLLM_TTFT_SECONDS: Final = "vllm:time_to_first_token_seconds"
VLLM_INTER_TOKEN_LATENCY_SECONDS: Final = "vllm:inter_token_latency_seconds"
"""vLLM's histogram of the time between consecutive output tokens (s), one observation per token after the first
(vLLM 0.32; it replaced ``vllm:time_per_output_token_seconds``, deprecated in 0.11 and gone by 0.13)."""
VLLM_REQUEST_TPOT_SECONDS: Final = "vllm:request_time_per_output_token_seconds"
"""vLLM's histogram of each finished request's mean time per output token (s; decode time / (output tokens - 1))."""
VLLM_QUEUE_TIME_SECONDS: Final = "vllm:request_queue_time_seconds"
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
VLLM_E2E_LATENCY_SECONDS: Final = "vllm:e2e_request_latency_seconds"
VLLM_REQUEST_SUCCESS: Final = "vllm:request_success_total"
VLLM_PROMPT_TOKENS_BY_SOURCE: Final = "vllm:prompt_tokens_by_source_total"
"""Prompt tokens by ``source``: ``local_compute`` (prefilled here), ``local_cache_hit`` (this engine's prefix cache),
``external_kv_transfer`` (pulled from a prefill engine by the KV connector) — the ground truth for "the decode side
did not recompute"."""
PROMPT_SOURCES: Final = ("local_compute", "local_cache_hit", "external_kv_transfer")
VLLM_NIXL_BYTES_TRANSFERRED: Final = "vllm:nixl_bytes_transferred"
"""vLLM's NixlConnector histogram of bytes per KV transfer, on the side that pulls (the decode engine); whole
blocks, so a prompt of ``l`` tokens moves ``ceil(l / block) * block`` tokens' KV (checked on vLLM 0.32, CPU)."""

# --- Which component exports each metric (a default query, panel or alert must never need the emulators) ---
Exporter = str
EXPORTERS: Final[dict[str, Exporter]] = {
    **{
        name: "router"
        for name in (
            METRIC_ROUTER_REQUESTS,
            METRIC_ROUTER_ROUTE_DECISIONS,
            METRIC_ROUTER_THRESHOLD_TOKENS,
            METRIC_ROUTER_THRESHOLD_MIN_TOKENS,
            METRIC_ROUTER_TTFT_SECONDS,
            METRIC_ROUTER_BREAKER_OPEN,
            METRIC_ROUTER_E2E_SECONDS,
            METRIC_ROUTER_TPOT_SECONDS,
            METRIC_ROUTER_FALLBACKS,
            METRIC_ROUTER_DECISION_SECONDS,
            METRIC_ROUTER_IN_FLIGHT,
            METRIC_ROUTER_LINK_EGRESS_GBPS,
            METRIC_ROUTER_LINK_CAP_GBPS,
            METRIC_ROUTER_LINK_SCARCE,
            METRIC_ROUTER_REMOTE_BYTES,
            METRIC_ROUTER_TTFT_SLO,
            METRIC_ROUTER_TTFT_SLO_OBJECTIVE,
            METRIC_ROUTER_LINK_WAITS,
            METRIC_ROUTER_LINK_WAIT_SECONDS,
            METRIC_ROUTER_LINK_AVAILABLE_GBPS,
            METRIC_ROUTER_LINK_AVAILABLE_SOURCE,
            METRIC_ROUTER_OPEN_CONNECTIONS,
            METRIC_ROUTER_CONNECTIONS_CLOSED,
            METRIC_ROUTER_CREDENTIAL_RELOADS,
            METRIC_ROUTER_UNCACHED_TOKENS,
            METRIC_ROUTER_BREAKER_TRANSITIONS,
            METRIC_ROUTER_PREFILL_RETRIES,
            METRIC_ROUTER_ENGINE_HEALTHY,
            METRIC_ROUTER_HEALTH_PROBE_FAILURES,
            METRIC_ROUTER_PREFIX_QUERY_TOKENS,
            METRIC_ROUTER_PREFIX_HIT_TOKENS,
            METRIC_ROUTER_ABANDONED_KV,
            METRIC_ROUTER_RELEASED_KV,
            METRIC_ROUTER_READY,
            METRIC_ROUTER_REPLICA_PEERS,
            METRIC_ROUTER_REPLICA_SYNC,
            METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS,
        )
    },
    METRIC_GATEWAY_KV_EGRESS_BYTES: "gateway",
    METRIC_GATEWAY_AUTH_FAILURES: "gateway",
    METRIC_GATEWAY_INSECURE: "gateway",
    METRIC_GATEWAY_ADMISSIONS: "gateway",
    METRIC_GATEWAY_ADMISSION_WAIT_SECONDS: "gateway",
    METRIC_GATEWAY_LANE_REORDERS: "gateway",
    METRIC_GATEWAY_LINK_AVAILABLE_GBPS: "gateway",
    METRIC_GATEWAY_PULLS: "gateway",
    METRIC_GATEWAY_PULL_HOLD_SECONDS: "gateway",
    METRIC_GATEWAY_LINK_SHARE: "gateway",
    METRIC_GATEWAY_LOANS: "gateway",
    **{
        name: "emulator"
        for name in (
            METRIC_LINK_EGRESS_BYTES,
            METRIC_LINK_UTILIZATION,
            METRIC_LINK_SCARCE,
            METRIC_LINK_WIRE_BYTES,
            METRIC_LINK_REVERSE_BYTES,
            METRIC_LINK_ACTIVE_TRANSFERS,
            METRIC_LINK_CAPACITY_GBPS,
            METRIC_LINK_RTT_SECONDS,
            METRIC_LINK_CONNECTIONS,
            METRIC_LINK_DROPPED,
            METRIC_ENGINE_KV_BYTES_SENT,
            METRIC_ENGINE_KV_BYTES_RECEIVED,
            METRIC_ENGINE_KV_HANDLES,
            METRIC_ENGINE_KV_EXPIRED,
            METRIC_ENGINE_INFO,
            METRIC_ENGINE_DRAINING,
        )
    },
    **{
        name: "operator"
        for name in (
            METRIC_OPERATOR_DECISIONS,
            METRIC_OPERATOR_RECONCILE_SECONDS,
            METRIC_OPERATOR_PROMETHEUS_ERRORS,
            METRIC_OPERATOR_API_RETRIES,
            METRIC_OPERATOR_LEADER,
            METRIC_OPERATOR_CYCLE_SECONDS,
            METRIC_OPERATOR_PROMETHEUS_QUERIES,
            METRIC_OPERATOR_ROLE_INSTANCES,
            METRIC_OPERATOR_RESYNCS,
            METRIC_OPERATOR_RESYNC_REPAIRS,
        )
    },
    **{
        name: "vllm"
        for name in (
            VLLM_REQUESTS_RUNNING,
            VLLM_REQUESTS_WAITING,
            VLLM_KV_CACHE_USAGE,
            VLLM_PROMPT_TOKENS,
            VLLM_GENERATION_TOKENS,
            VLLM_TTFT_SECONDS,
            VLLM_INTER_TOKEN_LATENCY_SECONDS,
            VLLM_REQUEST_TPOT_SECONDS,
            VLLM_QUEUE_TIME_SECONDS,
            VLLM_PREFIX_CACHE_QUERIES,
            VLLM_PREFIX_CACHE_HITS,
            VLLM_E2E_LATENCY_SECONDS,
            VLLM_REQUEST_SUCCESS,
            VLLM_PROMPT_TOKENS_BY_SOURCE,
            VLLM_NIXL_BYTES_TRANSFERRED,
        )
    },
}
"""Each metric name and the component that exports it: ``router``, ``gateway`` (the router binary in gateway
mode), ``operator``, ``vllm`` (real engines; our engine emulator speaks them too) or ``emulator`` (only the link and
engine emulators: nothing a real deployment has). Tests assert no default query, panel or alert reads an
``emulator`` series."""

KIB: Final = 1024
MIB: Final = 1024 * 1024
K_TOKENS: Final = 1024
"""The paper's "K" for token counts (Table 5: K = 1024 tokens)."""
GBPS_BITS: Final = 1e9
"""One Gbps is 10^9 bit/s (paper-spec.md §2.1 unit check)."""
NO_THRESHOLD_TOKENS: Final = 1 << 30
"""The threshold ``t`` that offloads nothing (no request is that long): the upper bound on ``t`` when nothing
pins it, the ``t`` of a deployment without a remote cluster, the largest ``t`` a resource may pin."""
