"""Session owners: all SQL about who a session belongs to.

A shared Hermes gateway serves several people from one profile and one
trove.db. Each session gets an owner key when it is bound (``binding.owners``
derives it from what the host says); cross-session reads are limited to the
calling session's owner unless the operator allows more. A session with no
owner row (written before schema 3, imported, or whose row a clean-up removed)
belongs to nobody known: fail closed, it is readable from itself and by
operators only, never as ``LOCAL_OWNER``'s (the profile's own CLI user).
"""

from __future__ import annotations

import time
from typing import Sequence

from .database import Database, chunked
from .sessionset import OWNED_SESSIONS_SQL, SessionSet
from .timeline import delete_with_ancestors_in

LOCAL_OWNER = "local"
# Owner keys that stand for "nobody identified yet" and may be replaced once.
PROVISIONAL_PREFIX = "session:"
# Keys recorded before the platform was known (``gateway:user:<id>``, written at agent
# init's platform-less bind until that bind became provisional): one person's DM and
# every group chat they opened a session in shared it. Replaced once, like a
# provisional key, by the first real key the host gives for the session.
UNKNOWN_PLATFORM_PREFIX = "gateway:"


def is_provisional(owner: str) -> bool:
    """Whether an owner key may still be replaced by a real one (see above)."""
    return owner.startswith((PROVISIONAL_PREFIX, UNKNOWN_PLATFORM_PREFIX))


class Owners:
    """The ``session_owners`` table."""

    def __init__(self, db: Database):
        self.db = db

    def record(self, session_id: str, owner: str, *, platform: str | None = None,
               user_id: str | None = None, chat_id: str | None = None,
               conversation_id: str | None = None) -> str:
        """Set a session's owner if it has none (or only a provisional one,
        ``is_provisional``); fill blank attributes; return the owner in force. An owner, once real, never changes:
        a session never moves from one person to another. Replacing a provisional key
        drops the rollups that held the session under it (``_drop_rollups_of_others``)."""
        now = time.time()
        with self.db.transaction() as conn:
            row = conn.execute("SELECT owner FROM session_owners WHERE session_id = ?",
                               (session_id,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO session_owners(session_id, owner, platform, user_id, chat_id,"
                    " conversation_id, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (session_id, owner, platform, user_id, chat_id, conversation_id, now))
                return owner
            current = row[0]
            if is_provisional(current) and not is_provisional(owner):
                current = owner
                _drop_rollups_of_others(conn, session_id, owner)
            conn.execute(
                "UPDATE session_owners SET owner = ?, platform = COALESCE(platform, ?),"
                " user_id = COALESCE(user_id, ?), chat_id = COALESCE(chat_id, ?),"
                " conversation_id = COALESCE(conversation_id, ?) WHERE session_id = ?",
                (current, platform, user_id, chat_id, conversation_id, session_id))
            return current

    def owner_of(self, session_id: str) -> str | None:
        """The owner of a (canonical) session; None when none is recorded (nobody's:
        readable from itself and by operators only)."""
        with self.db.reading() as conn:
            row = conn.execute("SELECT owner FROM session_owners WHERE session_id = ?",
                               (session_id,)).fetchone()
        return row[0] if row else None

    def canonical_sessions_of(self, owner: str) -> tuple[str, ...]:
        """Every canonical session recorded as the owner's (sorted); a session without
        an owner row is nobody's and never listed."""
        with self.db.reading() as conn:
            return tuple(r[0] for r in conn.execute(
                f"SELECT DISTINCT canonical_id FROM ({OWNED_SESSIONS_SQL}) AS owned"
                " ORDER BY 1", (owner,)))

    def sessions_of(self, owner: str, also: Sequence[str] = ()) -> SessionSet:
        """The owner's canonical sessions and ``also`` (the caller's own session, in
        case it has no session row yet) as a ``SessionSet``: SQL names them by owner,
        so their number never reaches a statement's parameter count."""
        owned = self.canonical_sessions_of(owner)
        listed = set(owned)
        return SessionSet((*owned, *also), owner=owner,
                          extra=[s for s in dict.fromkeys(also) if s not in listed])

    def others_exist(self, owner: str) -> bool:
        """Whether any session is not recorded as the owner's (someone else's, or
        nobody's): when none is, "every session of this owner" is simply every session
        and needs no filter."""
        with self.db.reading() as conn:
            return conn.execute(
                "SELECT EXISTS (SELECT 1 FROM sessions s"
                " LEFT JOIN session_owners o ON o.session_id = s.canonical_id"
                " WHERE o.owner IS NULL OR o.owner <> ?)", (owner,)).fetchone()[0] == 1

    @staticmethod
    def delete_in(conn, session_ids) -> int:
        """Forget the owners of sessions being deleted, inside the caller's transaction
        (the same unit as ``Store.delete_sessions_in``)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return 0
        return sum(conn.execute(f"DELETE FROM session_owners WHERE session_id IN"
                                f" ({','.join('?' * len(chunk))})", chunk).rowcount
                   for chunk in chunked(ids))

    def describe(self, session_id: str) -> dict | None:
        """The recorded row (for status), or None."""
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT owner, platform, user_id, chat_id, conversation_id FROM session_owners"
                " WHERE session_id = ?", (session_id,)).fetchone()
        return dict(zip(("owner", "platform", "user_id", "chat_id", "conversation_id"), row)) \
            if row else None


def _drop_rollups_of_others(conn, session_id: str, owner: str) -> list[int]:
    """Delete, inside the caller's transaction, every rollup holding this session under
    another owner than ``owner`` (its replaced key's), with the weeks and months built
    on it. Rollups are per owner: kept, a day of a replaced key shared by two chats
    held both new owners' sessions, and once its period left the lookback no pass ever
    looked at it again. Derived data: the next pass rebuilds what its window holds."""
    doomed = [r[0] for r in conn.execute(
        "SELECT rs.rollup_id FROM rollup_sessions rs JOIN rollups r"
        " ON r.rollup_id = rs.rollup_id WHERE rs.session_id = ? AND r.owner <> ?",
        (session_id, owner))]
    return delete_with_ancestors_in(conn, doomed)
