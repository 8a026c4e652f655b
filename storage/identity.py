"""Which shown messages are already stored: the identity scheme.

A stored message's identity is ``(session, content_hash, ordinal)``: the
ordinal-th message with that exact content in the session's history ("the third
'ok' the user sent"). A UNIQUE constraint enforces it in the database.

Which ordinal a *shown* message has cannot be read off the shown list alone:
after a compaction the host shows only the tail, so counting identical messages
inside the list would map a new "ok" onto an old one and drop it. Instead the
shown list is aligned against the stored history. Three rules make that safe
when the host rewrites history (/undo, /retry, edits) and texts repeat:

* **Order.** Matches never go backwards in store order, and a shown message
  that follows a new one is new itself: new rows get store_ids after every
  existing row, so stored order always equals transcript order.
* **Fresh rows only after the block.** Everything the engine returned after its
  summary block was raw at the time; a list carrying the block is aligned only
  against rows not yet summarized (``Store``), so a repeated "continue" is never
  mapped onto an old, summarized copy and dropped from the prompt.
* **New is appended, never merged.** A message that does not line up is stored
  as a new row with the next free ordinal; nothing shown is ever lost, and a
  list shown again lines up and adds nothing.
"""

from __future__ import annotations

from typing import Sequence

# How far ahead in the stored window a shown message may match. Bounds the work
# and keeps a common message ("ok") from matching a copy far in the future.
LOOKAHEAD = 64


def align(shown: Sequence[str | None], stored: Sequence[tuple[int, str]]) -> list[int | None]:
    """Map each shown hash to the store_id it lines up with, or None when it is new.

    ``shown`` holds content hashes in transcript order (None for messages that are
    not to be stored, such as the engine's own summary block). ``stored`` is the
    candidate rows from the anchor on, as ``(store_id, hash)`` in store order.
    Matching is greedy and monotonic (a stored row is claimed at most once and
    never before an earlier claim), and it stops at the first shown message that
    does not line up: that one and every later one are new, so they are stored
    after every existing row, in transcript order.
    """
    result: list[int | None] = []
    cursor = 0
    ended = False
    for digest in shown:
        if digest is None or ended:
            result.append(None)
            continue
        found = None
        for offset in range(cursor, min(len(stored), cursor + LOOKAHEAD)):
            if stored[offset][1] == digest:
                found = offset
                break
        if found is None:
            ended = True
            result.append(None)
        else:
            result.append(stored[found][0])
            cursor = found + 1
    return result


def matched_count(alignment: Sequence[int | None]) -> int:
    """How many shown messages an alignment found in the store."""
    return sum(1 for store_id in alignment if store_id is not None)
