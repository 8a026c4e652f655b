"""Scope of one tool call (design invariant 6): the bound session and what a call may read.

Every tool works inside the calling engine's session. Another session is
reachable only when the call names it (``session_id``) or asks for
``session_scope="all"``; nodes carried into this session from an older one,
and what lies under them, count as this session's. An unbound engine (no
session id) gets empty "unbound" answers. ``ctx`` is ``tools.ToolContext``.
"""

from __future__ import annotations

from typing import Any

from ..binding.owners import local_operator
from ..schemas import ArgumentError, Shape
from ..storage.owners import LOCAL_OWNER, Owners


def bound_session(ctx: Any) -> str | None:
    """The calling engine's canonical session, or None when it is unbound."""
    if not ctx.session_id:
        return None
    return ctx.store.canonical_session(ctx.session_id)


def operator_view(ctx: Any, current: str | None) -> bool:
    """Whether this call may see the database as a whole (its path, totals, settings,
    every owner's figures): an operator command, or a session of the profile's local
    owner (``is_operator``). In a messaging gateway any chat member can ask the agent to
    call a status tool, so another owner's session sees its own figures only
    (``diagnostics.caller``)."""
    if ctx.operator:
        return True
    return is_operator(Owners(ctx.store.db).owner_of(current) if current else None)


def is_operator(owner: str | None) -> bool:
    """Whether the owner of the calling session is the profile's operator: the local
    owner (the CLI user, ``binding.owners``) is, any other owner is not. With no owner
    known (an unbound engine, a session whose owner was never recorded, a database that
    cannot be read) whoever runs the process decides (``binding.owners.local_operator``:
    the CLI yes, a messaging gateway no: fail closed where other people type)."""
    if owner is not None:
        return owner == LOCAL_OWNER
    return local_operator()


def _unbound(tool: str, key: str) -> tuple[dict, Shape]:
    return ({"unbound": True, key: [], "note": f"{tool}: no session is bound to this engine yet, "
             "so nothing can be searched or read"}, Shape())


