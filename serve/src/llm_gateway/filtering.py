"""The safety filter applied to OpenAI-shaped answers: the text of each choice, and the function
names and arguments of its tool calls, whole (unary) or chunk by chunk (stream).

Function names arrive whole in one chunk and are checked whole (holding part of a name back would
split it for clients that take the first one they see); arguments are streamed text like content.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .safety import SafetyPolicy, StreamFilter

NONE, MASK, BLOCK = "none", "mask", "block"


def _calls(holder: dict[str, Any]) -> list[dict[str, Any]]:
    """The function parts ({"name", "arguments"}) of a message's or delta's tool calls."""
    functions = []
    calls = holder.get("tool_calls")
    if isinstance(calls, list):
        functions = [
            c["function"] for c in calls if isinstance(c, dict) and isinstance(c.get("function"), dict)
        ]
    legacy = holder.get("function_call")
    if isinstance(legacy, dict):
        functions.append(legacy)
    return functions


def filter_unary(safety: SafetyPolicy, doc: dict[str, Any], chat: bool) -> str:
    """Mask or block the answer in place; returns the action taken (none, mask, block)."""
    action = NONE
    key = "content" if chat else "text"
    for choice in doc.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        holder = choice.get("message") if chat else choice
        if not isinstance(holder, dict):
            continue
        fields: list[tuple[dict[str, Any], str]] = [(holder, key)]
        if chat:
            fields += [(fn, part) for fn in _calls(holder) for part in ("name", "arguments")]
        hit = blocked = False
        for owner, part in fields:
            text = owner.get(part)
            if not isinstance(text, str):
                continue
            result = safety.check(text)
            if result.hit:
                hit = True
                if safety.action == BLOCK:
                    blocked = True
                    break
                owner[part] = result.text
        if blocked:
            holder[key] = safety.block_message
            holder.pop("tool_calls", None)
            holder.pop("function_call", None)
            choice["finish_reason"] = "content_filter"
            action = BLOCK
        elif hit and action == NONE:
            action = MASK
    return action


class ChoiceFilter:
    """One choice of a stream: a StreamFilter for its text and one per tool call's arguments."""

    __slots__ = ("_new", "_safety", "args", "blocked", "hit", "text")

    def __init__(self, safety: SafetyPolicy, new: Callable[[], StreamFilter]) -> None:
        self._safety = safety
        self._new = new
        self.text = new()
        self.args: dict[int, StreamFilter] = {}
        self.blocked = False
        self.hit = False

    def feed_choice(self, choice: dict[str, Any], chat: bool) -> tuple[bool, bool]:
        """Filter one chunk's choice in place; (whether it carried text, whether anything is sent)."""
        finishing = choice.get("finish_reason") is not None
        if chat:
            key = "content"
            holder = choice.get("delta")
            if not isinstance(holder, dict):
                holder = choice["delta"] = {}
        else:
            key = "text"
            holder = choice
        text = holder.get(key)
        flt = self.text
        if isinstance(text, str) and text:
            carried = True
            sent = flt.feed(text)
        else:
            carried = False
            sent = ""
        if finishing:
            sent += flt.flush()  # the end of the answer: the held-back tail goes now
        if sent or isinstance(text, str):
            holder[key] = sent
        any_sent = bool(sent)
        if flt.hit:
            self.hit = True
            self.blocked = self.blocked or flt.blocked
        if chat and ("tool_calls" in holder or (finishing and self.args)):
            calls_carried, calls_sent = self._feed_calls(holder, finishing)
            carried = carried or calls_carried
            any_sent = any_sent or calls_sent
        return carried, any_sent

    def _feed_calls(self, delta: dict[str, Any], finishing: bool) -> tuple[bool, bool]:
        carried = sent = False
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            name = function.get("name")
            if isinstance(name, str) and name:
                result = self._safety.check(name)
                if result.hit:
                    self.hit = True
                    self.blocked = self.blocked or self._safety.action == BLOCK
                    function["name"] = result.text
                sent = True
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                carried = True
                index = call.get("index", 0)
                flt = self.args.get(index)
                if flt is None:
                    flt = self.args[index] = self._new()
                function["arguments"] = flt.feed(arguments)
                sent = sent or bool(function["arguments"])
                if flt.hit:
                    self.hit = True
                    self.blocked = self.blocked or flt.blocked
        if finishing:
            rest = self.flush_arguments()
            if rest:
                delta["tool_calls"] = self._merge(delta.get("tool_calls"), rest)
                sent = True
        return carried, sent

    def flush_arguments(self) -> list[dict[str, Any]]:
        """Held-back argument tails as tool-call deltas."""
        rests = []
        for index, flt in self.args.items():
            rest = flt.flush()
            if rest:
                rests.append({"index": index, "function": {"arguments": rest}})
        return rests

    @staticmethod
    def _merge(calls: Any, rests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        merged = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        for rest in rests:
            same = next((c for c in merged if c.get("index", 0) == rest["index"]), None)
            if same is not None and isinstance(same.get("function"), dict):
                function = same["function"]
                function["arguments"] = (function.get("arguments") or "") + rest["function"]["arguments"]
            else:
                merged.append(rest)
        return merged

    def flush(self, chat: bool) -> dict[str, Any] | None:
        """What is still held back at the end of the stream, as a delta (chat) or text; else None."""
        text = self.text.flush()
        if not chat:
            return {"text": text} if text else None
        delta: dict[str, Any] = {}
        if text:
            delta["content"] = text
        rests = self.flush_arguments()
        if rests:
            delta["tool_calls"] = rests
        return delta or None
