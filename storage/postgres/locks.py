"""Per-session locks on PostgreSQL: advisory locks instead of byte ranges of a file.

``storage/locks`` serializes a session's compaction across processes with POSIX
locks on ``<database>.locks``; hosts that share one PostgreSQL database share no
file, so the same two locks are session-level advisory locks on the server,
keyed by (schema, purpose) and the session's slot: an exclusive one while a
session is compacted, a shared one while an engine is bound to it; an exclusive
one while a cron run has taken it (``RUN``), keyed by the full id's hash. The server
drops a dead process's locks with its connection (a kill -9 included).
"""

from __future__ import annotations

import hashlib
import zlib

COMPACTION = "compaction"
HOLD = "hold"
RUN = "run"


def _key(conn, purpose: str, slot: int | str) -> tuple[int]:
    """One bigint. For a slot (an int): 32 bits of (schema, purpose), 31 bits of the
    slot. For a session id (a str, ``RUN``): 64 bits of the hash of (schema, purpose,
    the full id), so two runs never share a key in practice (a 20-bit slot did: a run
    went to ``<id>-2`` while another session's run held its slot)."""
    if isinstance(slot, str):
        text = f"{conn.schema}\0{purpose}\0{slot}".encode("utf-8", "surrogatepass")
        return (int.from_bytes(hashlib.sha256(text).digest()[:8], "big", signed=True),)
    return ((zlib.crc32(f"{conn.schema}:{purpose}".encode()) << 31) | (slot % (1 << 31)),)


def try_lock(db, purpose: str, slot: int | str, shared: bool = False) -> bool:
    """Take the advisory lock without waiting; whether it was granted."""
    fn = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
    with db.lock:
        return bool(db.conn.execute(f"SELECT {fn}(?)", _key(db.conn, purpose, slot)).fetchone()[0])


def unlock(db, purpose: str, slot: int | str, shared: bool = False) -> None:
    """Let the advisory lock go."""
    fn = "pg_advisory_unlock_shared" if shared else "pg_advisory_unlock"
    with db.lock:
        db.conn.execute(f"SELECT {fn}(?)", _key(db.conn, purpose, slot))


def held_elsewhere(db, purpose: str, slot: int) -> bool:
    """Whether another connection (another process) holds the lock in any mode (this
    connection's own locks never conflict with its test)."""
    if not try_lock(db, purpose, slot):
        return True
    unlock(db, purpose, slot)
    return False
