"""Output safety: sensitive terms found in one Aho-Corasick pass, streamed output included.

Matching is case-insensitive for scripts with case. In a stream, the last (longest term - 1)
characters of each choice are held back until the next chunk or the end of the stream, so a
term split across chunks is seen whole before any part of it reaches the client.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ahocorasick


def read_terms_file(path: Path) -> list[str]:
    """One term a line; blank lines and lines starting with # are ignored."""
    terms = []
    for line in path.read_text(encoding="utf-8").splitlines():
        term = line.strip()
        if term and not term.startswith("#"):
            terms.append(term)
    return terms


def _fold(text: str) -> str:
    lowered = text.lower()
    # lower() can change the length (e.g. U+0130); positions must stay aligned with the text
    return lowered if len(lowered) == len(text) else text


class TermMatcher:
    def __init__(self, terms: Iterable[str]) -> None:
        folded = sorted({_fold(t.strip()) for t in terms if t.strip()})
        self.size = len(folded)
        self.max_len = max((len(t) for t in folded), default=0)
        self._automaton = ahocorasick.Automaton()
        for term in folded:
            self._automaton.add_word(term, len(term))
        if folded:
            self._automaton.make_automaton()

    def spans(self, text: str) -> list[tuple[int, int]]:
        if not self.size or not text:
            return []
        return [(end - length + 1, end + 1) for end, length in self._automaton.iter(_fold(text))]


@dataclass(frozen=True, slots=True)
class SafetyResult:
    text: str
    hit: bool


class SafetyPolicy:
    def __init__(
        self,
        matcher: TermMatcher,
        action: Literal["mask", "block"],
        mask_char: str = "*",
        block_message: str = "",
    ) -> None:
        self.matcher = matcher
        self.action = action
        self.mask_char = mask_char
        self.block_message = block_message

    @property
    def enabled(self) -> bool:
        return self.matcher.size > 0

    def mask(self, text: str, spans: list[tuple[int, int]]) -> str:
        chars = list(text)
        for start, end in spans:
            for i in range(start, end):
                chars[i] = self.mask_char
        return "".join(chars)

    def check(self, text: str) -> SafetyResult:
        """For a whole text: masked text, or (on block) the text unchanged with hit=True."""
        spans = self.matcher.spans(text)
        if not spans:
            return SafetyResult(text, False)
        if self.action == "block":
            return SafetyResult(text, True)
        return SafetyResult(self.mask(text, spans), True)

    def stream(self) -> StreamFilter:
        return StreamFilter(self)


class StreamFilter:
    """Filters one choice of a stream. `feed` returns what may be sent now; `flush` the rest.

    The held-back tail is kept unmasked, with the masked positions alongside, so terms that
    overlap a term already found (e.g. "cc" in "ccc") are still found when the next chunk comes.
    """

    __slots__ = ("_hold", "_masked", "_pending", "_policy", "blocked", "hit")

    def __init__(self, policy: SafetyPolicy) -> None:
        self._policy = policy
        self._hold = max(policy.matcher.max_len - 1, 0)
        self._pending = ""
        self._masked: set[int] = set()  # positions in _pending to mask
        self.hit = False
        self.blocked = False

    def _render(self, text: str, masked: set[int], offset: int) -> str:
        if not masked:
            return text
        char = self._policy.mask_char
        return "".join(char if i + offset in masked else c for i, c in enumerate(text))

    def feed(self, text: str) -> str:
        if self.blocked:
            return ""
        if not self._hold and not self._policy.enabled:
            return text
        buffer = self._pending + text
        spans = self._policy.matcher.spans(buffer)
        masked = self._masked
        if spans:
            self.hit = True
            if self._policy.action == "block":
                self.blocked = True
                self._pending, self._masked = "", set()
                return ""
            for start, end in spans:
                masked.update(range(start, end))
        # Any term starting before `cut` ends inside the buffer, so it has been seen whole.
        cut = max(len(buffer) - self._hold, 0)
        out = self._render(buffer[:cut], masked, 0)
        self._pending = buffer[cut:]
        self._masked = {i - cut for i in masked if i >= cut}
        return out

    def flush(self) -> str:
        rest = "" if self.blocked else self._render(self._pending, self._masked, 0)
        self._pending, self._masked = "", set()
        return rest
