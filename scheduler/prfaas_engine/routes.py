"""HTTP surface of the engine emulator (aiohttp): the OpenAI API as vLLM serves it, /metrics, and /admin.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``; a final usage chunk with
``stream_options.include_usage``), ``POST /v1/completions/render`` and ``/v1/chat/completions/render`` (vLLM's
token rendering, called first by vllm-router 0.1.17), ``GET /v1/models``, ``GET /health`` (200; 503 while
draining), ``GET /ping`` (liveness, always 200), ``GET /version``, ``POST /reset_prefix_cache``,
``GET /metrics``, and the admin API: ``GET /admin/state`` (with the last requests' tracing headers),
``POST /admin/drain`` (``{"drain": bool}``, default true), ``POST /admin/role``
(``{"role": "prefill"|"decode"|"both"}``), ``POST /admin/faults`` (see :mod:`.faults`). There is deliberately
no ``/server_info`` or ``/model_info`` (vLLM has none): sglang-router then registers the worker without a
tokenizer path and never tries to fetch one from a model hub.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from . import openai_api as api
from .batching import DoneEvent, EngineBusy, EngineRequest, Event, FailedEvent, RequestTooLarge, TokenEvent
from .clock import Clock, LoopClock
from .config import ROLES, EngineConfig
from .disagg import ConsumeNixl, ProtocolError, plan_leg
from .engine import Engine
from .metrics import CONTENT_TYPE

ENGINE_KEY = web.AppKey("engine", Engine)
VERSION = "0.11.0+prfaas.emulator"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, message: str) -> web.Response:
    return web.json_response(api.error_body(status, message), status=status)


@web.middleware
async def dead_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """After the ``die`` fault an in-process engine drops every connection without an answer."""
    if request.app[ENGINE_KEY].state.dead:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=503)
    return await handler(request)


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=json.dumps(api.error_body(400, "the request body must be valid JSON")), content_type="application/json"
        ) from None


DISCONNECT_POLL_S = 0.25


async def next_event(request: web.Request, req: EngineRequest) -> Event:
    """The request's next event; ``ConnectionResetError`` once the client has gone away (checked every
    ``DISCONNECT_POLL_S`` while waiting, as vLLM checks ``is_disconnected``), so its slot is freed."""
    while True:
        if not req.events.empty():
            return req.events.get_nowait()
        try:  # a cancelled Queue.get takes no item, so the timeout loses no event
            return await asyncio.wait_for(req.events.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client went away") from None


class Routes:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.details = engine.config.enable_prompt_tokens_details
        self._releases: set[asyncio.Task[None]] = set()

    # --- inference ---------------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, chat=True)

    async def _infer(self, request: web.Request, chat: bool) -> web.StreamResponse:
        eng = self.engine
        raw = await _json(request)
        try:
            body = api.parse_body(api.ChatBody if chat else api.CompletionBody, raw)
            leg = plan_leg(raw, eng.state.role)
            ids = api.prompt_ids(body, eng.tokenizer)
            n = api.max_tokens(body, eng.config.default_max_tokens)
        except (api.BadRequest, ProtocolError) as exc:
            self._release_rejected(raw)
            return error(400, str(exc))
        if eng.state.draining:
            return error(503, f"engine {eng.config.engine_id} is draining: it takes no new requests")
        if eng.faults.inject_error():
            return error(500, "injected fault (error_rate): the engine failed this request")
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        traced = {h: request.headers[h] for h in ("x-request-id", "traceparent", "tracestate") if h in request.headers}
        eng.recent.append({"leg": type(leg).__name__, "request_id": request_id, **traced})
        req = EngineRequest(request_id=request_id, prompt_ids=ids, max_tokens=n, leg=leg, cache_salt=body.cache_salt)
        try:
            eng.core.submit(req)
        except EngineBusy as exc:
            return error(503, str(exc))
        except RequestTooLarge as exc:
            self._release_rejected(raw)
            return error(400, str(exc))
        builder = api.ResponseBuilder(chat, request_id, body.model or eng.config.model_name)
        try:
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                return await self._stream(request, req, builder, include_usage)
            return await self._whole(request, req, builder)
        except ConnectionResetError:  # the client went away mid-stream: abort (below), nothing to answer
            return web.Response(status=499)
        finally:
            if not req.finished:
                eng.core.abort(req)

    def _release_rejected(self, raw: Any) -> None:
        """A decode leg rejected before it was scheduled frees its producer's KV (vLLM 0.32 does this for any
        request carrying ``do_remote_prefill`` params that its serving layer answers with an error)."""
        params = raw.get("kv_transfer_params") if isinstance(raw, dict) else None
        if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
            return
        try:
            leg = plan_leg({"kv_transfer_params": params}, self.engine.state.role)
        except ProtocolError:
            return
        if isinstance(leg, ConsumeNixl):
            task = asyncio.get_running_loop().create_task(self.engine.release_remote(leg))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _whole(self, request: web.Request, req: EngineRequest, builder: api.ResponseBuilder) -> web.Response:
        text = []
        while True:
            event = await next_event(request, req)
            if isinstance(event, TokenEvent):
                text.append(event.text)
            elif isinstance(event, FailedEvent):
                return error(event.status, event.message)
            else:
                use = api.usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens, self.details)
                return web.json_response(
                    builder.full("".join(text), event.finish_reason, use, event.kv_transfer_params)
                )

    async def _stream(
        self, request: web.Request, req: EngineRequest, builder: api.ResponseBuilder, include_usage: bool
    ) -> web.StreamResponse:
        event = await next_event(request, req)
        if isinstance(event, FailedEvent):  # before any byte is sent, a failure is still an HTTP status
            return error(event.status, event.message)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        first = True
        while True:
            if isinstance(event, TokenEvent):
                await resp.write(api.sse(builder.chunk(event.text, first=first)))
                if first and self.engine.faults.drop_stream():
                    self.engine.core.abort(req)
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                first = False
            elif isinstance(event, FailedEvent):
                await resp.write(api.sse(api.error_body(event.status, event.message)))
                break
            elif isinstance(event, DoneEvent):
                final = builder.chunk(None if builder.chat else "", event.finish_reason, first=first)
                if event.kv_transfer_params is not None:
                    final["kv_transfer_params"] = event.kv_transfer_params
                await resp.write(api.sse(final))
                if include_usage:
                    use = api.usage(
                        event.prompt_tokens, event.completion_tokens, event.cached_tokens, self.details, stream=True
                    )
                    await resp.write(api.sse(builder.usage_chunk(use)))
                break
            event = await next_event(request, req)
        await resp.write(api.sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def render(self, request: web.Request) -> web.Response:
        chat = request.path.startswith("/v1/chat/")
        raw = await _json(request)
        try:
            body = api.parse_body(api.ChatBody if chat else api.CompletionBody, raw)
            ids = api.prompt_ids(body, self.engine.tokenizer)
            n = api.max_tokens(body, self.engine.config.default_max_tokens)
        except api.BadRequest as exc:
            return error(400, str(exc))
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        return web.json_response(api.render_response(body, ids, request_id, self.engine.config.model_name, n))

    # --- discovery, health, metrics ----------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        cfg = self.engine.config
        model = {
            "id": cfg.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "prfaas",
            "root": cfg.model_name,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def health(self, request: web.Request) -> web.Response:
        if self.engine.state.draining:
            return web.json_response({"status": "draining"}, status=503)
        return web.Response(status=200)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.core.prefix_cache.clear()
        return web.Response(status=200)

    # --- admin -------------------------------------------------------------------------------------------
    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.snapshot())

    async def _admin_body(self, request: web.Request) -> dict[str, Any]:
        if not request.body_exists:
            return {}
        raw = await _json(request)
        if not isinstance(raw, dict):
            raise web.HTTPBadRequest(
                text=json.dumps(api.error_body(400, "the body must be a JSON object")), content_type="application/json"
            )
        return raw

    async def drain(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        drain = body.get("drain", True)
        if not isinstance(drain, bool) or set(body) - {"drain"}:
            return error(400, 'expected {"drain": true|false}')
        self.engine.set_draining(drain)
        return web.json_response(self.engine.snapshot())

    async def role(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        role = body.get("role")
        if role not in ROLES or set(body) - {"role"}:
            return error(400, f'expected {{"role": one of {", ".join(ROLES)}}}, got {body!r}')
        self.engine.set_role(role)
        return web.json_response(self.engine.snapshot())

    async def faults(self, request: web.Request) -> web.Response:
        body = await self._admin_body(request)
        try:
            settings = self.engine.faults.update(body)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            return error(400, f"faults: {problems}")
        if settings.die:
            asyncio.get_running_loop().call_soon(self.engine.die)
        return web.json_response(self.engine.snapshot())


def create_app(
    config: EngineConfig, clock: Clock | None = None, on_die: Callable[[], None] | None = None
) -> web.Application:
    """An engine emulator as an aiohttp application; its engine starts and stops with the app."""
    engine = Engine(config, clock or LoopClock(), on_die)
    app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[dead_middleware])
    app[ENGINE_KEY] = engine
    r = Routes(engine)
    app.router.add_post("/v1/completions", r.completions)
    app.router.add_post("/v1/chat/completions", r.chat)
    app.router.add_post("/v1/completions/render", r.render)
    app.router.add_post("/v1/chat/completions/render", r.render)
    app.router.add_get("/v1/models", r.models)
    app.router.add_get("/health", r.health)
    app.router.add_get("/ping", r.ping)
    app.router.add_get("/version", r.version)
    app.router.add_get("/metrics", r.metrics)
    app.router.add_post("/reset_prefix_cache", r.reset_prefix_cache)
    app.router.add_get("/admin/state", r.state)
    app.router.add_post("/admin/drain", r.drain)
    app.router.add_post("/admin/role", r.role)
    app.router.add_post("/admin/faults", r.faults)

    async def start(_: web.Application) -> None:
        await engine.start()

    async def stop(_: web.Application) -> None:
        await engine.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
