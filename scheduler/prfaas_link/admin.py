"""The link's HTTP side: ``GET /metrics``, ``GET /health``, ``GET /admin/state``, ``GET /admin/egress``
(``?since=K``: the relay's own 1-s model windows of delivered model bytes, ``{"windows": {"K": bytes}}``, K =
floor of model time on the machine's monotonic clock), ``POST /admin/link``
(``{"capacity_gbps", "rtt_ms", "loss"}``, any subset: squeeze or cut the link mid-run) and
``POST /admin/faults`` (``{"slow_factor", "error_rate", "drop_mid_stream", "die"}``, any subset)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from .metrics import CONTENT_TYPE
from .relay import Link

LINK_KEY = web.AppKey("link", Link)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        raw = await request.json() if request.body_exists else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the body must be valid JSON")
    if not isinstance(raw, dict):
        return _error(400, "the body must be a JSON object")
    return raw


def create_admin_app(link: Link) -> web.Application:
    app = web.Application()
    app[LINK_KEY] = link

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=link.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=503 if link.dead else 200)

    async def state(request: web.Request) -> web.Response:
        return web.json_response(link.snapshot())

    async def egress(request: web.Request) -> web.Response:
        try:
            first = int(request.query.get("since", "0"))
        except ValueError:
            return _error(400, "since: must be an integer (a model second)")
        windows = link.windows.since(first)
        return web.json_response({"window_model_s": 1, "windows": {str(k): v for k, v in windows.items()}})

    async def reshape(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        try:
            link.reshape(body)
        except ValidationError as exc:
            return _error(
                400, "link: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            )
        return web.json_response(link.snapshot())

    async def faults(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        try:
            link.set_faults(body)
        except ValidationError as exc:
            return _error(
                400, "faults: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            )
        return web.json_response(link.snapshot())

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/admin/state", state)
    app.router.add_get("/admin/egress", egress)
    app.router.add_post("/admin/link", reshape)
    app.router.add_post("/admin/faults", faults)
    return app
