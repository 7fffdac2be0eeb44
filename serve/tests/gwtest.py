"""Test support: real servers on 127.0.0.1 ephemeral ports, run on one background event loop."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import jwt
import uvicorn
from llm_gateway.config import GatewayConfig, parse_config
from llm_gateway.server import GatewayServer, bind
from vllm_sim.app import SimApp
from vllm_sim.engine import SimConfig

T = TypeVar("T")
JWT_SECRET = "test-secret-that-is-long-enough-for-hs256-0123456789"
JWT_ENV = "LLM_GATEWAY_TEST_JWT_SECRET"
os.environ[JWT_ENV] = JWT_SECRET


class BackgroundLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="servers", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return fn()

        return self.run(wrapper())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Sim:
    """A vllm-sim served on the background loop."""

    def __init__(self, bg: BackgroundLoop, config: SimConfig, tls: tuple[Path, Path] | None = None) -> None:
        """`tls`: (certificate chain, key) PEM files to serve https."""
        self.bg = bg
        self.app = SimApp(config)
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        uconfig = uvicorn.Config(
            self.app,
            lifespan="off",
            http="httptools",
            access_log=False,
            log_level="warning",
            ssl_certfile=tls[0] if tls else None,
            ssl_keyfile=tls[1] if tls else None,
        )
        self.server = uvicorn.Server(uconfig)

        async def start() -> None:
            self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
            while not self.server.started:
                await asyncio.sleep(0.005)

        bg.run(start())

    def configure(self, **changes: Any) -> None:
        self.bg.call(lambda: self.app.config.update(changes))

    def stats(self) -> dict[str, Any]:
        return self.bg.call(self.app.engine.snapshot)

    def stop(self) -> None:
        async def stop() -> None:
            self.server.should_exit = True
            await self.task

        self.bg.run(stop())
        self.sock.close()


class Scripted:
    """An upstream that answers every POST with a fixed body: shapes the simulator does not make."""

    def __init__(self, bg: BackgroundLoop, body: bytes, content_type: bytes = b"application/json") -> None:
        self.body = body
        self.content_type = content_type
        self.requests = 0

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            while (await receive()).get("more_body"):
                pass
            if scope["method"] == "POST":
                self.requests += 1
            headers = [(b"content-type", self.content_type)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send(
                {"type": "http.response.body", "body": self.body if scope["method"] == "POST" else b""}
            )

        self.bg = bg
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, lifespan="off", http="httptools", access_log=False, log_level="warning")
        )

        async def start() -> None:
            self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
            while not self.server.started:
                await asyncio.sleep(0.005)

        bg.run(start())

    def stop(self) -> None:
        async def stop() -> None:
            self.server.should_exit = True
            await self.task

        self.bg.run(stop())
        self.sock.close()


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class Gateway:
    """An llm-gateway served on the background loop."""

    def __init__(self, bg: BackgroundLoop, config: GatewayConfig, config_path: Path | None = None) -> None:
        self.bg = bg
        self.config = config
        self.server = GatewayServer(config, config_path)
        ports = bg.run(self.server.start())
        self.url = f"http://127.0.0.1:{ports['listen']}"
        self.internal_url = f"http://127.0.0.1:{ports['internal']}"
        self.gateway = self.server.gateway

    def stop(self) -> None:
        self.bg.run(self.server.stop())

    def audit_records(self, count: int | None = None, timeout: float = 10) -> list[dict[str, Any]]:
        """The audit file's records, waiting (bounded) until at least `count` are written."""
        path = Path(self.config.audit.path)
        deadline = time.monotonic() + timeout
        while True:
            records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            if count is None or len(records) >= count or time.monotonic() > deadline:
                return records
            time.sleep(0.02)


def gateway_config(
    upstreams: dict[str, list[dict[str, Any]]], tmp_path: Path, **sections: Any
) -> GatewayConfig:
    data: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "internal": {"host": "127.0.0.1", "port": 0},
        "auth": {"mode": "jwt", "hs256_secret_env": JWT_ENV},
        "models": {name: {"upstreams": ups} for name, ups in upstreams.items()},
        "timeouts": {"connect_s": 2, "first_token_s": 10, "between_tokens_s": 5, "total_s": 20},
        "breaker": {"failures_to_open": 3, "open_s": 60, "probe_interval_s": 60},
        "audit": {"path": str(tmp_path / "audit.jsonl"), "prompts": "hashed"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, base_dir=tmp_path)


def token(sub: str = "alice", **claims: Any) -> str:
    payload = {"sub": sub, "exp": int(time.time()) + 3600, **claims}
    return jwt.encode(payload, JWT_SECRET, algorithm="HS256")


def auth_headers(sub: str = "alice", **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(sub)}", **extra}


def chat_body(content: str = "hello", model: str = "m", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def wait_for(predicate: Callable[[], bool], timeout: float = 10, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
