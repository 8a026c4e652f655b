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
on it). Where ``fcntl`` does not exist only the thread lock applies.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

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


def _lock_file(db_path: str) -> int | None:
    """The process's descriptor of ``<database>.locks`` (None for in-memory databases)."""
    if fcntl is None or db_path == ":memory:":
        return None
    with _guard:
        fd = _files.get(db_path)
        if fd is None:
            fd = os.open(db_path + ".locks", os.O_RDWR | os.O_CREAT, 0o600)
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


def held_in_process(db_path: str, session_id: str) -> bool:
    """Whether a thread of this process is compacting the session right now (the
    background preparer does not start new work then: the compaction is doing it)."""
    with _guard:
        lock = _thread_locks.get((db_path, session_id))
    return bool(lock is not None and lock.locked())
