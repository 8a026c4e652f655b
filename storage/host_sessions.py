"""Session titles from the host's own database (``$HERMES_HOME/state.db``).

Hermes's ``/title`` names a session in its ``sessions`` table; users remember
that name, not the id. Operators may give a title wherever a session id is
taken, and ``trove.py sessions`` shows the titles. The file is the host's: it is
only ever read (``mode=ro``, ``query_only``), and a missing, locked or foreign
file simply means "no titles".
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterable

from .database import _connect_read_only, chunked

STATE_DB = "state.db"


def _query(home: Path, sql: str, params: tuple) -> list[tuple]:
    path = Path(home) / STATE_DB
    if not path.is_file():
        return []
    try:
        conn = _connect_read_only(str(path))
        try:
            return [tuple(r) for r in conn.execute(sql, params).fetchall()]
        finally:
            conn.close()
    except sqlite3.Error:   # locked, foreign or an older schema: no titles
        return []


def session_for_title(home: Path, title: str) -> str | None:
    """The session id the host titled ``title`` (exact first, then ignoring case)."""
    rows = _query(home, "SELECT id, title FROM sessions WHERE title = ? OR "
                  "lower(title) = lower(?) ORDER BY title = ? DESC, started_at DESC LIMIT 2",
                  (title, title, title))
    if not rows:
        return None
    exact = [r for r in rows if r[1] == title]
    if exact or len(rows) == 1:
        return (exact or rows)[0][0]
    return None          # two titles differ only in case: ambiguous, never a guess


def titles(home: Path, session_ids: Iterable[str]) -> dict[str, str]:
    """``{session_id: title}`` for the ids that have a title in the host's database."""
    ids = list(dict.fromkeys(session_ids))
    found: dict[str, str] = {}
    for chunk in chunked(ids):
        marks = ", ".join("?" * len(chunk))
        found.update(_query(home, f"SELECT id, title FROM sessions WHERE id IN ({marks}) "
                            "AND title IS NOT NULL", tuple(chunk)))
    return found
