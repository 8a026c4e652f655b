"""What is worth keeping when no model writes the summary.

The deterministic digest (``summarize.deterministic_summary``) is what users
get offline or while the circuit breaker is open, so it must read like notes,
not like the first lines of every tool output. This module holds the pieces
that make it salient, all pure functions over text:

- ``condense_tool_output`` turns a tool result into a few lines: test runs
  become counts and outcomes ("12 passed, 5 failed: test_x, test_y"), code
  listings become one line naming the file, runs of near-identical lines
  become one line with a count; errors, assignments and sentences stay.
- ``value_score`` weighs the concrete values a reader comes back for:
  numbers with units, versions, dates, ``key=value`` settings, hosts, ticket
  ids, commit hashes, channels, personal names.
- ``state_key`` names the thing a line sets (``pool_size=14`` sets
  ``pool_size``; a test outcome sets "tests"), so only the last state of
  each thing is kept.
- ``parse_digest`` reads a digest back (for merging summaries): its
  ``[ref role] text`` lines keep their original references and roles, its
  ``Files:`` line is merged, its header is dropped.

Standard library only; never raises on odd text.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

__all__ = ["DigestLine", "condense_tool_output", "parse_digest", "state_key", "value_score",
           "META_LABELS", "TEST_OUTCOME_LABEL"]

TEST_OUTCOME_LABEL = "tests:"
META_LABELS = ("Files", "Tools used", "Key terms")
MAX_NAMED_FAILURES = 4      # failing tests named on an outcome line
REPEAT_MIN = 3              # this many lines of one shape collapse into one
MAX_LINE_CHARS = 280

# pytest / unittest / go / jest style outcomes, either order
_OUTCOME_WORDS = r"PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS|ok|FAIL|PASS|passed|failed"
_TEST_LINE = re.compile(
    rf"^\s*(?:(?P<id1>\S+::\S+|\S*test\S*)\s+(?P<out1>{_OUTCOME_WORDS})\b"
    rf"|(?:---\s+)?(?P<out2>{_OUTCOME_WORDS}):?\s+(?P<id2>\S+::\S+|\S*[Tt]est\S*))")
_TEST_SUMMARY = re.compile(r"^\W*(\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed)"
                           r"(?:,? \d+ \w+)*(?: in [\d.]+s)?)\W*$")
_FAIL_OUT = frozenset({"FAILED", "ERROR", "FAIL", "failed"})
_SKIP_OUT = frozenset({"SKIPPED", "XFAIL", "XPASS"})
_NUMBERED_CODE = re.compile(r"^\s*\d+[\s:|]\s*\S")
_CODE_START = re.compile(r"^\s*(?:def |class |return\b|import |from \S+ import |async def |"
                         r"if .*:$|for .*:$|elif |else:|try:|except\b|with .*:$|"
                         r"[})\]];?$|//|/\*|\* |function |const |let |var |@\w)")
_CALL_ASSIGNMENT = re.compile(r"^\s*[\w.\[\]]+\s*=\s*[\w.]+\(.*\)\s*(?:#.*)?$")
_HEADER_PATH = re.compile(r"^\s*(?:#|//|==>)\s*(\S+\.\w{1,8})\s*(?:<==)?\s*$")
_ERROR = re.compile(r"\b(?:error|exception|traceback|fatal|panic|denied|refused|not found|"
                    r"timed? ?out|segfault|[A-Z]\w+(?:Error|Exception))\b", re.I)
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][\w.-]*)\s*(?:=|:)\s*\S")
_INLINE_ASSIGNMENT = re.compile(r"(?<![\w.=<>!])([A-Za-z_][\w.]*[_.][\w.]*|[A-Z][A-Z0-9_]{2,})"
                                r"\s*=\s*[\"']?[\w./:-]")
_SHAPE_DIGITS = re.compile(r"\d+")
_SHAPE_WORD = re.compile(r"[A-Za-z_]\w*")

# Concrete values, each weighing on its own: what a later question asks for.
_VALUE_PATTERNS = (
    re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds?|minutes?|mins?|h|hours?|days?|weeks?|"
               r"[kmgt]i?b|%|px|tokens?|requests?|rps|qps|items?|rows?|retries|x)\b", re.I),
    re.compile(r"\bv?\d+\.\d+(?:\.\d+)+(?:[-+]\w+)?\b"),                 # versions 3.11.9
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}\b"),              # dates, times
    _INLINE_ASSIGNMENT,                                                  # pool_size=14
    re.compile(r"\b[a-z][\w-]*(?:\.[a-z][\w-]*)*\.(?:internal|local|com|net|org|io|dev|"
               r"cloud|lan)\b"),                                         # hosts
    re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b"),                               # tickets OPS-4471
    re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),  # commits
    re.compile(r"(?<![\w&])#[a-z][\w-]+"),                                # channels
    re.compile(r"\b[A-Z][a-z]+ [A-Z][a-z]+(?: [A-Z][a-z]+)?\b"),         # names
    re.compile(r"\b[a-z]+_\w*\d\w*\b"),                                  # ids cust_8812x
    re.compile(r"(?<![\w./-])\d{2,}(?![\w./-])"),                        # bare numbers
)


class DigestLine(NamedTuple):
    """One ``[ref role] text`` line read back from a digest."""

    ref: str
    role: str
    tool_name: str | None
    text: str


def _clip(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS - 1].rstrip() + "…"


def _shape(line: str) -> str:
    """A line's template: numbers and words replaced, so near-identical lines match."""
    return _SHAPE_WORD.sub("w", _SHAPE_DIGITS.sub("0", line.strip()))


