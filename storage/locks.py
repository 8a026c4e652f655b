"""One compaction of a session at a time, across threads and processes.

Compaction and ``/trove rotate apply`` both read a session's unsummarized rows
and write leaves over them. Run at the same moment (the gateway runs the
command on another thread; a cron run or a second gateway is another process)
they would summarize the same rows twice. Whoever holds the session's lock
reads the rows after taking it, so the second one finds them covered.

Threads of one process share a ``threading.Lock`` per (database, session).
Processes share byte-range locks (POSIX ``lockf``) on one small file next to
the database, ``<database>.locks``: one byte per session, at an offset derived
from the session id, so sessions rarely wait for each other. The kernel drops
a dead process's locks. The file descriptor stays open for the life of the
process (closing any descriptor of a file drops all of a process's POSIX locks
on it). Where ``fcntl`` does not exist only the thread lock applies. On PostgreSQL
(``db_path`` a URL) the same locks are advisory locks on the server
(``storage/postgres/locks``): hosts sharing one database share no file.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from .postgres import locks as pg_locks
from .postgres.connection import is_url

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

POLL_SECONDS = 0.05
SLOTS = 1 << 20

_guard = threading.Lock()
_thread_locks: dict[tuple[str, str], threading.Lock] = {}
_files: dict[str, int] = {}


class LockTimeout(RuntimeError):
    """Another thread or process kept compacting this session for too long."""


def _thread_lock(db_path: str, session_id: str) -> threading.Lock:
    with _guard:
        return _thread_locks.setdefault((db_path, session_id), threading.Lock())


def _lock_file(db_path: str, create: bool = True) -> int | None:
    """The process's descriptor of ``<database>.locks`` (None for in-memory databases,
    and without ``create`` when the file does not exist: then nobody holds a lock)."""
    if fcntl is None or db_path == ":memory:":
        return None
    with _guard:
        fd = _files.get(db_path)
        if fd is None:
            flags = os.O_RDWR | (os.O_CREAT if create else 0)
            try:
                fd = os.open(db_path + ".locks", flags, 0o600)
            except FileNotFoundError:
                if create:
                    raise
                return None
            _files[db_path] = fd
        return fd


def _slot(session_id: str) -> int:
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % SLOTS


@contextmanager
def session_compaction(db_path: str, session_id: str, timeout: float) -> Iterator[None]:
    """Hold the session's compaction lock; ``LockTimeout`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    lock = _thread_lock(db_path, session_id)
    if not lock.acquire(timeout=max(0.0, timeout)):
        raise LockTimeout(f"session {session_id!r} is being compacted by another thread")
    try:
        if is_url(db_path):
            with _server_lock(db_path, session_id, deadline):
                yield
            return
        fd = _lock_file(db_path)
        slot = _slot(session_id)
        if fd is not None:
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot, os.SEEK_SET)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise LockTimeout(f"session {session_id!r} is being compacted by "
                                          "another process") from None
                    time.sleep(POLL_SECONDS)
        try:
            yield
        finally:
            if fd is not None:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, slot, os.SEEK_SET)
    finally:
        lock.release()


@contextmanager
def _server_lock(db_path: str, session_id: str, deadline: float) -> Iterator[None]:
    """The compaction lock of a session on a PostgreSQL server (see the module text)."""
    from .database import get_database
    db, slot = get_database(db_path), _slot(session_id)
    while not pg_locks.try_lock(db, pg_locks.COMPACTION, slot):
        if time.monotonic() > deadline:
            raise LockTimeout(f"session {session_id!r} is being compacted by another process")
        time.sleep(POLL_SECONDS)
    try:
        yield
    finally:
        pg_locks.unlock(db, pg_locks.COMPACTION, slot)


def held_in_process(db_path: str, session_id: str) -> bool:
    """Whether a thread of this process is compacting the session right now (the
    background preparer does not start new work then: the compaction is doing it)."""
    with _guard:
        lock = _thread_locks.get((db_path, session_id))
    return bool(lock is not None and lock.locked())


# ---------------------------------------------------------------- sessions held by an engine
# A second byte range, after the compaction slots: each process holds a SHARED lock on
# the byte of every session one of its engines is bound to, for as long as it is bound.
# ``doctor clean`` (often another process: scripts/trove.py) tests that byte and never
# removes a session some running Hermes still holds, even one that stored nothing yet.
HOLD_BASE = SLOTS
_holds: dict[str, set[str]] = {}


def hold_sessions(db_path: str, session_ids: set[str]) -> None:
    """Make this process hold exactly ``session_ids`` of a database (shared locks):
    new ones are taken, ones no engine is bound to any more are let go (their run
    claims too). A byte another process is testing right now is simply not held this
    time (the next bind takes it)."""
    _release_runs(db_path, session_ids)
    if is_url(db_path):
        _hold_on_server(db_path, session_ids)
        return
    fd = _lock_file(db_path)
    if fd is None:
        return
    with _guard:
        held = _holds.setdefault(db_path, set())
        for session_id in held - session_ids:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, HOLD_BASE + _slot(session_id), os.SEEK_SET)
            held.discard(session_id)
        for session_id in session_ids - held:
            try:
                fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1,
                            HOLD_BASE + _slot(session_id), os.SEEK_SET)
                held.add(session_id)
            except OSError:
                pass


