"""The session views table: which lists the engine knows the rows of.

The SQL behind ``storage/identity``'s views (see its docstring for the rule).
Each engine copy (``origin``) keeps a small ring of views per session; a
session keeps at most ``MAX_VIEWS`` in all, the oldest dropped first. Every
function takes the caller's connection, so a view is written in the same
transaction as the rows it names.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from typing import Iterator, Sequence

from .database import chunked
from .identity import BLOCK_ID, View, decode_entries, encode_entries

# Views kept per engine copy and session of the lists it stored (a compaction's
# input, the hooks' lists), and of the lists its compactions returned: a list
# the host shows again after later compactions still carries an older block.
RING = 24
RETURNED_RING = 16
# Views kept per session over all copies, processes and restarts.
MAX_VIEWS = 96
# Views of other sessions read when a list may be another session's.
OTHER_VIEWS = 24


def _view(row) -> View:
    meta = {}
    if row[3]:
        try:
            meta = json.loads(row[3])
        except ValueError:
            meta = {}
    return View(entries=decode_entries(row[2]), session=row[0], origin=row[1], meta=meta)


def load(conn: sqlite3.Connection, session_id: str, limit: int = MAX_VIEWS) -> list[View]:
    """The session's views, newest first."""
    return list(each(conn, session_id, limit))


def each(conn: sqlite3.Connection, session_id: str, limit: int = MAX_VIEWS) -> Iterator[View]:
    """The session's views, newest first, read one at a time (a reader that is
    answered by the newest few never decodes the rest)."""
    for row in _newest(conn, session_id, limit):  # decoded as needed
        yield _view(row)


def _newest(conn: sqlite3.Connection, session_id: str, limit: int) -> list:
    """The session's newest ``limit`` view rows, undecoded, fetched at once (no
    statement left open)."""
    return conn.execute(
        "SELECT session_id, origin, entries, meta FROM session_views WHERE session_id = ?"
        " ORDER BY updated_at DESC LIMIT ?", (session_id, limit)).fetchall()


def holding(conn: sqlite3.Connection, session_id: str, store_ids: Sequence[int],
            limit: int = MAX_VIEWS) -> Iterator[View]:
    """The session's newest ``limit`` views that name one of ``store_ids``, newest
    first; the others are not decoded (a turn's fast path asks this)."""
    if not store_ids:
        return
    named = re.compile(r":(?:" + "|".join(str(int(s)) for s in store_ids) + r")(?= |$)")
    for row in _newest(conn, session_id, limit):
        if row[2] and named.search(row[2]):
            yield _view(row)


def block_fps(conn: sqlite3.Connection, session_id: str) -> set[str]:
    """Fingerprints of the engine's blocks that the session's views hold (read
    without decoding whole views: a block entry carries the BLOCK_ID)."""
    found = set()
    for (entries,) in conn.execute("SELECT entries FROM session_views WHERE session_id = ?"
                                   " AND entries LIKE ?", (session_id, f"%:{BLOCK_ID}%")):
        found.update(token.rpartition(":")[0] for token in entries.split()
                     if token.endswith(f":{BLOCK_ID}"))
    return found


LINEAGE_DEPTH = 8             # a branch's ancestors read for the blocks it may show


def lineage_block_fps(conn: sqlite3.Connection, *session_ids: str | None) -> set[str]:
    """Block fingerprints of these sessions and their ancestors (``parent_session_id``,
    ``LINEAGE_DEPTH`` each, every session read once): a /branch of a branch that never
    stored anything shows its grandparent's block."""
    found: set[str] = set()
    seen: set[str] = set()
    for current in session_ids:
        depth = 0
        while current and current not in seen and depth < LINEAGE_DEPTH:
            seen.add(current)
            depth += 1
            found |= block_fps(conn, current)
            row = conn.execute("SELECT parent_session_id FROM sessions WHERE session_id = ?",
                               (current,)).fetchone()
            current = row[0] if row else None
    return found


def load_others(conn: sqlite3.Connection, session_id: str,
                limit: int = OTHER_VIEWS) -> list[View]:
    """The newest views of every other session (a list that may not be this
    session's is read against them)."""
    rows = conn.execute(
        "SELECT session_id, origin, entries, meta FROM session_views WHERE session_id != ?"
        " ORDER BY updated_at DESC LIMIT ?", (session_id, limit)).fetchall()
    return [_view(r) for r in rows]


def digest_of(text: str) -> str:
    """A short digest of a view's stored entries (an identical view is not written twice)."""
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:20]


def save(conn: sqlite3.Connection, session_id: str, origin: str,
         entries: Sequence[tuple[str, int]], *, now: float, meta: dict | None = None,
         ring: int = RING, text: str | None = None) -> bool:
    """Remember a view for ``origin`` (into the oldest slot of its ``ring``); an
    identical view already there is only touched. Returns whether one was written.
    ``text`` is ``encode_entries(entries)`` when the caller has it."""
    text = encode_entries(entries) if text is None else text
    digest = digest_of(text)
    slots = conn.execute(
        "SELECT slot, digest, updated_at, meta FROM session_views"
        " WHERE session_id = ? AND origin = ?", (session_id, origin)).fetchall()
    same = next((s for s in slots if s[1] == digest), None)
    meta_text = json.dumps(meta) if meta else None
    if same is not None and same[2] >= max(s[2] for s in slots) and same[3] == meta_text:
        return False  # already this copy's newest view: a turn's repeated showing writes nothing
    if same is not None:
        conn.execute("UPDATE session_views SET updated_at = ?, meta = ? WHERE session_id = ?"
                     " AND origin = ? AND slot = ?",
                     (now, json.dumps(meta) if meta else None, session_id, origin, same[0]))
        return False
    used = {s[0] for s in slots}
    free = next((k for k in range(ring) if k not in used), None)
    slot = free if free is not None else min(slots, key=lambda s: s[2])[0]
    conn.execute(
        "INSERT OR REPLACE INTO session_views(session_id, origin, slot, updated_at, digest,"
        " entries, meta) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (session_id, origin, slot, now, digest, text, json.dumps(meta) if meta else None))
    if not slots:  # a new copy: keep the session's total bounded
        conn.execute(
            "DELETE FROM session_views WHERE session_id = ? AND rowid NOT IN (SELECT rowid"
            " FROM session_views WHERE session_id = ? ORDER BY updated_at DESC LIMIT ?)",
            (session_id, session_id, MAX_VIEWS))
    return True


def delete_sessions_in(conn: sqlite3.Connection, session_ids: Sequence[str]) -> int:
    """Forget the views of removed sessions (in the caller's transaction)."""
    removed = 0
    for chunk in chunked(session_ids):
        removed += conn.execute(
            f"DELETE FROM session_views WHERE session_id IN ({','.join('?' * len(chunk))})",
            chunk).rowcount
    return removed
