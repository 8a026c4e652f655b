"""Backups of a PostgreSQL trove schema with the server's own tool, ``pg_dump``.

The operator commands that write a backup before they change anything (rotate,
doctor repair, clean, import) call ``storage.backup.backup_database``; for a server
it lands here: ``pg_dump --format=custom --schema=<the trove schema>`` into a
temporary file renamed into place, restorable with ``pg_restore``. The password
reaches pg_dump through its environment (``PGPASSWORD``), never its command line,
so ``ps`` does not show it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .connection import _psycopg

# conninfo keys and the libpq variables that carry them to pg_dump
_ENV = {"host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT", "user": "PGUSER",
        "password": "PGPASSWORD", "dbname": "PGDATABASE", "options": "PGOPTIONS",
        "sslmode": "PGSSLMODE", "sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT",
        "sslkey": "PGSSLKEY", "passfile": "PGPASSFILE", "service": "PGSERVICE"}


def libpq_environment(url: str) -> dict[str, str]:
    """The process environment with the URL's parts as PG* variables (the URL's win)."""
    parts = _psycopg().conninfo.conninfo_to_dict(url)
    env = dict(os.environ)
    env.update({_ENV[k]: str(v) for k, v in parts.items() if k in _ENV and v is not None})
    return env


def dump(url: str, schema: str, target: Path) -> Path:
    """Write a custom-format dump of ``schema`` to ``target`` (temp file + rename)."""
    tool = shutil.which("pg_dump")
    if tool is None:
        raise RuntimeError("pg_dump is not installed here: install the PostgreSQL client "
                           "(Debian: postgresql-client) or back the server up with your own "
                           "tooling before running this command")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    done = subprocess.run([tool, "--format=custom", f"--schema={schema}", f"--file={tmp}"],
                          env=libpq_environment(url), capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"pg_dump failed: {done.stderr.strip()[:500]}")
    os.replace(tmp, target)
    return target
