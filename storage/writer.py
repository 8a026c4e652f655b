"""Statements of one transaction run on a helper thread while the caller prepares the next.

Ingesting a batch alternates two kinds of work: building the next rows (Python,
mostly counting tokens: tiktoken runs without the GIL) and writing the rows
already built (SQLite, which also runs without the GIL). ``StatementWriter``
lets them overlap: ``execute`` hands a statement to one helper thread, which
runs the statements in the order given, on the caller's connection, inside the
caller's transaction, while the caller builds the next one. On a machine with a
spare core a batch of 500 messages took ~15% less time than writing inline.

The rules that keep this safe:
- the caller holds the connection (the ``Database`` lock, its transaction) for
  the whole time and does not use it until ``close`` returns: the helper is the
  only thread running statements in between;
- ``close`` (also on leaving the ``with`` block, normally or by an error) waits
  for the helper to end: no thread outlives the writer, and the caller commits
  or rolls back only after the last statement has finished;
- a statement's error is raised to the caller (by the next ``execute`` or by
  ``close``) and the statements after it are not run; after an error of the
  caller, statements still queued are dropped.

With ``threaded=False`` every statement runs inline, which is what small batches
want (starting a thread costs ~0.1 ms).
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from typing import Sequence


class StatementWriter:
    """Runs statements on one connection in order, on a helper thread (see the module)."""

    def __init__(self, conn: sqlite3.Connection, *, threaded: bool):
        self._conn = conn
        self._threaded = threaded
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._abandoned = False

    def __enter__(self) -> "StatementWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None:
            self._abandoned = True  # the caller failed: what is still queued is not run
        self.close(raise_error=exc_type is None)

    def execute(self, sql: str, params: Sequence) -> None:
        """Run ``sql`` with ``params`` after the statements given before it (on the
        helper thread when threaded); raises an earlier statement's error, if any."""
        if not self._threaded:
            self._conn.execute(sql, params)
            return
        if self._error is not None:
            raise self._error
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trove-ingest-writer",
                                            daemon=True)
            self._thread.start()
        self._queue.put((sql, params))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._abandoned:
                return
            try:
                self._conn.execute(*item)
            except BaseException as exc:  # handed to the caller's thread
                self._error = exc
                return

    def close(self, raise_error: bool = True) -> None:
        """Wait until every statement given has run (or the first error stopped
        them) and the helper thread has ended; raise that error if ``raise_error``."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        if raise_error and self._error is not None:
            raise self._error
