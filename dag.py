"""Summary nodes and their exact lineage.

A node summarizes either raw messages (depth 0, a leaf) or nodes below it
(condensed: its depth is one more than its deepest child's). Ordinary
condensation merges nodes of one depth; the fold that keeps a long session's
frontier inside the summary block merges the oldest nodes of mixed depths.
Lineage lives in ``node_edges`` (parent -> child message or child node, with an
ordinal), indexed both ways, so every lineage question is one indexed query: a
node's children in order, every raw message under a node, which node covers a
message, and the frontier (nodes with no parent yet in a session, the ones that
stand in the prompt).

A new session (after /new) may carry nodes of an older one: ``session_carry``
puts them in the new session's frontier without copying them, so expanding a
carried node still reaches the old session's raw messages.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .storage import scans
from .storage.database import Database, chunked, row_limit
from .storage.sessionset import session_filter
from .storage.postgres import search as pg_search
from .store import SCAN_PAGE_ROWS, SCAN_SECONDS, row_to_dict

NODE_COLUMNS = (
    "node_id, session_id, depth, text, token_count, source_token_count, message_count,"
    " first_store_id, last_store_id, time_from, time_to, level, model, topics, created_at"
)

# The nodes carried into a session and everything under them, as a recursive CTE named
# ``carried(node_id)`` with one parameter (the session): ``Dag.carried_closure`` reads it,
# and a query that filters by the closure joins it instead of binding its node ids.
# ``PINNED_CARRIED_CLOSURE`` takes a second, the highest node id of a snapshot
# (``storage.snapshot``): nodes carried in since are left out, and with them what lies
# under them (a node's edges never change, and its children are older than it).
_CARRIED_SEED = "SELECT node_id FROM session_carry WHERE session_id = ?"
_CARRIED_STEP = (" UNION SELECT e.child_node_id FROM node_edges e JOIN carried"
                 " ON e.parent_id = carried.node_id WHERE e.child_node_id IS NOT NULL)")
CARRIED_CLOSURE = f"carried(node_id) AS ({_CARRIED_SEED}{_CARRIED_STEP}"
PINNED_CARRIED_CLOSURE = f"carried(node_id) AS ({_CARRIED_SEED} AND node_id <= ?{_CARRIED_STEP}"


@dataclass(frozen=True)
class NewNode:
    """Everything needed to write one summary node and its edges."""

    session_id: str
    depth: int
    text: str
    token_count: int
    source_token_count: int
    level: int
    model: str
    child_store_ids: Sequence[int] = ()
    child_node_ids: Sequence[int] = ()
    topics: Sequence[str] = ()


def depth_tag(depth: int) -> str:
    """FTS token for a node depth (nodes_fts tags hold ``s<hex session> d<depth>``)."""
    return f"d{int(depth)}"


def _node(row) -> dict:
    info = row_to_dict(row)
    info["topics"] = json.loads(info.get("topics") or "[]")
    return info


class Dag:
    """Summary nodes, lineage edges and the per-session frontier."""

    def __init__(self, db: Database):
        self.db = db

    # ------------------------------------------------------------------ writes
    def add_node(self, node: NewNode, now: float | None = None,
                 footer: Callable[[int, dict], str] | None = None) -> int:
        """Write a node and its ordered edges in one transaction; return its id.

        A node has either raw-message children (depth 0) or node children, the
        deepest of them exactly one level down; its coverage (message count,
        store_id and time range) is computed from the children so it can never
        disagree with the lineage.
        """
        if bool(node.child_store_ids) == bool(node.child_node_ids):
            raise ValueError("a node needs either message children or node children")
        stamp = time.time() if now is None else now
        with self.db.transaction() as conn:
            if node.child_store_ids:
                if node.depth != 0:
                    raise ValueError("message children belong to a depth-0 node")
                cover = conn.execute(
                    f"SELECT count(*), min(store_id), max(store_id),"
                    f" min(COALESCE(message_at, created_at)), max(COALESCE(message_at, created_at))"
                    f" FROM messages WHERE store_id IN ({','.join('?' * len(node.child_store_ids))})",
                    list(node.child_store_ids)).fetchone()
                if cover[0] != len(set(node.child_store_ids)):
                    raise ValueError("a child message does not exist")
            else:
                marks = ",".join("?" * len(node.child_node_ids))
                found, deepest = conn.execute(
                    f"SELECT count(*), max(depth) FROM nodes WHERE node_id IN ({marks})",
                    list(node.child_node_ids)).fetchone()
                if found != len(set(node.child_node_ids)):
                    raise ValueError("a child node does not exist")
                if deepest != node.depth - 1:
                    raise ValueError(f"the deepest child of a depth-{node.depth} node must be "
                                     f"depth {node.depth - 1}, found {deepest}")
                cover = conn.execute(
                    f"SELECT sum(message_count), min(first_store_id), max(last_store_id),"
                    f" min(time_from), max(time_to) FROM nodes WHERE node_id IN ({marks})",
                    list(node.child_node_ids)).fetchone()
            cur = conn.execute(
                "INSERT INTO nodes(session_id, depth, text, token_count, source_token_count,"
                " message_count, first_store_id, last_store_id, time_from, time_to, level, model,"
                " topics, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (node.session_id, node.depth, node.text, node.token_count,
                 node.source_token_count, cover[0], cover[1], cover[2], cover[3], cover[4],
                 node.level, node.model, json.dumps(list(node.topics)), stamp))
            node_id = cur.lastrowid
            if node.child_store_ids:
                rows = [(node_id, i, None, sid) for i, sid in enumerate(node.child_store_ids)]
            else:
                rows = [(node_id, i, nid, None) for i, nid in enumerate(node.child_node_ids)]
            conn.executemany("INSERT INTO node_edges(parent_id, ordinal, child_node_id,"
                             " child_store_id) VALUES (?, ?, ?, ?)", rows)
            if footer is not None:
                coverage = {"message_count": cover[0], "first_store_id": cover[1],
                            "last_store_id": cover[2], "time_from": cover[3], "time_to": cover[4],
                            "depth": node.depth, "topics": list(node.topics)}
                conn.execute("UPDATE nodes SET text = text || ? WHERE node_id = ?",
                             (footer(node_id, coverage), node_id))
            return node_id

    def carry_nodes(self, session_id: str, node_ids: Sequence[int]) -> int:
        """Put existing nodes into another session's frontier (lineage untouched)."""
        with self.db.transaction() as conn:
            start = conn.execute("SELECT COALESCE(MAX(ordinal) + 1, 0) FROM session_carry"
                                 " WHERE session_id = ?", (session_id,)).fetchone()[0]
            cur = conn.executemany(
                "INSERT OR IGNORE INTO session_carry(session_id, node_id, ordinal) VALUES (?, ?, ?)",
                [(session_id, nid, start + i) for i, nid in enumerate(node_ids)])
            return cur.rowcount

    # ------------------------------------------------------------------ reads
    def get_node(self, node_id: int) -> dict | None:
        """One node's row (topics decoded), or None."""
        with self.db.reading() as conn:
            row = conn.execute(f"SELECT {NODE_COLUMNS} FROM nodes WHERE node_id = ?",
                               (node_id,)).fetchone()
        return _node(row) if row else None

    def get_nodes(self, node_ids: Iterable[int]) -> dict[int, dict]:
        """Nodes by id (missing ids absent)."""
        ids = list(dict.fromkeys(int(i) for i in node_ids))
        if not ids:
            return {}
        found: dict[int, dict] = {}
        with self.db.reading() as conn:
            for chunk in chunked(ids):      # a carried closure may be any size
                found.update((r["node_id"], _node(r)) for r in conn.execute(
                    f"SELECT {NODE_COLUMNS} FROM nodes WHERE node_id IN"
                    f" ({','.join('?' * len(chunk))})", chunk))
        return found

    def children(self, node_id: int, offset: int = 0, limit: int = -1) -> list[dict]:
        """A node's immediate children in order: ``{ordinal, kind, id}`` (kind node|message)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT ordinal, child_node_id, child_store_id FROM node_edges"
                " WHERE parent_id = ? ORDER BY ordinal LIMIT ? OFFSET ?",
                (node_id, row_limit(limit), offset)).fetchall()
        return [{"ordinal": r[0], "kind": "node" if r[1] is not None else "message",
                 "id": r[1] if r[1] is not None else r[2]} for r in rows]

    def child_count(self, node_id: int) -> int:
        """How many immediate children a node has."""
        with self.db.reading() as conn:
            return conn.execute("SELECT count(*) FROM node_edges WHERE parent_id = ?",
                                (node_id,)).fetchone()[0]

    def edges_among(self, node_ids: Iterable[int]) -> list[tuple[int, int]]:
        """``(parent, child)`` edges between nodes of this set (so a search can tell a
        node from its broader parent); at most 500 ids are looked at."""
        ids = list(dict.fromkeys(int(i) for i in node_ids))[:500]
        if len(ids) < 2:
            return []
        marks = ",".join("?" * len(ids))
        with self.db.reading() as conn:
            return [(r[0], r[1]) for r in conn.execute(
                f"SELECT parent_id, child_node_id FROM node_edges WHERE parent_id IN ({marks})"
                f" AND child_node_id IN ({marks})", ids + ids)]

    def descendant_store_ids(self, node_id: int) -> list[int]:
        """Every raw message under a node, in lineage order (one recursive query)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                """
                WITH RECURSIVE walk(node_id, path) AS (
                    SELECT ?, ''
                    UNION ALL
                    SELECT e.child_node_id, walk.path || printf('%08d.', e.ordinal)
                    FROM node_edges e JOIN walk ON e.parent_id = walk.node_id
                    WHERE e.child_node_id IS NOT NULL
                )
                SELECT e.child_store_id FROM walk
                JOIN node_edges e ON e.parent_id = walk.node_id AND e.child_store_id IS NOT NULL
                ORDER BY walk.path, e.ordinal
                """, (node_id,)).fetchall()
        return [r[0] for r in rows]

    # BIGINT, not INTEGER: PostgreSQL's node ids are bigint, and a recursive term must
    # keep the type of the non-recursive one (with INTEGER every walk was refused there).
    _SUBTREE = """
        WITH RECURSIVE walk(node_id) AS (
            SELECT CAST(? AS BIGINT)
            UNION
            SELECT e.child_node_id FROM node_edges e JOIN walk ON e.parent_id = walk.node_id
            WHERE e.child_node_id IS NOT NULL
        )"""

    def subtree_sessions(self, node_id: int) -> set[str]:
        """Every session owning a node or a raw message under a node (the node's own
        too): whether a caller may count all of it is one question per session."""
        with self.db.reading() as conn:
            return {r[0] for r in conn.execute(
                self._SUBTREE + """
                SELECT n.session_id FROM walk JOIN nodes n ON n.node_id = walk.node_id
                UNION
                SELECT m.session_id FROM walk JOIN node_edges e ON e.parent_id = walk.node_id
                JOIN messages m ON m.store_id = e.child_store_id
                """, (node_id,))}

    def subtree_edges(self, node_id: int) -> list[dict]:
        """Every edge under a node: ``{parent, kind, id, session_id, time}`` (kind node |
        message; ``session_id`` None for a child that no longer exists; ``time`` a raw
        message's), so a caller's share of the node can be counted without a row's text."""
        with self.db.reading() as conn:
            rows = conn.execute(
                self._SUBTREE + """
                SELECT e.parent_id, e.child_node_id, e.child_store_id,
                       COALESCE(n.session_id, m.session_id),
                       COALESCE(m.message_at, m.created_at)
                FROM walk JOIN node_edges e ON e.parent_id = walk.node_id
                LEFT JOIN nodes n ON n.node_id = e.child_node_id
                LEFT JOIN messages m ON m.store_id = e.child_store_id
                ORDER BY e.parent_id, e.ordinal
                """, (node_id,)).fetchall()
        return [{"parent": r[0], "kind": "node" if r[1] is not None else "message",
                 "id": r[1] if r[1] is not None else r[2], "session_id": r[3], "time": r[4]}
                for r in rows]

    def covering_nodes(self, store_id: int) -> list[int]:
        """Leaf nodes whose children include a raw message (usually zero or one)."""
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT parent_id FROM node_edges WHERE child_store_id = ?", (store_id,))]

    def covered_store_ids(self, store_ids: Iterable[int]) -> set[int]:
        """Which of these raw messages are already summarized by some leaf."""
        ids = list(dict.fromkeys(int(i) for i in store_ids))
        covered: set[int] = set()
        with self.db.reading() as conn:
            for chunk in chunked(ids):
                covered.update(r[0] for r in conn.execute(
                    f"SELECT DISTINCT child_store_id FROM node_edges WHERE child_store_id IN"
                    f" ({','.join('?' * len(chunk))})", chunk))
        return covered

    def parents(self, node_id: int) -> list[int]:
        """Nodes that condensed this node (one per session that condensed it)."""
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT parent_id FROM node_edges WHERE child_node_id = ?", (node_id,))]

    def frontier(self, session_id: str) -> list[dict]:
        """Nodes standing in a session's prompt: its own and carried nodes that no node
        of this session has condensed yet, oldest coverage first."""
        with self.db.reading() as conn:
            rows = conn.execute(
                f"""
                SELECT {NODE_COLUMNS} FROM nodes n
                WHERE (n.session_id = :s OR n.node_id IN
                       (SELECT node_id FROM session_carry WHERE session_id = :s))
                  AND NOT EXISTS (
                    SELECT 1 FROM node_edges e JOIN nodes p ON p.node_id = e.parent_id
                    WHERE e.child_node_id = n.node_id AND p.session_id = :s)
                ORDER BY n.first_store_id, n.node_id
                """, {"s": session_id}).fetchall()
        return [_node(r) for r in rows]

    def session_nodes(self, session_id: str, depth: int | None = None) -> list[dict]:
        """All nodes a session owns (optionally one depth), oldest first."""
        sql = f"SELECT {NODE_COLUMNS} FROM nodes WHERE session_id = ?"
        params: list = [session_id]
        if depth is not None:
            sql += " AND depth = ?"
            params.append(depth)
        with self.db.reading() as conn:
            return [_node(r) for r in conn.execute(sql + " ORDER BY node_id", params)]

    def nodes_in_period(self, start: float, end: float, *, session_ids: Sequence[str] | None,
                        limit: int, max_node_id: int | None = None) -> list[dict]:
        """Nodes whose covered time range overlaps ``[start, end)``, newest first; with
        ``max_node_id`` (a ``timeline.Pin``'s) only those that existed then."""
        sql = f"SELECT {NODE_COLUMNS} FROM nodes WHERE time_to >= ? AND time_from < ?"
        params: list = [start, end]
        if max_node_id is not None:
            sql += " AND node_id <= ?"
            params.append(max_node_id)
        if session_ids is not None:
            term, bound = session_filter("session_id", session_ids)
            sql += f" AND {term}"
            params += bound
        sql += " ORDER BY time_to DESC, depth DESC LIMIT ?"
        with self.db.reading() as conn:
            return [_node(r) for r in conn.execute(sql, params + [limit])]

    def stats(self, session_id: str | None = None) -> dict:
        """Node counts per depth and token totals (one session or all)."""
        where = "WHERE session_id = ?" if session_id else ""
        params = [session_id] if session_id else []
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT depth, count(*), sum(token_count), sum(source_token_count)"
                f" FROM nodes {where} GROUP BY depth ORDER BY depth", params).fetchall()
        return {"by_depth": {r[0]: {"nodes": r[1], "tokens": r[2], "source_tokens": r[3]}
                             for r in rows},
                "nodes": sum(r[1] for r in rows)}

    def fts_candidates(self, match: str, *, limit: int) -> list[tuple]:
        """Nodes matching an FTS5 expression built by ``search``: ``(node_id, bm25)``."""
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return pg_search.match_ids(conn, "nodes", "node_id", match, limit=limit,
                                           ranked=True)
            return [tuple(r) for r in conn.execute(
                "SELECT rowid, rank FROM nodes_fts WHERE nodes_fts MATCH ? ORDER BY rank LIMIT ?",
                (match, limit))]

    # ------------------------------------------------------------------ search, scope, health reads
    def match_node_ids(self, match: str, *, limit: int, ranked: bool,
                       sessions: Sequence[str] | None = None) -> list[tuple[int, float | None]]:
        """Nodes matching an FTS5 expression built by ``search``: ranked best first
        ``(node_id, bm25)``, or newest first ``(node_id, None)`` (unranked, cheap).
        ``sessions`` keeps nodes of a scope too many sessions to name as tags in the
        expression (a join, ``session_filter``; None: the expression alone decides)."""
        rank, order = ("f.rank", "f.rank") if ranked else ("NULL", "f.rowid DESC")
        alias = "m" if self.db.dialect == "postgresql" else "n"   # pg_search's row is m
        term, scoped = session_filter(f"{alias}.session_id", sessions)
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return pg_search.match_ids(conn, "nodes", "node_id", match, limit=limit,
                                           ranked=ranked, where=[term] if term else [],
                                           params=scoped)
            join = " CROSS JOIN nodes n ON n.node_id = f.rowid" if term else ""
            return [(r[0], r[1]) for r in conn.execute(
                f"SELECT f.rowid, {rank} FROM nodes_fts f{join} WHERE nodes_fts MATCH ?"
                f"{' AND ' + term if term else ''} ORDER BY {order} LIMIT ?",
                (match, *scoped, limit))]

    def count_node_matches(self, match: str, *, cap: int) -> int:
        """How many nodes match an FTS5 expression, counting no further than ``cap``."""
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return pg_search.count_matches(conn, "nodes", "node_id", match, cap=cap)
            return conn.execute(
                "SELECT count(*) FROM (SELECT rowid FROM nodes_fts WHERE nodes_fts MATCH ?"
                " LIMIT ?)", (match, cap)).fetchone()[0]

    def substring_scan(self, session_ids: Sequence[str] | None, needles: Sequence[str], *,
                       limit: int, max_rows: int, max_seconds: float = SCAN_SECONDS,
                       page_rows: int = SCAN_PAGE_ROWS) -> list[int]:
        """node_ids (newest first) whose text contains every needle, scanning at most
        ``max_rows`` of the newest nodes: the fallback for CJK runs, emoji, symbols.
        Page by page like ``Store.substring_scan``: the shared connection is held one
        page at a time, and the scan stops after ``max_seconds`` with what it found."""
        conds = " AND ".join("instr(lower(text), ?) > 0" for _ in needles) or "1"
        scope, scoped = "", []
        if session_ids is not None:
            term, scoped = session_filter("session_id", session_ids)
            scope = f"{term} AND "
        lowered = [n.lower() for n in needles]

        def page(cursor: int, size: int) -> tuple[str, list]:
            return (f"SELECT node_id, {conds} FROM (SELECT node_id, text FROM nodes"
                    f" WHERE {scope}node_id < ? ORDER BY node_id DESC LIMIT ?) AS page",
                    lowered + scoped + [cursor, size])
        return scans.newest_first(self.db, page, limit=limit, max_rows=max_rows,
                                  max_seconds=max_seconds, page_rows=page_rows)

    def last_node_id(self) -> int:
        """The highest node_id (0 when there are no nodes)."""
        with self.db.reading() as conn:
            return conn.execute("SELECT COALESCE(MAX(node_id), 0) FROM nodes").fetchone()[0]

    def carried_node_ids(self, session_id: str) -> list[int]:
        """Nodes of older sessions carried into this session's frontier, in carry order."""
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT node_id FROM session_carry WHERE session_id = ? ORDER BY ordinal",
                (session_id,))]

    def carried_closure(self, session_id: str) -> set[int]:
        """Every node reachable downward from the nodes carried into a session: what a
        session may expand although another session owns it."""
        with self.db.reading() as conn:
            return {r[0] for r in conn.execute(
                f"WITH RECURSIVE {CARRIED_CLOSURE} SELECT node_id FROM carried",
                (session_id,))}

    def rows_under_containing(self, node_ids: Iterable[int], needle: str, *,
                              limit: int) -> list[int]:
        """The newest ``limit`` raw messages directly under these nodes whose content holds
        ``needle`` (newest first). With a session's carried closure: the rows a session
        may read although another session owns them, that hold, say, a payload placeholder."""
        ids = sorted({int(i) for i in node_ids})
        found: set[int] = set()
        with self.db.reading() as conn:
            for chunk in chunked(ids):
                found.update(r[0] for r in conn.execute(
                    "SELECT e.child_store_id FROM node_edges e JOIN messages m"
                    " ON m.store_id = e.child_store_id"
                    f" WHERE e.parent_id IN ({','.join('?' * len(chunk))})"
                    " AND instr(m.content, ?) > 0 ORDER BY e.child_store_id DESC LIMIT ?",
                    chunk + [needle, row_limit(limit)]))
        return sorted(found, reverse=True)[:max(limit, 0)]

    def nodes_with_source(self, node_ids: Iterable[int], source: str) -> set[int]:
        """Which of these nodes have at least one raw descendant from ``source``."""
        keep: set[int] = set()
        with self.db.reading() as conn:
            for node_id in dict.fromkeys(int(i) for i in node_ids):
                row = conn.execute(
                    """
                    WITH RECURSIVE walk(node_id) AS (
                        SELECT ?
                        UNION
                        SELECT e.child_node_id FROM node_edges e JOIN walk
                        ON e.parent_id = walk.node_id WHERE e.child_node_id IS NOT NULL
                    )
                    SELECT 1 FROM walk JOIN node_edges e ON e.parent_id = walk.node_id
                    JOIN messages m ON m.store_id = e.child_store_id
                    WHERE m.source = ? LIMIT 1
                    """, (node_id, source)).fetchone()
                if row:
                    keep.add(node_id)
        return keep

    def fts_row_counts(self) -> dict:
        """Rows in ``nodes`` and documents in its FTS index (they should be equal)."""
        docs = ("(SELECT count(*) FROM nodes WHERE fts IS NOT NULL)"
                if self.db.dialect == "postgresql" else "(SELECT count(*) FROM nodes_fts_docsize)")
        with self.db.reading() as conn:  # one statement: both counts from one snapshot
            rows, docs = conn.execute(f"SELECT (SELECT count(*) FROM nodes), {docs}").fetchone()
        return {"rows": rows, "fts_docs": docs}

    # ------------------------------------------------------------------ operator maintenance
    def external_references(self, session_ids: Sequence[str], limit: int = 20) -> list[dict]:
        """Where other sessions depend on these sessions' summaries or messages: their
        nodes carried into another session, or another session's node built on them.
        Such a session must never be removed (``doctor clean`` protects it)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        owned = f"SELECT node_id FROM nodes WHERE session_id IN ({marks})"
        with self.db.reading() as conn:
            carried = conn.execute(
                f"SELECT session_id, node_id FROM session_carry WHERE node_id IN ({owned})"
                f" AND session_id NOT IN ({marks}) LIMIT ?", ids + ids + [limit]).fetchall()
            built = conn.execute(
                f"SELECT p.session_id, e.parent_id FROM node_edges e"
                f" JOIN nodes p ON p.node_id = e.parent_id WHERE p.session_id NOT IN ({marks})"
                f" AND (e.child_node_id IN ({owned}) OR e.child_store_id IN"
                f" (SELECT store_id FROM messages WHERE session_id IN ({marks}))) LIMIT ?",
                ids + ids + ids + [limit]).fetchall()
        return ([{"session_id": r[0], "node_id": r[1], "how": "carried"} for r in carried]
                + [{"session_id": r[0], "node_id": r[1], "how": "condensed"} for r in built])

    def delete_session_nodes_in(self, conn, session_ids: Sequence[str]) -> dict:
        """Delete these sessions' nodes, their edges and their carry rows inside the
        caller's transaction, so the messages (``Store.delete_sessions_in``) go in the
        same unit; FTS follows by trigger. A node still carried into or condensed by
        another session makes the foreign keys fail the whole transaction."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return {"nodes": 0, "edges": 0, "carry_rows": 0}
        removed = {"nodes": 0, "edges": 0, "carry_rows": 0}
        # each table for every slice before the next table: an edge between two removed
        # sessions' nodes goes before either node, whichever slices they fall in
        for key, sql in (
                ("carry_rows", "DELETE FROM session_carry WHERE session_id IN ({})"),
                ("edges", "DELETE FROM node_edges WHERE parent_id IN"
                          " (SELECT node_id FROM nodes WHERE session_id IN ({}))"),
                ("nodes", "DELETE FROM nodes WHERE session_id IN ({})")):
            for chunk in chunked(ids):
                removed[key] += conn.execute(sql.format(",".join("?" * len(chunk))),
                                             chunk).rowcount
        return removed

    def rebuild_node_fts(self) -> None:
        """Rebuild the summary full-text index from the nodes table (doctor repair)."""
        with self.db.transaction() as conn:
            conn.execute("REINDEX INDEX nodes_fts" if self.db.dialect == "postgresql"
                         else "INSERT INTO nodes_fts(nodes_fts) VALUES ('rebuild')")
