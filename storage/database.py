"""One shared SQLite connection per database file per process.

The host deep-copies the engine for every agent (CLI, subagents, gateway
sessions, temporary /compress agents). If each copy opened its own connection,
a busy gateway would exhaust file descriptors and fight over locks. So engines
hold only a path, and ``get_database(path)`` hands every caller in the process
the same ``Database``: one connection, serialized by a re-entrant lock.

Opening is cheap by design: pragmas, pending migrations and a structural check
that reads only the schema. The deep FTS integrity check is never run here.

Operator reads (``trove.py status``, ``grep``, ``export`` ...) must never turn a
file into a trove database: ``trove_file_problem`` looks at a file without
writing, and ``open_read_only`` opens a trove database with ``mode=ro`` and
``query_only``: no journal-mode switch, no migration, no write.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, TypeVar

from . import migrations
from .postgres.connection import is_url

log = logging.getLogger(__name__)
T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000
# How often the shared connection checks that its file is still the one at its path.
FILE_CHECK_SECONDS = 1.0
REQUIRED_OBJECTS = (
    "sessions", "messages", "messages_fts", "nodes", "node_edges", "nodes_fts",
    "session_carry", "trove_meta", "messages_fts_insert", "nodes_fts_insert",
)

# The tables every trove database has had since migration 1 (read-only probe).
TROVE_MARKERS = ("trove_migrations", "trove_meta", "sessions", "messages", "nodes")
SQLITE_MAGIC = b"SQLite format 3\x00"

_registry: dict[str, "Database"] = {}
_read_only: dict[str, "Database"] = {}
_keys: dict[str, str] = {}  # a path as configured -> its registry key (``resolve_path``)
_registry_lock = threading.Lock()


# "All rows" as a bound LIMIT: SQLite reads LIMIT -1 as no limit, PostgreSQL refuses a
# negative LIMIT, and SQLite refuses LIMIT NULL; the largest bigint means the same on both.
NO_LIMIT = 2**63 - 1


def row_limit(limit: int | None) -> int:
    """A LIMIT to bind on either engine: ``limit``, or ``NO_LIMIT`` for None or negative."""
    return NO_LIMIT if limit is None or limit < 0 else limit


# Ids bound in one ``IN (?, ...)`` list. Both engines cap a statement's parameters (SQLite
# at 32,766 on most builds, 999 before 3.32; PostgreSQL at 65,535), so a list that grows
# with the user's data (carried nodes, a session's rows) is bound in slices of this size.
IN_CHUNK = 500


def chunked(values: Iterable[T]) -> Iterator[list[T]]:
    """``values`` in lists of at most ``IN_CHUNK``, each bound as one ``IN (...)``.

    Why: one bound parameter per id fails past the engine's limit ("too many SQL
    variables"); every statement over such a list takes its slices from here, so the
    rule and its size live in one place."""
    items = list(values)
    for start in range(0, len(items), IN_CHUNK):
        yield items[start:start + IN_CHUNK]


class DatabaseError(RuntimeError):
    """The trove database cannot be opened or is structurally broken."""


class Connected:
    """The unit-of-work contract both engines keep: ``conn`` used under ``lock``."""

    lock: threading.RLock
    conn: sqlite3.Connection

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One unit of work: BEGIN IMMEDIATE ... COMMIT, rolled back on any error (on a
        server BEGIN IMMEDIATE also takes the writer lock, see storage/postgres)."""
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


class Database(Connected):
    """A connection plus the lock that serializes its use across threads."""

    dialect = "sqlite"

    def __init__(self, path: str, read_only: bool = False):
        self.path = path
        self.display = path  # what reports print (a server URL's is without password)
        self.read_only = read_only
        self.lock = threading.RLock()
        self.opened_at = time.time()
        self.open_seconds = 0.0
        started = time.perf_counter()
        try:
            if read_only:
                self.conn = _connect_read_only(path)
            else:
                self.conn = _open_with_retry(path)
            self.missing_objects = structural_check(self.conn)
        except migrations.SchemaTooNewError:
            raise
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open trove database {path}: {exc}") from exc
        self.open_seconds = time.perf_counter() - started
        self.file_id = _file_id(path)
        self._file_checked = time.monotonic()

    def file_replaced(self) -> bool:
        """Whether the file at ``path`` is no longer the one this connection has open
        (deleted, or another file moved over it), looked at most once per
        ``FILE_CHECK_SECONDS``.

        SQLite keeps writing to the file it opened: after an operator (or a restore
        script) deletes or replaces ``trove.db`` under a running agent, every new
        turn would go to an unlinked file and be lost at exit, while tools read a
        database no one else can see."""
        if self.path == ":memory:" or self.file_id is None:
            return False
        now = time.monotonic()
        if now - self._file_checked < FILE_CHECK_SECONDS:
            return False
        self._file_checked = now
        return _file_id(self.path) != self.file_id


def _file_id(path: str) -> tuple | None:
    """(device, inode) of the file at ``path``; None when it is missing or unreadable."""
    if path == ":memory:":
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


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


def _connect_read_only(path: str, immutable: bool = False) -> sqlite3.Connection:
    """A connection that cannot write: ``mode=ro`` and ``query_only``, no WAL switch.
    ``immutable`` also skips locks and the ``-shm`` file (a probe of a foreign file)."""
    uri = "file:" + urllib.parse.quote(str(Path(path).expanduser().resolve())) + "?mode=ro"
    uri += "&immutable=1" if immutable else ""
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA temp_store = MEMORY")
    return conn


