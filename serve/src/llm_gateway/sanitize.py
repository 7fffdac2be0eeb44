"""Input cleaning: invisible and bidi controls out, HTML to text where configured, length limits.

Only user-visible text is touched: string contents of messages, text parts, string prompts.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

# Characters that render as nothing but change how text reads or tokenizes: bidi embeddings,
# overrides and isolates (the "Trojan Source" set), zero-width space, direction marks, word
# joiner and invisible operators, the BOM, soft hyphen, Mongolian vowel separator, deprecated
# format controls, interlinear annotation marks, Unicode tag characters (used to smuggle
# invisible ASCII instructions), and C0/C1 controls other than tab, newline and carriage return.
# ZWJ (U+200D) and ZWNJ (U+200C) stay: emoji sequences and Persian and Indic scripts need them.
_INVISIBLE: list[int] = [
    0x00AD,
    0x061C,
    0x180E,
    0x200B,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2060, 0x2065),
    *range(0x2066, 0x206A),
    *range(0x206A, 0x2070),
    0xFEFF,
    *range(0xFFF9, 0xFFFC),
    *range(0xE0000, 0xE0080),
    *[c for c in range(0x00, 0x20) if c not in (0x09, 0x0A, 0x0D)],
    *range(0x7F, 0xA0),
]
_TRANSLATION: dict[int, None] = dict.fromkeys(_INVISIBLE)
INVISIBLE_CHARS = frozenset(chr(c) for c in _INVISIBLE)

_SCRIPT_STYLE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_BLOCK_TAG = re.compile(r"</?(?:p|div|br|li|ul|ol|tr|table|h[1-6]|section|article)\b[^>]*>", re.IGNORECASE)
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]*(?:\s[^<>]*)?/?>")
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_SPACES = re.compile(r"[ \t]{2,}")


def html_to_text(text: str) -> str:
    """Tags out, entities decoded, block elements kept as line breaks. `a < b` is left alone."""
    text = _COMMENT.sub("", _SCRIPT_STYLE.sub("", text))
    text = _BLOCK_TAG.sub("\n", text)
    text = _TAG.sub("", text)
    text = html.unescape(text)
    text = _SPACES.sub(" ", text)
    return _BLANK_LINES.sub("\n\n", text)


def clean_text(text: str, *, strip_html: bool) -> str:
    text = text.translate(_TRANSLATION)
    if strip_html and ("<" in text or "&" in text):
        # entities may decode to invisible characters, so clean once more
        text = html_to_text(text).translate(_TRANSLATION)
    return text.strip()


@dataclass(slots=True)
class _Slot:
    """A piece of text in the request that cleaning and truncation may rewrite."""

    container: Any
    key: Any
    text: str


def _chat_slots(payload: dict[str, Any]) -> list[_Slot]:
    slots: list[_Slot] = []
    for message in payload["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            slots.append(_Slot(message, "content", content))
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    slots.append(_Slot(part, "text", part["text"]))
    return slots


def _completion_slots(payload: dict[str, Any]) -> list[_Slot]:
    prompt = payload["prompt"]
    if isinstance(prompt, str):
        return [_Slot(payload, "prompt", prompt)]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return [_Slot(prompt, i, p) for i, p in enumerate(prompt)]
    return []  # token ids: nothing to clean


def clean_payload(
    payload: dict[str, Any], *, chat: bool, strip_html: bool, max_chars: int, truncate: bool
) -> tuple[int, bool]:
    """Clean the request's text in place. Returns (characters after cleaning, whether truncated).

    Over `max_chars`, either ApiError 400, or truncation: the longest text is shortened first,
    keeping its beginning, until the total fits.
    """
    slots = _chat_slots(payload) if chat else _completion_slots(payload)
    total = 0
    for slot in slots:
        slot.text = clean_text(slot.text, strip_html=strip_html)
        total += len(slot.text)
    truncated = False
    if total > max_chars:
        if not truncate:
            raise ApiError(
                400,
                f"The input is {total} characters after cleaning; this endpoint accepts at most {max_chars}.",
                param="messages" if chat else "prompt",
                code="input_too_long",
                kind="input_too_long",
            )
        truncated = True
        excess = total - max_chars
        for slot in sorted(slots, key=lambda s: len(s.text), reverse=True):
            if excess <= 0:
                break
            cut = min(excess, len(slot.text))
            slot.text = slot.text[: len(slot.text) - cut]
            excess -= cut
        total = max_chars
    for slot in slots:
        slot.container[slot.key] = slot.text
    return total, truncated
