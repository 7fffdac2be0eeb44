"""Weighted, sticky choice of an upstream: weighted rendezvous hashing on the user.

Each upstream scores -ln(u)/weight, u a hash of (user, upstream name) in (0, 1); the user's
order of preference is by score. A user therefore keeps the same upstream for as long as the
weights stay, the shares converge to the weights, changing one weight moves only the users it
must, and when the first choice is unusable the next is a stable second choice.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Sequence

from .upstream import Upstream

_SCALE = float(1 << 64)


def _unit_hash(key: str, name: str) -> float:
    digest = hashlib.blake2b(f"{key}\x00{name}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SCALE


def rank(key: str, upstreams: Sequence[Upstream]) -> list[Upstream]:
    """Upstreams with weight > 0, the user's preferred first."""
    scored = [(-math.log(_unit_hash(key, u.name)) / u.weight, u) for u in upstreams if u.weight > 0]
    scored.sort(key=lambda pair: pair[0])
    return [u for _, u in scored]


def sticky_key(user: str | None, body_user: object, request_id: str) -> str:
    """The authenticated user, else the request's `user` field, else nothing sticky."""
    if user:
        return "sub:" + user
    if isinstance(body_user, str) and body_user:
        return "user:" + body_user
    return "anon:" + (request_id or uuid.uuid4().hex)
