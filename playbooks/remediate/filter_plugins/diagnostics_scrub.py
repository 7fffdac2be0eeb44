"""Filters of the remediation playbooks (found by Ansible next to the playbooks that use them).

``diagnostics_scrub(text, secrets=())``: the text with every secret replaced by ``<redacted:KIND>``, so
that a diagnostics tarball can be handed to a vendor or pasted into a ticket:

* the literal values in ``secrets`` (the gateway's JWT secret, ...), wherever they appear;
* PEM private keys (``-----BEGIN ... PRIVATE KEY-----`` to ``-----END ... PRIVATE KEY-----``);
* JSON Web Tokens (``eyJ...``.``...``.``...``): ServiceAccount tokens and client JWTs;
* kubeadm bootstrap / join tokens (``abcdef.0123456789abcdef``);
* ``Bearer <credential>`` and the values of ``token``, ``secret``, ``password`` keys (``key: value``,
  ``key=value``, ``"key": "value"``), and ``client-key-data`` / ``token`` fields of kubeconfigs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|\Z)", re.DOTALL
)
JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
BOOTSTRAP_TOKEN = re.compile(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b")
BEARER = re.compile(r"(?i)(\bbearer\s+)[^\s\"',]+")
KEY_VALUE = re.compile(
    r"(?i)(\"?\b(?:[a-z0-9_-]*(?:token|secret|password|passwd)|client-key-data)\"?\s*[:=]\s*\"?)"
    r"(?!<redacted)([^\s\"',}]+)"
)


def diagnostics_scrub(text: Any, secrets: Iterable[Any] = ()) -> str:
    """TEXT with the secrets replaced (see the module's docstring)."""
    out = "" if text is None else str(text)
    for secret in sorted({str(s) for s in secrets or () if s is not None and len(str(s)) >= 4}, key=len)[
        ::-1
    ]:
        out = out.replace(secret, "<redacted:secret>")
    out = PRIVATE_KEY.sub("<redacted:private-key>", out)
    out = JWT.sub("<redacted:jwt>", out)
    out = BOOTSTRAP_TOKEN.sub("<redacted:bootstrap-token>", out)
    out = BEARER.sub(r"\1<redacted:credential>", out)
    return KEY_VALUE.sub(r"\1<redacted:value>", out)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"diagnostics_scrub": diagnostics_scrub}
