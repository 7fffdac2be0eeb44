"""Network checks for the kubeadm roles' validation (stdlib ipaddress; runs on the controller)."""

from __future__ import annotations

import ipaddress
from typing import Any


def cidr_overlaps(first: str, others: str | list[str]) -> bool:
    """True when network FIRST shares an address with OTHERS (one CIDR or a list; host bits allowed)."""
    a = ipaddress.ip_network(first, strict=False)
    for other in [others] if isinstance(others, str) else others:
        b = ipaddress.ip_network(other, strict=False)
        if a.version == b.version and a.overlaps(b):
            return True
    return False


def cidr_is_valid(value: Any) -> bool:
    """True for a network in CIDR notation (a.b.c.d/n), host bits not allowed."""
    if not isinstance(value, str) or "/" not in value:
        return False
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        return False
    return True


def cidr_network(address: str, netmask: str) -> str:
    """The network (CIDR) of an interface address and its netmask, as facts give them."""
    return str(ipaddress.ip_interface(f"{address}/{netmask}").network)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"cidr_overlaps": cidr_overlaps, "cidr_is_valid": cidr_is_valid, "cidr_network": cidr_network}
