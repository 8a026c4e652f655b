"""What is wrong with a trove database that cannot be used, and how to repair it.

A database can be unusable for reasons the agent cannot fix itself: the file is
truncated or overwritten, a directory sits where the file should be, or it (or
its directory, or its ``-wal``/``-shm`` companions) is read-only. The engine
must keep the agent running anyway (a bounded prompt, as for ignored sessions)
and every tool must say plainly what is wrong and what the operator can do.
This module turns the error into those two sentences; it never writes.

``host_entry`` is the last line of the same promise for every other failure:
a hook the host calls (``on_session_end``, ``update_model``...) never raises
into the host, whatever it was handed; the error is logged (a bounded number
of times) and kept for status, and the hook returns its fallback.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .backup import backup_dir
from .database import DatabaseError
from .postgres.connection import is_url
from .migrations import SchemaTooNewError

log = logging.getLogger(__name__)

# After a database failure, the engine runs without it this long before trying again.
RETRY_SECONDS = 30.0

DAMAGED = ("not a database", "malformed", "disk image", "file is encrypted", "corrupt")
READ_ONLY = ("readonly", "read-only", "permission denied", "access permission",
             "unable to open", "disk i/o error")
FULL = ("database or disk is full", "no space left")
LOCKED = ("database is locked", "database table is locked")
CLOSED = ("closed database", "connection is closed")


# How many times one hook's failures are logged per process (then only counted), and
# how many error lines an engine keeps for status.
LOG_LIMIT = 20
KEPT_ERRORS = 50
_logged: dict[str, int] = {}
_logged_lock = threading.Lock()


def host_entry(fallback: Any = None):
    """Decorate a method the host calls so that it never raises into the host.

    On any exception (a RecursionError from absurdly nested input included) the
    error is logged (at most ``LOG_LIMIT`` times per hook and process), appended
    to the engine's ``errors`` (the newest ``KEPT_ERRORS`` are kept) and the
    hook returns ``fallback``: a value, or a callable given the same arguments."""
    def decorate(method: Callable) -> Callable:
        name = method.__name__

        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                report(self, name, f"{type(exc).__name__}: {str(exc)[:200]}")
                return fallback(self, *args, **kwargs) if callable(fallback) else fallback
        return guarded
    return decorate


def report(engine: Any, where: str, problem: str) -> None:
    """Log what a hook could not use or do (at most ``LOG_LIMIT`` times per hook and
    process) and keep it in the engine's ``errors`` for status (the newest
    ``KEPT_ERRORS``)."""
    note = f"{where}: {problem}"
    with _logged_lock:
        _logged[where] = count = _logged.get(where, 0) + 1
    if count <= LOG_LIMIT:
        log.warning("hermes-trove: %s (the host goes on%s)", note,
                    "; later problems of this hook are not logged" if count == LOG_LIMIT else "")
    errors = getattr(engine, "errors", None)
    if isinstance(errors, list):
        errors.append(note)
        del errors[:-KEPT_ERRORS]


class Unavailable(RuntimeError):
    """The database failed recently and is not tried again yet (carries the fault)."""


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the database itself (as opposed to a bug, bad input or
    a payload file: those must not switch the engine to running without its store)."""
    return isinstance(exc, (sqlite3.Error, DatabaseError, SchemaTooNewError, Unavailable))


# SQLite primary result codes that say the file or its disk cannot be used now, for
# every statement alike: PERM, BUSY, LOCKED, NOMEM, READONLY, IOERR, CORRUPT, FULL,
# CANTOPEN, PROTOCOL, NOLFS, AUTH, NOTADB. The rest (ERROR: a syntax error or an unknown
# table; CONSTRAINT, TOOBIG, MISMATCH, RANGE...) are one statement's own failure.
SQLITE_OUTAGE_CODES = frozenset({3, 5, 6, 7, 8, 10, 11, 13, 14, 15, 22, 23, 26})
# SQLSTATE classes (and single codes) that mean the server cannot serve this store:
# connection (08), credentials (28), no such database (3D) or schema (3F), resources
# such as a full disk (53), a shutdown (57), the system (58), the server's own
# configuration (F0), corruption (XX), a lock held past lock_timeout (55P03), a
# read-only standby (25006), a missing grant (42501). A cancelled statement (57014,
# statement_timeout) is that statement's alone.
PG_OUTAGE_CLASSES = ("08", "28", "3D", "3F", "53", "57", "58", "F0", "XX")
PG_OUTAGE_CODES = frozenset({"55P03", "25006", "42501"})
PG_STATEMENT_CODES = frozenset({"57014"})


