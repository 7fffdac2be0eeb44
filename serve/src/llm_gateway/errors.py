"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response


class ApiError(Exception):
    """An error answered to the client; `kind` is what the audit record and metrics call it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, extra_headers: dict[str, str] | None = None) -> Response:
        headers = {**self.headers, **(extra_headers or {})}
        return Response(self.body(), status_code=self.status, media_type="application/json", headers=headers)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def sse_error(message: str, code: str) -> bytes:
    """An error event that ends a stream already answered 200, then [DONE]."""
    return b"data: " + error_body(message, "server_error", None, code) + b"\n\ndata: [DONE]\n\n"


def unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        type_="authentication_error",
        code="invalid_api_key",
        kind="unauthorized",
        headers={"WWW-Authenticate": "Bearer"},
    )


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist.",
        type_="invalid_request_error",
        param="model",
        code="model_not_found",
        kind="unknown_model",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than {limit} bytes.", code="body_too_large", kind="too_large"
    )


def invalid_json() -> ApiError:
    return ApiError(
        400, "We could not parse the JSON body of your request.", code="invalid_json", kind="invalid_request"
    )


def bad_upstream_answer() -> ApiError:
    return ApiError(502, "The model server sent an unreadable answer.", type_="server_error")


def unavailable(reason: str) -> ApiError:
    """No upstream answered and the fallback is `error`: 503 with the reason as code."""
    message = {
        "overloaded": "The model is overloaded; retry later.",
        "timeout": "The model did not answer in time.",
    }.get(reason, "The model is unavailable; retry later.")
    return ApiError(503, message, type_="server_error", code=reason, headers={"Retry-After": "1"})


# pydantic's names for types and validators, which OpenAI's `param` leaves out
_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "text", "image_url"}


def _param(loc: tuple[Any, ...]) -> str:
    parts = [
        str(p)
        for p in loc
        if isinstance(p, int)
        or (p not in _TYPE_WORDS and "[" not in p and not p.startswith(("function-", "constrained-")))
    ]
    return ".".join(parts)


def validation_error(exc: ValidationError) -> ApiError:
    """A request body the schema refuses, as OpenAI words it (unknown fields first)."""
    errors = exc.errors(include_url=False, include_input=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    error = unknown[0] if unknown else errors[0]
    param = _param(tuple(error["loc"]))
    if error["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
        code = "unknown_parameter"
    elif error["type"] == "json_invalid":
        return invalid_json()
    elif error["type"] == "missing":
        message, code = f"Missing required parameter: '{param}'.", "missing_required_parameter"
    elif error["type"] in ("model_type", "model_attributes_type", "dict_type") and not param:
        message, code = "The request body must be a JSON object.", "invalid_json"
    else:
        message, code = f"Invalid value for '{param}': {error['msg']}", "invalid_value"
    return ApiError(400, message, param=param or None, code=code, kind="invalid_request")
