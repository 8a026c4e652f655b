"""Exact refs: ``{store_id, start, end, quote}`` with ``quote == text[start:end]``.

The text of a ref is the stored message's content string exactly as
``trove_expand`` shows it (``content``; for multimodal messages the exact JSON
text of the parts). Offsets count Python characters (Unicode code points) of
that string, the same unit as ``content_offset``. A ref is checked against the
stored text every time it is used, so a ref cannot carry words its message
does not contain.

Transcript GC (``Store.replace_with_placeholder``) is the one rewrite of a stored row:
a summarized tool row's text becomes its payload placeholder, same store_id. A ref made
before that indexes the original text; ``with_original`` lets ``verify`` resolve it
there while the payload file still holds it, and say the row was rewritten when not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..recall.query_plan import QueryPlan, fold
from ..schemas import ArgumentError, _integer as schema_integer
from ..storage.payloads import PayloadError, refs_in, restore_text

QUOTE_MAX_CHARS = 2000        # a quote longer than this is refused (cite a sentence, not a page)
REPAIR_WINDOW_CHARS = 400     # how far around stale offsets a quote is looked for
SENTENCE_MAX_CHARS = 400      # a grep ref quotes one sentence, cut to this size
OCCURRENCES_COUNTED = 10      # an ambiguous quote's occurrences are counted up to this
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
ORIGINAL_KEY = "original_text"   # on a loaded row: () -> the text before transcript GC


class RefError(ValueError):
    """A ref that cannot be used: missing fields, out of scope, or a quote that does not match."""


@dataclass(frozen=True)
class Ref:
    """A verified ref: where the quote is, how it was checked, and when it was said."""

    store_id: int
    start: int
    end: int
    quote: str
    status: str            # verified | repaired | located
    role: str
    session_id: str
    said_at: float | None  # the message time (when it was said)
    original: bool = False  # indexes the row's text before transcript GC (its payload)

    def as_dict(self) -> dict:
        """The JSON shape of the ref itself."""
        return {"store_id": self.store_id, "start": self.start, "end": self.end,
                "quote": self.quote}


def ref_text(row: dict) -> str:
    """The string a ref's offsets index: the stored content as trove_expand shows it."""
    if row.get("content_format") in ("text", "json") and isinstance(row.get("content"), str):
        return row["content"]
    return ""


def text_of(ref: "Ref", row: dict) -> str:
    """The text a verified ref indexes: the stored text, or the original it was resolved in."""
    return row[ORIGINAL_KEY]() if ref.original else ref_text(row)


def with_original(row: dict, payloads: Any) -> dict:
    """``row`` with a way to read its text before transcript GC, when it holds placeholders.

    The original is read (hash-checked, ``restore_text``) only when a quote is not in the
    stored text; unreadable, it raises RefError saying the row was rewritten."""
    text = ref_text(row)
    found = refs_in(text)
    if not found:
        return row
    cache: list[str] = []

    def original() -> str:
        if not cache:
            why = "no payload store is reachable here"
            try:
                if payloads is not None:
                    cache.append(restore_text(text, payloads))
            except (PayloadError, OSError) as exc:
                why = str(exc)[:200]
            if not cache:
                raise RefError(
                    f"store_id {row['store_id']} was rewritten by transcript GC (or stored "
                    f"externalized): its text is now the placeholder of {', '.join(found)}, "
                    f"and the original is not readable ({why}); cite the stored text as "
                    "trove_expand shows it") from None
        return cache[0]

    return {**row, ORIGINAL_KEY: original}


def said_at(row: dict) -> float | None:
    """When a message was said: the host's time when known, else when it was stored."""
    return row["message_at"] if row.get("message_at") is not None else row.get("created_at")


def make_ref(row: dict, start: int, end: int) -> dict:
    """The exact ref of ``text[start:end]`` of a stored row."""
    text = ref_text(row)
    start, end = max(0, min(start, len(text))), max(0, min(end, len(text)))
    return {"store_id": row["store_id"], "start": start, "end": end, "quote": text[start:end]}


