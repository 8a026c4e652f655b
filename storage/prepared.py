"""SQL of the background-prepared summaries (``prep_summaries``, migration 4, and
``prep_condensed``, migration 8).

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

from .database import chunked


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
    for part in chunked(ids):
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


# The key column of each table of prepared work (names are never taken from input).
_KEY_COLUMNS = {"prep_summaries": "first_store_id", "prep_condensed": "group_key"}


def _fill(conn: sqlite3.Connection, table: str, session_id: str, key, owner: str,
          summary: dict) -> bool:
    cur = conn.execute(
        f"UPDATE {table} SET state = 'ready', summary = ? WHERE session_id = ?"
        f" AND {_KEY_COLUMNS[table]} = ? AND owner = ? AND state = 'claimed'",
        (json.dumps(summary), session_id, key, owner))
    return cur.rowcount == 1


def _release(conn: sqlite3.Connection, table: str, session_id: str, key, owner: str) -> None:
    conn.execute(f"DELETE FROM {table} WHERE session_id = ? AND {_KEY_COLUMNS[table]} = ?"
                 " AND owner = ? AND state = 'claimed'", (session_id, key, owner))


def fill(conn: sqlite3.Connection, session_id: str, first_store_id: int, owner: str,
         summary: dict) -> bool:
    """Store the finished summary of a chunk this owner still holds; False if lost."""
    return _fill(conn, "prep_summaries", session_id, first_store_id, owner, summary)


def release(conn: sqlite3.Connection, session_id: str, first_store_id: int, owner: str) -> None:
    """Give a claim back (the worker failed or stopped)."""
    _release(conn, "prep_summaries", session_id, first_store_id, owner)


def ready(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    """Every ready summary of a session, oldest chunk first."""
    rows = conn.execute(
        "SELECT first_store_id, store_ids, source_hash, summary FROM prep_summaries"
        " WHERE session_id = ? AND state = 'ready' ORDER BY first_store_id", (session_id,))
    return [{"first_store_id": first, "store_ids": json.loads(ids), "source_hash": digest,
             "summary": json.loads(summary)} for first, ids, digest, summary in rows]


def in_flight(conn: sqlite3.Connection, session_id: str, now: float | None = None) -> list[dict]:
    """Chunks a worker is summarizing right now (claimed, lease not run out)."""
    now = time.time() if now is None else now
    rows = conn.execute("SELECT first_store_id, store_ids, lease_until FROM prep_summaries"
                        " WHERE session_id = ? AND state = 'claimed' AND lease_until > ?"
                        " ORDER BY first_store_id", (session_id, now))
    return [{"first_store_id": first, "store_ids": json.loads(ids), "lease_until": until}
            for first, ids, until in rows]


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
    """How many chunks and groups of a session are claimed and ready, for status."""
    counts = dict(conn.execute("SELECT state, COUNT(*) FROM prep_summaries WHERE session_id = ?"
                               " GROUP BY state", (session_id,)).fetchall())
    groups = dict(conn.execute("SELECT state, COUNT(*) FROM prep_condensed WHERE session_id = ?"
                               " GROUP BY state", (session_id,)).fetchall())
    return {"claimed": counts.get("claimed", 0), "ready": counts.get("ready", 0),
            "groups_claimed": groups.get("claimed", 0), "groups_ready": groups.get("ready", 0)}


# ---------------------------------------------------------------- condensed groups
def group_key(children: Iterable[tuple[int | None, int | None, str]]) -> str:
    """Fingerprint of a group to merge: each child's ``(first_store_id,
    last_store_id, summary text without footer)``, in order. The texts are what
    a merge reads, so equal keys mean equal input."""
    digest = hashlib.sha256()
    for first, last, text in children:
        body = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        digest.update(f"{first}:{last}:{body};".encode())
    return digest.hexdigest()[:32]


def claim_group(conn: sqlite3.Connection, session_id: str, key: str, depth: int, owner: str,
                lease_seconds: float, now: float | None = None) -> bool:
    """Claim the group ``key``; False when it is ready or claimed by a live lease."""
    now = time.time() if now is None else now
    row = conn.execute("SELECT state, lease_until FROM prep_condensed"
                       " WHERE session_id = ? AND group_key = ?", (session_id, key)).fetchone()
    if row is not None and (row[0] == "ready" or row[1] > now):
        return False
    conn.execute(
        "INSERT INTO prep_condensed(session_id, group_key, depth, state, owner, lease_until,"
        " created_at, summary) VALUES (?, ?, ?, 'claimed', ?, ?, ?, NULL)"
        " ON CONFLICT(session_id, group_key) DO UPDATE SET state = 'claimed',"
        " owner = excluded.owner, lease_until = excluded.lease_until,"
        " created_at = excluded.created_at, summary = NULL",
        (session_id, key, depth, owner, now + lease_seconds, now))
    return True


def fill_group(conn: sqlite3.Connection, session_id: str, key: str, owner: str,
               summary: dict) -> bool:
    """Store the finished summary of a group this owner still holds; False if lost."""
    return _fill(conn, "prep_condensed", session_id, key, owner, summary)


def release_group(conn: sqlite3.Connection, session_id: str, key: str, owner: str) -> None:
    """Give a group claim back (the worker failed or stopped)."""
    _release(conn, "prep_condensed", session_id, key, owner)


def ready_groups(conn: sqlite3.Connection, session_id: str) -> dict[str, dict]:
    """Every ready group summary of a session by key (with its ``depth``)."""
    rows = conn.execute("SELECT group_key, depth, summary FROM prep_condensed"
                        " WHERE session_id = ? AND state = 'ready'", (session_id,))
    return {key: {**json.loads(summary), "depth": depth} for key, depth, summary in rows}


def group_states(conn: sqlite3.Connection, session_id: str,
                 now: float | None = None) -> dict[str, str]:
    """Each group key of a session that is ready or claimed with a live lease."""
    now = time.time() if now is None else now
    return dict(conn.execute("SELECT group_key, state FROM prep_condensed WHERE session_id = ?"
                             " AND (state = 'ready' OR lease_until > ?)", (session_id, now)))


def drop_groups(conn: sqlite3.Connection, session_id: str, keys: Iterable[str]) -> None:
    """Forget used or stale group summaries."""
    conn.executemany("DELETE FROM prep_condensed WHERE session_id = ? AND group_key = ?",
                     [(session_id, k) for k in keys])


def delete_sessions_in(conn: sqlite3.Connection, session_ids: Sequence[str]) -> dict:
    """Forget removed sessions' prepared leaves and merges, inside the caller's
    transaction (``doctor clean apply`` removes sessions in one unit)."""
    ids = list(dict.fromkeys(session_ids))
    if not ids:
        return {"prepared_rows": 0}
    removed = 0
    for chunk in chunked(ids):
        marks = ",".join("?" * len(chunk))
        for table in ("prep_summaries", "prep_condensed"):
            removed += conn.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})",
                                    chunk).rowcount
    return {"prepared_rows": removed}