def trove_file_problem(path: str | os.PathLike, allow_older: bool = False) -> str | None:
    """Why ``path`` is not an openable trove database (None when it is one).

    Reads the file header, then the schema through a read-only connection, so
    an unrelated SQLite file (Hermes's ``state.db``) or an empty file is named,
    never converted. A trove schema newer or older than this code is reported
    too: a read must not migrate (``allow_older`` for a writing command, which may)."""
    if is_url(path):
        return None  # a server: opening it says what is wrong (never the password)
    file = Path(path).expanduser()
    if file.is_dir():
        return f"{file} is a directory, not a trove database file"
    if not file.is_file():
        return f"no trove database at {file}"
    with open(file, "rb") as handle:
        header = handle.read(len(SQLITE_MAGIC))
    if header != SQLITE_MAGIC:
        return f"{file} is not a trove database ({'an empty file' if not header else 'not SQLite'})"
    try:
        names, version = _schema_names(file, immutable=True)
        wal = Path(f"{file}-wal")
        if "trove_migrations" not in names and wal.is_file() and wal.stat().st_size:
            names, version = _schema_names(file)  # a live file's schema may be in its WAL
    except sqlite3.Error as exc:
        return f"{file} is not a trove database (cannot read it: {exc})"
    missing = [name for name in TROVE_MARKERS if name not in names]
    if missing or version < 1:
        return f"{file} is not a trove database (no {', '.join(missing) or 'schema version'})"
    if version > migrations.latest_version():
        return (f"{file} has trove schema version {version}, newer than this hermes-trove "
                f"(up to {migrations.latest_version()}): update the plugin")
    if version < migrations.latest_version() and not allow_older:
        return (f"{file} has trove schema version {version}; this hermes-trove needs "
                f"{migrations.latest_version()}: a read does not migrate, so start Hermes with "
                "the plugin once, or run a writing command such as 'trove.py backup' "
                "(it migrates)")
    return None


def _schema_names(file: Path, immutable: bool = False) -> tuple[set[str], int]:
    """The schema's object names and ``user_version``, read without writing."""
    conn = _connect_read_only(str(file), immutable=immutable)
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        return names, migrations.schema_version(conn)
    finally:
        conn.close()


def open_read_only(path: str | os.PathLike) -> Database:
    """The process-wide read-only ``Database`` for an existing trove file (see
    ``trove_file_problem``, which callers run first)."""
    key = resolve_path(path)
    with _registry_lock:
        db = _read_only.get(key)
        if db is None:
            db = _open(key, read_only=True)
            _read_only[key] = db
        return db


def structural_check(conn: sqlite3.Connection) -> list[str]:
    """Names of required tables, views and triggers that are missing (schema read only)."""
    present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    return [name for name in REQUIRED_OBJECTS if name not in present]


def resolve_path(path: str | os.PathLike) -> str:
    """The canonical key for a database file (absolute, symlinks resolved)."""
    text = str(path)
    if text == ":memory:" or is_url(text):
        return text
    return str(Path(text).expanduser().resolve())


def get_database(path: str | os.PathLike) -> Database:
    """The process-wide shared ``Database`` for ``path``, opened on first use; a path
    no file system can name (a NUL byte, a lone surrogate) is a ``DatabaseError``,
    so the engine's fault handling keeps the agent running and says why."""
    text = os.fspath(path)
    if isinstance(text, str) and not is_url(text) and ("\0" in text or not _encodable(text)):
        raise DatabaseError(f"the trove database path {text[:200]!r} is not a usable file name "
                            "(it holds a NUL byte or an unpaired surrogate): fix "
                            "TROVE_DATABASE_PATH")
    key = _keys.get(text) if isinstance(text, str) else None
    if key is None:
        key = resolve_path(path)  # file system calls: once per spelling of the path
        if isinstance(text, str) and os.path.isabs(text) and len(_keys) < 1024:
            _keys[text] = key  # (a relative path's meaning follows the working directory)
    with _registry_lock:
        db = _registry.get(key)
        if db is not None and isinstance(db, Database) and db.file_replaced():
            # the file was deleted or replaced: open what is at the path now (a new
            # database, or a fault the engine reports), never the unlinked one
            log.warning("hermes-trove: %s was deleted or replaced while open; opening "
                        "the file now at that path", key)
            del _registry[key]
            db = None
        if db is not None and db.dialect == "postgresql" and db.connection_lost():
            # the server dropped the connection: a new one (or a fault the engine reports
            # and retries), never the dead one for the rest of the process
            log.warning("hermes-trove: the server closed the connection to %s; "
                        "connecting again", db.display)
            del _registry[key]
            db = None
        if db is None:
            db = _open(key)
            _registry[key] = db
        return db


def open_private(target: str | os.PathLike, read_only: bool = False):
    """A connection of its own (not the shared one) for a background worker that must
    not wait behind the turn's statements, or a dry run that must not migrate: a
    file's or a server's, as ``target`` names."""
    return _open(resolve_path(target), read_only=read_only)


def _open(key: str, read_only: bool = False):
    """A ``Database`` for a SQLite file, a ``PgDatabase`` for a ``postgresql://`` URL
    (``TROVE_DATABASE_URL``): the same contract, so no caller asks which it got
    unless it needs SQL only one engine has (``db.dialect``)."""
    if is_url(key):
        from .postgres.database import PgDatabase
        return PgDatabase(key, error=DatabaseError, too_new=migrations.SchemaTooNewError,
                          read_only=read_only)
    return Database(key, read_only=read_only)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def forget_database(path: str | os.PathLike) -> None:
    """Close and drop the shared connection for ``path`` (tests, restore, repair)."""
    key = resolve_path(path)
    with _registry_lock:
        found = [_registry.pop(key, None), _read_only.pop(key, None)]
    for db in found:
        if db is not None:
            db.close()
