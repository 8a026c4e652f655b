"""SQL of the background-prepared summaries table (``prep_summaries``, migration 4).

A worker *claims* a chunk (its first store_id in a session) with a lease, then
*fills* it with a summary; compaction *takes* a ready one whose sources are
unchanged and *drops* what is stale. The primary key ``(session_id,
first_store_id)`` is the claim: an insert succeeds for one process only, and
a claim whose lease ran out (a crashed worker) can be taken over. Every
function is one short transaction so a turn on the shared connection never
waits long for a worker.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from typing import Iterable, Sequence


def source_hash(rows: Iterable[tuple[int, str]]) -> str:
    """Fingerprint of a chunk's ``(store_id, content_hash)`` pairs, in order."""
    digest = hashlib.sha256()
    for store_id, content_hash in rows:
        digest.update(f"{int(store_id)}:{content_hash};".encode())
    return digest.hexdigest()[:32]


def chunk_hashes(conn: sqlite3.Connection, store_ids: Sequence[int]) -> list[tuple[int, str]]:
    """``(store_id, content_hash)`` of the stored rows among ``store_ids``, in the given order."""
    if not store_ids:
        return []
    found: dict[int, str] = {}
    ids = list(store_ids)
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        marks = ",".join("?" * len(part))
        found.update(conn.execute(
            f"SELECT store_id, content_hash FROM messages WHERE store_id IN ({marks})", part))
    return [(s, found[s]) for s in ids if s in found]


def claim(conn: sqlite3.Connection, session_id: str, store_ids: Sequence[int], digest: str,
          owner: str, lease_seconds: float, now: float | None = None) -> bool:
    """Claim the chunk starting at ``store_ids[0]``; False when someone else holds it
    (a live claim or a ready summary). A stale claim or a ready summary of other
    sources is replaced."""
    now = time.time() if now is None else now
    row = conn.execute("SELECT state, lease_until, source_hash FROM prep_summaries"
                       " WHERE session_id = ? AND first_store_id = ?",
                       (session_id, store_ids[0])).fetchone()
    if row is not None:
        state, lease_until, old_digest = row
        if old_digest == digest and (state == "ready" or lease_until > now):
            return False
        if state == "claimed" and lease_until > now:
            return False
    conn.execute(
        "INSERT INTO prep_summaries(session_id, first_store_id, last_store_id, store_ids,"
        " source_hash, state, owner, lease_until, created_at, summary)"
        " VALUES (?, ?, ?, ?, ?, 'claimed', ?, ?, ?, NULL)"
        " ON CONFLICT(session_id, first_store_id) DO UPDATE SET"
        " last_store_id = excluded.last_store_id, store_ids = excluded.store_ids,"
        " source_hash = excluded.source_hash, state = 'claimed', owner = excluded.owner,"
        " lease_until = excluded.lease_until, created_at = excluded.created_at, summary = NULL",
        (session_id, store_ids[0], store_ids[-1], json.dumps(list(store_ids)), digest, owner,
         now + lease_seconds, now))
    return True


def fill(conn: sqlite3.Connection, session_id: str, first_store_id: int, owner: str,
         summary: dict) -> bool:
    """Store the finished summary of a chunk this owner still holds; False if lost."""
    cur = conn.execute(
        "UPDATE prep_summaries SET state = 'ready', summary = ?"
        " WHERE session_id = ? AND first_store_id = ? AND owner = ? AND state = 'claimed'",
        (json.dumps(summary), session_id, first_store_id, owner))
    return cur.rowcount == 1


def release(conn: sqlite3.Connection, session_id: str, first_store_id: int, owner: str) -> None:
    """Give a claim back (the worker failed or stopped)."""
    conn.execute("DELETE FROM prep_summaries WHERE session_id = ? AND first_store_id = ?"
                 " AND owner = ? AND state = 'claimed'", (session_id, first_store_id, owner))


def ready(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    """Every ready summary of a session, oldest chunk first."""
    rows = conn.execute(
        "SELECT first_store_id, store_ids, source_hash, summary FROM prep_summaries"
        " WHERE session_id = ? AND state = 'ready' ORDER BY first_store_id", (session_id,))
    return [{"first_store_id": first, "store_ids": json.loads(ids), "source_hash": digest,
             "summary": json.loads(summary)} for first, ids, digest, summary in rows]


def drop(conn: sqlite3.Connection, session_id: str, first_store_ids: Iterable[int]) -> None:
    """Forget used or stale prepared summaries."""
    conn.executemany("DELETE FROM prep_summaries WHERE session_id = ? AND first_store_id = ?",
                     [(session_id, f) for f in first_store_ids])


def last_store_id(conn: sqlite3.Connection, session_id: str, now: float | None = None) -> int:
    """The newest store_id covered by a ready or live-claimed chunk (0 if none):
    where the next chunk to prepare starts."""
    now = time.time() if now is None else now
    row = conn.execute("SELECT MAX(last_store_id) FROM prep_summaries WHERE session_id = ?"
                       " AND (state = 'ready' OR lease_until > ?)", (session_id, now)).fetchone()
    return int(row[0] or 0)


def states(conn: sqlite3.Connection, session_id: str) -> dict:
    """How many chunks of a session are claimed and ready, for status."""
    counts = dict(conn.execute("SELECT state, COUNT(*) FROM prep_summaries WHERE session_id = ?"
                               " GROUP BY state", (session_id,)).fetchall())
    return {"claimed": counts.get("claimed", 0), "ready": counts.get("ready", 0)}
