"""Network checks for the kubeadm roles' validation (stdlib ipaddress; runs on the controller)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
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


def node_ipv4_addresses(facts: Mapping[str, Any], skip: Iterable[str] = ()) -> list[dict[str, str]]:
    """Every IPv4 address of every interface in gathered FACTS (ansible_facts), primary and secondary, as
    {'interface': NAME, 'address': 'A.B.C.D/PREFIX'}; interfaces whose name matches a regex of SKIP left out.

    The setup module lists the names in `interfaces` and keeps each under its name with '-' made '_'."""
    found: list[dict[str, str]] = []
    for name in facts.get("interfaces") or []:
        if any(re.search(pattern, name) for pattern in skip):
            continue
        interface = facts.get(name.replace("-", "_")) or {}
        for entry in [interface.get("ipv4"), *(interface.get("ipv4_secondaries") or [])]:
            if not isinstance(entry, Mapping) or not entry.get("address"):
                continue
            prefix = entry.get("prefix") or entry.get("netmask") or "32"
            address = str(ipaddress.ip_interface(f"{entry['address']}/{prefix}"))
            if {"interface": name, "address": address} not in found:
                found.append({"interface": name, "address": address})
    return found


def addresses_overlapping(addresses: Iterable[Mapping[str, str]], network: str) -> list[str]:
    """'INTERFACE A.B.C.D/PREFIX' of the ADDRESSES (node_ipv4_addresses) whose network overlaps NETWORK."""
    wanted = ipaddress.ip_network(network, strict=False)
    return [
        f"{entry['interface']} {entry['address']}"
        for entry in addresses
        if ipaddress.ip_interface(entry["address"]).network.overlaps(wanted)
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "cidr_overlaps": cidr_overlaps,
            "cidr_is_valid": cidr_is_valid,
            "node_ipv4_addresses": node_ipv4_addresses,
            "addresses_overlapping": addresses_overlapping,
        }
