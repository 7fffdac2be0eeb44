"""Forwarding a completion request: upstream choice and retry, timeouts, the safety filter on the
answer (streamed or not), fallback, client disconnects, and the audit record of every outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .audit import RequestRecord
from .errors import ApiError, error_body, model_not_found
from .http_client import PoolExhaustedError, UpstreamError
from .http_client import Response as UpstreamResponse
from .routing import rank, sticky_key
from .runtime import Gateway, Runtime
from .safety import StreamFilter
from .sanitize import clean_payload
from .schema import ChatCompletionRequest, CompletionRequest
from .upstream import Upstream

log = logging.getLogger("llm_gateway.proxy")

REQUEST_ID = "X-Request-ID"
UPSTREAM_HEADER = "X-LLM-Gateway-Upstream"
FALLBACK_HEADER = "X-LLM-Gateway-Fallback"
SAFETY_HEADER = "X-LLM-Gateway-Safety"
MAX_ATTEMPTS = 3
_JSON_HEADERS = (("Content-Type", "application/json"),)
_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "text", "image_url"}


class _ClientGone(Exception):
    pass


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id")
    if given and len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


def _param(loc: tuple[Any, ...]) -> str:
    parts = [
        str(p)
        for p in loc
        if isinstance(p, int)
        or (p not in _TYPE_WORDS and "[" not in p and not p.startswith(("function-", "constrained-")))
    ]
    return ".".join(parts)


def _validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False, include_input=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    error = unknown[0] if unknown else errors[0]
    param = _param(tuple(error["loc"]))
    if error["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
        code = "unknown_parameter"
    elif error["type"] == "json_invalid":
        message, param, code = "We could not parse the JSON body of your request.", "", "invalid_json"
    elif error["type"] == "missing":
        message, code = f"Missing required parameter: '{param}'.", "missing_required_parameter"
    elif error["type"] in ("model_type", "model_attributes_type") and not param:
        message, code = "The request body must be a JSON object.", "invalid_json"
    else:
        message, code = f"Invalid value for '{param}': {error['msg']}", "invalid_value"
    return ApiError(400, message, param=param or None, code=code, kind="invalid_request")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, f"The request body is larger than {limit} bytes.", code="body_too_large", kind="too_large"
        )
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413,
                    f"The request body is larger than {limit} bytes.",
                    code="body_too_large",
                    kind="too_large",
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise _ClientGone() from None
    return b"".join(chunks)


class _DisconnectWatch:
    """Cancels the request's task when the client goes away, so the upstream request is aborted."""

    __slots__ = ("_task", "_watcher", "done", "gone")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self.done = False
        self._task = asyncio.current_task()
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                if not self.done and self._task is not None:
                    self._task.cancel()
                return

    def stop(self) -> None:
        self.done = True
        self._watcher.cancel()

    def owns(self, _: BaseException) -> bool:
        """Whether a CancelledError came from us; if so, absorb it."""
        if self.gone and self._task is not None:
            self._task.uncancel()
            return True
        return False


