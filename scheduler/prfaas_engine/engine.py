"""One emulated instance assembled from its config: scheduler, prefix cache, KV store and server, metrics,
faults and its runtime state (role, draining). Built by :func:`~prfaas_engine.routes.create_app`."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prfaas_core.request.tokens import Tokenizer, build_tokenizer

from .batching import EngineCore, EngineRequest
from .clock import Clock
from .config import EngineConfig, HostPort, Role
from .disagg import ConsumeBootstrap, ConsumeNixl
from .faults import FaultInjector
from .kv_transfer import HeldKv, KvServer, KvStore, KvTransferError, nixl_done, nixl_request, pull_kv, room_request
from .metrics import EngineMetrics


@dataclass
class EngineState:
    role: Role
    draining: bool = False
    dead: bool = False


RECENT_REQUESTS = 64
"""Requests whose tracing headers (``x-request-id``, ``traceparent``, ``tracestate``) ``/admin/state`` lists."""


class Engine:
    def __init__(self, config: EngineConfig, clock: Clock, on_die: Callable[[], None] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.state = EngineState(role=config.role)
        self.tokenizer: Tokenizer = build_tokenizer(config.tokenizer)
        self.metrics = EngineMetrics(config.model_name)
        self.faults = FaultInjector(config.seed)
        self.store = KvStore(config.engine_id, clock, config.kv_timeout_s, on_expired=self._expired)
        self.kv_server = KvServer(
            self.store, self._sent, room_wait_s=config.bootstrap_wait_s, on_released=self._released
        )
        self.core = EngineCore(config, clock, self.metrics, self.store, self.faults, self._kv_params, self._load_kv)
        self.kv_listen: HostPort | None = None
        self.kv_advertise: HostPort | None = None
        self.on_die = on_die
        self._tasks: list[asyncio.Task[None]] = []
        self.recent: deque[dict[str, str]] = deque(maxlen=RECENT_REQUESTS)
        """The last requests' tracing headers, as ``/admin/state`` shows them (what reached this engine)."""
        self.metrics.set_info(self.state.role, config.hardware_profile.accelerator, config.engine_id)

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        listen = self.config.kv_listen or HostPort(self.config.host, 0)
        self.kv_listen = await self.kv_server.start(listen)
        self.kv_advertise = self.config.kv_advertise or self.kv_listen
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.core.run()),
            loop.create_task(self.core.sweep_forever(min(1.0, self.config.kv_timeout_s / 4))),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.core.close()
        await self.kv_server.close()

    def die(self) -> None:
        """The ``die`` fault: stop answering at once."""
        self.state.dead = True
        if self.on_die is not None:
            self.on_die()
            return
        for task in self._tasks:
            task.cancel()
        asyncio.get_running_loop().create_task(self.kv_server.close())

    # --- KV hooks ----------------------------------------------------------------------------------------
    def _kv_params(self, req: EngineRequest) -> dict[str, Any]:
        adv = self.kv_advertise
        assert adv is not None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.config.engine_id,
            "remote_block_ids": list(req.block_ids),
            "remote_host": adv.host,
            "remote_port": adv.port,
            "tp_size": 1,
            # the rest of what vLLM 0.32's NixlConnector answers (seen on real engines); decode legs echo it back
            "dcp_size": 1,
            "pp_size": 1,
            "remote_request_id": req.request_id,
            "remote_num_tokens": req.prompt_tokens,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": req.cached_tokens,
        }

    async def _load_kv(self, req: EngineRequest) -> None:
        leg = req.leg
        if isinstance(leg, ConsumeNixl):  # the leading blocks its prefix cache holds are not pulled
            request = nixl_request(leg.engine_id, leg.block_ids, req.cached_tokens // self.config.block_tokens)
        elif isinstance(leg, ConsumeBootstrap):
            request = room_request(leg.room)
        else:
            raise AssertionError(f"not a consume leg: {leg!r}")
        timeout_s = self.config.kv_timeout_s + self.config.bootstrap_wait_s
        received = await pull_kv(leg.host, leg.port, request, timeout_s)
        self.metrics.kv_received.inc(self.config.scale.model_bytes(received))
        self.metrics.nixl_bytes_l.observe(self.config.scale.model_bytes(received))

    def _sent(self, held: HeldKv, nbytes: int) -> None:
        self.metrics.kv_sent.inc(self.config.scale.model_bytes(nbytes))
        self.metrics.kv_handles.set(len(self.store))

    def _released(self, held: HeldKv) -> None:
        self.metrics.kv_handles.set(len(self.store))

    async def release_remote(self, leg: ConsumeNixl) -> None:
        """Tell a producer to free the KV of a decode leg this engine rejected before scheduling it (vLLM 0.32:
        the serving layer's ``notify_kv_transfer_request_rejected``, a notification-only read). Best effort:
        a producer that cannot be reached frees it at its timeout."""
        timeout_s = self.config.bootstrap_wait_s
        with contextlib.suppress(KvTransferError):
            await pull_kv(leg.host, leg.port, nixl_done(leg.engine_id, leg.block_ids), timeout_s)

    def _expired(self, held: HeldKv) -> None:
        self.metrics.kv_expired.inc()
        self.metrics.kv_handles.set(len(self.store))

    # --- runtime control ---------------------------------------------------------------------------------
    def set_role(self, role: Role) -> None:
        self.state.role = role
        self.metrics.set_info(role, self.config.hardware_profile.accelerator, self.config.engine_id)

    def set_draining(self, draining: bool) -> None:
        self.state.draining = draining
        self.metrics.draining.set(1 if draining else 0)

    def snapshot(self) -> dict[str, Any]:
        core = self.core
        return {
            "engine_id": self.config.engine_id,
            "role": self.state.role,
            "hardware": self.config.hardware_profile.accelerator,
            "model": self.config.model_name,
            "model_profile": self.config.model_profile,
            "draining": self.state.draining,
            "drained": self.state.draining and core.in_flight == 0,
            "running": len(core.running),
            "waiting": len(core.waiting),
            "loading_kv": len(core.loading),
            "kv_handles": len(self.store),
            "kv_cache_usage": core.used_blocks / self.config.kv_cache_blocks,
            "prefix_cache_blocks": len(core.prefix_cache),
            "kv_listen": str(self.kv_listen) if self.kv_listen else None,
            "kv_advertise": str(self.kv_advertise) if self.kv_advertise else None,
            "max_batch": self.config.batch_limit,
            "scale": {"time_scale": self.config.scale.time_scale, "byte_scale": self.config.scale.byte_scale},
            "faults": self.faults.settings.model_dump(),
            "steps": core.steps,
            "recent_requests": list(self.recent),
        }
