"""Bounded substring scans, newest rows first, one page at a time.

FTS5 tokenizes some text badly (CJK runs, emoji, symbols), so search falls back
to scanning with ``instr``. A scan holds the shared connection for one page
only, so a writer (another agent's compaction) waits at most one page, and it
stops at a row budget and a deadline with what it found so far. Messages and
summary nodes are scanned the same way; only their SQL differs.
"""

from __future__ import annotations

import time
from typing import Callable

from .database import Database

# A page query: (cursor: ids below it, size) -> (sql, params); each row is (id, matched).
PageQuery = Callable[[int, int], tuple[str, list]]


def newest_first(db: Database, page_query: PageQuery, *, limit: int, max_rows: int,
                 max_seconds: float, page_rows: int) -> list[int]:
    """Ids (newest first) of the rows ``page_query`` marks as matching, reading at
    most ``max_rows`` rows, ``page_rows`` per page, until ``limit`` are found or
    ``max_seconds`` have passed."""
    found: list[int] = []
    cursor, scanned = 2 ** 62, 0
    deadline = time.monotonic() + max_seconds
    while scanned < max_rows and len(found) < limit:
        size = min(page_rows, max_rows - scanned)
        sql, params = page_query(cursor, size)
        with db.reading() as conn:
            page = conn.execute(sql, params).fetchall()
        found += [r[0] for r in page if r[1]]
        scanned += len(page)
        if len(page) < size or time.monotonic() > deadline:
            break
        cursor = page[-1][0]
    return found[:limit]