class Proxy:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def handle(self, request: Request, chat: bool) -> Response:
        gw = self.gw
        rt = gw.runtime
        started = time.perf_counter()
        client = request.client.host if request.client else None
        record = RequestRecord(
            _request_id(request),
            "chat" if chat else "completion",
            request.headers.get("x-app-name"),
            client,
            started,
        )
        gw.in_flight += 1
        try:
            return await self._handle(request, rt, record, chat)
        finally:
            gw.in_flight -= 1

    def list_models(self, request: Request) -> Response:
        """GET /v1/models: authenticated, and audited like any request that reaches auth."""
        gw = self.gw
        rt = gw.runtime
        record = RequestRecord(
            _request_id(request),
            "models",
            request.headers.get("x-app-name"),
            request.client.host if request.client else None,
            time.perf_counter(),
        )
        headers = {REQUEST_ID: record.request_id}
        try:
            record.user = rt.auth.authenticate(request.headers.get("authorization"))
        except ApiError as exc:
            record.status = exc.status
            record.outcome = "rejected"
            record.error_type = exc.kind
            gw.finish(record, rt)
            return exc.response(headers)
        created = int(rt.loaded_at)
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "llm-gateway"} for m in rt.models
        ]
        record.status = 200
        gw.finish(record, rt)
        return Response(
            orjson.dumps({"object": "list", "data": data}), media_type="application/json", headers=headers
        )

    async def _handle(self, request: Request, rt: Runtime, record: RequestRecord, chat: bool) -> Response:
        base_headers = {REQUEST_ID: record.request_id}
        try:
            record.user = rt.auth.authenticate(request.headers.get("authorization"))
            body = await _read_body(request, rt.config.limits.max_body_bytes)
            model_cls: type[BaseModel] = ChatCompletionRequest if chat else CompletionRequest
            try:
                model_cls.model_validate_json(body)
            except ValidationError as exc:
                raise _validation_error(exc) from None
            payload: dict[str, Any] = orjson.loads(body)
            model = payload["model"]
            upstreams = rt.models.get(model)
            if upstreams is None:
                raise model_not_found(model)
            record.model = model
            record.stream = bool(payload.get("stream"))
            limits = rt.config.limits
            _, record.truncated = clean_payload(
                payload,
                chat=chat,
                strip_html=rt.config.sanitize.strip_html,
                max_chars=limits.max_input_chars,
                truncate=limits.on_overlong == "truncate",
            )
            record.payload = payload
            candidates = rank(sticky_key(record.user, payload.get("user"), record.request_id), upstreams)
        except ApiError as exc:
            record.status = exc.status
            record.outcome = "rejected"
            record.error_type = exc.kind
            self.gw.finish(record, rt)
            return exc.response(base_headers)
        except _ClientGone:
            return self._disconnected(record, rt)

        return await self._forward(request, rt, record, payload, candidates, chat, base_headers)

    def _disconnected(self, record: RequestRecord, rt: Runtime) -> Response:
        record.status = 499
        record.outcome = "client_disconnected"
        record.error_type = "client_disconnected"
        self.gw.finish(record, rt)
        return Response(status_code=499)

    # --- forwarding ----------------------------------------------------------------------
    async def _forward(
        self,
        request: Request,
        rt: Runtime,
        record: RequestRecord,
        payload: dict[str, Any],
        candidates: list[Upstream],
        chat: bool,
        headers: dict[str, str],
    ) -> Response:
        """Try the user's upstreams in turn until one answers; else the fallback.

        Unary: the whole answer within `total_s`. Stream: the headers and the first chunk within
        `first_token_s` (and `total_s`), before answering, so that a failure can still fail over
        or fall back with a proper status; the open response then goes to a _StreamPump.

        Each attempt ends in exactly one breaker verdict, and every upstream response that is not
        handed to the pump is closed here, whatever ended the attempt (timeout, client gone, a
        status that sends us to the next upstream). Closing a response not read to its end aborts
        its connection: the pool gets its slot back and vLLM stops generating.
        """
        stream = record.stream
        path = "/v1/chat/completions" if chat else "/v1/completions"
        timeouts = rt.config.timeouts
        include_usage = False
        if stream:
            options = payload.get("stream_options") or {}
            include_usage = bool(options.get("include_usage"))
            # the gateway always wants usage, for the audit and token metrics
            payload["stream_options"] = {**options, "include_usage": True}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total_s
        reasons: list[str] = []
        watch = _DisconnectWatch(request.receive)
        try:
            for upstream in candidates[:MAX_ATTEMPTS]:
                if not upstream.breaker.acquire():
                    reasons.append("breaker_open")
                    continue
                payload["model"] = upstream.served_model
                body = orjson.dumps(payload)
                limit = min(deadline, loop.time() + timeouts.first_token_s) if stream else deadline
                response: UpstreamResponse | None = None
                handed_over = False
                upstream.in_flight += 1
                try:
                    async with asyncio.timeout_at(limit):
                        response = await upstream.pool.request(
                            "POST",
                            path,
                            headers=_JSON_HEADERS,
                            body=body,
                            connect_timeout_s=timeouts.connect_s,
                        )
                        if stream and response.status == 200:
                            data = await response.next_chunk() or b""
                        else:
                            data = await response.read()
                    status = response.status
                    if status in (429, 503):
                        upstream.breaker.record_neutral()
                        reasons.append("overloaded")
                        continue
                    if status >= 500:
                        upstream.breaker.record_failure(f"HTTP {status}")
                        reasons.append("upstream_error")
                        continue
                    record.upstream = upstream.name
                    record.served_model = upstream.served_model
                    headers[UPSTREAM_HEADER] = upstream.name
                    if status != 200:
                        # the upstream refused the request itself (bad sampling values, context too long)
                        upstream.breaker.record_success()
                        record.status = status
                        record.outcome = "upstream_rejected"
                        record.error_type = f"upstream_{status}"
                        self.gw.finish(record, rt)
                        return Response(
                            data, status_code=status, media_type="application/json", headers=headers
                        )
                    if not stream:
                        upstream.breaker.record_success()
                        return self._unary_ok(rt, record, data, chat, headers)
                    # from here the pump owns the response, the in-flight count and the verdict
                    pump = _StreamPump(self.gw, rt, record, upstream, response, data, chat, include_usage)
                    handed_over = True
                    return _SSEResponse(pump, headers)
                except TimeoutError:
                    upstream.breaker.record_failure("first token timeout" if stream else "timeout")
                    reasons.append("timeout")
                    record.upstream = upstream.name
                    break  # the time budget is spent: no other upstream gets the request
                except PoolExhaustedError:
                    upstream.breaker.record_neutral()
                    reasons.append("overloaded")
                    continue
                except UpstreamError as exc:
                    upstream.breaker.record_failure(str(exc))
                    reasons.append("unreachable")
                    continue
                except BaseException:
                    # the client went away (cancelled), or a bug: neither says anything about the upstream
                    upstream.breaker.record_neutral()
                    raise
                finally:
                    if not handed_over:
                        upstream.in_flight -= 1
                        if response is not None:
                            response.close()  # idempotent; aborts the connection if not read to the end
            return self._fallback(
                rt, record, chat, reasons, headers, stream=stream, include_usage=include_usage
            )
        except asyncio.CancelledError as exc:
            if watch.owns(exc):
                return self._disconnected(record, rt)
            raise
        finally:
            watch.stop()

    def _unary_ok(
        self, rt: Runtime, record: RequestRecord, data: bytes, chat: bool, headers: dict[str, str]
    ) -> Response:
        try:
            doc = orjson.loads(data)
            choices = doc.get("choices") or []
        except (orjson.JSONDecodeError, AttributeError):
            record.status = 502
            record.outcome = "upstream_error"
            record.error_type = "bad_upstream_response"
            self.gw.finish(record, rt)
            return ApiError(
                502, "The model server sent an unreadable answer.", type_="server_error"
            ).response(headers)
        safety = rt.safety
        if safety.enabled:
            for choice in choices:
                holder = choice.get("message") if chat else choice
                key = "content" if chat else "text"
                if not isinstance(holder, dict) or not isinstance(holder.get(key), str):
                    continue
                result = safety.check(holder[key])
                if result.hit:
                    if safety.action == "block":
                        holder[key] = safety.block_message
                        choice["finish_reason"] = "content_filter"
                        record.safety_action = "block"
                    else:
                        holder[key] = result.text
                        if record.safety_action == "none":
                            record.safety_action = "mask"
        usage = doc.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        doc["model"] = record.model
        if record.safety_action != "none":
            headers[SAFETY_HEADER] = record.safety_action
        record.status = 200
        self.gw.finish(record, rt)
        return Response(orjson.dumps(doc), media_type="application/json", headers=headers)

    # --- fallback ------------------------------------------------------------------------
    def _fallback(
        self,
        rt: Runtime,
        record: RequestRecord,
        chat: bool,
        reasons: list[str],
        headers: dict[str, str],
        *,
        stream: bool,
        include_usage: bool = False,
    ) -> Response:
        reason = "timeout" if "timeout" in reasons else (reasons[-1] if reasons else "no_upstream")
        if reasons and all(r in ("overloaded", "breaker_open") for r in reasons) and "overloaded" in reasons:
            reason = "overloaded"
        record.fallback = reason
        record.error_type = reason
        record.outcome = "fallback"
        assert record.model is not None
        self.gw.metrics.fallbacks.labels(record.model, reason).inc()
        headers[FALLBACK_HEADER] = reason
        fallback = rt.config.fallback
        if fallback.mode == "error":
            record.status = 503
            self.gw.finish(record, rt)
            message = {
                "overloaded": "The model is overloaded; retry later.",
                "timeout": "The model did not answer in time.",
            }.get(reason, "The model is unavailable; retry later.")
            return ApiError(
                503, message, type_="server_error", code=reason, headers={"Retry-After": "1"}
            ).response(headers)
        record.status = 200
        self.gw.finish(record, rt)
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + record.request_id
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        if not stream:
            if chat:
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": {"role": "assistant", "content": fallback.message},
                    "finish_reason": "stop",
                }
            else:
                choice = {"index": 0, "text": fallback.message, "finish_reason": "stop"}
            doc = {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": record.model,
                "choices": [choice],
                "usage": usage,
            }
            return Response(orjson.dumps(doc), media_type="application/json", headers=headers)
        obj = "chat.completion.chunk" if chat else "text_completion"
        if chat:
            first = {
                "index": 0,
                "delta": {"role": "assistant", "content": fallback.message},
                "finish_reason": "stop",
            }
        else:
            first = {"index": 0, "text": fallback.message, "finish_reason": "stop"}
        events = [{"id": rid, "object": obj, "created": created, "model": record.model, "choices": [first]}]
        if include_usage:
            events.append(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": record.model,
                    "choices": [],
                    "usage": usage,
                }
            )
        body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return Response(
            body, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )


