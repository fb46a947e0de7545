"""The router's aiohttp application factory and its background tasks (signals refresh, config reload)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from prfaas_core import names
from prfaas_core.api import RouterConfig

from ..gateway.gateway import Gateway
from ..path.proxy import Proxy
from ..state.config import ConfigWatcher, compile_config, load_config
from ..state.metrics import RouterMetrics, exposition, gauge
from ..state.peers import NO_PEERS, ReplicaPeers, ReplicaSync
from ..state.runtime import Runtime
from ..state.security import (
    InsecureGatewayError,
    SecurityMetrics,
    TlsReloader,
    TokenAuth,
    auth_middleware,
    read_token,
)
from ..state.signals import Signals, not_ready_reason
from ..state.wire import CLIENT_KEEPALIVE_S, error_body
from .hygiene import Hygiene, start_listener

log = structlog.get_logger("prfaas.router")

RUNTIME = web.AppKey("runtime", Runtime)
PROXY = web.AppKey("proxy", Proxy)
GATEWAY = web.AppKey("gateway", Gateway)
METRICS = web.AppKey("metrics", RouterMetrics)
HYGIENE = web.AppKey("hygiene", Hygiene)
TLS = web.AppKey("tls", TlsReloader)


def check_secure(config: RouterConfig, allow_insecure_gateway: bool) -> None:
    """A gateway without a token serves anyone: refused unless explicitly allowed."""
    tokenless = config.gateway is None or not config.gateway.token_file
    if config.mode == "gateway" and tokenless and not allow_insecure_gateway:
        raise InsecureGatewayError(
            "gateway mode without gateway.tokenFile would serve anyone: set the token file (chart: "
            "gateway.token.secretName, the PrefillCluster's endpoint.tokenSecretRef) or pass "
            "--allow-insecure-gateway (chart: security.allowInsecureGateway=true)"
        )


WATCHER = web.AppKey("watcher", ConfigWatcher)
WORKERS_GATEWAY = (
    "a gateway (mode: gateway) runs as one process: its link admission is one process's state (run gateway replicas, "
    "which lend each other their link share, instead of --workers)"
)


def create_app(
    config: RouterConfig,
    config_path: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    settings_path: Path | None = None,
    http_limits: httpx.Limits | None = None,
    allow_insecure_gateway: bool = False,
    models: frozenset[str] | None = None,
    peers: ReplicaPeers = NO_PEERS,
) -> web.Application:
    """A router (or gateway) app over ``config``; with ``config_path`` the file is watched and reloaded.
    Gateway mode without a token raises :class:`InsecureGatewayError` unless ``allow_insecure_gateway``.
    ``models``: the model names requests may name (others get OpenAI's 404); None accepts any. ``peers``: the other
    router replicas in front of the same PD cluster, which share their PD prefill books, and their shared token
    (:mod:`.replica_sync`; router mode only; raises ValueError when the token file is unreadable or empty, or peers
    are given without it)."""
    check_secure(config, allow_insecure_gateway)
    runtime = Runtime(compile_config(config), clock)
    metrics = RouterMetrics()
    http = httpx.AsyncClient(
        limits=http_limits
        or httpx.Limits(max_connections=4096, max_keepalive_connections=512, keepalive_expiry=CLIENT_KEEPALIVE_S),
        timeout=httpx.Timeout(60.0, connect=config.timeouts.connect_seconds),
    )
    proxy = Proxy(runtime, http, metrics)
    proxy.models = models
    security = SecurityMetrics(metrics.registry)
    sec = config.security
    auth = TokenAuth(config.gateway.token_file if config.gateway else None, security, sec.token_overlap_seconds, clock)
    gateway = Gateway(runtime, http, metrics, token=lambda: auth.token)
    gateway_mode = config.mode == "gateway"
    if gateway_mode:
        metrics.drop_router_series()
    else:  # a router is no gateway: its gauge would tell the alerts a gateway runs in the router's namespace
        metrics.registry.unregister(security.insecure)
    hygiene = Hygiene(sec, metrics.registry, authenticating=gateway_mode and auth.token is not None)
    middlewares = [hygiene.middleware()]
    if gateway_mode:
        middlewares.insert(0, auth_middleware(auth, security, hygiene.authenticated))
        if auth.token is None:
            security.insecure.set(1)
            log.warning("gateway serving WITHOUT a token (--allow-insecure-gateway): anyone may call it")
    app = web.Application(client_max_size=config.limits.max_body_bytes, middlewares=middlewares)
    app[RUNTIME], app[PROXY], app[GATEWAY], app[METRICS] = runtime, proxy, gateway, metrics
    app[HYGIENE] = hygiene
    replicas = ReplicaSync(runtime, metrics, peers, security) if not gateway_mode else None
    if replicas is not None and not replicas.enabled:
        replicas = None  # no peers: the books path is not served at all
    tls = _tls_reloader(config, security)
    if tls is not None:
        app[TLS] = tls
    signals = Signals(runtime, http, metrics, aborts=(proxy.aborts, gateway.aborts))
    watcher = ConfigWatcher(config_path, settings_path) if config_path else None
    if watcher is not None:
        watcher.poll()  # record the current digest
        if watcher.rejected is None:
            watcher.applied = watcher.digest
        app[WATCHER] = watcher

    async def background(app: web.Application) -> AsyncIterator[None]:
        proxy.open()
        await proxy.sync_remotes()
        stop = asyncio.Event()

        async def refresher() -> None:
            while not stop.is_set():
                try:
                    await signals.refresh(proxy.remote_clients)
                except Exception:  # a failed refresh keeps the previous snapshot; never kill the loop
                    log.exception("signals refresh failed")
                if watcher is not None:
                    new = watcher.poll()
                    if new is not None:
                        try:
                            check_secure(new, allow_insecure_gateway)
                            runtime.reconfigure(compile_config(new))
                            if gateway_mode:
                                gateway.reload_secrets()
                            await proxy.sync_remotes()
                            if new.gateway is not None and new.gateway.token_file:
                                auth.set_path(new.gateway.token_file)
                            auth.overlap_s = new.security.token_overlap_seconds
                            if gateway_mode:
                                security.insecure.set(0 if auth.token else 1)
                                hygiene.budget.authenticating = auth.token is not None
                            hygiene.configure(new.security)
                            watcher.applied, watcher.rejected = watcher.digest, None
                            log.info("configuration reloaded", path=str(config_path), endpoints=len(new.endpoints))
                        except (ValueError, OSError) as exc:
                            watcher.rejected = str(exc)
                            log.error("configuration rejected; keeping the previous one", error=str(exc))
                    elif watcher.last_error:
                        log.error("configuration file invalid; keeping the previous one", error=watcher.last_error)
                        watcher.last_error = None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), runtime.compiled.config.routing.refresh_interval_seconds)

        async def credentials() -> None:
            """Token, certificate and key files (kubelet rewrites mounted Secrets in place)."""
            while not stop.is_set():
                try:
                    auth.poll()
                    if tls is not None:
                        tls.poll()
                    proxy.refresh_tokens()
                except Exception:  # a failed poll keeps the last good credentials; never kill the loop
                    log.exception("credential poll failed")
                with contextlib.suppress(asyncio.TimeoutError):
                    poll = runtime.compiled.config.security.credential_poll_seconds
                    await asyncio.wait_for(stop.wait(), poll)

        task = asyncio.create_task(refresher())
        creds = asyncio.create_task(credentials())
        sync = asyncio.create_task(replicas.run(stop)) if replicas is not None else None
        yield
        stop.set()
        await task
        await signals.close()
        await creds
        if sync is not None:
            await sync
        if replicas is not None:
            await replicas.aclose()
        await proxy.shutdown()
        await gateway.aclose()
        await http.aclose()

    app.cleanup_ctx.append(background)
    handler = gateway.prefill if gateway_mode else proxy.completions
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/status", gateway.status)
    if gateway_mode:
        app.router.add_post(names.PULL_DONE_PATH, gateway.pull_done)
        app.router.add_post(names.LOANS_PATH, gateway.lend)
        app.router.add_delete(names.LOAN_PATH, gateway.repay)
    if replicas is not None:
        app.router.add_put(names.REPLICA_BOOKS_PATH, replicas.receive)
    return app


async def _models(request: web.Request) -> web.Response:
    name = request.app[RUNTIME].compiled.config.model.served_model_name or "prfaas"
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "prfaas"}]})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    watcher = request.app.get(WATCHER)
    # the digest of the configuration file in force (sha256 of its bytes, NUL, the settings file's bytes):
    # a writer of the file can wait until the router has applied what it wrote — also while the router is not
    # ready, which is when the long-term loop's emergency flip publishes its drain. A file rejected on reload
    # leaves the previous digest, and says why in config_error (the previous configuration stays in force)
    digest = watcher.applied if watcher is not None else None
    rejected = {"config_error": watcher.rejected} if watcher is not None and watcher.rejected else {}
    why = not_ready_reason(rt)
    healthy = [n for n, load in rt.snapshot.engines.items() if load.healthy]
    if why is not None or not healthy:
        message = f"not ready: {why}" if why is not None else "no healthy engine behind the router yet"
        return web.json_response(
            {**error_body(503, message, "service_unavailable"), "config_digest": digest, **rejected}, status=503
        )
    # each remote PrFaaS cluster as the router sees it now: "ready", why not, or "unknown" before its first poll
    snap = rt.snapshot
    remotes = {
        r.name: (snap.remote_ready[r.name] or "ready") if r.name in snap.remote_ready else "unknown"
        for r in rt.compiled.remotes
    }
    # each remote whose gateway books the link in its calendar (its status lists the link in scheduledLinks):
    # there the router's own ledger only pre-filters (long requests go to the gateway, which decides)
    calendar = {r.name: snap.remote_scheduled.get(r.name, False) for r in rt.compiled.remotes}
    return web.json_response(
        {
            "status": "ready",
            "healthy_engines": len(healthy),
            "config_digest": digest,
            "remotes": remotes,
            "link_calendar": calendar,
            **rejected,
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    data = exposition(request.app[METRICS].registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _tls_reloader(config: RouterConfig, security: SecurityMetrics) -> TlsReloader | None:
    gw = config.gateway
    if gw is None or not gw.tls_cert_file:
        return None
    return TlsReloader(gw.tls_cert_file, gw.tls_key_file or gw.tls_cert_file, security)


def server_ssl_context(app: web.Application) -> ssl.SSLContext | None:
    """The app's listening TLS context (reloaded in place when the certificate or key changes)."""
    tls = app.get(TLS)
    return tls.context if tls is not None else None


def run(
    config_path: Path,
    host: str,
    port: int,
    settings_path: Path | None = None,
    allow_insecure_gateway: bool = False,
    models: frozenset[str] | None = None,
    peers: ReplicaPeers = NO_PEERS,
    wait_for_config: bool = False,
    worker_port: int | None = None,
) -> None:
    """Serve until interrupted, on uvloop when it is installed (it roughly doubles what one core proxies).
    ``worker_port``: this process is one of several workers sharing ``port`` (:func:`serve`)."""
    main = serve(
        config_path, host, port, settings_path, allow_insecure_gateway, models, peers, wait_for_config, worker_port
    )
    try:
        import uvloop
    except ImportError:  # optional speedup
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


async def serve(
    config_path: Path,
    host: str,
    port: int,
    settings_path: Path | None = None,
    allow_insecure_gateway: bool = False,
    models: frozenset[str] | None = None,
    peers: ReplicaPeers = NO_PEERS,
    wait_for_config: bool = False,
    worker_port: int | None = None,
) -> None:
    """Run until cancelled (the CLI's ``prfaas router``); with ``wait_for_config``, first :func:`await_config`.
    ``worker_port``: one of ``prfaas router --workers N``'s processes, which share ``port`` (SO_REUSEPORT) and each
    serve on 127.0.0.1:``worker_port`` too, where their siblings send their books."""
    shared = worker_port is not None
    if wait_for_config:
        config = await await_config(config_path, settings_path, allow_insecure_gateway, host, port, shared=shared)
    else:
        config, _ = load_config(config_path, settings_path)
    if shared and config.mode == "gateway":
        raise ValueError(WORKERS_GATEWAY)
    app = create_app(
        config,
        config_path,
        settings_path=settings_path,
        allow_insecure_gateway=allow_insecure_gateway,
        models=models,
        peers=peers,
    )
    runner, _ = await start_listener(app, app[HYGIENE], host, port, server_ssl_context(app), shared, worker_port)
    gc.freeze()  # what startup allocated (config, profiles, modules) stays out of every later collection
    log.info("router listening", host=host, port=port, mode=config.mode, config=str(config_path))
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


# --- Waiting for the configuration: a router or gateway started before the operator wrote its ConfigMap (an
# optional volume: the file is absent until then), or over an invalid one, serves no answers from a guess. It
# answers /health 200 (alive: no restart, no kubelet backoff delaying it later), /ready and every other path 503
# with the reason, /metrics prfaas_router_ready 0, and starts serving once a usable file appears.

CONFIG_WAIT_POLL_S = 1.0


def usable_config(
    config_path: Path, settings_path: Path | None, allow_insecure_gateway: bool
) -> tuple[RouterConfig | None, str]:
    """The configuration when the router can start on it, else None and why not (one line): the file's
    parse and validation, the gateway's security (:func:`check_secure`, its token file) and compilation."""
    try:
        config, _ = load_config(config_path, settings_path)
        check_secure(config, allow_insecure_gateway)
        token = config.gateway.token_file if config.mode == "gateway" and config.gateway else None
        if token and read_token(token) is None:
            raise ValueError(f"gateway.tokenFile {token}: unreadable or empty (a bearer token, one line)")
        compile_config(config)
    except (ValueError, OSError) as exc:  # ConfigError and InsecureGatewayError are ValueErrors
        return None, " ".join(str(exc).split())
    return config, ""


async def await_config(
    config_path: Path,
    settings_path: Path | None,
    allow_insecure_gateway: bool,
    host: str,
    port: int,
    poll_s: float = CONFIG_WAIT_POLL_S,
    shared: bool = False,
) -> RouterConfig:
    """The first usable configuration (:func:`usable_config`, polled every ``poll_s``); until then a listener on
    ``host:port`` answers as the section above says, in plain HTTP (the TLS files are named by the config)."""
    config, why = usable_config(config_path, settings_path, allow_insecure_gateway)
    if config is not None:
        return config
    registry = CollectorRegistry()
    gauge(names.METRIC_ROUTER_READY, "1 while the router can serve.", registry=registry, mode="livemin").set(0)
    reason = [why]

    async def waiting(request: web.Request) -> web.Response:
        if request.path == "/health":
            return web.json_response({"status": "ok", "config": "waiting"})
        if request.path == "/metrics":
            return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
        message = f"not ready: no usable configuration yet: {reason[0]}"
        return web.json_response({**error_body(503, message, "service_unavailable"), "config_digest": None}, status=503)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", waiting)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True, reuse_port=shared or None).start()
    log.warning("no usable configuration yet: waiting for it (/ready answers 503)", config=str(config_path), error=why)
    try:
        while config is None:
            await asyncio.sleep(poll_s)
            config, why = usable_config(config_path, settings_path, allow_insecure_gateway)
            if config is None and why != reason[0]:
                log.warning("still no usable configuration", config=str(config_path), error=why)
                reason[0] = why
    finally:
        await runner.cleanup()  # the router's own listener takes the port over
    log.info("configuration found: starting", config=str(config_path), mode=config.mode)
    return config
