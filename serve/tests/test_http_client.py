"""The gateway's own upstream client against raw asyncio servers: the stale keep-alive socket
retried once, a refused connection tried again, a connection slot passed on by a waiter cancelled as
it was handed one, and backpressure on a body nobody reads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from llm_gateway.http_client import (
    _HIGH_WATER,
    _REFUSED_RETRY_PAUSES_S,
    ConnectionPool,
    UpstreamClosedError,
    UpstreamConnectError,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError):
            await self.handler(reader, writer, self.connections)
        writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bool:
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return False
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        self.requests += 1
        return True

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


def _ok(body: bytes = b"ok") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[RawServer]:
    raw = RawServer(handler)
    raw.server = await asyncio.start_server(raw._serve, "127.0.0.1", 0)
    try:
        yield raw
    finally:
        raw.server.close()


async def test_stale_keep_alive_socket_is_retried_once_on_a_fresh_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        raw = server
        if n == 1:
            await raw.read_request(reader)
            writer.write(_ok())  # keep-alive
            await writer.drain()
            await raw.read_request(reader)  # the second request on this socket: closed unanswered
            writer.transport.abort()
            return
        while await raw.read_request(reader):
            writer.write(_ok(b"fresh"))
            await writer.drain()

    async with serving(handler) as server:
        pool = ConnectionPool("127.0.0.1", server.port, max_connections=4)
        first = await pool.request("GET", "/", connect_timeout_s=2)
        assert await first.read() == b"ok" and pool.idle == 1
        second = await pool.request("GET", "/", connect_timeout_s=2)
        assert second.status == 200 and await second.read() == b"fresh"
        assert (server.connections, server.requests) == (2, 3)
        assert pool.in_use == 0
        pool.close()


async def test_a_fresh_socket_closed_unanswered_is_not_retried() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.transport.abort()

    async with serving(handler) as server:
        pool = ConnectionPool("127.0.0.1", server.port, max_connections=4)
        with pytest.raises(UpstreamClosedError):
            await pool.request("POST", "/", body=b"{}", connect_timeout_s=2)
        assert (server.connections, server.requests) == (1, 1)  # the request may have run: no retry
        assert pool.in_use == 0
        pool.close()


def _free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (for now): a connect there is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_refused_connection_is_tried_again_until_the_upstream_listens() -> None:
    """A Service's ClusterIP while a replica is replaced: refused now, answering a moment later."""
    port = _free_port()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await server.read_request(reader):
            writer.write(_ok())
            await writer.drain()

    server = RawServer(handler)

    async def listen_soon() -> None:
        await asyncio.sleep(_REFUSED_RETRY_PAUSES_S[0] / 2)  # after the first try, before the second
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", port)

    opening = asyncio.create_task(listen_soon())
    pool = ConnectionPool("127.0.0.1", port, max_connections=4)
    try:
        response = await pool.request("POST", "/", body=b"{}", connect_timeout_s=2)
        assert response.status == 200 and await response.read() == b"ok"
        assert (server.connections, server.requests) == (1, 1)
    finally:
        await opening
        pool.close()
        if server.server is not None:
            server.server.close()


async def test_a_connection_refused_every_time_fails_after_the_retries() -> None:
    pool = ConnectionPool("127.0.0.1", _free_port(), max_connections=4)
    began = asyncio.get_running_loop().time()
    with pytest.raises(UpstreamConnectError, match=rf"\({len(_REFUSED_RETRY_PAUSES_S) + 1} tries\)"):
        await pool.request("POST", "/", body=b"{}", connect_timeout_s=2)
    assert asyncio.get_running_loop().time() - began >= sum(_REFUSED_RETRY_PAUSES_S)
    assert pool.in_use == 0
    pool.close()


async def _answer_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head:
            return
        writer.write(_ok())
        await writer.drain()


async def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on() -> None:
    async with serving(_answer_all) as server:
        pool = ConnectionPool("127.0.0.1", server.port, max_connections=1)
        holder = await pool.request("GET", "/", connect_timeout_s=2)  # holds the only slot
        waiter_b = asyncio.create_task(pool.request("GET", "/", connect_timeout_s=5))
        waiter_c = asyncio.create_task(pool.request("GET", "/", connect_timeout_s=5))
        await asyncio.sleep(0.05)
        assert not waiter_b.done() and not waiter_c.done()
        await holder.read()  # releases the slot: B's future is resolved ...
        waiter_b.cancel()  # ... and B is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter_b
        response = await asyncio.wait_for(waiter_c, 2)  # C got the slot B could not use
        assert await response.read() == b"ok"
        assert pool.in_use == 0
        pool.close()


async def test_a_waiter_cancelled_while_queued_leaves_the_queue() -> None:
    async with serving(_answer_all) as server:
        pool = ConnectionPool("127.0.0.1", server.port, max_connections=1)
        holder = await pool.request("GET", "/", connect_timeout_s=2)
        waiter = asyncio.create_task(pool.request("GET", "/", connect_timeout_s=5))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await holder.read()
        assert pool.in_use == 0
        response = await asyncio.wait_for(pool.request("GET", "/", connect_timeout_s=2), 2)
        assert await response.read() == b"ok" and pool.in_use == 0
        pool.close()


async def test_an_unread_body_stops_the_socket_and_reading_resumes_it() -> None:
    size = 8 * _HIGH_WATER
    body = bytes(i % 251 for i in range(size))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.read_request(reader)
        writer.write(_ok(body))
        await writer.drain()  # waits while the client does not read
        await asyncio.sleep(1)

    async with serving(handler) as server:
        pool = ConnectionPool("127.0.0.1", server.port, max_connections=1)
        response = await pool.request("GET", "/", connect_timeout_s=2)
        await asyncio.sleep(0.3)  # nobody reads: the client must stop reading the socket
        assert response._paused
        buffered = response._buffered
        assert _HIGH_WATER < buffered < 2 * _HIGH_WATER  # bounded near the high-water mark
        received = bytearray()
        while (chunk := await response.next_chunk()) is not None:
            received += chunk
        assert bytes(received) == body and not response._paused
        assert pool.in_use == 0
        pool.close()
