"""from_toml: parse TOML text (the output of `containerd config dump`) on the controller."""

from __future__ import annotations

import tomllib
from typing import Any

from ansible.errors import AnsibleFilterError


def from_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(str(text))
    except tomllib.TOMLDecodeError as error:
        raise AnsibleFilterError(f"from_toml: not valid TOML: {error}") from error


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"from_toml": from_toml}