class Access:
    """What one call may read: its session, carried lineage, and what it explicitly names.

    Owners (shared gateways): another session is readable only when it belongs
    to the calling session's owner, unless ``TROVE_CROSS_OWNER_RECALL`` is on or
    an operator command asks. Another owner's session or row is "not found":
    its existence is not revealed either."""

    def __init__(self, ctx: Any, params: dict, current: str):
        self.ctx = ctx
        self.current = current
        self.scope = params.get("session_scope", "current")
        self._owners = Owners(ctx.store.db)
        self.every_owner = bool(ctx.operator or getattr(ctx.config, "cross_owner_recall", False))
        self.owner = self._owners.owner_of(current)
        self._owned: tuple[str, ...] | None = None
        self._owner_of: dict[str, str | None] = {}
        self._alone: bool | None = None
        named = params.get("session_id")
        self.named = ctx.store.canonical_session(named) if named else None
        if self.named and not self.owns(self.named):
            raise ArgumentError(f"session {str(named)[:120]!r} not found")
        if self.scope == "session" and not self.named:
            raise ArgumentError("session_scope='session' needs session_id")
        self._closure: set[int] | None = None

    def owns(self, session: str) -> bool:
        """Whether ``session`` (canonical) belongs to the caller's owner. A session
        with no owner recorded (the caller's own or the other) is nobody's: only
        itself and operators read it (fail closed)."""
        if self.every_owner or session == self.current:
            return True
        if self.owner is None:
            return False
        if session not in self._owner_of:
            self._owner_of[session] = self._owners.owner_of(session)
        return self._owner_of[session] == self.owner

    def alone(self) -> bool:
        """Whether nothing in the database can be another owner's for this caller (an
        operator, or every session recorded as the caller's owner's): then a count or
        time range stored with a node is the caller's as it stands, and checking each
        row under it would only cost time."""
        if self._alone is None:
            self._alone = self.every_owner or (
                self.owner is not None and not self._owners.others_exist(self.owner))
        return self._alone

    def search_sessions(self) -> tuple[str, ...] | None:
        """Sessions whose raw rows a search covers (None = all). The owner's set is a
        ``SessionSet``: SQL names it by owner (``storage.sessionset.session_filter``), never
        one parameter per session."""
        if self.scope == "all":
            if self.every_owner:
                return None  # every session is readable: no filter at all
            if self.owner is None:
                return (self.current,)   # an unknown owner reads only its own session
            if self.alone():
                return None  # every session is this owner's: no filter at all
            if self._owned is None:
                self._owned = self._owners.sessions_of(self.owner, also=(self.current,))
            return self._owned
        return (self.named,) if self.named else (self.current,)

    def rollup_owners(self) -> tuple[str, ...] | None:
        """Whose rollups this call may list (None = every owner's): the caller's own
        owner's, or every owner's for operators and ``TROVE_CROSS_OWNER_RECALL``; a
        session with no owner has none."""
        if self.every_owner:
            return None
        return (self.owner,) if self.owner is not None else ()

    def owns_rollup(self, rollup: dict) -> bool:
        """Whether a rollup is of an owner this call may read (another owner's is "not
        found": its existence is not revealed)."""
        owners = self.rollup_owners()
        return owners is None or rollup.get("owner") in owners

    def carried(self) -> set[int]:
        """Nodes carried into this session and everything under them."""
        if self._closure is None:
            self._closure = self.ctx.dag.carried_closure(self.current)
        return self._closure

    def allows_session(self, session: str) -> bool:
        """This session, an explicitly named one, or any of the owner's with
        ``session_scope="all"``."""
        if session == self.current or session == self.named:
            return True
        return self.scope == "all" and self.owns(session)

    def node_ok(self, node: dict) -> bool:
        """A node of an allowed session, or one under a node carried into this session."""
        return self.allows_session(node["session_id"]) or node["node_id"] in self.carried()

    def known_node_ids(self, node_ids) -> list[int]:
        """Of these node ids (a row's covering nodes, a node's parents), those whose
        existence the caller may learn: a node of its owner's sessions, or one it may
        read (carried lineage). Another owner's node is "not found" when named, so its
        id is not listed either: a node of this session carried into another owner's
        session and condensed there, or a leaf of another owner over a row of this
        session, would name that owner's node."""
        ids = list(node_ids)
        nodes = self.ctx.dag.get_nodes(ids) if ids else {}
        return [n for n in ids if n in nodes and self.knows_node(nodes[n])]

    def knows_node(self, node: dict) -> bool:
        """Whether the caller may learn that a node (``node_id``, ``session_id``) exists
        (``known_node_ids``)."""
        return self.owns(node["session_id"]) or self.node_ok(node)

    def knows_row(self, row: dict) -> bool:
        """Whether the caller may learn that a raw row (``store_id``, ``session_id``)
        exists (``known_store_ids``)."""
        return self.owns(row["session_id"]) or self.message_ok(row)

    def coverage(self, node: dict) -> dict:
        """A node's coverage as the caller may count it: ``message_count``, ``time_from``,
        ``time_to`` and ``source_token_count``. They were computed over every row under
        the node when it was written; when some of that material is another owner's (a
        summary over a span carried from or shared with another owner), the caller
        counts only the rows it may learn exist, reached through nodes it may learn
        exist (what trove_expand pages to), and the tokens the summary was built from
        are withheld (None): they measured the other owner's text too."""
        stored = {k: node[k] for k in ("message_count", "time_from", "time_to",
                                       "source_token_count")}
        if self.alone() or all(self.owns(s)
                               for s in self.ctx.dag.subtree_sessions(node["node_id"])):
            return stored
        under: dict[int, list[dict]] = {}
        for edge in self.ctx.dag.subtree_edges(node["node_id"]):
            under.setdefault(edge["parent"], []).append(edge)
        memo: dict[int, tuple[int, list]] = {}
        hidden: list[int] = []

        def walk(node_id: int) -> tuple[int, list]:
            if node_id not in memo:
                count, times = 0, []
                for edge in under.get(node_id, ()):
                    if edge["session_id"] is None:         # removed since: shown as missing
                        count += edge["kind"] == "message"
                    elif edge["kind"] == "node":
                        if self.knows_node({"node_id": edge["id"],
                                            "session_id": edge["session_id"]}):
                            sub, sub_times = walk(edge["id"])
                            count, times = count + sub, times + sub_times
                        else:
                            hidden.append(edge["id"])
                    elif self.knows_row({"store_id": edge["id"],
                                         "session_id": edge["session_id"]}):
                        count += 1
                        times += [edge["time"]] if edge["time"] is not None else []
                    else:
                        hidden.append(edge["id"])
                memo[node_id] = (count, times)
            return memo[node_id]

        count, times = walk(node["node_id"])
        if not hidden:
            return stored
        return {"message_count": count, "time_from": min(times, default=None),
                "time_to": max(times, default=None), "source_token_count": None}

    def known_store_ids(self, store_ids) -> list[int]:
        """Of these store ids (a summary's first and last row), those the caller may learn
        exist: a row of its owner's sessions, or one it may read (``known_node_ids``)."""
        ids = [i for i in store_ids if i is not None]
        rows = self.ctx.store.get_messages(ids) if ids else {}
        return [i for i in ids if i in rows and self.knows_row(rows[i])]

    def message_ok(self, row: dict) -> bool:
        """A message of an allowed session, or one under a carried node."""
        if self.allows_session(row["session_id"]):
            return True
        closure = self.carried()
        return bool(closure) and any(n in closure for n in
                                     self.ctx.dag.covering_nodes(row["store_id"]))

    def handle(self, key: str, value: int | str, session: str, **extra) -> dict:
        """A complete ``trove_expand`` call that reaches this row from this session."""
        args: dict = {key: value, **extra}
        if session != self.current:
            if self.scope == "all":
                args["session_scope"] = "all"
            elif session == self.named:
                args["session_id"] = session
        return {"tool": "trove_expand", "args": args}

    def refusal(self, what: str, session: str) -> ArgumentError:
        """The error for a row of another session, naming the argument that opens it
        (another owner's row is simply not found)."""
        if not self.owns(session):
            return ArgumentError(f"{what} not found")
        return ArgumentError(f"{what} belongs to another session ({session}); pass "
                             f"session_id='{session}' or session_scope='all' to read it")


def _load_message(ctx: Any, access: Access, store_id: int) -> dict:
    row = ctx.store.get_message(store_id)
    if row is None:
        raise ArgumentError(f"store_id {store_id} not found")
    if not access.message_ok(row):
        raise access.refusal(f"store_id {store_id}", row["session_id"])
    return row


def _load_node(ctx: Any, access: Access, node_id: int) -> dict:
    node = ctx.dag.get_node(node_id)
    if node is None:
        raise ArgumentError(f"node_id {node_id} not found")
    if not access.node_ok(node):
        raise access.refusal(f"node_id {node_id}", node["session_id"])
    return node
