"""Running the gateway: two uvicorn servers (public and internal) on one event loop, sharing one
Gateway; SIGHUP reloads the configuration, SIGTERM/SIGINT drain and stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Generator
from pathlib import Path

import orjson
import uvicorn

from .app import create_internal_app, create_public_app
from .config import GatewayConfig
from .runtime import Gateway

log = logging.getLogger("llm_gateway")


class _Server(uvicorn.Server):
    """Signals are handled once for both servers by GatewayServer, not by each uvicorn.Server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def tune_gc() -> None:
    """Fewer, cheaper garbage collections: the start-up objects (FastAPI, pydantic schemas, config)
    are frozen out of the collector's scans, and young collections run less often. Each request
    allocates many short-lived objects; with the defaults, full collections land in the tail
    latency."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class GatewayServer:
    def __init__(
        self, config: GatewayConfig, config_path: Path | None = None, log_level: str = "warning"
    ) -> None:
        self.config = config
        self.gateway = Gateway(config, config_path)
        self._log_level = log_level
        self._servers: list[_Server] = []
        self._sockets: list[socket.socket] = []
        self.ports: dict[str, int] = {}

    def _uvicorn(self, app: object, internal: bool) -> _Server:
        limits = self.config.limits
        config = uvicorn.Config(
            app,  # type: ignore[arg-type]
            lifespan="off",
            http="httptools",
            loop="none",
            access_log=False,  # the audit trail is the access log
            log_level=self._log_level,
            server_header=False,
            date_header=False,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=int(self.config.timeouts.total_s) + 5,
            limit_concurrency=None if internal else limits.max_concurrent_requests,
            backlog=2048,
        )
        return _Server(config)

    async def start(self) -> dict[str, int]:
        """Bind both listeners and start serving; returns the bound ports (useful with port 0)."""
        tune_gc()
        listen, internal = self.config.listen, self.config.internal
        self._sockets = [bind(listen.host, listen.port), bind(internal.host, internal.port)]
        self.ports = {
            "listen": self._sockets[0].getsockname()[1],
            "internal": self._sockets[1].getsockname()[1],
        }
        await self.gateway.start()
        self._servers = [
            self._uvicorn(create_public_app(self.gateway), internal=False),
            self._uvicorn(create_internal_app(self.gateway), internal=True),
        ]
        self._tasks = [
            asyncio.create_task(server.serve(sockets=[sock]))
            for server, sock in zip(self._servers, self._sockets, strict=True)
        ]
        while not all(s.started for s in self._servers):
            done = [t for t in self._tasks if t.done()]
            if done:
                await done[0]  # raises what stopped it
                raise RuntimeError("a listener stopped during start-up")
            await asyncio.sleep(0.01)
        log.warning(
            "llm-gateway listening on http://%s:%d (internal http://%s:%d)",
            listen.host,
            self.ports["listen"],
            internal.host,
            self.ports["internal"],
        )
        return self.ports

    def request_stop(self) -> None:
        for server in self._servers:
            server.should_exit = True

    async def wait(self) -> None:
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.gateway.close()
            for sock in self._sockets:
                sock.close()

    async def stop(self) -> None:
        self.request_stop()
        await self.wait()


async def run(
    config: GatewayConfig, config_path: Path | None, port_file: Path | None, log_level: str
) -> None:
    server = GatewayServer(config, config_path, log_level)
    await server.start()
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[bool]] = set()

    def on_hup() -> None:
        task = loop.create_task(server.gateway.reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(server.ports))
        tmp.replace(port_file)
    await server.wait()
