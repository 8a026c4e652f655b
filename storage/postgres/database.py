"""``PgDatabase``: the PostgreSQL twin of ``storage.database.Database``.

Same contract: one shared connection per server database per process, serialized
by a re-entrant lock; ``transaction()`` is one unit of work that holds the writer
lock (a transaction-scoped advisory lock, as ``BEGIN IMMEDIATE`` holds SQLite's
write lock), ``reading()`` the connection for reads. Opening applies pending
migrations (``schema``) and runs the structural check. ``path`` is the URL without
its password is ``display``, what status and errors print (``path`` is the URL
itself, the registry's key; it is never printed).
"""

from __future__ import annotations

import threading
import time

from ..database import Connected
from . import schema
from .connection import Connection, display_name

DIALECT = "postgresql"


class PgDatabase(Connected):
    """A PostgreSQL connection plus the lock that serializes its use across threads
    (``transaction``, ``reading`` and ``close`` are ``Connected``'s)."""

    dialect = DIALECT

    def __init__(self, url: str, *, error: type[Exception], too_new: type[Exception],
                 read_only: bool = False):
        self.path = url
        self.display = display_name(url)
        self.read_only = read_only
        self.lock = threading.RLock()
        self.opened_at = time.time()
        started = time.perf_counter()
        try:
            self.conn = Connection(url)
            if not read_only:
                schema.migrate(self.conn, too_new)
            self.missing_objects = schema.structural_check(self.conn)
            # substring search uses the pg_trgm index when migration 2 could build it
            self.trigram = bool(self.conn.execute(
                "SELECT to_regclass('messages_trgm')").fetchone()[0])
        except too_new:
            raise
        except Exception as exc:  # psycopg missing, server down, bad credentials
            raise error(f"cannot open trove database {self.display}: {exc}") from None
        self.open_seconds = time.perf_counter() - started

    def connection_lost(self) -> bool:
        """Whether the server closed this connection (a restart, a failover, an idle
        timeout, ``pg_terminate_backend``). Why: psycopg never reconnects by itself,
        so without a new connection every later statement failed ("the connection is
        closed") and the store stayed away until the process exited."""
        raw = getattr(self.conn, "raw", None)
        return bool(raw is not None and (raw.closed or raw.broken))

    def schema_version(self) -> int:
        """The applied PostgreSQL schema version."""
        with self.lock:
            return schema.schema_version(self.conn)
