"""Files an operator command writes (``export --out``, ``dag --out``): never the database.

An ``--out`` typo must not destroy data. ``check_output`` refuses the trove
database itself, its ``-wal``/``-shm``/``-journal`` companions (also through
symlinks or hard links), directories, and any existing file unless ``force``.
``atomic_output`` then writes to a temporary file in the same folder and
renames it over the target only when the whole content was written, so a
failed export leaves no half-written file and an overwritten file is replaced
in one step.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


class OutputRefused(Exception):
    """An ``--out`` path the command must not write (the message says why and what to do)."""


def _same_file(a: Path, b: Path) -> bool:
    """Whether two existing paths are one file (symlinks and hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path: str | os.PathLike, db_path: str | os.PathLike,
                 force: bool = False) -> Path:
    """The absolute path an operator command may write, or ``OutputRefused``.

    Refuses the database and its SQLite companion files whatever ``force`` says:
    overwriting them loses every stored message."""
    out = Path(path).expanduser()
    resolved = out.resolve()
    db = Path(db_path).expanduser().resolve()
    for suffix in SQLITE_COMPANIONS:
        companion = Path(str(db) + suffix)
        if resolved == companion or (out.exists() and _same_file(out, companion)):
            raise OutputRefused(f"refusing to write {out}: it is the trove database"
                                f"{' file ' + suffix if suffix else ''} ({db}); choose another "
                                "--out path")
    if out.is_dir():
        raise OutputRefused(f"refusing to write {out}: it is a directory; name a file")
    if out.exists() and not force:
        raise OutputRefused(f"refusing to overwrite {out}: the file exists (pass --force to "
                            "replace it)")
    if not resolved.parent.is_dir():
        raise OutputRefused(f"cannot write {out}: the folder {resolved.parent} does not exist")
    return resolved


def _mode_for(target: Path) -> int:
    """The mode the output gets: a replaced file keeps its own, a new one what the user's
    umask gives any new file (mkstemp's temporary file is 0600, which made a page the
    user wants to open or share unreadable to anyone else)."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def atomic_output(path: str | os.PathLike, db_path: str | os.PathLike,
                  force: bool = False) -> Iterator[IO[str]]:
    """A text handle whose content lands at ``path`` only if the block succeeds.

    Checked by ``check_output`` first; written to a temporary sibling, flushed and
    fsynced, then renamed over ``path`` (atomic on one filesystem)."""
    target = check_output(path, db_path, force)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if target.exists() and not force:  # created by someone else while we wrote
            raise OutputRefused(f"refusing to overwrite {target}: the file appeared while "
                                "writing (pass --force to replace it)")
        os.chmod(temp, _mode_for(target))
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
