"""Which shown messages are already stored: the identity scheme.

A stored message's identity is ``(session, content_hash, ordinal)``: the
ordinal-th message with that exact content in the session's history ("the third
'ok' the user sent"). A UNIQUE constraint enforces it in the database.

Which ordinal a *shown* message has cannot be read off the shown list alone:
after a compaction the host shows only the tail, so counting identical messages
inside the list would map a new "ok" onto an old one and drop it. Instead the
shown list is aligned against the stored history, starting at the stored copy
of its first message (the anchor): shown messages that line up with stored ones
are the same messages; the rest are new and get the next free ordinal. New
messages can only be appended, never merged into old ones, so nothing shown is
ever lost, and a transcript shown again (whole, grown by a turn, or as the tail
after a compaction) lines up and adds nothing.
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
    session's history from the anchor on, as ``(store_id, hash)`` in store order.
    Matching is greedy and monotonic: a match never goes backwards in the stored
    window, so each stored row is claimed at most once.
    """
    result: list[int | None] = []
    cursor = 0
    for digest in shown:
        if digest is None:
            result.append(None)
            continue
        found = None
        for offset in range(cursor, min(len(stored), cursor + LOOKAHEAD)):
            if stored[offset][1] == digest:
                found = offset
                break
        if found is None:
            result.append(None)
        else:
            result.append(stored[found][0])
            cursor = found + 1
    return result


def matched_count(alignment: Sequence[int | None]) -> int:
    """How many shown messages an alignment found in the store."""
    return sum(1 for store_id in alignment if store_id is not None)
