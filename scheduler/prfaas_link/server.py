"""Run the link emulator as a process (``prfaas link``): the relay plus its HTTP admin/metrics server.

Prints one JSON line ``{"event": "ready", "listen": ..., "target": ..., "admin": ...}`` once listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys

from aiohttp import web

from .admin import create_admin_app
from .config import LinkConfig
from .relay import Link


def _die() -> None:
    sys.stdout.flush()
    os._exit(137)


async def serve(config: LinkConfig) -> None:
    link = Link(config, on_die=_die)
    listen = await link.start()
    runner: web.AppRunner | None = None
    admin = None
    if config.admin is not None:
        runner = web.AppRunner(create_admin_app(link), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, config.admin.host, config.admin.port)
        await site.start()
        port = int(runner.addresses[0][1]) if runner.addresses else config.admin.port
        admin = f"http://{config.admin.host}:{port}"
    print(
        json.dumps({"event": "ready", "listen": str(listen), "target": str(config.target), "admin": admin}), flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()
        await link.close()
