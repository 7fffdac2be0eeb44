"""JWT bearer authentication: HS256 with a secret from the environment, or RS256 from a JWKS file.

The user id is the token's `sub`. Verified tokens are cached (bounded, until their `exp`), since
applications reuse one token for many requests and signature checks are the costliest step here.
The secret is never logged or put in an error message.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Any, Protocol

import jwt

from .config import AuthConfig, ConfigError
from .errors import ApiError, unauthorized

log = logging.getLogger("llm_gateway.auth")

_CACHE_SIZE = 4096
# RFC 7518 3.2: an HS256 key must be at least as long as the hash output.
MIN_HS256_SECRET_BYTES = 32
_CACHE_TTL_WITHOUT_EXP_S = 60.0


class Authenticator(Protocol):
    def authenticate(self, authorization: str | None) -> str | None:
        """The user id, None when authentication is off; raises ApiError (401)."""


class NoAuth:
    def authenticate(self, authorization: str | None) -> str | None:
        return None


class JwtAuth:
    def __init__(self, config: AuthConfig) -> None:
        self._options: Any = {"require": ["sub", "exp"] if config.require_exp else ["sub"]}
        self._audience = config.audience
        self._issuer = config.issuer
        self._leeway = config.leeway_s
        self._secret: str | None = None
        self._keys: dict[str | None, Any] = {}
        if config.hs256_secret_env is not None:
            secret = os.environ.get(config.hs256_secret_env)
            if not secret:
                raise ConfigError(
                    f"auth.hs256_secret_env: environment variable {config.hs256_secret_env} is not set"
                )
            if len(secret.encode()) < MIN_HS256_SECRET_BYTES:
                # the variable's name only: neither the secret nor its length is logged
                log.warning(
                    "auth.hs256_secret_env: the secret in %s is shorter than %d bytes, which makes "
                    "tokens guessable offline; use a random one, e.g. `openssl rand -hex 32`",
                    config.hs256_secret_env,
                    MIN_HS256_SECRET_BYTES,
                )
            self._secret = secret
            self._algorithms = ["HS256"]
        else:
            assert config.jwks_file is not None
            try:
                jwks = jwt.PyJWKSet.from_json(config.jwks_file.read_text(encoding="utf-8"))
            except (OSError, jwt.PyJWTError, ValueError) as exc:
                raise ConfigError(f"auth.jwks_file: cannot load {config.jwks_file}: {exc}") from None
            for key in jwks.keys:
                if key.algorithm_name not in ("RS256", None) and key.key_type != "RSA":
                    continue
                self._keys[key.key_id] = key.key
            if not self._keys:
                raise ConfigError(f"auth.jwks_file: {config.jwks_file} holds no RSA key")
            self._algorithms = ["RS256"]
        self._cache: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def _key_for(self, token: str) -> Any:
        if self._secret is not None:
            return self._secret
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise unauthorized(f"Invalid bearer token: {exc}") from None
        if kid in self._keys:
            return self._keys[kid]
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        raise unauthorized("Invalid bearer token: unknown signing key")

    def authenticate(self, authorization: str | None) -> str | None:
        if not authorization:
            raise unauthorized("Missing bearer token in the Authorization header.")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("The Authorization header must be `Bearer <token>`.")
        now = time.time()
        cached = self._cache.get(token)
        if cached is not None:
            if cached[1] > now:
                self._cache.move_to_end(token)
                return cached[0]
            del self._cache[token]
        try:
            claims = jwt.decode(
                token,
                self._key_for(token),
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options=self._options,
            )
        except ApiError:
            raise
        except jwt.PyJWTError as exc:
            raise unauthorized(f"Invalid bearer token: {exc}") from None
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub or len(sub) > 256:
            raise unauthorized("Invalid bearer token: `sub` must be a non-empty string.")
        exp = claims.get("exp")
        valid_until = (
            float(exp) + self._leeway if isinstance(exp, int | float) else now + _CACHE_TTL_WITHOUT_EXP_S
        )
        self._cache[token] = (sub, valid_until)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return sub


def build_authenticator(config: AuthConfig) -> Authenticator:
    if config.mode == "none":
        log.warning("auth.mode is none: requests are not authenticated and audit lines carry no user")
        return NoAuth()
    return JwtAuth(config)
