"""One shared SQLite connection per database file per process.

The host deep-copies the engine for every agent (CLI, subagents, gateway
sessions, temporary /compress agents). If each copy opened its own connection,
a busy gateway would exhaust file descriptors and fight over locks. So engines
hold only a path, and ``get_database(path)`` hands every caller in the process
the same ``Database``: one connection, serialized by a re-entrant lock.

Opening is cheap by design: pragmas, pending migrations and a structural check
that reads only the schema. The deep FTS integrity check is never run here.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from . import migrations

BUSY_TIMEOUT_MS = 5000
REQUIRED_OBJECTS = (
    "sessions", "messages", "messages_fts", "nodes", "node_edges", "nodes_fts",
    "session_carry", "trove_meta", "messages_fts_insert", "nodes_fts_insert",
)

_registry: dict[str, "Database"] = {}
_registry_lock = threading.Lock()


class DatabaseError(RuntimeError):
    """The trove database cannot be opened or is structurally broken."""


class Database:
    """A connection plus the lock that serializes its use across threads."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.RLock()
        self.opened_at = time.time()
        self.open_seconds = 0.0
        started = time.perf_counter()
        try:
            self.conn = _open_with_retry(path)
            self.missing_objects = structural_check(self.conn)
        except migrations.SchemaTooNewError:
            raise
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open trove database {path}: {exc}") from exc
        self.open_seconds = time.perf_counter() - started

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One unit of work: BEGIN IMMEDIATE ... COMMIT, rolled back on any error."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """Exclusive use of the connection for reads (no transaction is opened)."""
        with self.lock:
            yield self.conn

    def close(self) -> None:
        """Close the connection (tests and scripts; the engine never closes it)."""
        with self.lock:
            self.conn.close()


def _open_with_retry(path: str) -> sqlite3.Connection:
    """Connect and migrate. Several processes may create the same new file at once
    (a gateway and a cron run): switching a new file to WAL can answer "database is
    locked" without waiting, so the whole open is tried again for up to the busy
    timeout before the error stands."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        conn = None
        try:
            conn = _connect(path)
            migrations.migrate(conn)
            return conn
        except sqlite3.OperationalError as exc:
            if conn is not None:
                conn.close()
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
        except BaseException:
            if conn is not None:
                conn.close()
            raise


def _connect(path: str) -> sqlite3.Connection:
    if path != ":memory:":
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL: a committed turn survives power loss, not only a process crash.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA temp_store = MEMORY")
    return conn


def structural_check(conn: sqlite3.Connection) -> list[str]:
    """Names of required tables, views and triggers that are missing (schema read only)."""
    present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    return [name for name in REQUIRED_OBJECTS if name not in present]


def resolve_path(path: str | os.PathLike) -> str:
    """The canonical key for a database file (absolute, symlinks resolved)."""
    text = str(path)
    if text == ":memory:":
        return text
    return str(Path(text).expanduser().resolve())


def get_database(path: str | os.PathLike) -> Database:
    """The process-wide shared ``Database`` for ``path``, opened on first use."""
    key = resolve_path(path)
    with _registry_lock:
        db = _registry.get(key)
        if db is None:
            db = Database(key)
            _registry[key] = db
        return db


def forget_database(path: str | os.PathLike) -> None:
    """Close and drop the shared connection for ``path`` (tests, restore, repair)."""
    key = resolve_path(path)
    with _registry_lock:
        db = _registry.pop(key, None)
    if db is not None:
        db.close()