def _test_outcome(lines: list[str]) -> tuple[str | None, set[int]]:
    """One outcome line for the test results among ``lines`` and the indexes it replaces."""
    counts: Counter = Counter()
    failures: list[str] = []
    used: set[int] = set()
    reported = None
    for n, line in enumerate(lines):
        found = _TEST_LINE.match(line)
        if found:
            outcome = found.group("out1") or found.group("out2")
            test_id = found.group("id1") or found.group("id2")
            kind = ("failed" if outcome in _FAIL_OUT else
                    "skipped" if outcome in _SKIP_OUT else "passed")
            counts[kind] += 1
            if kind == "failed":
                failures.append(test_id.rsplit("::", 1)[-1])
            if not _ERROR.search(line):  # a failure with its error stays readable as is
                used.add(n)
            continue
        summary = _TEST_SUMMARY.match(line)
        if summary and ("passed" in line or "failed" in line):
            reported = summary.group(1)
            used.add(n)
    if not counts and reported is None:
        return None, set()
    if reported is not None:
        text = reported
    else:
        text = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped") if counts[k])
    if failures:
        named = ", ".join(dict.fromkeys(failures[:MAX_NAMED_FAILURES]))
        more = len(failures) - min(len(failures), MAX_NAMED_FAILURES)
        text += f"; failing: {named}" + (f" (+{more} more)" if more > 0 else "")
    return f"{TEST_OUTCOME_LABEL} {text}", used


def _is_code(line: str) -> bool:
    return bool(_NUMBERED_CODE.match(line) or _CODE_START.match(line)
                or _CALL_ASSIGNMENT.match(line))


def condense_tool_output(text: str) -> list[str]:
    """The lines worth reading of one tool result, in order, much shorter than the output.

    Test results collapse to one outcome line (placed where the run ended),
    a code listing to ``code: <file> (<n> lines)``, runs of at least three
    lines of one shape to the first one plus ``(×n similar)``. A line that
    reports an error or sets a value is always kept as it is.
    """
    if not isinstance(text, str) or not text.strip():
        return []
    lines = [line for line in text.splitlines() if line.strip()]
    outcome, used = _test_outcome(lines)
    shapes = Counter(_shape(line) for n, line in enumerate(lines) if n not in used)
    out: list[str] = []
    code_lines, code_file = 0, None
    seen_shapes: set[str] = set()
    last_used = max(used, default=-1)
    for n, line in enumerate(lines):
        if n in used:
            if n == last_used:
                out.append(outcome)
            continue
        if _ERROR.search(line) or (_ASSIGNMENT.match(line) and not _is_code(line)):
            out.append(_clip(line))
            continue
        header = _HEADER_PATH.match(line)
        if header and n + 1 < len(lines) and _is_code(lines[n + 1]):
            code_file = header.group(1)
            continue
        if _is_code(line):
            code_lines += 1
            continue
        shape = _shape(line)
        if shapes[shape] >= REPEAT_MIN:
            if shape not in seen_shapes:
                seen_shapes.add(shape)
                out.append(_clip(line) + f" (×{shapes[shape]} similar)")
            continue
        out.append(_clip(line))
    if outcome and last_used < 0:
        out.append(outcome)
    if code_lines:
        out.insert(0, f"code: {code_file or 'listing'} ({code_lines} lines)")
    return out


def value_score(segment: str) -> int:
    """How many kinds of concrete value a segment carries (0-4)."""
    return min(4, sum(1 for pattern in _VALUE_PATTERNS if pattern.search(segment)))


def state_key(segment: str) -> str | None:
    """The thing a line sets, when it plainly sets one; a newer line with the
    same key supersedes it (the last state of each thing is what is kept)."""
    if segment.startswith(TEST_OUTCOME_LABEL):
        return TEST_OUTCOME_LABEL
    if segment.startswith("code: "):
        return segment.split(" (", 1)[0]
    found = _ASSIGNMENT.match(segment)
    if found and "=" in segment[:found.end() + 2]:
        return found.group(1).lower()
    return None


_DIGEST_LINE = re.compile(r"^\[(?P<ref>[mn]\d+|[^\]\s]{1,40}) (?P<role>[a-z_]+)(?::(?P<tool>[^\]\s]+))?\] ?")
_DIGEST_HEADER = re.compile(r"^\[[^\]]*: \d+ (?:messages?|summaries|summary), \d+ tokens[^\]]*\]$|"
                            r"^\[[mn]\d+(?:-[mn]\d+)?\]$")


def parse_digest(text: str, ref: str, tool_name: str | None = None
                 ) -> tuple[dict[str, list[str]], list[DigestLine]]:
    """A summary's text read back: its meta lists and its content lines.

    Lines written by the deterministic digest (``[m12 user] ...``) keep
    their own reference and role; any other line (an LLM summary) is
    attributed to ``ref`` with role ``summary``. Header lines are dropped.
    """
    meta: dict[str, list[str]] = {}
    out: list[DigestLine] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or _DIGEST_HEADER.match(line):
            continue
        label, sep, rest = line.partition(": ")
        if sep and label in META_LABELS:
            meta.setdefault(label, []).extend(v.strip() for v in rest.split(", ") if v.strip())
            continue
        found = _DIGEST_LINE.match(line)
        if found and found.group("role") in ("user", "assistant", "tool", "system", "summary"):
            body = line[found.end():]
            for part in re.split(r" (?:…|·) ", body):
                if part.strip():
                    out.append(DigestLine(found.group("ref"), found.group("role"),
                                          found.group("tool"), part.strip()))
        else:
            out.append(DigestLine(ref, "summary", tool_name, line.lstrip("-• ").strip()))
    return meta, out
