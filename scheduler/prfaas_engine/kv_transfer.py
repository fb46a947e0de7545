"""KV transfer between engines over TCP: a store of KV held for remote decodes, the server that streams it,
and the client a decode engine pulls with.

One TCP server per engine serves both protocols' handles (the vLLM NIXL side channel and the SGLang bootstrap
port). Wire protocol (one pull per connection)::

    client → server   PULL nixl <engine_id> <block_id>,<block_id>,... [<skip>]\\n   |   PULL room <room>\\n
    server → client   OK <nbytes>\\n  followed by exactly nbytes bytes     |   ERR <http-status> <message>\\n
    client → server   DONE nixl <engine_id> <block_id>,...\\n   →   OK 0\\n (the handle is freed, nothing moves)

The payload is ``S_kv(l)·byte_scale`` real bytes (``ScaleSettings.wire_bytes``) of the whole blocks held, less the
first ``skip`` blocks (the decode's prefix cache holds them: vLLM reads only the blocks it lacks). A handle is freed
once its bytes are fully sent; a broken transfer leaves it held, so the decode may retry; a handle never pulled is
freed ``kv_timeout_s`` after it was produced (older vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT; vLLM 0.32 leases them
for ``kv_lease_duration``, 30 s, renewed by a waiting decode's heartbeats).
``DONE`` is vLLM 0.32's notification-only read: a decode engine that rejects a request carrying a KV handle (its
serving layer answered an error before scheduling it) tells the producer to free the blocks, moving none.
Pulling an unknown, already-pulled or expired handle is an error (404), never a silent success.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .clock import Clock
from .config import HostPort

PAYLOAD_CHUNK = bytes(256 * 1024)
HEADER_LIMIT = 1 << 20


class KvTransferError(Exception):
    """A failed pull; ``status`` is the HTTP status the decode request answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class HeldKv:
    key: str
    wire_bytes: int
    model_bytes: float
    expires_at: float
    release: Callable[[], None]
    block_ids: tuple[int, ...] = ()
    skipped_wire_bytes: Callable[[int], int] | None = None
    """The wire bytes a pull moves when the decode holds the leading ``skip`` blocks already (None: that share of
    ``wire_bytes`` less)."""

    def pull_bytes(self, skip: int) -> int:
        if skip <= 0:
            return self.wire_bytes
        if self.skipped_wire_bytes is not None:
            return min(self.wire_bytes, self.skipped_wire_bytes(skip))
        n_blocks = max(1, len(self.block_ids))
        return self.wire_bytes - self.wire_bytes * skip // n_blocks


@dataclass
class KvStore:
    """KV caches held for remote decodes, by key; ``sweep`` frees the expired ones."""

    engine_id: str
    clock: Clock
    timeout_s: float
    on_expired: Callable[[HeldKv], None] = lambda held: None
    _held: dict[str, HeldKv] = field(default_factory=dict)
    _waiters: dict[str, list[asyncio.Future[None]]] = field(default_factory=dict)

    @staticmethod
    def nixl_key(block_ids: tuple[int, ...]) -> str:
        return f"nixl:{block_ids[0]}"

    @staticmethod
    def room_key(room: int) -> str:
        return f"room:{room}"

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, held: HeldKv) -> None:
        """Hold KV for a remote decode; wakes a decode already waiting for it (SGLang rooms)."""
        if held.key in self._held:
            raise KvTransferError(409, f"KV handle {held.key} is already held (duplicate bootstrap_room?)")
        self._held[held.key] = held
        for waiter in self._waiters.pop(held.key, []):
            if not waiter.done():
                waiter.set_result(None)

    def put_back(self, held: HeldKv) -> None:
        """Hold again after a broken transfer (same expiry), unless it expired meanwhile."""
        if self.clock.now() < held.expires_at and held.key not in self._held:
            self._held[held.key] = held
        else:
            held.release()
            self.on_expired(held)

    async def take(self, key: str, wait_s: float) -> HeldKv:
        """Remove and return the handle, waiting up to ``wait_s`` for it to appear (SGLang rooms)."""
        if key not in self._held and wait_s > 0:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(waiter)
            try:
                await asyncio.wait_for(waiter, wait_s)
            except TimeoutError:
                pass
            finally:
                waiters = self._waiters.get(key, [])
                if waiter in waiters:
                    waiters.remove(waiter)
                if not waiters:
                    self._waiters.pop(key, None)
        held = self._held.pop(key, None)
        if held is None:
            raise KvTransferError(404, self._missing(key, waited_s=wait_s))
        return held

    def _missing(self, key: str, waited_s: float) -> str:
        kind, _, ident = key.partition(":")
        what = f"bootstrap room {ident}" if kind == "room" else f"remote_block_ids starting at {ident}"
        waited = f" after waiting {waited_s:g} s" if waited_s > 0 else ""
        return (
            f"no KV held for {what} on engine {self.engine_id}{waited}: never produced here, already pulled, "
            f"or expired ({self.timeout_s:g} s after its prefill)"
        )

    def sweep(self) -> int:
        """Free every handle past its expiry; returns how many."""
        now = self.clock.now()
        expired = [h for h in self._held.values() if h.expires_at <= now]
        for held in expired:
            del self._held[held.key]
            held.release()
            self.on_expired(held)
        return len(expired)

    def release_all(self) -> None:
        for held in list(self._held.values()):
            held.release()
        self._held.clear()

    def keys(self) -> list[str]:
        return list(self._held)