def is_outage(exc: BaseException) -> bool:
    """Whether a database error means the store cannot be used now (the server is down
    or refuses this user, the file is damaged, read-only, full or locked) rather than
    that one statement failed (a bug, a schema this version does not expect, a
    constraint, one oversized value).

    Why the difference matters: an outage switches the engine to running without its
    store until a retry works (``Tracker``); a statement error must not, or one bad
    query in one path (an identity read, a search) left every later turn of the
    process unstored and sent the operator to check a server that was fine. The
    rule reads the driver's own code first (PostgreSQL's SQLSTATE as
    ``storage.postgres.connection`` keeps it, SQLite's result code), then the
    error's words; a database that cannot be opened is always an outage."""
    if isinstance(exc, (DatabaseError, SchemaTooNewError, Unavailable)):
        return True
    if not isinstance(exc, sqlite3.Error):
        return False
    if hasattr(exc, "sqlstate"):   # from the PostgreSQL adapter (None: no statement ran)
        code = exc.sqlstate
        if code is None:
            return True
        if code in PG_STATEMENT_CODES:
            return False
        return code in PG_OUTAGE_CODES or code.startswith(PG_OUTAGE_CLASSES)
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):   # raised by SQLite itself: its code decides, not words
        return (code & 0xFF) in SQLITE_OUTAGE_CODES
    lowered = str(exc).lower()  # raised by Python's module or by hand: the words
    return any(word in lowered for word in DAMAGED + READ_ONLY + FULL + LOCKED + CLOSED)


