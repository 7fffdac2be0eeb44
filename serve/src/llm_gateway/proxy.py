"""Forwarding a completion request: intake (auth, body, validation, cleaning), the choice of
upstream and retry, timeouts, the breaker's verdict per attempt, and the hand-off to the unary
answer, the stream (streaming.py) or the fallback (fallback.py)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive

from .audit import RequestRecord
from .errors import (
    ApiError,
    bad_upstream_answer,
    body_too_large,
    invalid_json,
    model_not_found,
    validation_error,
)
from .fallback import fallback_response
from .filtering import NONE, filter_unary
from .http_client import PoolExhaustedError, UpstreamError
from .http_client import Response as UpstreamResponse
from .routing import rank, sticky_key
from .runtime import Gateway, Runtime
from .sanitize import clean_payload
from .schema import ChatCompletionRequest, CompletionRequest
from .streaming import SSEResponse, StreamPump
from .upstream import Upstream

log = logging.getLogger("llm_gateway.proxy")

REQUEST_ID = "X-Request-ID"
UPSTREAM_HEADER = "X-LLM-Gateway-Upstream"
SAFETY_HEADER = "X-LLM-Gateway-Safety"
MAX_ATTEMPTS = 3
_JSON_HEADERS = (("Content-Type", "application/json"),)


class _ClientGone(Exception):
    pass


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id")
    if given and len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


def _new_record(request: Request, kind: str) -> RequestRecord:
    return RequestRecord(
        _request_id(request),
        kind,
        request.headers.get("x-app-name"),
        request.client.host if request.client else None,
        time.perf_counter(),
    )


def _parse(body: bytes, chat: bool) -> dict[str, Any]:
    """The body parsed once: orjson reads it, the schema checks the result."""
    model_cls: type[BaseModel] = ChatCompletionRequest if chat else CompletionRequest
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        # error path only: pydantic's own parse names the field where it can (an int past 64 bits)
        try:
            model_cls.model_validate_json(body)
        except ValidationError as exc:
            raise validation_error(exc) from None
        raise invalid_json() from None
    try:
        model_cls.model_validate(payload)
    except ValidationError as exc:
        raise validation_error(exc) from None
    return payload  # type: ignore[no-any-return]  # a dict: the schema is an object


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
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
        record = _new_record(request, "chat" if chat else "completion")
        gw.in_flight += 1
        try:
            return await self._handle(request, gw.runtime, record, chat)
        finally:
            gw.in_flight -= 1

    def list_models(self, request: Request) -> Response:
        """GET /v1/models: authenticated, and audited like any request that reaches auth."""
        rt = self.gw.runtime
        record = _new_record(request, "models")
        headers = {REQUEST_ID: record.request_id}
        try:
            record.user = rt.auth.authenticate(request.headers.get("authorization"))
        except ApiError as exc:
            return self._reject(record, rt, exc, headers)
        created = int(rt.loaded_at)
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "llm-gateway"} for m in rt.models
        ]
        self.gw.end(record, rt, 200)
        return Response(
            orjson.dumps({"object": "list", "data": data}), media_type="application/json", headers=headers
        )

    def _reject(self, record: RequestRecord, rt: Runtime, exc: ApiError, headers: dict[str, str]) -> Response:
        self.gw.end(record, rt, exc.status, "rejected", exc.kind)
        return exc.response(headers)

    def _disconnected(self, record: RequestRecord, rt: Runtime) -> Response:
        self.gw.end(record, rt, 499, "client_disconnected", "client_disconnected")
        return Response(status_code=499)

    async def _handle(self, request: Request, rt: Runtime, record: RequestRecord, chat: bool) -> Response:
        headers = {REQUEST_ID: record.request_id}
        try:
            record.user = rt.auth.authenticate(request.headers.get("authorization"))
            payload = _parse(await _read_body(request, rt.config.limits.max_body_bytes), chat)
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
            return self._reject(record, rt, exc, headers)
        except _ClientGone:
            return self._disconnected(record, rt)
        return await self._forward(request, rt, record, payload, candidates, chat, headers)

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
        or fall back with a proper status; the open response then goes to a StreamPump.

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
                        self.gw.end(record, rt, status, "upstream_rejected", f"upstream_{status}")
                        return Response(
                            data, status_code=status, media_type="application/json", headers=headers
                        )
                    if not stream:
                        return self._unary_ok(rt, record, upstream, data, chat, headers)
                    # from here the pump owns the response, the in-flight count and the verdict
                    pump = StreamPump(self.gw, rt, record, upstream, response, data, chat, include_usage)
                    handed_over = True
                    return SSEResponse(pump, headers)
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
            return fallback_response(
                self.gw, rt, record, chat, reasons, headers, stream=stream, include_usage=include_usage
            )
        except asyncio.CancelledError as exc:
            if watch.owns(exc):
                return self._disconnected(record, rt)
            raise
        finally:
            watch.stop()

    def _unary_ok(
        self,
        rt: Runtime,
        record: RequestRecord,
        upstream: Upstream,
        data: bytes,
        chat: bool,
        headers: dict[str, str],
    ) -> Response:
        """A 200 answer: unreadable is the upstream's failure (a 502); else filtered and passed on."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("choices", []), list):
            upstream.breaker.record_failure("unreadable answer")
            self.gw.end(record, rt, 502, "upstream_error", "bad_upstream_response")
            return bad_upstream_answer().response(headers)
        upstream.breaker.record_success()
        if rt.safety.enabled:
            action = filter_unary(rt.safety, doc, chat)
            if action != NONE:
                record.safety_action = action
                headers[SAFETY_HEADER] = action
        usage = doc.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        doc["model"] = record.model
        self.gw.end(record, rt, 200)
        return Response(orjson.dumps(doc), media_type="application/json", headers=headers)
