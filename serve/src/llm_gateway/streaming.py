"""A stream from upstream to client: server-sent events re-encoded through the safety filter,
served by Starlette's StreamingResponse (which also cancels it when the client goes away).

The pump owns the open upstream response, the upstream's in-flight count and the breaker's verdict
from the moment the proxy hands it the first chunk; `close` ends all three and the audit record,
once, whichever way the stream ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .audit import RequestRecord
from .errors import sse_error
from .filtering import ChoiceFilter
from .http_client import Response as UpstreamResponse
from .http_client import UpstreamError
from .runtime import Gateway, Runtime
from .upstream import Upstream

_DONE = b"data: [DONE]\n\n"


class StreamPump:
    """Moves one stream from upstream to client through the safety filter."""

    def __init__(
        self,
        gw: Gateway,
        rt: Runtime,
        record: RequestRecord,
        upstream: Upstream,
        response: UpstreamResponse,
        first: bytes,
        chat: bool,
        include_usage: bool,
    ) -> None:
        self.gw = gw
        self.rt = rt
        self.record = record
        self.upstream = upstream
        self.response = response
        self.first = first
        self.chat = chat
        self.include_usage = include_usage
        self.choices: dict[int, ChoiceFilter] = {}
        self.buffer = bytearray()
        self.finished = False  # [DONE] sent or the stream was cut by the filter
        self.content_chunks = 0
        self.meta: dict[str, Any] = {}
        self._verdict_given = False
        self._closed = False
        record.settle(200)

    # --- the breaker's verdict and the end of the record, once each -------------------------
    def _verdict(self, failure: str | None = None, neutral: bool = False) -> None:
        if self._verdict_given:
            return
        self._verdict_given = True
        breaker = self.upstream.breaker
        if neutral:
            breaker.record_neutral()
        elif failure is not None:
            breaker.record_failure(failure)
        else:
            breaker.record_success()

    def client_gone(self) -> None:
        if not self._verdict_given:
            self._verdict(neutral=True)
            self.record.settle(499, "client_disconnected", "client_disconnected")

    def close(self) -> None:
        """Release everything the stream holds and write its audit record (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.client_gone()  # ended before its end without a verdict: the client left
        # not read to the end: closing aborts the connection, and vLLM stops generating
        self.response.close()
        self.upstream.in_flight -= 1
        record = self.record
        if record.completion_tokens is None and self.content_chunks:
            record.completion_tokens = self.content_chunks
            record.usage_estimated = True
        self.gw.finish(record, self.rt)

    # --- the body ---------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[bytes]:
        record, response = self.record, self.response
        timeouts = self.rt.config.timeouts
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total_s - (time.perf_counter() - record.started)
        try:
            out = self.process(self.first)
            if out:
                yield out
            while not self.finished:
                chunk = response.buffered_chunk()
                if chunk is None:
                    wait = min(timeouts.between_tokens_s, deadline - loop.time())
                    async with asyncio.timeout(max(wait, 0)):
                        chunk = await response.next_chunk()
                if chunk is None:
                    break
                out = self.process(chunk)
                if out:
                    yield out
            tail = self.finish_stream()
            self._verdict()
            if tail:
                yield tail
        except TimeoutError:
            self._verdict("stream stalled")
            record.settle(200, "timeout", "upstream_timeout")
            yield sse_error("The model stopped sending tokens in time.", "timeout")
        except UpstreamError as exc:
            self._verdict(str(exc))
            record.settle(200, "upstream_error", "upstream_stream_broken")
            yield sse_error("The model server ended the stream unexpectedly.", "upstream_error")
        except asyncio.CancelledError:
            self.client_gone()  # Starlette cancels the body when the client disconnects
            raise

    # --- SSE in, SSE out ----------------------------------------------------------------------
    def process(self, data: bytes) -> bytes:
        """Whole SSE events in `data` (plus what was left over) filtered and re-encoded."""
        buffer = self.buffer
        buffer += data
        out: list[bytes] = []
        start = 0
        while not self.finished:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            event = bytes(buffer[start:end])
            start = end + 2
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip(), out)
        del buffer[:start]
        return b"".join(out)

    def _event(self, data: bytes, out: list[bytes]) -> None:
        if self.finished:
            return
        if data == b"[DONE]":
            self._flush_all(out)
            out.append(_DONE)
            self.finished = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(chunk, dict):
            return
        record = self.record
        if "error" in chunk:
            record.settle(record.status, "upstream_error", "upstream_stream_error")
            out.append(b"data: " + data + b"\n\n")
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        if not self.include_usage and "usage" in chunk:
            del chunk["usage"]
        choices = chunk.get("choices") or []
        self.meta = {"id": chunk.get("id"), "object": chunk.get("object"), "created": chunk.get("created")}
        if not choices:
            if not self.include_usage:
                return
            self._flush_all(out)  # the usage chunk comes after all the text
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            flt = self.choices.get(index)
            if flt is None:
                flt = self.choices[index] = ChoiceFilter(self.rt.safety, self.rt.safety.stream)
            carried, sent = flt.feed_choice(choice, self.chat)
            self.content_chunks += carried
            if flt.blocked:
                self._block(index, out)
                return
            if sent and record.ttft_s is None:
                record.ttft_s = time.perf_counter() - record.started
                self.gw.metrics.observe_ttft(record.model or "", self.upstream.name, record.ttft_s)
            if flt.hit and record.safety_action == "none":
                record.safety_action = "mask"
        chunk["model"] = record.model
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        doc = {**self.meta, "model": self.record.model, "choices": [choice]}
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def _flush_all(self, out: list[bytes]) -> None:
        for index, flt in self.choices.items():
            rest = flt.flush(self.chat)
            if rest is not None:
                key = "delta" if self.chat else "text"
                value: Any = rest if self.chat else rest["text"]
                out.append(self._chunk({"index": index, key: value, "finish_reason": None}))

    def _block(self, index: int, out: list[bytes]) -> None:
        message = self.rt.safety.block_message
        if self.chat:
            choice: dict[str, Any] = {
                "index": index,
                "delta": {"content": message} if message else {},
                "finish_reason": "content_filter",
            }
        else:
            choice = {"index": index, "text": message, "finish_reason": "content_filter"}
        out.append(self._chunk(choice))
        out.append(_DONE)
        self.record.safety_action = "block"
        self.finished = True

    def finish_stream(self) -> bytes:
        if self.finished:
            return b""
        out: list[bytes] = []
        if self.buffer:
            out.append(self.process(b"\n\n"))
        if not self.finished:
            self._flush_all(out)
            out.append(_DONE)
            self.finished = True
        return b"".join(out)


class SSEResponse(StreamingResponse):
    """Headers now, body as the upstream produces it (no Content-Length: chunked)."""

    def __init__(self, pump: StreamPump, headers: dict[str, str]) -> None:
        super().__init__(
            pump.events(), headers={**headers, "Cache-Control": "no-cache"}, media_type="text/event-stream"
        )
        self._pump = pump

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (OSError, ClientDisconnect):
            self._pump.client_gone()
        finally:
            self._pump.close()
