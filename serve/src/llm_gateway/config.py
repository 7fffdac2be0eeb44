"""The gateway's YAML configuration: its schema, and loading it with errors that name the key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(Exception):
    """The configuration is wrong; the message names the offending key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Section):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=0, le=65535)


class InternalListenConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(9000, ge=0, le=65535)


class AuthConfig(_Section):
    mode: Literal["jwt", "none"] = "jwt"
    hs256_secret_env: str | None = None
    jwks_file: Path | None = None
    audience: str | None = None
    issuer: str | None = None
    leeway_s: float = Field(30.0, ge=0, le=600)
    require_exp: bool = True

    @model_validator(mode="after")
    def _one_key_source(self) -> AuthConfig:
        if self.mode == "jwt" and (self.hs256_secret_env is None) == (self.jwks_file is None):
            raise ValueError("with mode jwt, set exactly one of hs256_secret_env or jwks_file")
        return self


class UpstreamConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str
    served_model: str = Field(min_length=1)
    weight: int = Field(1, ge=0, le=10_000)
    max_connections: int = Field(256, ge=1, le=10_000)
    # https:// upstreams: the server's certificate is verified against this CA bundle (PEM),
    # or the system's trust store without one. tls_verify: false turns verification off.
    ca_file: Path | None = None
    tls_verify: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("must be a base URL without path, query or fragment")
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"bad port: {exc}") from None
        return value.rstrip("/")

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def tls(self) -> bool:
        return self.url.startswith("https://")

    @model_validator(mode="after")
    def _tls_settings(self) -> UpstreamConfig:
        if not self.tls and (self.ca_file is not None or not self.tls_verify):
            raise ValueError("ca_file and tls_verify apply to https:// upstreams only")
        return self


class ModelConfig(_Section):
    upstreams: list[UpstreamConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_and_weights(self) -> ModelConfig:
        names = [u.name for u in self.upstreams]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"upstream names must be unique, repeated: {', '.join(duplicates)}")
        if sum(u.weight for u in self.upstreams) == 0:
            raise ValueError("at least one upstream needs a weight above 0")
        return self


class LimitsConfig(_Section):
    max_input_chars: int = Field(8192, ge=1)
    on_overlong: Literal["reject", "truncate"] = "reject"
    max_body_bytes: int = Field(1 << 20, ge=1024)
    max_concurrent_requests: int = Field(2048, ge=1)


class TimeoutsConfig(_Section):
    connect_s: float = Field(2.0, gt=0)
    first_token_s: float = Field(30.0, gt=0)
    between_tokens_s: float = Field(10.0, gt=0)
    total_s: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> TimeoutsConfig:
        if self.first_token_s > self.total_s:
            raise ValueError("first_token_s cannot exceed total_s")
        return self


class BreakerConfig(_Section):
    failures_to_open: int = Field(5, ge=1)
    open_s: float = Field(15.0, gt=0)
    probe_interval_s: float = Field(5.0, gt=0)
    probe_timeout_s: float = Field(2.0, gt=0)


class SanitizeConfig(_Section):
    strip_html: bool = False


class SafetyConfig(_Section):
    terms_file: Path | None = None
    terms: list[str] = Field(default_factory=list)
    action: Literal["mask", "block"] = "mask"
    mask_char: str = Field("*", min_length=1, max_length=1)
    block_message: str = ""


class FallbackConfig(_Section):
    mode: Literal["message", "error"] = "error"
    message: str = "系统繁忙，请稍后再试"


class AuditConfig(_Section):
    path: str = Field(min_length=1)  # "-" writes to stdout
    prompts: Literal["off", "hashed", "full"] = "hashed"
    queue_size: int = Field(10_000, ge=1)


class GatewayConfig(_Section):
    listen: ListenConfig = ListenConfig()
    internal: InternalListenConfig = InternalListenConfig()
    auth: AuthConfig  # required: running without authentication must be written down (mode: none)
    models: dict[str, ModelConfig] = Field(min_length=1)
    limits: LimitsConfig = LimitsConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    breaker: BreakerConfig = BreakerConfig()
    sanitize: SanitizeConfig = SanitizeConfig()
    safety: SafetyConfig = SafetyConfig()
    fallback: FallbackConfig = FallbackConfig()
    audit: AuditConfig

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for name in value:
            if not name or len(name) > 128 or any(c.isspace() for c in name):
                raise ValueError(f"bad model name {name!r}")
        return value


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def parse_config(data: Any, *, base_dir: Path | None = None) -> GatewayConfig:
    """Validate an already-loaded mapping; ConfigError names the first offending key."""
    if not isinstance(data, dict):
        raise ConfigError("(top level): the configuration must be a YAML mapping")
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            loc = tuple(error["loc"])
            message = error["msg"]
            if error["type"] == "extra_forbidden":
                message = "unknown key"
            elif error["type"] == "missing" and loc == ("auth",):
                message = (
                    "required: mode: jwt with hs256_secret_env or jwks_file, "
                    "or mode: none to run without authentication"
                )
            problems.append(f"{_key_path(loc)}: {message}")
        raise ConfigError("; ".join(problems)) from None
    return _resolve_paths(config, base_dir)


def _check_audit_path(value: str) -> None:
    """The audit file must be writable now: found at start (and by --check), not by the writer."""
    if value == "-":
        return
    path = Path(value)  # as given: relative to the working directory, as the writer opens it
    if path.is_dir():
        raise ConfigError(f"audit.path: {path} is a directory, not a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"audit.path: {path} is not writable")
        return
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"audit.path: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"audit.path: directory {parent} is not writable")


def _resolve_paths(config: GatewayConfig, base_dir: Path | None) -> GatewayConfig:
    """Relative file paths are relative to the config file, and must exist now, not at first use."""
    _check_audit_path(config.audit.path)
    base = base_dir or Path.cwd()
    safety, auth = config.safety, config.auth
    if safety.terms_file is not None:
        path = safety.terms_file if safety.terms_file.is_absolute() else base / safety.terms_file
        if not path.is_file():
            raise ConfigError(f"safety.terms_file: {path} is not a readable file")
        safety = safety.model_copy(update={"terms_file": path})
    if auth.jwks_file is not None:
        path = auth.jwks_file if auth.jwks_file.is_absolute() else base / auth.jwks_file
        if not path.is_file():
            raise ConfigError(f"auth.jwks_file: {path} is not a readable file")
        auth = auth.model_copy(update={"jwks_file": path})
    models = {}
    for model_name, model in config.models.items():
        upstreams = []
        for i, upstream in enumerate(model.upstreams):
            if upstream.ca_file is not None:
                path = upstream.ca_file if upstream.ca_file.is_absolute() else base / upstream.ca_file
                if not path.is_file():
                    raise ConfigError(
                        f"models.{model_name}.upstreams.{i}.ca_file: {path} is not a readable file"
                    )
                upstream = upstream.model_copy(update={"ca_file": path})
            upstreams.append(upstream)
        models[model_name] = model.model_copy(update={"upstreams": upstreams})
    if auth.mode == "jwt" and auth.hs256_secret_env is not None and not os.environ.get(auth.hs256_secret_env):
        raise ConfigError(f"auth.hs256_secret_env: environment variable {auth.hs256_secret_env} is not set")
    return config.model_copy(update={"safety": safety, "auth": auth, "models": models})


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_config(data, base_dir=path.parent.resolve())
