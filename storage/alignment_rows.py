"""The rows a shown list may be: the SQL ``storage/alignment`` reads candidates with.

Identity's rules (``storage/identity``) decide which row a shown message is; these
functions only read the session's rows a gap, a block's tail or an anchored list may
line up with (all of them by ``store_id`` order, parameters bound). Kept apart so the
alignment module holds the reading of lists and this one the queries it needs.
"""

from __future__ import annotations

from . import identity
from .database import chunked

# A block whose tail is unknown is aligned against unsummarized rows among this many
# times the shown list's length of the session's newest rows.
FRESH_SCAN_FACTOR = 8


def fresh_from(conn, session_id: str, low: int, limit: int) -> list[int]:
    """The session's first ``limit`` rows from ``low`` on that no summary covers."""
    return [row[0] for row in conn.execute(
        "SELECT store_id FROM messages AS m WHERE session_id = ? AND store_id >= ?"
        " AND NOT EXISTS (SELECT 1 FROM node_edges AS e WHERE e.child_store_id = m.store_id)"
        " ORDER BY store_id LIMIT ?", (session_id, low, limit))]


def rows_between(conn, session_id: str, low: int, high: int, enough: int) -> int:
    """How many of the session's rows lie strictly between ``low`` and ``high``
    (counted up to ``enough``: the callers only compare). The subquery is named:
    PostgreSQL before 16 refuses one without a name, and every turn whose list needed
    this count failed to store (host walk 310003 on PostgreSQL 15)."""
    return conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM messages WHERE session_id = ? AND store_id > ?"
        " AND store_id < ? LIMIT ?) AS gap", (session_id, low, high, max(0, enough))).fetchone()[0]


def gap_rows(conn, session_id: str, before: int | None, after: int | None,
             limit: int, *, fresh_only: bool, rendered: int | None = None,
             beside: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """``(store_id, fingerprint)`` of the session's rows a gap may be: between
    its neighbours' rows, before the first (the newest of them) or after the last;
    with ``fresh_only`` only rows no summary covers, or, given ``rendered`` (the
    newest node when the list's block was rendered), no summary up to it covers:
    a row a later compaction summarized is still the stale list's message; and,
    whatever covers them, the rows ``beside`` (a view showed them raw after the
    list's block: ``Alignment._block_in_views``)."""
    columns = "store_id, role, content, content_format, tool_calls, tool_call_id"
    first: tuple = (session_id,)
    fresh = ""
    if fresh_only:
        shown = sorted(sid for sid in beside if (before is None or sid > before)
                       and (after is None or sid < after))
        fresh = (" AND (NOT EXISTS (SELECT 1 FROM node_edges AS e"
                 " WHERE e.child_store_id = m.store_id"
                 + (" AND e.parent_id <= ?)" if rendered is not None else ")")
                 + (f" OR store_id IN ({','.join('?' * len(shown))}))" if shown else ")"))
        first = (session_id, *(() if rendered is None else (rendered,)), *shown)
    head = f"SELECT {columns} FROM messages AS m WHERE session_id = ?{fresh}"
    if before is not None and after is not None:
        rows = conn.execute(f"{head} AND store_id > ? AND store_id < ?"
                            f" ORDER BY store_id LIMIT ?",
                            (*first, before, after, limit)).fetchall()
    elif before is not None:
        rows = conn.execute(f"{head} AND store_id > ? ORDER BY store_id LIMIT ?",
                            (*first, before, limit)).fetchall()
    else:
        rows = conn.execute(f"{head} AND store_id < ? ORDER BY store_id DESC LIMIT ?",
                            (*first, after, limit)).fetchall()[::-1]
    return [(r[0], identity.fingerprint(r[1], r[2], r[3], r[4], r[5])) for r in rows]


def fresh_rows(conn, session_id: str, limit: int) -> list[tuple[int, str]]:
    """``(store_id, hash)`` of the session's newest ``limit`` rows that no summary
    covers and that come after the newest row one does, in store order (looking
    at most ``FRESH_SCAN_FACTOR * limit`` rows back). A row older than what the
    newest summary covers and left out of it is one the host dropped (a /retry's
    or /undo's first attempt): nothing shown after a block is that row."""
    rows = []
    for store_id, digest, covered in conn.execute(
            "SELECT store_id, content_hash, EXISTS (SELECT 1 FROM node_edges AS e"
            " WHERE e.child_store_id = m.store_id) FROM messages AS m"
            " WHERE session_id = ? ORDER BY store_id DESC LIMIT ?",
            (session_id, FRESH_SCAN_FACTOR * limit)):
        if covered:
            break
        rows.append((store_id, digest))
    return rows[:limit][::-1]

def hashes_of(conn, store_ids: list[int]) -> list[tuple[int, str]]:
    """``(store_id, content hash)`` of these rows (any order; missing ones left out)."""
    found = []
    for chunk in chunked(store_ids):
        found += [(r[0], r[1]) for r in conn.execute(
            f"SELECT store_id, content_hash FROM messages WHERE store_id IN"
            f" ({','.join('?' * len(chunk))})", chunk)]
    return found