def failing_operation(exc: BaseException) -> str:
    """The trove function that ran the failing statement (``store.ingest``,
    ``storage.identity.read_view``...), from the traceback's innermost frame in
    this package outside the connection adapters; "" when none is known. Why: the
    repair of a statement error names the operation, so a report points at code."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_PACKAGE) and not module.endswith(_ADAPTERS):
            found = f"{module[len(_PACKAGE):].lstrip('.')}.{frame.f_code.co_name}"
        tb = tb.tb_next
    return found


_PACKAGE = __name__.rsplit(".", 2)[0]
_ADAPTERS = ("storage.postgres.connection", "storage.database", "storage.faults")


def describe(path: str | os.PathLike, exc: BaseException, where: str = "") -> dict:
    """``{"path", "problem", "repair"}`` for a database that failed with ``exc`` in
    ``where`` (the hook or tool that ran into it).

    A statement error (``is_outage`` false) is described as what it is: one
    operation failed, the store stays in use, and the repair is a bug report or a
    schema check, never a server, a password or a backup to restore."""
    text = f"{type(exc).__name__}: {exc}"
    if is_database_error(exc) and not is_outage(exc):
        operation = failing_operation(exc)
        named = " in ".join(p for p in (operation, where) if p) or "an operation"
        return {"path": str(path), "kind": "statement",
                "problem": f"{named} failed: the database refused one statement "
                           f"({text})"[:500],
                "repair": "not an outage: the database stays in use and later turns are "
                          "stored (what this one missed is stored from the host's next "
                          "list). A refused statement is a hermes-trove bug or a schema this "
                          "version does not expect: run /trove doctor to check the schema, "
                          "and report the operation and the error to hermes-trove"}
    if is_url(str(path)):  # a server (``path`` is its name without the password)
        return {"path": str(path), "problem": f"{path} cannot be used ({text})"[:500],
                "repair": _server_repair(getattr(exc, "sqlstate", None))}
    path = Path(path)
    lowered = text.lower()
    try:
        backups = backup_dir(str(path))
        is_dir = path.is_dir()
    except (ValueError, OSError):   # no file can have this name (a NUL byte)
        return {"path": repr(str(path))[:300], "problem": str(exc)[:500],
                "repair": "set TROVE_DATABASE_PATH to a plain file path (or leave it empty "
                          "for HERMES_HOME/trove.db) and restart"}
    if is_dir:
        problem = f"{path} is a directory, not a database file"
        repair = ("move that directory away (or set TROVE_DATABASE_PATH to a file path); "
                  "a new database is created at the next start")
    elif isinstance(exc, SchemaTooNewError):
        problem, repair = str(exc), "update hermes-trove, or point TROVE_DATABASE_PATH elsewhere"
    elif any(word in lowered for word in FULL):
        # checked before "damaged": neither a full disk nor a held lock is a reason to
        # restore a backup over the file (the old advice for both)
        problem = f"{path} cannot be written: the disk is full ({text})"
        repair = (f"free space on the disk holding {path.parent} (or move the database with "
                  "TROVE_DATABASE_PATH); the engine tries the database again every "
                  f"{RETRY_SECONDS:.0f} s and stores the turns it missed from the host's list")
    elif any(word in lowered for word in LOCKED):
        problem = (f"{path} is locked: another process held its write lock longer than the "
                   f"busy timeout ({text})")
        repair = ("find the process holding it (a long operator command, an open sqlite3 "
                  "shell, a backup tool) and let it finish; the engine tries the database "
                  f"again every {RETRY_SECONDS:.0f} s; the file itself is fine")
    elif any(word in lowered for word in DAMAGED):
        problem = f"{path} is damaged ({text})"
        repair = (f"move the file aside with its -wal/-shm files and restore the newest backup "
                  f"from {backups} (or let a new database be created); "
                  f"`sqlite3 {path.name} .recover` may salvage rows from the damaged copy")
    elif any(word in lowered for word in READ_ONLY) or not _writable(path):
        problem = f"{path} cannot be written ({text})"
        repair = (f"give the agent's user write permission on {path}, its -wal and -shm "
                  f"files and the directory {path.parent}")
    else:
        problem = f"{path} cannot be used ({text})"
        repair = ("run /trove doctor (or scripts/trove.py doctor) for details; restore a backup "
                  f"from {backups} if the file is damaged")
    return {"path": str(path), "problem": problem[:500], "repair": repair}


# What to do about a server outage, by SQLSTATE (code, else class); the rest (no code:
# no connection) is the connection's repair. Why: a full disk or a held lock on the
# server is not fixed by checking that it is up or the credentials.
_SERVER_REPAIRS = {
    "53100": "free space on the disk of the PostgreSQL server (its data directory)",
    "53": "the PostgreSQL server is out of a resource (memory, connections: "
          "max_connections); free it or raise the limit",
    "55P03": "another session held a lock on trove's tables past lock_timeout (30 s): find "
             "it in pg_stat_activity and let it finish",
    "42501": "grant the trove user USAGE and CREATE on its schema and rights on its tables",
    "25006": "the server is a read-only standby: point TROVE_DATABASE_URL at the primary",
    "XX": "the server reports damaged data or an internal error: read its log, and "
          "restore from a backup (pg_dump) if data is damaged",
}


def _server_repair(sqlstate: str | None) -> str:
    """The repair of a PostgreSQL outage with ``sqlstate`` (see ``_SERVER_REPAIRS``)."""
    found = _SERVER_REPAIRS.get(sqlstate or "") or _SERVER_REPAIRS.get((sqlstate or "")[:2])
    retry = f"; the engine tries the server again every {RETRY_SECONDS:.0f} s"
    if found:
        return found + retry + "; /trove doctor says more"
    return ("check that the PostgreSQL server is up and reachable, the credentials (in "
            "TROVE_DATABASE_URL or the PG* variables) and that psycopg is installed "
            "(requirements-extras.txt)" + retry + "; /trove doctor says more")


def _writable(path: Path) -> bool:
    """Whether the file (when present) and its directory are writable."""
    if path.exists() and not os.access(path, os.W_OK):
        return False
    return os.access(path.parent if path.parent.exists() else Path("."), os.W_OK)


class Tracker:
    """One engine's view of its database's health: the last fault, and whether it is
    time to try the database again (plain values, so deep copies stay cheap)."""

    def __init__(self) -> None:
        self.fault: dict | None = None
        self.at = 0.0

    def note(self, path: str | os.PathLike, exc: BaseException, where: str = "") -> dict:
        """What is wrong (from ``exc``, met in ``where``). An outage (``is_outage``) is
        remembered with its time, so the engine runs without the store until the
        retry, and logged once per failure; a statement error is only described (the
        caller reports it a bounded number of times): the store stays in use."""
        fault = describe(path, exc, where)
        if fault.get("kind") == "statement":
            return fault
        self.fault, self.at = fault, time.monotonic()
        log.warning("hermes-trove: %s; %s", self.fault["problem"], self.fault["repair"])
        return self.fault

    def usable(self) -> bool:
        """False while a recent fault stands; after ``RETRY_SECONDS`` the next caller
        tries the database again (a restored file is picked up)."""
        if self.fault is None:
            return True
        if time.monotonic() - self.at < RETRY_SECONDS:
            return False
        self.fault = None
        return True
