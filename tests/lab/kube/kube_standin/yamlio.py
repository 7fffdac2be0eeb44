"""YAML for the node-side stand-ins: PyYAML (Debian's python3-yaml, in the lab node image).

Kubernetes reads YAML by converting it to JSON first (sigs.k8s.io/yaml); PyYAML's safe loader gives the
same scalars for what kubeadm configs and kubeconfigs hold (strings, ints, floats, bools, null).
"""

from __future__ import annotations

import sys
from typing import Any

try:
    import yaml
except ImportError:  # pragma: no cover - the lab image installs python3-yaml
    sys.stderr.write("kube-standin: python3-yaml is missing on this node (the lab image installs it)\n")
    raise SystemExit(1) from None


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def load_yaml_file(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_all(text: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


YAMLError = yaml.YAMLError