# A third range: an EXCLUSIVE lock on the byte of every cron run's session an engine
# of this process took (``claim_run``). Two processes that bind runs of one job
# started in the same second (one host id) test and take it in one step, so the
# second one stores under ``<id>-2`` even when neither has stored anything yet.
# Its offset is 62 bits of the id's hash (``_run_offset``), not a 20-bit slot: a run
# whose slot another session's claim held went to ``<id>-2`` though nobody ran it.
# The claim is kept while the run lasts: its engine lets it go when the host ends the
# run (``release_run``), else at the process's next bind after the engine left it
# (``hold_sessions``), and the kernel or the server when the process dies.
RUN_BASE = 1 << 62
_runs: dict[str, set[str]] = {}


def _run_offset(session_id: str) -> int:
    """The byte of a run's claim in the lock file: ``RUN_BASE`` plus 62 bits of the
    full id's hash (the largest offset is the largest a lock can start at, 2^63 - 1)."""
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()
    return RUN_BASE + int.from_bytes(digest[:8], "big") % RUN_BASE


def claim_run(db_path: str, session_id: str) -> bool:
    """Take ``session_id`` for a run of this process (an exclusive lock, kept until
    ``release_run`` or until no engine of this process is bound to it:
    ``hold_sessions``); False when another process has it. Threads of this process
    are told apart by the caller (``binding.session``): a process never conflicts
    with its own locks. Without locks (no ``fcntl``, an in-memory database, a lock
    file that cannot be opened) every claim succeeds: runs are then told apart only
    within this process."""
    with _guard:
        if session_id in _runs.get(db_path, ()):
            return True
    if is_url(db_path):
        from .database import get_database
        taken = pg_locks.try_lock(get_database(db_path), pg_locks.RUN, session_id)
    else:
        try:
            fd = _lock_file(db_path)
        except OSError:   # no lock file (a read-only folder): the run binds as before
            return True
        if fd is None:
            return True
        try:
            with _guard:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _run_offset(session_id),
                            os.SEEK_SET)
            taken = True
        except OSError:
            taken = False
    if taken:
        with _guard:
            _runs.setdefault(db_path, set()).add(session_id)
    return taken


def release_run(db_path: str, session_id: str) -> None:
    """Let go of this process's claim on a run (the run ended): a process that ran one
    job and then idles must not keep it from every other process until its next bind."""
    with _guard:
        held = session_id in _runs.get(db_path, ())
        _runs.get(db_path, set()).discard(session_id)
    if held:
        _unlock_run(db_path, session_id)


def _release_runs(db_path: str, keep: set[str]) -> None:
    """Let go of the run claims of sessions no engine of this process is bound to."""
    with _guard:
        gone = _runs.get(db_path, set()) - keep
        _runs.get(db_path, set()).difference_update(gone)
    for session_id in gone:
        _unlock_run(db_path, session_id)


def _unlock_run(db_path: str, session_id: str) -> None:
    """Unlock one run claim this process took (its ``_runs`` entry is gone already)."""
    if is_url(db_path):
        from .database import get_database
        pg_locks.unlock(get_database(db_path), pg_locks.RUN, session_id)
        return
    fd = _lock_file(db_path)
    with _guard:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, _run_offset(session_id), os.SEEK_SET)


def _hold_on_server(db_path: str, session_ids: set[str]) -> None:
    from .database import get_database
    db = get_database(db_path)
    with _guard:
        held = _holds.setdefault(db_path, set())
        for session_id in held - session_ids:
            pg_locks.unlock(db, pg_locks.HOLD, _slot(session_id), shared=True)
            held.discard(session_id)
        for session_id in session_ids - held:
            if pg_locks.try_lock(db, pg_locks.HOLD, _slot(session_id), shared=True):
                held.add(session_id)


def held_here(db_path: str, session_id: str) -> bool:
    """Whether this process holds the session (an engine of it is bound to it)."""
    with _guard:
        return session_id in _holds.get(db_path, ())


def in_use_elsewhere(db_path: str, session_id: str) -> bool:
    """Whether another process holds the session (an engine bound to it) or is
    compacting it right now. Only a lock another process owns can make the test
    fail; a slot shared by two sessions (rare) errs on the safe side: "in use".
    Sessions this process holds are answered by ``held_here`` (testing them here
    would convert this process's own lock)."""
    if held_here(db_path, session_id):
        return False
    if is_url(db_path):
        from .database import get_database
        db, slot = get_database(db_path), _slot(session_id)
        return (pg_locks.held_elsewhere(db, pg_locks.HOLD, slot)
                or (not held_in_process(db_path, session_id)
                    and pg_locks.held_elsewhere(db, pg_locks.COMPACTION, slot)))
    try:   # a read-only scan never creates the lock file: without it nothing is held
        fd = _lock_file(db_path, create=False)
    except OSError:
        return True   # the locks cannot be tested: assume the session may be in use
    if fd is None:
        return False
    offsets = [HOLD_BASE + _slot(session_id)]
    if not held_in_process(db_path, session_id):   # else its own lock, not another's
        offsets.append(_slot(session_id))
    with _guard:
        for offset in offsets:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, os.SEEK_SET)
            except OSError:
                return True
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)
    return False
