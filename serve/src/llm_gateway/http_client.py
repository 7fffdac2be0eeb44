"""A small keep-alive HTTP/1.1 client for the upstream hop.

httpx costs a few hundred microseconds of CPU per request, which alone would eat most of the
gateway's latency budget at 1,500 requests/s on one core. This client does only what the
gateway needs: POST/GET with a body, Content-Length or chunked responses (parsed by httptools,
the parser uvicorn uses), a bounded pool of keep-alive connections per upstream, backpressure
on streamed bodies, and cancellation by closing the connection, which is what makes vLLM stop
generating for a client that went away.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Sequence

import httptools

# Above this many buffered bytes the socket stops being read until the consumer catches up.
_HIGH_WATER = 1 << 20
_LOW_WATER = 1 << 18

# The pauses before connecting again to an upstream that refused the connection (RST, or ICMP port
# unreachable), within the caller's connect timeout. An upstream is a Kubernetes Service's ClusterIP: while
# a replica is replaced, this node's kube-proxy can still pick a Pod that has just gone, or have no ready
# endpoint for a moment; each new connect is kube-proxy's choice again. Nothing was sent on a refused
# connection, so connecting again cannot run a request twice (Istio's default retry policy retries
# connect-failure likewise). A connect that times out is not tried again: that budget is spent.
_REFUSED_RETRY_PAUSES_S = (0.05, 0.25)


class UpstreamError(Exception):
    """Any failure talking to an upstream."""


class UpstreamConnectError(UpstreamError):
    """The TCP connection could not be made."""


class UpstreamClosedError(UpstreamError):
    """The upstream closed the connection or sent something unparseable."""


class PoolExhaustedError(UpstreamError):
    """Every allowed connection to the upstream was busy for the whole connect timeout."""


class _Connection(asyncio.Protocol):
    __slots__ = ("_parser", "_response", "closed", "idle_since", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._response: Response | None = None
        self.closed = False
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.abort(UpstreamClosedError(f"bad HTTP response from upstream: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self._response
        if response is not None and not response.complete:
            response._fail(UpstreamClosedError("upstream closed the connection"))

    def pause_writing(self) -> None:  # requests are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self._response is not None:
            self._response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self._response
        if response is not None:
            response.status = self._parser.get_status_code()
            response._keep_alive = self._parser.should_keep_alive()
            response._wake_headers()

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        response = self._response
        if response is not None:
            response._finish()

    # used by Response / pool
    def start(self, response: Response, request: bytes) -> None:
        self._response = response
        self._parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        self.transport.write(request)

    def detach(self) -> None:
        self._response = None

    def abort(self, error: UpstreamError | None = None) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        response = self._response
        if response is not None and not response.complete and error is not None:
            response._fail(error)


class Response:
    """One upstream response. Always end it with `read()`, draining `next_chunk()`, or `close()`."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_error",
        "_keep_alive",
        "_paused",
        "_pool",
        "_released",
        "_waiter",
        "complete",
        "got_bytes",
        "headers",
        "status",
    )

    def __init__(self, pool: ConnectionPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._keep_alive = False
        self._released = False
        self.complete = False
        self.got_bytes = False

    # fed by the connection
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_headers(self) -> None:
        self.got_bytes = True
        self._wake()

    def _feed(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_headers(self) -> None:
        while not self.status:
            if self._error is not None:
                raise self._error
            await self._wait()

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body; releases the connection."""
        try:
            while not self.complete:
                if self._error is not None:
                    raise self._error
                await self._wait()
            return b"".join(self._chunks)
        finally:
            self.close()

    def buffered_chunk(self) -> bytes | None:
        """A piece of body already received, without waiting; None if there is none yet."""
        if not self._chunks:
            return None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < _LOW_WATER and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()
        return chunk

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body as it arrives, None at its end (the connection is then released)."""
        while True:
            chunk = self.buffered_chunk()
            if chunk is not None:
                return chunk
            if self.complete:
                self.close()
                return None
            if self._error is not None:
                self.close()
                raise self._error
            await self._wait()

    def close(self) -> None:
        """Give the connection back, or abort it if the body was not read to the end.

        Aborting is deliberate: it is how an upstream learns that nobody wants the rest.
        """
        if self._released:
            return
        self._released = True
        conn = self._conn
        conn.detach()
        reusable = self.complete and self._keep_alive and self._error is None and not conn.closed
        if not reusable:
            conn.abort()
        self._pool._release(conn, reusable)


class ConnectionPool:
    """Keep-alive connections to one upstream, at most `max_connections` in use at once."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int = 256,
        max_idle: int = 64,
        idle_timeout_s: float = 4.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.max_connections = max_connections
        self._max_idle = max_idle
        # Below the 5 s keep-alive of uvicorn (which vLLM runs on), so we rarely reuse a socket
        # the server is about to close.
        self._idle_timeout_s = idle_timeout_s
        self._idle: deque[_Connection] = deque()
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._host_header = f"{host}:{port}".encode()
        self._closed = False

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def _acquire_slot(self) -> None:
        while self._in_use >= self.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass on the slot we were handed
                raise
        self._in_use += 1

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, conn: _Connection, reusable: bool) -> None:
        self._in_use -= 1
        if reusable and not self._closed and len(self._idle) < self._max_idle:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        elif not conn.closed:
            conn.abort()
        self._wake_one()

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # most recently used: warmest, least likely to be closed
            if not conn.closed and now - conn.idle_since < self._idle_timeout_s:
                return conn
            conn.abort()
        return None

    async def _connect(self) -> _Connection:
        """A new connection; a refused one is tried again after each of _REFUSED_RETRY_PAUSES_S."""
        loop = asyncio.get_running_loop()
        for pause in (*_REFUSED_RETRY_PAUSES_S, None):
            try:
                _, conn = await loop.create_connection(
                    _Connection,
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                )
            except ConnectionRefusedError as exc:
                if pause is None:
                    tries = len(_REFUSED_RETRY_PAUSES_S) + 1
                    raise UpstreamConnectError(
                        f"cannot connect to {self.host}:{self.port}: {exc} ({tries} tries)"
                    ) from exc
                await asyncio.sleep(pause)
            except OSError as exc:
                raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
            else:
                return conn
        raise AssertionError("unreachable")  # pragma: no cover

    def _encode(self, method: str, path: str, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self._host_header]
        lines.extend(f"{name}: {value}".encode() for name, value in headers)
        if body or method == "POST":
            lines.append(b"Content-Length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        connect_timeout_s: float,
    ) -> Response:
        """Send a request and return once the response headers are in.

        The caller bounds the wait for headers with its own timeout; `connect_timeout_s` bounds
        waiting for a free connection and the TCP handshake.
        """
        if self._closed:
            raise UpstreamConnectError("upstream pool is closed")
        payload = self._encode(method, path, headers, body)
        try:
            async with asyncio.timeout(connect_timeout_s):
                await self._acquire_slot()
        except TimeoutError:
            raise PoolExhaustedError(
                f"all {self.max_connections} connections to {self.host}:{self.port} busy"
            ) from None
        released = False
        try:
            for attempt in range(2):
                conn = self._take_idle()
                reused = conn is not None
                if conn is None:
                    try:
                        async with asyncio.timeout(connect_timeout_s):
                            conn = await self._connect()
                    except TimeoutError:
                        raise UpstreamConnectError(
                            f"connect to {self.host}:{self.port} timed out after {connect_timeout_s}s"
                        ) from None
                response = Response(self, conn)
                conn.start(response, payload)
                try:
                    await response.wait_headers()
                except UpstreamClosedError:
                    # A reused keep-alive socket the server closed just as we wrote to it: the
                    # request never reached the application, so one retry on a fresh one is safe.
                    retry = reused and not response.got_bytes and attempt == 0
                    released = True
                    response.close()
                    if retry:
                        await self._acquire_slot()
                        released = False
                        continue
                    raise
                except BaseException:
                    released = True
                    response.close()
                    raise
                released = True
                return response
            raise UpstreamClosedError("unreachable")  # pragma: no cover
        finally:
            if not released:
                self._in_use -= 1
                self._wake_one()

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().abort()
