"""Externalized payloads in the server's database, not in a folder of one host.

On SQLite a large tool output or data URI is a file beside ``trove.db``
(``storage.payloads.PayloadStore``). Hosts that share one PostgreSQL database share
its rows, and a row's placeholder names its payload by hash: a file on the host that
wrote it would leave every other host unable to restore or expand it. So on a server
the payload bytes live in the ``payloads`` table (migration 4), under the same
contract: content-addressed (the same bytes give the same ref, stored once), checked
against their hash on every read, never a path shown to the model.
"""

from __future__ import annotations

import time

from ..payloads import (REF_PREFIX, PayloadMissingError, PayloadRef, PayloadRefError,
                        PayloadStore, human_size, parse_ref, ref_for)


class ServerPayloadStore(PayloadStore):
    """``PayloadStore``'s contract on the database ``target`` names (opened on first
    use: building the ingest policy never needs the server), or on ``database`` when
    given (a connection already open, such as a dry run's read-only one)."""

    def __init__(self, target: str, database=None):
        self.target = target
        self.database = database
        self.root = None  # no folder: ``usage`` says what is stored

    def _db(self):
        if self.database is not None:
            return self.database
        from ..database import get_database
        return get_database(self.target)

    def path_of(self, ref: str):
        """Payloads on a server have no file."""
        raise PayloadRefError(f"payload {ref} is stored in the database, not in a file")

    def put(self, data: bytes, *, kind: str, mime: str | None) -> PayloadRef:
        """Store ``data`` once (one transaction); the same bytes always give the same ref
        and keep the first kind and time."""
        data = bytes(data)
        ref = ref_for(data)
        sha = ref[len(REF_PREFIX):]
        with self._db().transaction() as conn:
            created = conn.execute(
                "INSERT INTO payloads(sha256, kind, mime, size, created_at, data)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (sha256) DO NOTHING",
                (sha, kind, mime, len(data), time.time(), data)).rowcount == 1
        return PayloadRef(ref, sha, kind, mime, len(data), created)

    def _read_bytes(self, ref: str, sha: str) -> bytes:
        """The stored bytes of a payload, unchecked (the base class checks the hash)."""
        with self._db().reading() as conn:
            row = conn.execute("SELECT data FROM payloads WHERE sha256 = ?", (sha,)).fetchone()
        if row is None:
            raise PayloadMissingError(f"payload {ref} is not in the payload store")
        return bytes(row[0])

    def exists(self, ref: str) -> bool:
        """Whether the payload of a (valid) ref is stored; does not read or verify it."""
        sha = parse_ref(ref)
        with self._db().reading() as conn:
            return conn.execute("SELECT 1 FROM payloads WHERE sha256 = ?",
                                (sha,)).fetchone() is not None

    def describe(self, ref: str) -> dict:
        """Metadata of a payload (no content): kind, mime, size, created_at."""
        sha = parse_ref(ref)
        with self._db().reading() as conn:
            row = conn.execute("SELECT kind, mime, size, created_at FROM payloads"
                               " WHERE sha256 = ?", (sha,)).fetchone()
        if row is None:
            raise PayloadMissingError(f"payload {ref} is not in the payload store")
        return {"ref": ref, "kind": row[0] or "unknown", "mime": row[1], "size": int(row[2]),
                "size_text": human_size(int(row[2])), "created_at": row[3]}

    def delete(self, ref: str) -> bool:
        """Remove a payload (rollback, GC only); True if it was stored."""
        sha = parse_ref(ref)
        with self._db().transaction() as conn:
            return conn.execute("DELETE FROM payloads WHERE sha256 = ?",
                                (sha,)).rowcount == 1

    def sweep_temp_files(self, max_age_seconds: float = 3600.0) -> int:
        """Nothing to sweep: a payload row is written whole or not at all."""
        return 0

    def refs(self):
        """Every stored payload's ref (a migration copies them)."""
        with self._db().reading() as conn:
            shas = [row[0] for row in conn.execute("SELECT sha256 FROM payloads")]
        return iter(REF_PREFIX + sha for sha in shas)

    def usage(self) -> dict:
        """How many payloads are stored and their bytes."""
        with self._db().reading() as conn:
            count, size = conn.execute(
                "SELECT count(*), COALESCE(sum(size), 0) FROM payloads").fetchone()
        return {"path": "payloads table", "files": int(count), "bytes": int(size)}
