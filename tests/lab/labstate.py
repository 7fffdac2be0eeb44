"""Where the lab's state lives (SSH key, registry CA, mirror, image digests, download cache): per machine.

The lab is one per machine: its containers (gpu-node-1..3, lab-mirror), their SSH ports, its network and
volumes have machine-wide names, so two checkouts on one machine drive the same lab. Its state is per machine
too, ${XDG_STATE_HOME:-~/.local/state}/llm-lab, and each checkout reaches it as .lab, a link labctl.py makes
(the lab inventory, docs and commands name .lab/...): a new clone finds the lab an earlier one left, as the
Go build cache (~/.cache/llm-lab/go) is found. LAB_STATE_DIR names another directory; a checkout whose .lab is
a directory of its own (made before this) keeps using it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = REPO / ".lab"


def machine_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llm-lab"


def state_dir(link: Path = LINK) -> Path:
    """The lab state directory (absolute, links resolved); computed only, nothing made."""
    if os.environ.get("LAB_STATE_DIR"):
        return Path(os.environ["LAB_STATE_DIR"]).resolve()
    if link.is_symlink() or link.exists():
        return link.resolve()
    return machine_state_dir().resolve()


STATE = state_dir()


def link_checkout(state: Path = STATE, link: Path = LINK) -> None:
    """Make the state directory, and the checkout's .lab a link to it (nothing when .lab already exists or
    LAB_STATE_DIR names the state)."""
    state.mkdir(parents=True, exist_ok=True)
    if not os.environ.get("LAB_STATE_DIR") and not (link.is_symlink() or link.exists()):
        link.symlink_to(state, target_is_directory=True)


def unlink_checkout(link: Path = LINK) -> None:
    """Remove the checkout's .lab link (labctl.py destroy removes the directory it points to)."""
    if link.is_symlink():
        link.unlink()