def verify(raw: Any, load: Callable[[int], dict]) -> Ref:
    """Check one ref against its stored message; repair stale offsets only when unambiguous.

    ``raw`` is ``{store_id, quote, start?, end?}``. With offsets, the quote must
    be ``text[start:end]``; otherwise it is looked for within
    ``REPAIR_WINDOW_CHARS`` around them and accepted ("repaired") only when it
    occurs there exactly once. Without offsets it must occur exactly once in
    the whole message ("located"). ``load`` raises for a message the caller
    may not read. Raises RefError with the reason.
    """
    if not isinstance(raw, dict):
        raise RefError("a ref must be an object {store_id, start, end, quote}")
    store_id = _integer(raw.get("store_id"), "store_id")
    quote = raw.get("quote")
    if not isinstance(quote, str) or not quote:
        raise RefError(f"ref to store_id {store_id} needs a non-empty quote")
    if len(quote) > QUOTE_MAX_CHARS:
        raise RefError(f"quote of store_id {store_id} is over {QUOTE_MAX_CHARS} characters")
    try:
        row = load(store_id)
    except RefError:
        raise
    except Exception as exc:
        raise RefError(str(exc)) from None
    has_offsets = raw.get("start") is not None or raw.get("end") is not None
    if has_offsets:
        start = _integer(raw.get("start"), "start")
        end = _integer(raw.get("end", start + len(quote)), "end")
    for original in (False, True):
        if original:    # not in the stored text: the text it held before transcript GC
            if not callable(row.get(ORIGINAL_KEY)):
                break
            text = row[ORIGINAL_KEY]()      # raises RefError when it is not readable
        else:
            text = ref_text(row)
        if has_offsets:
            if text[start:end] == quote:
                return _ref(row, start, quote, "verified", original)
            low = max(0, min(start, end) - REPAIR_WINDOW_CHARS)
            high = max(start, end) + REPAIR_WINDOW_CHARS
            found = _occurrences(text, quote, low, high)
            where = f"within {REPAIR_WINDOW_CHARS} characters of offsets {start}..{end}"
            status = "repaired"
        else:
            found = _occurrences(text, quote, 0, len(text))
            where = "in the message"
            status = "located"
        if found:
            break
    if len(found) == 1:
        return _ref(row, found[0], quote, status, original)
    if not found:
        raise RefError(f"quote not found {where} of store_id {store_id}: the quote must be "
                       "copied exactly from the stored text")
    times = f"at least {OCCURRENCES_COUNTED}" if len(found) == OCCURRENCES_COUNTED \
        else str(len(found))
    raise RefError(f"quote occurs {times} times {where} of store_id {store_id}; "
                   "give its exact start and end")


def _ref(row: dict, start: int, quote: str, status: str, original: bool = False) -> Ref:
    return Ref(store_id=row["store_id"], start=start, end=start + len(quote), quote=quote,
               status=status, role=row["role"], session_id=row["session_id"],
               said_at=said_at(row), original=original)


def _occurrences(text: str, quote: str, low: int, high: int) -> list[int]:
    """Start offsets of ``quote`` lying wholly inside ``text[low:high]`` (overlaps counted)."""
    found, at = [], text.find(quote, low)
    while 0 <= at and at + len(quote) <= high and len(found) < OCCURRENCES_COUNTED:
        found.append(at)
        at = text.find(quote, at + 1)
    return found


def _integer(value: Any, name: str) -> int:
    """A ref field as a non-negative integer, read the way tool arguments are."""
    try:
        number = schema_integer(name, value)
    except ArgumentError:
        number = -1
    if number < 0:
        raise RefError(f"ref {name} must be a non-negative integer")
    return number


# ---------------------------------------------------------------- refs for search hits
def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence or line of ``text``, whitespace trimmed."""
    spans, at = [], 0
    for brk in _SENTENCE_END.finditer(text):
        spans.append((at, brk.start()))
        at = brk.end()
    spans.append((at, len(text)))
    out = []
    for start, end in spans:
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        trail = len(piece.rstrip())
        if trail > lead:
            out.append((start + lead, start + trail))
    return out


def best_sentence_ref(row: dict, plan: QueryPlan) -> dict | None:
    """The exact ref of the sentence of a message that best matches a query.

    A sentence scores by the distinct query words (any variant) and needles it
    holds; ties go to the earlier sentence. Long sentences are cut to
    ``SENTENCE_MAX_CHARS`` around the first matching word. None when the row
    has no text.
    """
    text = ref_text(row)
    if not text:
        return None
    variants = [c.variants for c in plan.concepts]
    needles = [n.lower() for n in plan.needles]
    best, best_score = None, -1
    for start, end in sentence_spans(text):
        folded = fold(text[start:end])
        words = set(re.findall(r"\w+", folded))
        score = sum(1 for group in variants if any(v in words for v in group))
        score += sum(1 for n in needles if n and n in folded)
        if score > best_score:
            best, best_score = (start, end), score
    if best is None:
        return None
    start, end = best
    if end - start > SENTENCE_MAX_CHARS:
        folded, origin = folded_with_origins(text[start:end])
        hits = [folded.find(v) for group in variants for v in group if v in folded]
        centre = start + (origin[min(hits)] if hits else 0)
        start = max(start, centre - SENTENCE_MAX_CHARS // 4)
        end = min(end, start + SENTENCE_MAX_CHARS)
    return make_ref(row, start, end)


def folded_with_origins(text: str) -> tuple[str, list[int]]:
    """``fold(text)`` and, for each of its characters, the offset in ``text`` of the
    character it came from.

    Why: folding changes lengths (a combining accent is dropped, "İ" lowers to two
    characters and folds to "i"), so an offset found in the folded text
    is not an offset of the original; read as one, it cut a long sentence's ref away
    from the word that matched, or past the sentence's end (an empty quote). Folding
    works character by character (its one context rule, a final sigma, keeps the
    length), so each folded character has one original character.
    """
    folded = fold(text)
    if text.isascii():
        return folded, list(range(len(text)))
    origin = [at for at, ch in enumerate(text) for _ in fold(ch)]
    if len(origin) != len(folded):     # never seen; a cut at the start is still exact
        return folded, [0] * len(folded)
    return folded, origin
