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
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prfaas_core.api import RouterConfig

from .config import ConfigWatcher, load_config
from .gateway import Gateway
from .http_util import json_error
from .metrics import RouterMetrics
from .proxy import Proxy
from .runtime import Runtime, compile_config
from .signals import Signals

log = structlog.get_logger("prfaas.router")

RUNTIME = web.AppKey("runtime", Runtime)
PROXY = web.AppKey("proxy", Proxy)
GATEWAY = web.AppKey("gateway", Gateway)
METRICS = web.AppKey("metrics", RouterMetrics)


def create_app(
    config: RouterConfig,
    config_path: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    settings_path: Path | None = None,
    http_limits: httpx.Limits | None = None,
) -> web.Application:
    """A router (or gateway) app over ``config``; with ``config_path`` the file is watched and reloaded."""
    runtime = Runtime(compile_config(config), clock)
    metrics = RouterMetrics()
    http = httpx.AsyncClient(
        limits=http_limits or httpx.Limits(max_connections=4096, max_keepalive_connections=512),
        timeout=httpx.Timeout(60.0, connect=config.timeouts.connect_seconds),
    )
    proxy = Proxy(runtime, http, metrics)
    gateway = Gateway(runtime, http, metrics)
    app = web.Application(client_max_size=config.limits.max_body_bytes)
    app[RUNTIME], app[PROXY], app[GATEWAY], app[METRICS] = runtime, proxy, gateway, metrics
    signals = Signals(runtime, http, metrics)
    watcher = ConfigWatcher(config_path, settings_path) if config_path else None
    if watcher is not None:
        watcher.poll()  # record the current digest

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
                            runtime.reconfigure(compile_config(new))
                            await proxy.sync_remotes()
                            gateway.reload_secrets()
                            log.info("configuration reloaded", path=str(config_path), endpoints=len(new.endpoints))
                        except (ValueError, OSError) as exc:
                            log.error("configuration rejected; keeping the previous one", error=str(exc))
                    elif watcher.last_error:
                        log.error("configuration file invalid; keeping the previous one", error=watcher.last_error)
                        watcher.last_error = None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), runtime.compiled.config.routing.refresh_interval_seconds)

        task = asyncio.create_task(refresher())
        yield
        stop.set()
        await task
        await proxy.shutdown()
        await http.aclose()

    app.cleanup_ctx.append(background)
    gateway_mode = config.mode == "gateway"
    handler = gateway.prefill if gateway_mode else proxy.completions
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/status", gateway.status)
    return app


async def _models(request: web.Request) -> web.Response:
    name = request.app[RUNTIME].compiled.config.model.served_model_name or "prfaas"
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "prfaas"}]})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    healthy = [n for n, load in rt.snapshot.engines.items() if load.healthy]
    if not healthy:
        return json_error(503, "no healthy engine behind the router yet", "service_unavailable")
    return web.json_response({"status": "ready", "healthy_engines": len(healthy)})


async def _metrics(request: web.Request) -> web.Response:
    data = generate_latest(request.app[METRICS].registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


def server_ssl_context(config: RouterConfig) -> ssl.SSLContext | None:
    gw = config.gateway
    if gw is None or not gw.tls_cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(gw.tls_cert_file, gw.tls_key_file)
    return ctx


def run(config_path: Path, host: str, port: int, settings_path: Path | None = None) -> None:
    """Serve until interrupted, on uvloop when it is installed (it roughly doubles what one core proxies)."""
    try:
        import uvloop
    except ImportError:  # optional speedup
        asyncio.run(serve(config_path, host, port, settings_path))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(config_path, host, port, settings_path))


async def serve(config_path: Path, host: str, port: int, settings_path: Path | None = None) -> None:
    """Run until cancelled (the CLI's ``prfaas router``)."""
    config, _ = load_config(config_path, settings_path)
    app = create_app(config, config_path, settings_path=settings_path)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=server_ssl_context(config), backlog=4096)
    await site.start()
    gc.freeze()  # what startup allocated (config, profiles, modules) stays out of every later collection
    log.info("router listening", host=host, port=port, mode=config.mode, config=str(config_path))
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