class _SSEResponse(Response):
    """Headers now, body as the upstream produces it (no Content-Length: chunked)."""

    media_type = "text/event-stream"

    def __init__(self, pump: _StreamPump, headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]
        self._pump = pump

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._pump.run(receive, send, self.raw_headers)


class _StreamPump:
    """Moves one stream from upstream to client through the safety filter."""

    def __init__(
        self,
        gw: Gateway,
        rt: Runtime,
        record: RequestRecord,
        upstream: Upstream,
        response: Any,
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
        self.filters: dict[int, StreamFilter] = {}
        self.buffer = bytearray()
        self.finished = False  # [DONE] sent or the stream was cut by the filter
        self.content_chunks = 0
        self.meta: dict[str, Any] = {}
        self.new_filter: Callable[[], StreamFilter] = rt.safety.stream

    async def run(self, receive: Receive, send: Send, raw_headers: list[tuple[bytes, bytes]]) -> None:
        record, upstream, breaker = self.record, self.upstream, self.upstream.breaker
        timeouts = self.rt.config.timeouts
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total_s - (time.perf_counter() - record.started)
        watch = _DisconnectWatch(receive)
        record.status = 200
        try:
            await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
            out = self.process(self.first)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            response = self.response
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
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            tail = self.finish_stream()
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            breaker.record_success()
        except TimeoutError:
            breaker.record_failure("stream stalled")
            record.outcome = "timeout"
            record.error_type = "upstream_timeout"
            await self._send_error(send, "The model stopped sending tokens in time.", "timeout")
        except UpstreamError as exc:
            breaker.record_failure(str(exc))
            record.outcome = "upstream_error"
            record.error_type = "upstream_stream_broken"
            await self._send_error(send, "The model server ended the stream unexpectedly.", "upstream_error")
        except asyncio.CancelledError as exc:
            if not watch.owns(exc):
                raise
            breaker.record_neutral()
            record.status = 499
            record.outcome = "client_disconnected"
            record.error_type = "client_disconnected"
        except OSError:
            breaker.record_neutral()
            record.status = 499
            record.outcome = "client_disconnected"
            record.error_type = "client_disconnected"
        finally:
            watch.stop()
            # not read to the end: closing aborts the connection, and vLLM stops generating
            self.response.close()
            upstream.in_flight -= 1
            if record.completion_tokens is None and self.content_chunks:
                record.completion_tokens = self.content_chunks
                record.usage_estimated = True
            self.gw.finish(record, self.rt)

    async def _send_error(self, send: Send, message: str, code: str) -> None:
        body = b"data: " + error_body(message, "server_error", None, code) + b"\n\ndata: [DONE]\n\n"
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": body, "more_body": False})

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
            out.append(b"data: [DONE]\n\n")
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
            record.outcome = "upstream_error"
            record.error_type = "upstream_stream_error"
            out.append(b"data: " + data + b"\n\n")
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        if not self.include_usage and "usage" in chunk:
            del chunk["usage"]
        choices = chunk.get("choices") or []
        if not choices and not self.include_usage:
            return
        self.meta = {"id": chunk.get("id"), "object": chunk.get("object"), "created": chunk.get("created")}
        key = "content" if self.chat else "text"
        for choice in choices:
            index = choice.get("index", 0)
            flt = self.filters.get(index)
            if flt is None:
                flt = self.filters[index] = self.new_filter()
            holder = (choice.get("delta") or {}) if self.chat else choice
            text = holder.get(key)
            sent = ""
            if isinstance(text, str) and text:
                self.content_chunks += 1
                sent = flt.feed(text)
            if choice.get("finish_reason") is not None:
                sent += flt.flush()
            if flt.blocked:
                self._block(index, out)
                return
            if isinstance(text, str) or sent:
                holder[key] = sent
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
        for index, flt in self.filters.items():
            rest = flt.flush()
            if rest:
                if self.chat:
                    out.append(
                        self._chunk({"index": index, "delta": {"content": rest}, "finish_reason": None})
                    )
                else:
                    out.append(self._chunk({"index": index, "text": rest, "finish_reason": None}))

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
        out.append(b"data: [DONE]\n\n")
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
            out.append(b"data: [DONE]\n\n")
            self.finished = True
        return b"".join(out)
