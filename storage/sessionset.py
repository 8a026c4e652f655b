"""Session sets: the sessions one read covers, and the one rule for naming them in SQL.

A cron job makes one session per run (``binding/cron.py``: 1,440 a day), so "every
session of this owner" outgrows the engines' bound-parameter limits (SQLite 32,766
or Debian's 250,000, PostgreSQL 65,535) within weeks. Every read limited to a scope
renders it through ``session_filter``: an owner's set as a subquery on the owner (one
parameter), a short list id by id. Its own module (not ``owners.py``) because
``timeline.py``, which ``owners.py`` imports, renders scopes too.
"""

from __future__ import annotations

from typing import Iterable, Sequence

# Every canonical session recorded as an owner's, with one parameter (the owner) however
# many there are: a session without an owner row is nobody's and never in it.
OWNED_SESSIONS_SQL = ("SELECT s.canonical_id FROM sessions s JOIN session_owners o"
                      " ON o.session_id = s.canonical_id WHERE o.owner = ?")


class SessionSet(tuple):
    """The sessions one read covers: a sorted tuple of canonical ids (so Python code
    iterates, counts and tests membership as on any tuple, membership in constant
    time) that also knows how SQL names it (``session_filter``).

    Why: a cron job makes one session per run (1,440 a day), so "every session of
    this owner" outgrows the engines' bound-parameter limits (SQLite 32,766 or
    250,000, PostgreSQL 65,535) within weeks. A set read from an owner
    (``Owners.sessions_of``) is written in SQL as a subquery on the owner, one
    parameter; a plain list (one session, a named one) is bound id by id."""

    owner: str | None
    extra: tuple[str, ...]

    def __new__(cls, ids: Iterable[str], owner: str | None = None,
                extra: Sequence[str] = ()):
        made = super().__new__(cls, sorted(set(ids)))
        made.owner = owner
        made.extra = tuple(extra)
        made._members = frozenset(made)
        return made

    def __contains__(self, session: object) -> bool:
        return session in self._members


def session_filter(column: str, sessions: Sequence[str] | None) -> tuple[str, list]:
    """The SQL term limiting ``column`` to ``sessions`` and its parameters ("" and []
    for None: every session). The one rule every read of a session scope renders: an
    owner's set (``SessionSet`` from ``Owners.sessions_of``) as ``IN (subquery)`` with
    the owner as its one parameter, whatever its size; a plain list (one or a few
    sessions) as one parameter per id; an empty list as matching nothing."""
    if sessions is None:
        return "", []
    owner = getattr(sessions, "owner", None)
    if owner is not None:
        extra = list(sessions.extra)
        more = f" OR {column} IN ({','.join('?' * len(extra))})" if extra else ""
        return f"({column} IN ({OWNED_SESSIONS_SQL}){more})", [owner, *extra]
    ids = list(sessions)
    return f"{column} IN ({','.join('?' * len(ids)) or 'NULL'})", ids
