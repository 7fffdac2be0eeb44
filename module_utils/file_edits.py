"""Whether a partial edit of a file, as ansible.builtin.lineinfile, blockinfile and replace make it, is in
place: the kinds of edit the ``edits`` option of the module library/files_in_place.py takes (a line, a
block between markers, a regexp that must not match), the validation of an entry's kind of edit into one of
them (an error names the field, ``edits[2].block``), and the reasons an edit is not in place in a file's
text, following those modules' own code (ansible-core 2.19).

The module reads the file (its text, stat, owner, group and mode) and validates the entry's path, owner,
group and mode. Nothing from Ansible is imported at import time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.in_place_report import EntryError, entry_field, entry_name

# The kinds of edit, one of which each entry of ``edits`` gives, and the fields only a block takes with
# blockinfile's defaults for them (ansible/modules/blockinfile.py, argument_spec of main()).
EDIT_KINDS = ("line", "block", "absent_regexp")
BLOCK_DEFAULTS = {"marker": "# {mark} ANSIBLE MANAGED BLOCK", "marker_begin": "BEGIN", "marker_end": "END"}
# The line break lineinfile and blockinfile write (b(os.linesep), to_bytes(os.linesep)): "\n" on the nodes.
NEWLINE = os.linesep
# A file's lines as lineinfile reads them (f.readlines() on bytes: broken after each \n only, ends kept) ...
READLINES = re.compile(r"[^\n]*\n|[^\n]+")
# ... and as blockinfile does (bytes.splitlines(True): broken after \r\n, \r or \n, ends kept). Not
# str.splitlines, which also breaks at \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029.
BYTES_SPLITLINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


@dataclass(frozen=True)
class PresentLine:
    """ansible.builtin.lineinfile with ``line``, state=present, and no regexp or search_string."""

    line: str

    def reasons(self, text: str) -> list[str]:
        # lineinfile.py, present() (ansible-core 2.19): without regexp and search_string, `match` stays None
        # and the loop of step 3 (lines 362-366) sets index[0] to the LAST line whose
        # b_cur_line.rstrip(b'\r\n') == b_line, with exact_line_match = True; that skips the insertbefore/
        # insertafter branch (line 397: `... and not exact_line_match`), so where the line stands does not
        # count. (But with firstmatch and a regexp insertbefore/insertafter, lines 368-379 break out of that
        # loop at the first line the regexp matches, before a later copy of the line: not for this check.)
        # The only change left is lines 432-435: `elif b_lines[index[0]] != b_new_line` rewrites that line
        # unless it is exactly line + os.linesep (lines 390-393). So a CRLF ending, or the last line of the
        # file without a line break, is rewritten: it differs here.
        last = None
        for physical in READLINES.findall(text):
            if physical.rstrip("\r\n") == self.line:
                last = physical
        if last is None:
            return ["line missing"]
        if last == self.line + NEWLINE:
            return []
        ending = last[len(self.line) :]
        if not ending:
            return ["line present but without a line break (the last line of the file)"]
        return [f"line present but ends with {ending!r}, not {NEWLINE!r}"]


@dataclass(frozen=True)
class PresentBlock:
    """ansible.builtin.blockinfile with ``block`` (not empty), state=present, and prepend_newline and
    append_newline false (their defaults). ``begin``, ``end`` and ``lines``: the marker lines and the block's
    lines as blockinfile writes them, line breaks included."""

    begin: str
    end: str
    lines: tuple[str, ...]

    def marker_reasons(self, begins: list[int], ends: list[int]) -> list[str]:
        if not begins and not ends:
            return ["block missing (neither marker found)"]
        for word, found in (("begin", begins), ("end", ends)):
            if not found:
                return [f"{word} marker missing"]
            if len(found) > 1:
                return [f"{word} marker found {len(found)} times"]
        if ends[0] <= begins[0]:
            return ["end marker before begin marker"]
        return []

    def reasons(self, text: str) -> list[str]:
        # blockinfile.py main() (ansible-core 2.19), with both markers found and n0 < n1 (lines 318-323,
        # 347-348): lines[n0:n1 + 1] are cut and [marker0] + block lines + [marker1] put back at n0 (line
        # 368), after making sure lines[n0 - 1] ends with os.linesep (lines 354-356); prepend_newline and
        # append_newline (lines 362-376) are false by default. The result equals the original (line 386,
        # changed=False) when the cut lines are those lines and the line before ends with a line break. Only
        # one begin and one end marker are taken as in place (with more, blockinfile takes the last of
        # each), and the file must end with a line break, to be safe.
        lines = BYTES_SPLITLINES.findall(text)
        begins = [number for number, line in enumerate(lines) if line == self.begin]
        ends = [number for number, line in enumerate(lines) if line == self.end]
        markers = self.marker_reasons(begins, ends)
        if markers:
            return markers
        begin, end = begins[0], ends[0]
        if tuple(lines[begin + 1 : end]) != self.lines:
            return ["block content differs"]
        if begin > 0 and not lines[begin - 1].endswith(NEWLINE):
            return [f"the line before the begin marker ends with {lines[begin - 1][-1:]!r}"]
        if not text.endswith(NEWLINE):
            return ["no line break at the end of the file"]
        return []


@dataclass(frozen=True)
class AbsentPattern:
    """ansible.builtin.replace with ``regexp`` (and no after or before): the regexp must not match."""

    pattern: re.Pattern[str]

    def reasons(self, text: str) -> list[str]:
        # replace.py main() (ansible-core 2.19): the content is to_text()'d (line 258), searched with
        # re.compile(regexp, re.MULTILINE) (line 283), and changed only when re.subn made a replacement
        # (line 289): no match, no change.
        found = self.pattern.search(text)
        if found is None:
            return []
        line_number = text.count("\n", 0, found.start()) + 1
        return [f"absent_regexp matches at line {line_number}"]


Edit = PresentLine | PresentBlock | AbsentPattern


def edit_field(index: int, field: str) -> str:
    return entry_field("edits", index, field)


def edit_kind(index: int, entry: dict[str, Any]) -> str:
    given = [kind for kind in EDIT_KINDS if entry[kind] is not None]
    if len(given) != 1:
        got = f" (got {', '.join(given)})" if given else ""
        raise EntryError(f"{entry_name('edits', index)}: give exactly one of line, block, absent_regexp{got}")
    return given[0]


def reject_markers_without_block(index: int, kind: str, entry: dict[str, Any]) -> None:
    given = [field for field in BLOCK_DEFAULTS if entry[field] is not None]
    if kind != "block" and given:
        raise EntryError(f"{entry_name('edits', index)}: {', '.join(given)} only with block, not with {kind}")


def validated_line(index: int, line: str) -> PresentLine:
    if "\n" in line:
        raise EntryError(
            f"{edit_field(index, 'line')}: {line!r} holds a line break; no line of a file can equal it, so"
            " lineinfile would add it again on every run"
        )
    return PresentLine(line)


def marker_line(index: int, marker: str, field: str, mark: str) -> str:
    """A marker line as blockinfile makes it: re.sub(b'{mark}', b(mark), to_bytes(marker)) + os.linesep
    (blockinfile.py lines 309-310), where b() is six.b, which encodes Latin-1, and re.sub reads backslash
    escapes in ``mark``."""
    try:
        raw_mark = mark.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise EntryError(
            f"{edit_field(index, field)}: {mark!r} is not Latin-1, which blockinfile needs"
        ) from exc
    try:
        line = re.sub(rb"{mark}", raw_mark, marker.encode("utf-8", "surrogateescape"))
    except re.error as exc:
        raise EntryError(
            f"{edit_field(index, field)}: {mark!r}: {exc} (blockinfile puts it in with re.sub)"
        ) from exc
    return line.decode("utf-8", "surrogateescape") + NEWLINE


def validated_block(index: int, entry: dict[str, Any]) -> PresentBlock:
    block: str = entry["block"]
    if not block:
        raise EntryError(f"{edit_field(index, 'block')}: empty; blockinfile then removes the block")
    marker, begin, end = (
        entry[field] if entry[field] is not None else default for field, default in BLOCK_DEFAULTS.items()
    )
    if "{mark}" not in marker:
        raise EntryError(
            f"{edit_field(index, 'marker')}: {marker!r} holds no {{mark}}, so the begin and end markers are"
            " one line and blockinfile adds the block again on every run"
        )
    # blockinfile.py lines 311-314: a block not ending with os.linesep gets one, then splitlines(True)
    if not block.endswith(NEWLINE):
        block += NEWLINE
    return PresentBlock(
        begin=marker_line(index, marker, "marker_begin", begin),
        end=marker_line(index, marker, "marker_end", end),
        lines=tuple(BYTES_SPLITLINES.findall(block)),
    )


def validated_absent_regexp(index: int, regexp: str) -> AbsentPattern:
    if not regexp:
        raise EntryError(f"{edit_field(index, 'absent_regexp')}: empty; it matches every file")
    try:
        return AbsentPattern(re.compile(regexp, re.MULTILINE))
    except re.error as exc:
        raise EntryError(
            f"{edit_field(index, 'absent_regexp')}: {regexp!r} is not a regular expression ({exc})"
        ) from exc


def edit_of_entry(index: int, entry: dict[str, Any]) -> Edit:
    """The edit entry ``index`` of ``edits`` gives (exactly one of line, block, absent_regexp), validated;
    EntryError, naming the field, when it cannot be checked."""
    kind = edit_kind(index, entry)
    reject_markers_without_block(index, kind, entry)
    if kind == "line":
        return validated_line(index, entry["line"])
    if kind == "block":
        return validated_block(index, entry)
    return validated_absent_regexp(index, entry["absent_regexp"])
