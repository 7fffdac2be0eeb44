"""ansible-playbook's output as the tests read it."""

from __future__ import annotations


def flat(text: str) -> str:
    """TEXT on one line: the callback's escaped and real line breaks and runs of spaces as one space (a long
    message is wrapped wherever its width falls)."""
    return " ".join(text.replace("\\n", " ").split())
