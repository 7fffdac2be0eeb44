"""The simulator's HTTP surface, as plain ASGI: vLLM's OpenAI endpoints, /health, /metrics,
and /sim/* to change faults and timing at run time and read counters (tests, lab, benchmark)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .engine import Engine, Overloaded, SimConfig

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _error(message: str, type_: str, code: int) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = _JSON) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _prompt_tokens(payload: dict[str, Any]) -> int:
    if "messages" in payload:
        text = ""
        for message in payload["messages"]:
            content = message.get("content")
            if isinstance(content, str):
                text += content
            elif isinstance(content, list):
                text += "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return max(1, len(text) // 4)
    prompt = payload.get("prompt", "")
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], int):
            return len(prompt)
        return max(1, sum(len(p) for p in prompt) // 4)
    return max(1, len(str(prompt)) // 4)


class SimApp:
    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.engine = Engine(self.config)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            await self._completion(receive, send, chat=path == "/v1/chat/completions")
        elif path == "/health" and method == "GET":
            if self.config.health_fail:
                await _respond(send, 500, _error("engine is dead", "InternalServerError", 500))
            else:
                await _respond(send, 200, b"", [])
        elif path == "/metrics" and method == "GET":
            await _respond(send, 200, self.engine.render_metrics(), [(b"content-type", b"text/plain")])
        elif path == "/v1/models" and method == "GET":
            now = int(time.time())
            data = [
                {"id": m, "object": "model", "created": now, "owned_by": "vllm", "root": m}
                for m in self.config.served_models
            ]
            await _respond(send, 200, orjson.dumps({"object": "list", "data": data}))
        elif path == "/sim/config" and method == "POST":
            body = await _read_body(receive)
            try:
                self.config.update(orjson.loads(body or b"{}"))
            except (ValueError, TypeError) as exc:
                await _respond(send, 400, _error(str(exc), "BadRequestError", 400))
                return
            await _respond(send, 200, orjson.dumps(self.config.as_dict()))
        elif path == "/sim/stats" and method == "GET":
            await _respond(send, 200, orjson.dumps(self.engine.snapshot()))
        else:
            await _respond(send, 404, _error("Not Found", "NotFoundError", 404))

    async def _completion(self, receive: Receive, send: Send, chat: bool) -> None:
        body = await _read_body(receive)
        if body is None:
            return
        try:
            payload = orjson.loads(body)
            model = payload["model"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            await _respond(send, 400, _error("invalid request body", "BadRequestError", 400))
            return
        if model not in self.config.served_models:
            await _respond(send, 404, _error(f"The model `{model}` does not exist.", "NotFoundError", 404))
            return
        max_tokens = payload.get("max_completion_tokens") or payload.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens > self.config.max_model_len:
            message = (
                f"This model's maximum context length is {self.config.max_model_len} tokens. "
                f"However, you requested {max_tokens} output tokens."
            )
            await _respond(send, 400, _error(message, "BadRequestError", 400))
            return
        engine = self.engine
        gone = asyncio.Event()
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        admitted = False
        try:
            try:
                await engine.admit()
            except Overloaded:
                await _respond(send, 503, _error("waiting queue is full", "ServiceUnavailableError", 503))
                return
            admitted = True
            engine.stats["started"] += 1
            fault = engine.fault()
            if fault == "error":
                await _respond(send, 500, _error("simulated engine error", "InternalServerError", 500))
                return
            if fault == "hang":
                await asyncio.Event().wait()
            if payload.get("stream"):
                await self._stream(send, payload, model, chat)
            else:
                await self._unary(send, payload, model, chat)
        except asyncio.CancelledError:
            if not gone.is_set():
                raise
            task.uncancel()
            # a request the client abandoned: generation stops (running) or never starts (waiting)
            engine.stats["cancelled" if admitted else "abandoned"] += 1
        finally:
            watcher.cancel()
            if admitted:
                engine.release()

    def _plan(self, payload: dict[str, Any]) -> tuple[list[str], str, int, int]:
        max_tokens = payload.get("max_completion_tokens") or payload.get("max_tokens")
        tokens, reason = self.engine.output_tokens(max_tokens if isinstance(max_tokens, int) else None)
        n = payload.get("n") or 1
        return tokens, reason, _prompt_tokens(payload), n if isinstance(n, int) and n > 0 else 1

    async def _unary(self, send: Send, payload: dict[str, Any], model: str, chat: bool) -> None:
        started = time.perf_counter()
        config = self.config
        tokens, reason, prompt_tokens, n = self._plan(payload)
        if config.ttft_s:
            await asyncio.sleep(config.ttft_s)
        self.engine.observe_ttft(time.perf_counter() - started)
        if config.itl_s and len(tokens) > 1:
            await asyncio.sleep(config.itl_s * (len(tokens) - 1))
        text = "".join(tokens)
        if chat:
            choices: list[dict[str, Any]] = [
                {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                for i in range(n)
            ]
        else:
            choices = [{"index": i, "text": text, "finish_reason": reason} for i in range(n)]
        completion_tokens = len(tokens) * n
        doc = {
            "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        await _respond(send, 200, orjson.dumps(doc))
        self.engine.finished(model, reason, prompt_tokens, completion_tokens, time.perf_counter() - started)

    async def _stream(self, send: Send, payload: dict[str, Any], model: str, chat: bool) -> None:
        started = time.perf_counter()
        config = self.config
        tokens, reason, prompt_tokens, n = self._plan(payload)
        options = payload.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = b'{"id":' + orjson.dumps(rid) + b',"object":"' + obj.encode() + b'","created":'
        head += str(created).encode() + b',"model":' + orjson.dumps(model) + b',"choices":'

        def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            tail = b"}" if usage is None else b',"usage":' + orjson.dumps(usage) + b"}"
            return b"data: " + head + orjson.dumps(choices) + tail + b"\n\n"

        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        if config.ttft_s:
            await asyncio.sleep(config.ttft_s)
        first = time.perf_counter()
        self.engine.observe_ttft(first - started)
        if chat:
            role = [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                for i in range(n)
            ]
            await send({"type": "http.response.body", "body": event(role), "more_body": True})
        end = config.stream_end
        last = first
        for position, token in enumerate(tokens):
            if position and config.itl_s:
                await asyncio.sleep(config.itl_s)
            elif position:
                await asyncio.sleep(0)  # let other streams and disconnects through
            now = time.perf_counter()
            if position:
                self.engine.observe_itl(now - last)
            last = now
            done = reason if end == "with_text" and position == len(tokens) - 1 else None
            if chat:
                choices = [{"index": i, "delta": {"content": token}, "finish_reason": done} for i in range(n)]
            else:
                choices = [{"index": i, "text": token, "finish_reason": done} for i in range(n)]
            await send({"type": "http.response.body", "body": event(choices), "more_body": True})
        if end != "done" and (end != "with_text" or not tokens):
            empty: list[dict[str, Any]] = [
                {"index": i, "delta": {}, "finish_reason": reason}
                if chat
                else {"index": i, "text": "", "finish_reason": reason}
                for i in range(n)
            ]
            await send({"type": "http.response.body", "body": event(empty), "more_body": True})
        tail = b""
        completion_tokens = len(tokens) * n
        if (include_usage and end != "done") or end == "usage_chunk":
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
            tail = event([], usage)
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})
        self.engine.finished(model, reason, prompt_tokens, completion_tokens, time.perf_counter() - started)


def create_app(config: SimConfig | None = None) -> SimApp:
    return SimApp(config)


async def serve(app: SimApp, host: str, port: int, log_level: str = "warning") -> None:
    """Serve until cancelled (used by tests and the benchmark as well as the CLI)."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, lifespan="off", http="httptools", access_log=False, log_level=log_level
    )
    server = uvicorn.Server(config)
    with contextlib.suppress(asyncio.CancelledError):
        await server.serve()