def _parse_pull(line: str) -> tuple[str, str, tuple[int, ...], int]:
    """``PULL nixl <engine> <ids> [<skip>]``, ``DONE nixl <engine> <ids>`` or ``PULL room <room>`` → (kind, engine
    or room, block ids, skip); kind ``done`` for a DONE."""
    parts = line.split()
    pull = len(parts) in (4, 5) and parts[:2] == ["PULL", "nixl"]
    if pull or (len(parts) == 4 and parts[:2] == ["DONE", "nixl"]):
        try:
            ids = tuple(int(x) for x in parts[3].split(","))
            skip = int(parts[4]) if len(parts) == 5 else 0
        except ValueError:
            raise KvTransferError(400, "malformed block id list or skip count") from None
        if not 0 <= skip <= len(ids):
            raise KvTransferError(400, f"skip must be in [0, {len(ids)}] (the blocks held), got {skip}")
        return ("nixl" if pull else "done"), parts[2], ids, skip
    if len(parts) == 3 and parts[:2] == ["PULL", "room"] and parts[2].isdigit():
        return "room", parts[2], (), 0
    raise KvTransferError(400, f"malformed KV request {line[:80]!r}")


class KvServer:
    """Streams held KV to decode engines; ``on_sent(held, nbytes)`` is called once a handle is delivered (``nbytes``:
    what was sent, less than ``held.wire_bytes`` when the decode held leading blocks already)."""

    def __init__(
        self,
        store: KvStore,
        on_sent: Callable[[HeldKv, int], None],
        room_wait_s: float,
        on_released: Callable[[HeldKv], None] = lambda held: None,
    ) -> None:
        self.store = store
        self.on_sent = on_sent
        self.on_released = on_released
        """A handle freed by its consumer's DONE (never read)."""
        self.room_wait_s = room_wait_s
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.address: HostPort | None = None

    async def start(self, listen: HostPort) -> HostPort:
        self._server = await asyncio.start_server(self._handle, listen.host, listen.port, limit=HEADER_LIMIT)
        sock = self._server.sockets[0].getsockname()
        self.address = HostPort(listen.host, int(sock[1]))
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Served in a task of its own: close() cancels that, never asyncio's connection handler.
        inner = asyncio.get_running_loop().create_task(self._serve_one(reader, writer))
        self._tasks.add(inner)
        try:
            await inner
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            if not inner.cancelled():
                raise
        finally:
            self._tasks.discard(inner)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode("ascii", errors="replace").strip()
        try:
            kind, ident, block_ids, skip = _parse_pull(line)
            if kind in ("nixl", "done"):
                if ident != self.store.engine_id:
                    raise KvTransferError(
                        404, f"unknown remote_engine_id {ident!r}: this KV server belongs to {self.store.engine_id}"
                    )
                held = await self.store.take(KvStore.nixl_key(block_ids), 0.0)
                if held.block_ids != block_ids:
                    self.store.put_back(held)
                    raise KvTransferError(404, "remote_block_ids do not match the KV held for that request")
            else:
                held = await self.store.take(KvStore.room_key(int(ident)), self.room_wait_s)
        except KvTransferError as exc:
            writer.write(f"ERR {exc.status} {exc.message}\n".encode())
            await writer.drain()
            return
        if kind == "done":  # the consumer will never read it: free it now, move nothing
            held.release()
            self.on_released(held)
            writer.write(b"OK 0\n")
            await writer.drain()
            return
        nbytes = held.pull_bytes(skip)
        try:
            writer.write(f"OK {nbytes}\n".encode())
            remaining = nbytes
            while remaining > 0:
                n = min(remaining, len(PAYLOAD_CHUNK))
                writer.write(PAYLOAD_CHUNK[:n] if n < len(PAYLOAD_CHUNK) else PAYLOAD_CHUNK)
                remaining -= n
                await writer.drain()
        except BaseException:
            self.store.put_back(held)
            raise
        held.release()
        self.on_sent(held, nbytes)


async def pull_kv(host: str, port: int, request: str, timeout_s: float) -> int:
    """Pull one KV cache; returns the bytes received (exactly what the server announced)."""
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port, limit=HEADER_LIMIT)
            try:
                writer.write(request.encode("ascii") + b"\n")
                await writer.drain()
                header = (await reader.readline()).decode("ascii", errors="replace").strip()
                if header.startswith("ERR "):
                    _, status, message = header.split(" ", 2)
                    raise KvTransferError(int(status), f"KV pull from {where} refused: {message}")
                if not header.startswith("OK "):
                    raise KvTransferError(502, f"KV pull from {where}: bad answer {header[:80]!r}")
                expected = int(header[3:])
                received = 0
                while received < expected:
                    chunk = await reader.read(min(expected - received, 1 << 20))
                    if not chunk:
                        raise KvTransferError(502, f"KV pull from {where} broke after {received} of {expected} bytes")
                    received += len(chunk)
                return received
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except TimeoutError:
        raise KvTransferError(504, f"KV pull from {where} timed out after {timeout_s:g} s") from None
    except OSError as exc:
        raise KvTransferError(502, f"KV pull from {where} failed: {exc}") from None


def nixl_request(engine_id: str, block_ids: tuple[int, ...], skip: int = 0) -> str:
    """Pull the blocks ``block_ids`` but the first ``skip`` (the decode's own prefix cache holds them)."""
    ids = ",".join(map(str, block_ids))
    return f"PULL nixl {engine_id} {ids} {skip}" if skip else f"PULL nixl {engine_id} {ids}"


def nixl_done(engine_id: str, block_ids: tuple[int, ...]) -> str:
    """The notification that frees a handle no decode will read (``pull_kv`` of it receives 0 bytes)."""
    return f"DONE nixl {engine_id} {','.join(map(str, block_ids))}"


def room_request(room: int) -> str:
    return f"PULL room {room}"
