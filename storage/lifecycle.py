"""Pruning session rows that never stored anything.

Every ``on_session_start`` makes a session row, and hosts start many sessions
that never say a word (review forks, cron probes, a ``/new`` followed by
quitting). Those rows only slow listings down. This prunes them,
automatically and bounded: only rows untouched for
``TROVE_EMPTY_LIFECYCLE_GC_MAX_AGE_HOURS``, only once at least
``TROVE_EMPTY_LIFECYCLE_GC_THRESHOLD`` have piled up, at most ``MAX_PRUNE`` per
run, in one transaction. A row is never pruned when anything refers to it: a
message, a summary node, a carried node, an alias session, an import ledger
entry, or when it is itself an alias (its id continues another conversation), nor
while an engine of any process is bound to it (``locks.in_use_elsewhere``).
"""

from __future__ import annotations

import time

from . import locks
from .database import Database

MAX_PRUNE = 500
LAST_RUN_KEY = "empty_lifecycle_gc_last"
MIN_INTERVAL_SECONDS = 3600  # a run reads every session row: at most one an hour

# A session row nobody depends on: self-canonical, no messages, no nodes, no
# carried nodes, no alias pointing at it, not the target of an import.
_EMPTY_SESSIONS = """
SELECT s.session_id FROM sessions AS s
WHERE s.canonical_id = s.session_id AND s.updated_at < ?
  AND NOT EXISTS (SELECT 1 FROM messages AS m WHERE m.session_id = s.session_id)
  AND NOT EXISTS (SELECT 1 FROM nodes AS n WHERE n.session_id = s.session_id)
  AND NOT EXISTS (SELECT 1 FROM session_carry AS c WHERE c.session_id = s.session_id)
  AND NOT EXISTS (SELECT 1 FROM sessions AS a
                  WHERE a.canonical_id = s.session_id AND a.session_id <> s.session_id)
  AND s.session_id NOT IN (SELECT l.target_id FROM import_ledger AS l
                           WHERE l.target_kind = 'session')
ORDER BY s.updated_at
LIMIT ?
"""


def prune_if_due(db: Database, *, threshold: int, max_age_hours: float,
                 keep: tuple[str, ...] = ()) -> dict | None:
    """``prune_empty_sessions`` at most once per ``MIN_INTERVAL_SECONDS`` per database
    (the last run's time is kept in ``trove_meta``); None when not due."""
    now = time.time()
    with db.reading() as conn:
        row = conn.execute("SELECT value FROM trove_meta WHERE key = ?", (LAST_RUN_KEY,)).fetchone()
    try:
        if row and now - float(row[0]) < MIN_INTERVAL_SECONDS:
            return None
    except ValueError:
        pass  # an unreadable stamp: run and rewrite it
    return prune_empty_sessions(db, threshold=threshold, max_age_hours=max_age_hours,
                                keep=keep, now=now)


def prune_empty_sessions(db: Database, *, threshold: int, max_age_hours: float,
                         keep: tuple[str, ...] = (), now: float | None = None) -> dict:
    """Delete up to ``MAX_PRUNE`` empty, old, unreferenced session rows when at
    least ``threshold`` exist; ``keep`` (the sessions bound right now) are never
    touched. Returns what it found and deleted, for status."""
    now = time.time() if now is None else now
    cutoff = now - max_age_hours * 3600
    with db.transaction() as conn:
        conn.execute("INSERT INTO trove_meta(key, value) VALUES (?, ?) ON CONFLICT(key)"
                     " DO UPDATE SET value = excluded.value", (LAST_RUN_KEY, str(now)))
        found = [r[0] for r in conn.execute(_EMPTY_SESSIONS, (cutoff, MAX_PRUNE + len(keep)))]
        path = str(db.path)
        found = [s for s in found if s not in keep and not locks.held_here(path, s)
                 and not locks.in_use_elsewhere(path, s)][:MAX_PRUNE]
        if len(found) < max(1, threshold):
            return {"candidates": len(found), "pruned": 0}
        conn.executemany("DELETE FROM sessions WHERE session_id = ?", [(s,) for s in found])
    return {"candidates": len(found), "pruned": len(found)}
