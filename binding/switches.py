"""Session switches the host makes without ``on_session_start``.

The Hermes 0.19 CLI switches sessions with a reset-only path: it sets
``agent.session_id`` and calls ``agent.reset_session_state()``, which calls
``on_session_reset()`` and then ``bind_session_state(session_db, session_id)``.
Nothing says whether the switch was /new, /resume or /branch; this module
tells them apart from what exists:

- the target is a session trove already stores: **resume** (continue its own
  rows, DAG and known tail);
- the host's state.db already has the target, created as a child of the
  session we were in: **branch** (the CLI writes the branch row and copies the
  history before switching);
- the host's state.db has the target otherwise: **resume** of a session trove
  has not seen yet (nothing is carried into it);
- the host has no row for it yet (the CLI creates the /new row after the
  switch), or no session DB was given: **new**.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dag import Dag
from ..store import Store

NEW, RESUME, BRANCH = "new", "resume", "branch"


@dataclass(frozen=True)
class Switch:
    """One decided switch: its kind, the session left and the one entered."""

    kind: str
    old_session_id: str | None
    new_session_id: str


def host_session_row(session_db, session_id: str) -> dict | None:
    """The host's state.db row for ``session_id`` (None without a DB, or on any error:
    the host's DB is advisory here, never a reason to fail a switch)."""
    if session_db is None:
        return None
    try:
        row = session_db.get_session(session_id)
    except Exception:
        return None
    return dict(row) if row else None


def classify(store: Store, *, old_session_id: str | None, new_session_id: str,
             host_row: dict | None) -> Switch:
    """Decide what a reset-only switch to ``new_session_id`` is (see the module doc)."""
    if store.get_session(new_session_id) is not None:
        return Switch(RESUME, old_session_id, new_session_id)
    if host_row is not None:
        parent = host_row.get("parent_session_id")
        if old_session_id and parent and (
                parent == old_session_id
                or store.canonical_session(parent) == store.canonical_session(old_session_id)):
            return Switch(BRANCH, old_session_id, new_session_id)
        return Switch(RESUME, old_session_id, new_session_id)
    return Switch(NEW, old_session_id, new_session_id)


def carry_into(dag: Dag, switch: Switch, *, old_canonical: str | None, new_canonical: str,
               retain_depth: int) -> list[int]:
    """Carry summary nodes of the session left into the one entered; return their ids.

    /new carries the old frontier's nodes of depth >= ``retain_depth`` (as the
    gateway's /new does; a negative depth carries nothing). /branch carries the
    whole frontier: the branch's copied history shows the parent's summary block,
    and what that block stands for must stay reachable from the branch (its
    raw tail is stored under the branch at its first ingest; the parent's rows
    are never duplicated in the parent). /resume carries nothing: the resumed
    session has its own store and DAG."""
    if not old_canonical or old_canonical == new_canonical or switch.kind == RESUME:
        return []
    floor = 0 if switch.kind == BRANCH else retain_depth
    if floor < 0:
        return []
    nodes = [n["node_id"] for n in dag.frontier(old_canonical) if n["depth"] >= floor]
    if nodes:
        dag.carry_nodes(new_canonical, nodes)
    return nodes
