"""Online backups of a live trove database with SQLite's backup API.

A file copy of a database in WAL mode can miss committed pages still in the
WAL, or catch a page mid-write; the backup API copies a consistent snapshot
while the engine keeps writing. Every apply path (doctor repair, clean, source,
rotate, import) writes one of these first.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from .database import BUSY_TIMEOUT_MS, get_database
from .postgres import dump as pg_dump
from .postgres.connection import is_url

PAGES_PER_STEP = 4096


def backup_dir(db_path: str | Path) -> Path:
    """Where backups of a database go: ``backups/`` next to it."""
    return Path(db_path).expanduser().resolve().parent / "backups"


def timestamped_name(db_path: str | Path, label: str = "backup") -> str:
    """``<stem>-<label>-<UTC time>.db``, sortable by time."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{Path(db_path).stem}-{label}-{stamp}.db"


def unused_path(first: str | Path) -> Path:
    """``first``, or ``<stem>-1<suffix>``, ``<stem>-2<suffix>`` ...: the first name no
    file has. Timestamped names have a one-second resolution, and two backups in one
    second (``doctor clean --apply`` run twice) must not replace each other: the first
    one may be the only copy of what the second run's action then removes."""
    first = Path(first)
    candidate, counter = first, 0
    while candidate.exists():
        counter += 1
        candidate = first.with_name(f"{first.stem}-{counter}{first.suffix}")
    return candidate


def _publish_new(tmp: Path, first: Path) -> Path:
    """Move the finished copy ``tmp`` to ``first`` or the next unused name, never over
    an existing file (a hard link fails instead of replacing, even in a race)."""
    candidate = first
    while True:
        candidate = unused_path(candidate)
        try:
            os.link(tmp, candidate)
        except FileExistsError:
            continue  # taken since the check: try the next name
        except OSError:  # a file system without hard links: check, then rename
            os.replace(tmp, candidate)
            return candidate
        tmp.unlink()
        return candidate


def backup_database(db_path: str | Path, dest: str | Path | None = None, *,
                    label: str = "backup") -> Path:
    """Write a consistent copy of ``db_path``; return its path.

    ``dest`` defaults to a timestamped file under ``backup_dir``, which never
    replaces an existing backup (a second one in the same second gets ``-1``...,
    see ``unused_path``). The copy is written to a temporary name and fsynced,
    then moved into place, so an explicit rolling ``dest``
    (``*-rotate-latest.db``) is always either the old or the new backup.
    """
    if is_url(str(db_path)):  # a server: pg_dump of the trove schema (``dest`` required)
        return pg_dump.dump(str(db_path), get_database(str(db_path)).conn.schema, Path(dest))
    source_path = Path(db_path).expanduser().resolve()
    target = Path(dest) if dest else backup_dir(source_path) / timestamped_name(source_path, label)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True,
                             timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        copy = sqlite3.connect(tmp)
        try:
            source.backup(copy, pages=PAGES_PER_STEP)
            copy.execute("PRAGMA journal_mode = DELETE")  # a single self-contained file
        finally:
            copy.close()
    finally:
        source.close()
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    if dest:
        os.replace(tmp, target)
    else:
        target = _publish_new(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target
