"""Run an engine emulator as a process (``prfaas engine``): serve until SIGTERM/SIGINT.

On start it prints one JSON line ``{"event": "ready", "url": ..., "kv_listen": ..., "kv_advertise": ...,
"engine_id": ..., "role": ...}`` to stdout, so a supervisor that asked for port 0 learns the real ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys

from aiohttp import web

from .config import EngineConfig
from .routes import ENGINE_KEY, create_app


def _die() -> None:
    sys.stdout.flush()
    os._exit(137)


async def serve(config: EngineConfig) -> None:
    app = create_app(config, on_die=_die)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=1024)
    await site.start()
    engine = app[ENGINE_KEY]
    port = config.port
    if runner.addresses:
        port = int(runner.addresses[0][1])
    ready = {
        "event": "ready",
        "url": f"http://{config.host}:{port}",
        "kv_listen": str(engine.kv_listen),
        "kv_advertise": str(engine.kv_advertise),
        "engine_id": config.engine_id,
        "role": engine.state.role,
    }
    print(json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
