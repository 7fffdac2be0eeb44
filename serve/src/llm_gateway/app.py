"""Wiring: the public ASGI app (OpenAI endpoints, /health, /ready) and the internal one
(/metrics, /debug/dump_state)."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .errors import error_body
from .proxy import Proxy
from .runtime import Gateway
from .schema import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    HealthStatus,
    ModelList,
)

_PUBLIC_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready", "/openapi.json"}
)
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request; unknown fields are named"},
    401: {"model": ErrorResponse, "description": "Missing or invalid bearer token"},
    404: {"model": ErrorResponse, "description": "Unknown model"},
    413: {"model": ErrorResponse, "description": "Request body too large"},
    503: {"model": ErrorResponse, "description": "No usable upstream and the fallback is `error`"},
}
_AUTH_HEADERS = [
    {
        "name": "X-App-Name",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "The calling application, recorded in the audit trail",
    },
    {
        "name": "X-Request-ID",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "maxLength": 128},
        "description": "Taken if given (printable ASCII, at most 128), else generated; echoed",
    },
]


def _body(schema_name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
        },
        "parameters": _AUTH_HEADERS,
    }


def _completion_route(what: str, request: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
    """The documentation of a completion endpoint (the body is read by the proxy, not by FastAPI)."""
    return {
        "summary": f"{what} completion (JSON, or server-sent events with `stream: true`)",
        "openapi_extra": _body(request.__name__),
        "response_model": None,
        "responses": {
            200: {
                "model": response,
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
                "description": "The completion; X-LLM-Gateway-Fallback marks the canned fallback answer",
            },
            **_ERRORS,
        },
    }


class MetricsMiddleware:
    """Times every request to the end of its response: http_request_duration_seconds."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.metrics = gateway.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]
        try:
            await self.app(scope, receive, send_status)
        finally:
            route = path if path in _PUBLIC_ROUTES else "other"
            self.metrics.observe_http(scope["method"], route, status, time.perf_counter() - started)


def _error_response(exc: Exception) -> Response:
    if isinstance(exc, StarletteHTTPException):
        messages = {404: "Not found.", 405: "Method not allowed."}
        body = error_body(messages.get(exc.status_code, str(exc.detail)), "invalid_request_error")
        return Response(body, status_code=exc.status_code, media_type="application/json")
    body = error_body("Internal error in the gateway.", "server_error")
    return Response(body, status_code=500, media_type="application/json")


def create_public_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(
        title="LLM gateway",
        version=__version__,
        summary="OpenAI-compatible gateway in front of vLLM",
        docs_url=None,
        redoc_url=None,
    )
    proxy = Proxy(gateway)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return _error_response(exc)

    @app.post(
        "/v1/chat/completions", **_completion_route("Chat", ChatCompletionRequest, ChatCompletionResponse)
    )
    async def chat_completions(request: Request) -> Response:
        return await proxy.handle(request, chat=True)

    @app.post("/v1/completions", **_completion_route("Text", CompletionRequest, CompletionResponse))
    async def completions(request: Request) -> Response:
        return await proxy.handle(request, chat=False)

    @app.get(
        "/v1/models",
        summary="The models this gateway serves",
        openapi_extra={"parameters": _AUTH_HEADERS},
        response_model=None,
        responses={200: {"model": ModelList, "description": "Models"}, 401: _ERRORS[401]},
    )
    async def models(request: Request) -> Response:
        return proxy.list_models(request)

    @app.get(
        "/health",
        summary="Liveness: the gateway process answers",
        response_model=None,
        responses={200: {"model": HealthStatus, "description": "Alive"}},
    )
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get(
        "/ready",
        summary="Readiness: every configured model has a usable upstream that has been reached",
        response_model=None,
        responses={
            200: {"model": HealthStatus, "description": "Ready"},
            503: {"model": HealthStatus, "description": "Some model has no usable upstream"},
        },
    )
    async def ready() -> Response:
        # usable: its breaker lets requests through; reached: a request or probe through it has
        # succeeded once. A new replica (a drain moved it) is not Ready while it cannot reach its
        # upstreams yet (their Service names not resolving, their connects timing out), so clients
        # stay on the replicas that can.
        rt = gateway.runtime
        models = {
            name: any(u.weight > 0 and u.breaker.usable() and u.breaker.reached for u in ups)
            for name, ups in rt.models.items()
        }
        ok = all(models.values())
        body = orjson.dumps({"status": "ready" if ok else "not_ready", "models": models})
        return Response(body, status_code=200 if ok else 503, media_type="application/json")

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    app.add_middleware(MetricsMiddleware, gateway=gateway)
    return app


def build_openapi(app: FastAPI) -> dict[str, Any]:
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes, openapi_version="3.1.0"
    )
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for model in (ChatCompletionRequest, CompletionRequest):
        generated = copy.deepcopy(model.model_json_schema(ref_template="#/components/schemas/{model}"))
        for name, definition in generated.pop("$defs", {}).items():
            schemas[name] = definition
        schemas[model.__name__] = generated
    components["securitySchemes"] = {
        "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
    }
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models"):
        for operation in schema["paths"][path].values():
            operation["security"] = [{"bearerAuth": []}]
    schema["paths"] = dict(sorted(schema["paths"].items()))
    components["schemas"] = dict(sorted(schemas.items()))
    return schema


def create_internal_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="LLM gateway (internal)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        # rendering takes the registry's locks and some CPU: keep it off the event loop
        body = await asyncio.to_thread(gateway.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/debug/dump_state")
    async def dump_state() -> Response:
        rt = gateway.runtime
        upstreams = rt.upstreams()
        figures = await asyncio.gather(*(u.vllm_figures() for u in upstreams))
        state = {
            "version": __version__,
            "config_path": str(gateway.config_path) if gateway.config_path else None,
            "config_loaded_at": rt.loaded_at,
            "in_flight": gateway.in_flight,
            "audit": {"path": gateway.audit.path, "dropped": gateway.audit.dropped},
            "safety_terms": rt.safety.matcher.size,
            "upstreams": [{**u.snapshot(), "vllm": f} for u, f in zip(upstreams, figures, strict=True)],
        }
        return Response(orjson.dumps(state, option=orjson.OPT_INDENT_2), media_type="application/json")

    return app
