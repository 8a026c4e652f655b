"""Rule 6 of ``storage/identity``: where a list no view explains starts in the
stored history (a database from before views, an import, a replay, views lost).

The older anchored alignment: a known tail the engine returned after its block, the
unsummarized rows after a block whose tail is not known, or the stored copies of the
list's first message (``alignment_rows.anchor_rows``), each read in order with
``align``. ``storage/alignment`` asks it for the elements its views leave
unexplained; its SQL reads message rows and lineage only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from . import identity
from .alignment_rows import (ALIGN_SLACK, FP_COLUMNS, anchor_rows, fingerprints_of, fresh_rows,
                             row_fp)

# At most this many stored copies of the first shown message are tried as anchors.
ANCHOR_CANDIDATES = 16


@dataclass(frozen=True)
class KnownTail:
    """What the engine returned after one of its summary blocks: the raw messages
    after it were ``store_ids``; ``nodes`` was the highest node_id when the block
    was rendered (summaries above it were written later; None when not known).

    A list carrying that block starts with those messages, as far as the host
    did not rewrite them (/undo, /retry, edits). What follows is aligned in order
    against unsummarized rows after the last match: rows stored later (by a
    hook), or newer turns the host keeps verbatim beside a manual /compress of
    the older part; anything else is new."""

    store_ids: tuple[int, ...]
    low: int
    nodes: int | None = None


def legacy_alignment(conn, session_id: str, hashes: list[str | None],
                     known: KnownTail | None, after_block: bool,
                     digests: list[str | None]) -> list[int | None]:
    """Rule 6 of ``storage/identity``: where a list no view explains starts in
    the stored history (a known tail, the unsummarized rows after a block, or
    the anchored whole-history search). ``hashes`` are the elements' fingerprints,
    compared with the rows' as every other rule does (a whitespace edit is the
    same message); ``digests`` their exact content hashes, for the index."""
    if known is not None:
        return align_known(conn, session_id, hashes, known)
    if after_block:
        return align_fresh(conn, session_id, hashes)
    return align_whole(conn, session_id, hashes, digests)


def align_known(conn, session_id: str, hashes: list[str | None],
                known: KnownTail) -> list[int | None]:
    """Align a list that follows the engine's summary block.

    The shown messages line up with the known tail's store_ids as far as they
    agree (an /undo, /retry or edit changes the list from some point on);
    what follows is aligned, in order, against the rows after the last match:
    rows a hook stored later, the verbatim turns beside a manual /compress, or
    nothing (then it is new). A row already summarized when the block was
    rendered (by a node up to ``nodes``) is never a candidate; a row only a
    later compaction summarized is: a stale view shown again must still line
    up with it.
    """
    real = [i for i, h in enumerate(hashes) if h is not None]
    ids = list(known.store_ids)
    stored = dict(fingerprints_of(conn, ids))
    alignment: list[int | None] = [None] * len(hashes)
    matched, last = 0, known.low - 1
    for pos, store_id in zip(real, ids):
        if stored.get(store_id) != hashes[pos] or store_id <= last:
            break
        alignment[pos], last, matched = store_id, store_id, matched + 1
    rest = real[matched:]
    if rest:
        window = [row_fp(r) for r in conn.execute(
            f"SELECT {FP_COLUMNS} FROM messages AS m WHERE session_id = ?"
            " AND store_id > ? AND NOT EXISTS (SELECT 1 FROM node_edges AS e"
            " WHERE e.child_store_id = m.store_id AND e.parent_id <= ?)"
            " ORDER BY store_id LIMIT ?",
            (session_id, last, 2**62 if known.nodes is None else known.nodes,
             len(rest) + ALIGN_SLACK))]
        for pos, store_id in zip(rest, align([hashes[p] for p in rest], window)):
            alignment[pos] = store_id
    return alignment


def align_fresh(conn, session_id: str, hashes: list[str | None]) -> list[int | None]:
    """Align a list that follows a summary block whose tail is not known: only
    the newest rows no summary covers are candidates, anchored at each stored
    copy of the first shown message; the longest in-order match wins."""
    wanted = sum(1 for h in hashes if h is not None)
    first = next((h for h in hashes if h is not None), None)
    window = fresh_rows(conn, session_id, wanted + ALIGN_SLACK)
    return _best_anchor(hashes, (window[i:] for i, (_, digest) in enumerate(window)
                                 if digest == first))


def align_whole(conn, session_id: str, hashes: list[str | None],
                digests: list[str | None]) -> list[int | None]:
    """Find where a list without a summary block starts in the stored history.

    Such a list is a whole-transcript view (the host before any compaction, a
    replay, an import), so any row may match, summarized or not. Candidates
    are the newest and the oldest stored copies of its first message; from
    each the list is aligned in order, and the candidate lining up the most
    messages wins (a list that starts with something new is new throughout).
    """
    first = next((i for i, h in enumerate(hashes) if h is not None), None)
    if first is None:
        return [None] * len(hashes)
    # The newest copies (a tail shown again) and the oldest (a whole
    # transcript replayed); read lazily, so the fingerprint scan runs only when
    # the exact copies do not line the whole list up.
    candidates = anchor_rows(conn, session_id, digests[first], hashes[first],
                             ANCHOR_CANDIDATES)
    span = sum(1 for h in hashes if h is not None) + ALIGN_SLACK
    windows = ([row_fp(r) for r in conn.execute(
        f"SELECT {FP_COLUMNS} FROM messages WHERE session_id = ?"
        " AND store_id >= ? ORDER BY store_id LIMIT ?", (session_id, store_id, span))]
        for store_id in candidates)
    return _best_anchor(hashes, windows)


def _best_anchor(hashes: list[str | None],
                 windows: Iterable[Sequence[tuple[int, str]]]) -> list[int | None]:
    """The in-order alignment that lines up the most shown messages, over candidate
    windows each starting at a stored copy of the first shown message (the first
    window wins a tie; all new when there is none)."""
    wanted = sum(1 for h in hashes if h is not None)
    best: tuple[int, list[int | None]] = (0, [None] * len(hashes))
    for window in windows:
        alignment = align(hashes, window)
        score = identity.matched_count(alignment)
        if score > best[0]:
            best = (score, alignment)
        if score == wanted:
            break
    return best[1]


def align(shown: Sequence[str | None], stored: Sequence[tuple[int, str]]) -> list[int | None]:
    """Rule 6, for lists no view explains: map each shown fingerprint to the
    store_id it lines up with, or None when it is new.

    ``stored`` is the candidate rows from an anchor on, as ``(store_id, fingerprint)``
    in store order. Matching is greedy and monotonic (a stored row is claimed at
    most once and never before an earlier claim), and it stops at the first shown
    message that does not line up: that one and every later one are new."""
    result: list[int | None] = []
    cursor = 0
    ended = False
    for digest in shown:
        if digest is None or ended:
            result.append(None)
            continue
        found = None
        for offset in range(cursor, min(len(stored), cursor + identity.LOOKAHEAD)):
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
