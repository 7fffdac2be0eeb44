"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import orjson
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
