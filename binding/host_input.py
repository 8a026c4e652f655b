"""What the host hands a hook, made safe to store: the one place that sanitises it.

The host's own values are trusted for meaning, never for shape: a transcript
may hold a non-dict entry, a message nested thousands of levels deep (json and
every recursive walk would hit Python's recursion limit), a session id with a
lone surrogate (SQLite text must be UTF-8) and a context length as text. Each
function here returns what can be used and reports what it left out
(``faults.report``: logged a bounded number of times, kept for status), so the
hook goes on instead of raising into the host.
"""

from __future__ import annotations

import re
from typing import Any

from ..storage import faults

MAX_NESTING = 200             # deeper content cannot be encoded exactly: never stored
_DIGITS = re.compile(r"\s*\d{1,12}\s*")


def messages(value: Any, engine: Any = None, where: str = "host") -> list[dict]:
    """The dict messages of a shown list whose content nests at most ``MAX_NESTING``
    levels; anything else (not a list, a non-dict entry, absurd nesting) is left out
    and reported against ``engine``. Messages kept are the host's own objects."""
    if not isinstance(value, (list, tuple)):
        if value is not None:
            faults.report(engine, where, f"messages is a {type(value).__name__}, not a list: "
                          "nothing stored")
        return []
    if all(isinstance(m, dict) for m in value) and not any(map(_too_deep, value)):
        return value if isinstance(value, list) else list(value)
    kept, notes = [], []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            notes.append(f"message {index} is a {type(message).__name__}, not a dict: "
                         "not stored")
        elif _too_deep(message):
            notes.append(f"message {index} nests deeper than {MAX_NESTING} levels: not stored")
        else:
            kept.append(message)
    for note in notes[:5]:
        faults.report(engine, where, note)
    return kept


def _too_deep(value: Any) -> bool:
    """Whether a JSON-like value nests deeper than ``MAX_NESTING`` (iterative: no
    recursion limit, stops at the first path that is too deep)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
    return False


def session_id(value: Any) -> str | None:
    """A session id as text SQLite can store: None for none; lone surrogates and NUL
    written as backslash escapes (the same host id always maps to the same text)."""
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else str(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\x00")
    return text or None


def count(value: Any, previous: int, engine: Any = None, where: str = "host") -> int:
    """A token count the host passes (an int, a whole float, digits as text; None is
    0); anything else ("128k", a bool) keeps ``previous`` and is reported."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    faults.report(engine, where, f"{str(value)[:40]!r} is not a token count; keeping {previous}")
    return previous
