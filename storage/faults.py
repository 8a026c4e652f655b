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


def describe(path: str | os.PathLike, exc: BaseException) -> dict:
    """``{"path", "problem", "repair"}`` for a database that failed with ``exc``."""
    text = f"{type(exc).__name__}: {exc}"
    if is_url(str(path)):  # a server (``path`` is its name without the password)
        return {"path": str(path), "problem": f"{path} cannot be used ({text})"[:500],
                "repair": "check that the PostgreSQL server is up and reachable, the "
                          "credentials (in TROVE_DATABASE_URL or the PG* variables) and that "
                          "psycopg is installed (requirements-extras.txt); /trove doctor says more"}
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

    def note(self, path: str | os.PathLike, exc: BaseException) -> dict:
        """Remember what is wrong (from ``exc``) and when; log it once per failure."""
        self.fault, self.at = describe(path, exc), time.monotonic()
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
