"""The legs' client resends a leg once when the pooled connection it went out on is closed under it before
any byte of an answer (the keep-alive race behind the ~1/220 router->gateway legs that failed with a read
error and fell back), and never resends a failed connect. Real sockets: a raw asyncio server that answers
the first request of each connection and closes the connection when the next one arrives, unanswered — what
a server closing an idle keep-alive connection at the instant the client reuses it looks like."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from prfaas_router.state.wire import LegSession

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"ok": true}'


async def _serve() -> tuple[asyncio.AbstractServer, int, list[int]]:
    requests_per_connection: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests_per_connection.append(0)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0
                )
                await reader.readexactly(length)
                requests_per_connection[-1] += 1
                if requests_per_connection[-1] > 1:  # a reused connection: closed, unanswered
                    return
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, requests_per_connection


def test_a_leg_on_a_connection_closed_under_it_is_sent_once_more() -> None:
    async def main() -> tuple[list[int], list[int]]:
        server, port, per_connection = await _serve()
        legs = LegSession.open()
        statuses = []
        try:
            for _ in range(3):
                async with legs.post(f"http://127.0.0.1:{port}/v1/completions", data=b'{"prompt": "x"}') as resp:
                    statuses.append(resp.status)
                    assert await resp.json() == {"ok": True}
            resp = await legs.post(f"http://127.0.0.1:{port}/v1/completions", data=b"{}")  # awaited, not entered
            statuses.append(resp.status)
            resp.release()
        finally:
            await legs.close()
            server.close()
        return statuses, per_connection

    statuses, per_connection = asyncio.run(main())
    assert statuses == [200, 200, 200, 200]
    # each leg after the first went out on the pooled connection, lost it, and was answered on a new one
    assert per_connection == [2, 2, 2, 1]


def test_a_plain_aiohttp_post_fails_in_the_same_race() -> None:
    """The race this guards against: aiohttp resends only idempotent methods by itself."""

    async def main() -> None:
        server, port, _ = await _serve()
        async with aiohttp.ClientSession() as session:
            try:
                async with session.post(f"http://127.0.0.1:{port}/", data=b"{}") as resp:
                    await resp.read()
                with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
                    async with session.post(f"http://127.0.0.1:{port}/", data=b"{}") as resp:
                        await resp.read()
            finally:
                server.close()

    asyncio.run(main())


def test_a_failed_connect_is_not_resent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused

    async def main() -> None:
        legs = LegSession.open()
        try:
            with pytest.raises(aiohttp.ClientConnectorError):
                await legs.post(f"http://127.0.0.1:{port}/", data=b"{}")
        finally:
            await legs.close()

    asyncio.run(main())
