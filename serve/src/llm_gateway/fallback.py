"""The answer when no upstream could: a 503 in OpenAI's error format, or a canned message shaped
like a real completion (unary or streamed), marked with X-LLM-Gateway-Fallback."""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.responses import Response

from .audit import RequestRecord
from .errors import unavailable
from .runtime import Gateway, Runtime

FALLBACK_HEADER = "X-LLM-Gateway-Fallback"


def fallback_reason(reasons: list[str]) -> str:
    """One reason for the audit and the header, from what each attempt ran into."""
    if "timeout" in reasons:
        return "timeout"
    if "overloaded" in reasons and all(r in ("overloaded", "breaker_open") for r in reasons):
        return "overloaded"
    return reasons[-1] if reasons else "no_upstream"


def fallback_response(
    gw: Gateway,
    rt: Runtime,
    record: RequestRecord,
    chat: bool,
    reasons: list[str],
    headers: dict[str, str],
    *,
    stream: bool,
    include_usage: bool,
) -> Response:
    reason = fallback_reason(reasons)
    record.fallback = reason
    assert record.model is not None
    gw.metrics.fallbacks.labels(record.model, reason).inc()
    headers[FALLBACK_HEADER] = reason
    fallback = rt.config.fallback
    if fallback.mode == "error":
        gw.end(record, rt, 503, "fallback", reason)
        return unavailable(reason).response(headers)
    gw.end(record, rt, 200, "fallback", reason)
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
    head = {"id": rid, "object": obj, "created": created, "model": record.model}
    events: list[dict[str, Any]] = [{**head, "choices": [first]}]
    if include_usage:
        events.append({**head, "choices": [], "usage": usage})
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return Response(body, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
