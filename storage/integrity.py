"""The deep FTS integrity check, kept off every turn and off start-up.

FTS5's ``integrity-check`` reads the whole index (about 15 s at 1M rows; one
field report: 81 s on start-up). It runs here at most once per
``TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS``, in a daemon thread on its own
connection, so the shared connection (and the turn using it) never waits.
The result is recorded in ``trove_meta`` for status and doctor.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time

from .database import BUSY_TIMEOUT_MS
from .postgres.connection import is_url

log = logging.getLogger(__name__)

CHECKED_AT_KEY = "fts_checked_at"
RESULT_KEY = "fts_check_result"
_running: set[str] = set()
_running_lock = threading.Lock()


# PostgreSQL's search indexes: the tsvector columns are computed by the server from
# the row (they cannot drift from their content as an external FTS5 index can); what
# can go wrong is an index left invalid (a failed or interrupted build) or missing.
SERVER_INDEXES = ("messages_fts", "nodes_fts")


def run_fts_check(path: str) -> dict:
    """Check both FTS indexes against their content on a private connection (on a
    server: that both search indexes exist and are valid, see ``SERVER_INDEXES``)."""
    started = time.perf_counter()
    result: dict = {"ok": True, "problems": []}
    if is_url(path):
        result["problems"] = _server_index_problems(path)
        result["ok"] = not result["problems"]
        result["seconds"] = round(time.perf_counter() - started, 3)
        return result
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        for table in ("messages_fts", "nodes_fts"):
            try:
                conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
            except sqlite3.DatabaseError as exc:
                result["ok"] = False
                result["problems"].append(f"{table}: {exc}")
        conn.rollback()
    finally:
        conn.close()
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def _server_index_problems(url: str) -> list[str]:
    from .database import open_private
    db = open_private(url, read_only=True)
    try:
        with db.reading() as conn:
            found = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT c.relname, i.indisvalid, i.indisready FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relnamespace = current_schema()::regnamespace")}
    finally:
        db.close()
    problems = []
    for name in SERVER_INDEXES:
        if name not in found:
            problems.append(f"{name}: the index is missing")
        elif not all(found[name]):
            problems.append(f"{name}: the index is invalid (a failed build); REINDEX rebuilds it")
    return problems


def record_result(path: str, result: dict) -> None:
    """Store the check's time and verdict in the database's bookkeeping table."""
    if is_url(path):
        from .database import open_private
        db = open_private(path)
        try:
            with db.transaction() as conn:
                _record(conn, result)
        finally:
            db.close()
        return
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        _record(conn, result)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _record(conn, result: dict) -> None:
    for key, value in ((CHECKED_AT_KEY, str(time.time())), (RESULT_KEY, json.dumps(result))):
        conn.execute("INSERT INTO trove_meta(key, value) VALUES (?, ?) ON CONFLICT(key)"
                     " DO UPDATE SET value = excluded.value", (key, value))


def is_due(last_checked_at: str | None, interval_hours: float, now: float | None = None) -> bool:
    """Whether the interval since the last check has passed (0 hours = never)."""
    if interval_hours <= 0:
        return False
    if not last_checked_at:
        return True
    try:
        last = float(last_checked_at)
    except ValueError:
        return True
    return ((time.time() if now is None else now) - last) >= interval_hours * 3600


def start_if_due(path: str, last_checked_at: str | None, interval_hours: float) -> bool:
    """Start the background check when due and not already running; True if started."""
    # A server's tsvector column is computed by PostgreSQL itself: nothing to drift.
    if path == ":memory:" or is_url(path) or not is_due(last_checked_at, interval_hours):
        return False
    with _running_lock:
        if path in _running:
            return False
        _running.add(path)

    def work() -> None:
        try:
            result = run_fts_check(path)
            record_result(path, result)
            if not result["ok"]:
                log.warning("hermes-trove: FTS integrity problems: %s (run /trove doctor repair)",
                            result["problems"])
        except Exception as exc:  # a background check must never crash anything
            log.warning("hermes-trove: FTS integrity check failed to run: %s", exc)
        finally:
            with _running_lock:
                _running.discard(path)

    threading.Thread(target=work, name="trove-fts-check", daemon=True).start()
    return True
