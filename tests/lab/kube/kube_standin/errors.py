"""metav1.Status error shapes (k8s.io/apimachinery/pkg/api/errors)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out

    @staticmethod
    def _qual(group: str, plural: str) -> str:
        return f"{plural}.{group}" if group else plural

    @classmethod
    def not_found(cls, group: str, plural: str, name: str) -> ApiError:
        return cls(
            404,
            "NotFound",
            f'{cls._qual(group, plural)} "{name}" not found',
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def already_exists(cls, group: str, plural: str, name: str) -> ApiError:
        return cls(
            409,
            "AlreadyExists",
            f'{cls._qual(group, plural)} "{name}" already exists',
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def conflict(cls, group: str, plural: str, name: str, why: str) -> ApiError:
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {cls._qual(group, plural)} "{name}": {why}',
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def invalid(cls, group: str, kind: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
        """causes: (reason e.g. FieldValueRequired, field, message)."""
        msg = "; ".join(f"{f}: {m}" for _, f, m in causes)
        return cls(
            422,
            "Invalid",
            f'{kind}{"." + group if group else ""} "{name}" is invalid: {msg}',
            {
                "name": name,
                "group": group,
                "kind": kind,
                "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes],
            },
        )

    @classmethod
    def invalid_simple(cls, message: str) -> ApiError:
        return cls(422, "Invalid", message)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def forbidden(
        cls, user: str, verb: str, group: str, plural: str, namespace: str, name: str = "", sub: str = ""
    ) -> ApiError:
        res = plural + (f"/{sub}" if sub else "")
        where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
        named = f' "{name}"' if name else ""
        msg = (
            f'{cls._qual(group, plural)}{named} is forbidden: User "{user}" cannot {verb} resource "{res}" '
            f'in API group "{group}"{where}'
        )
        return cls(403, "Forbidden", msg, {"name": name, "group": group, "kind": plural})

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    @classmethod
    def too_many_requests(cls, message: str, causes: list[dict[str, str]] | None = None) -> ApiError:
        return cls(429, "TooManyRequests", message, {"causes": causes or []})
