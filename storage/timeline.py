"""Time-window reads of messages and summaries, and the rollup tables (one place for their SQL).

Everything here works on half-open windows ``[start, end)`` of Unix seconds
(see ``timekeys`` for how a local day becomes one). A message's time is
``COALESCE(message_at, created_at)``: the time the message itself carries, else
when it was stored; the ``messages_rollup_time`` index is on exactly that
expression. Reads return ids (and a little metadata); the callers load full
rows through ``Store`` / ``Dag`` so the row shapes stay defined once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable, Sequence

from . import timekeys
from .database import Database, chunked, row_limit
from .sessionset import session_filter
from .snapshot import MILLISECONDS, Snapshot

Eligible = Callable[[str, str], bool]     # (session_id, source) -> may feed rollups

MESSAGE_TIME = "COALESCE(message_at, created_at)"
# The one rule of which leaves a window (a day) rolls up as summaries: those lying wholly
# inside it (bound: start, end). A leaf's time range is its messages' (``Dag.add_node``),
# so the rest of the window's messages, the day's part of a leaf spanning midnight among
# them, are read raw: each message reaches the day it was said, exactly once.
WHOLE_LEAF = "n.depth = 0 AND n.time_from >= ? AND n.time_to < ?"
_NOT_IN_WHOLE_LEAF = (" AND NOT EXISTS (SELECT 1 FROM node_edges e JOIN nodes n"
                      " ON n.node_id = e.parent_id WHERE e.child_store_id = m.store_id"
                      f" AND {WHOLE_LEAF}")     # open: ``_not_in_whole_leaf`` closes it
ROLLUP_COLUMNS = ("rollup_id, kind, period_key, time_zone, owner, period_start, period_end, text,"
                  " token_count, source_token_count, level, model, message_count, session_count,"
                  " time_from, time_to, watermark, built_at")


@dataclass(frozen=True)
class NewRollup:
    """Everything needed to write (or rewrite) one rollup and its lineage."""

    kind: str
    period_key: str
    time_zone: str
    owner: str                               # whose sessions (``storage.owners``): never mixed
    period_start: float
    period_end: float
    text: str
    token_count: int
    source_token_count: int
    level: int
    model: str
    message_count: int
    time_from: float | None
    time_to: float | None
    watermark: str
    sources: Sequence[tuple[str, int]]      # ("rollup" | "node" | "message", id), in order
    session_ids: Sequence[str]


@dataclass(frozen=True)
class Pin(Snapshot):
    """The store as it was at one instant, for paging a list that writes change between
    calls: the highest message ``store_id``, summary ``node_id`` and ``rollup_id`` then,
    and the time (ms) a period was resolved at. Every read given a pin leaves out rows
    above it, and a message counts as unsummarized while no node at or below the pin
    holds it; so page two of ``trove_recent`` lists the same items as page one saw,
    whatever was stored, compacted or rolled up in between. Ids only grow (a rollup
    rebuilt in place keeps its id: see ``Timeline.freshness``). Its token is
    ``storage.snapshot``'s, the one codec every paged tool's snapshot shares."""

    KIND: ClassVar[str] = "recent"
    store_id: int
    node_id: int
    rollup_id: int
    now_ms: int = field(metadata=MILLISECONDS)


def _pinned(pin: Pin | None, column: str, kind: str) -> tuple[str, list]:
    return pin.below(column, kind) if pin is not None else ("", [])


def _not_in_whole_leaf(start: float, end: float, pin: Pin | None) -> tuple[str, list]:
    """``_NOT_IN_WHOLE_LEAF`` for the window, counting only leaves at or below the pin."""
    bound, params = _pinned(pin, "n.node_id", "node")
    return f"{_NOT_IN_WHOLE_LEAF}{bound})", [start, end, *params]


def _in(values: Sequence) -> str:
    return ",".join("?" * len(values))


def _session_filter(column: str, sessions: Sequence[str] | None) -> tuple[str, list]:
    """`` AND <column in sessions>`` (``sessionset.session_filter``: an owner's set is a
    subquery, never one parameter per session), or "" for every session."""
    term, params = session_filter(column, sessions)
    return (f" AND {term}" if term else ""), params


class Timeline:
    """Time-bounded reads over messages and nodes, and the rollup tables."""

    def __init__(self, db: Database):
        self.db = db

    def pin(self, now: float) -> Pin:
        """The store as it is now (``Pin``): its newest message, node and rollup ids,
        read in one statement, and ``now`` to the millisecond."""
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT (SELECT COALESCE(max(store_id), 0) FROM messages),"
                " (SELECT COALESCE(max(node_id), 0) FROM nodes),"
                " (SELECT COALESCE(max(rollup_id), 0) FROM rollups)").fetchone()
        return Pin(int(row[0]), int(row[1]), int(row[2]), max(0, int(now * 1000)))

    # ------------------------------------------------------------------ time-window reads
    def sessions_between(self, start: float, end: float,
                         pin: Pin | None = None) -> list[tuple[str, str, str | None]]:
        """``(session_id, source, owner)`` of every session with a message in the window
        (at or below the pin; owner None: none recorded).
        (The owners come by a join: a day of a cron job's runs is a session a minute,
        and a list of them bound one parameter each could pass the engine's limit.)"""
        bound, params = _pinned(pin, "store_id", "store")
        with self.db.reading() as conn:
            return [(r[0], r[1], r[2]) for r in conn.execute(
                f"SELECT m.session_id, m.source, o.owner FROM (SELECT DISTINCT"
                f" session_id, source FROM messages WHERE {MESSAGE_TIME} >= ?"
                f" AND {MESSAGE_TIME} < ?{bound}) AS m LEFT JOIN session_owners o"
                f" ON o.session_id = m.session_id",
                (start, end, *params))]

    def session_spans(self, start: float, end: float, sessions: Sequence[str] | None,
                      limit: int, pin: Pin | None = None) -> list[dict]:
        """Per session with a message in the window (of these sessions; None = all; at or
        below the pin):
        ``session_id``, ``message_count``, ``first_at``, ``last_at``, ``first_store_id``
        and ``first_user_id`` (its first user message in the window, or None); the
        sessions active last first, at most ``limit``."""
        where, params = _session_filter("session_id", sessions)
        bound, pinned = _pinned(pin, "store_id", "store")
        where, params = where + bound, params + pinned
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT session_id, count(*), min({MESSAGE_TIME}), max({MESSAGE_TIME}),"
                f" min(store_id), min(CASE WHEN role = 'user' THEN store_id END)"
                f" FROM messages WHERE {MESSAGE_TIME} >= ? AND {MESSAGE_TIME} < ?{where}"
                f" GROUP BY session_id ORDER BY 4 DESC LIMIT ?",
                [start, end, *params, limit]).fetchall()
        return [dict(zip(("session_id", "message_count", "first_at", "last_at",
                          "first_store_id", "first_user_id"), r)) for r in rows]

    def active_buckets(self, start: float, end: float, width: int) -> list[float]:
        """Start times of the ``width``-second buckets holding at least one message.
        A bucket is the time floored to ``width``: SQLite's CAST truncates, but
        PostgreSQL's rounds to nearest, which put a message late in a bucket into the
        next one (23:59 into the next day, whose rollup then never saw it)."""
        bucket = (f"CAST(floor({MESSAGE_TIME} / ?) AS BIGINT)" if self.db.dialect == "postgresql"
                  else f"CAST({MESSAGE_TIME} / ? AS INTEGER)")
        with self.db.reading() as conn:
            return [r[0] * width for r in conn.execute(
                f"SELECT DISTINCT {bucket} FROM messages"
                f" WHERE {MESSAGE_TIME} >= ? AND {MESSAGE_TIME} < ?", (width, start, end))]

    def message_ids_between(self, start: float, end: float, sessions: Sequence[str] | None, *,
                            uncovered: bool, limit: int, newest_first: bool = True,
                            loose: bool = False, pin: Pin | None = None) -> list[int]:
        """Messages of these sessions (None = all) in the window, by time; with
        ``uncovered`` only those no summary node has taken in yet; with ``loose`` only
        those no leaf lying wholly inside the window holds (``WHOLE_LEAF``): a day
        rollup's raw sources, including the day's part of a leaf spanning midnight.
        With a pin, the store as it was then: messages at or below it, and only nodes
        at or below it take a message in."""
        where, params = _session_filter("m.session_id", sessions)
        bound, pinned = _pinned(pin, "m.store_id", "store")
        where, params = where + bound, params + pinned
        if uncovered:
            node_bound, node_params = _pinned(pin, "e.parent_id", "node")
            where += (" AND NOT EXISTS (SELECT 1 FROM node_edges e"
                      f" WHERE e.child_store_id = m.store_id{node_bound})")
            params += node_params
        elif loose:
            clause, loose_params = _not_in_whole_leaf(start, end, pin)
            where += clause
            params += loose_params
        order = "DESC" if newest_first else "ASC"
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                f"SELECT m.store_id FROM messages m WHERE {MESSAGE_TIME} >= ?"
                f" AND {MESSAGE_TIME} < ?{where}"
                f" ORDER BY {MESSAGE_TIME} {order}, m.store_id {order} LIMIT ?",
                [start, end, *params, limit])]

    def leaf_ids_within(self, start: float, end: float,
                        sessions: Sequence[str] | None) -> list[int]:
        """Depth-0 nodes of these sessions lying wholly inside the window (``WHOLE_LEAF``),
        oldest first. A leaf spanning the window's edge is none of its leaves: the
        window takes its own part of it as raw messages (``loose``), so each message
        reaches the day it was said, and only that day."""
        where, params = _session_filter("session_id", sessions)
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                f"SELECT node_id FROM nodes n WHERE {WHOLE_LEAF}{where}"
                f" ORDER BY time_from, node_id", [start, end, *params])]

    def material_mark(self, start: float, end: float, sessions: Sequence[str],
                      pin: Pin | None = None) -> tuple[str, bool]:
        """A fingerprint of what a window holds for these sessions: message count and
        newest id, leaves wholly inside it and newest id, loose messages (in no such
        leaf). Any late message, new leaf inside the window or message newly taken into
        one changes it; a leaf spanning the window's edge changes nothing (the window
        reads its part raw before and after). Also whether the window has sources at
        all (a leaf or a loose message). With a pin: the window as it was then."""
        where, params = _session_filter("session_id", sessions)
        rows, row_params = _pinned(pin, "store_id", "store")
        loose_rows, _ = _pinned(pin, "m.store_id", "store")
        leaf_bound, leaf_params = _pinned(pin, "node_id", "node")
        not_in_leaf, loose_params = _not_in_whole_leaf(start, end, pin)
        with self.db.reading() as conn:
            messages = conn.execute(
                f"SELECT count(*), COALESCE(max(store_id), 0) FROM messages"
                f" WHERE {MESSAGE_TIME} >= ? AND {MESSAGE_TIME} < ?{where}{rows}",
                [start, end, *params, *row_params]).fetchone()
            leaves = conn.execute(
                f"SELECT count(*), COALESCE(max(node_id), 0) FROM nodes n WHERE {WHOLE_LEAF}"
                f"{where}{leaf_bound}", [start, end, *params, *leaf_params]).fetchone()
            loose = conn.execute(
                f"SELECT count(*) FROM messages m WHERE {MESSAGE_TIME} >= ?"
                f" AND {MESSAGE_TIME} < ?{where.replace('session_id', 'm.session_id')}"
                f"{loose_rows}{not_in_leaf}",
                [start, end, *params, *row_params, *loose_params]).fetchone()[0]
        return (f"m{messages[0]}:{messages[1]}|n{leaves[0]}:{leaves[1]}|l{loose}",
                bool(leaves[0] or loose))

    # ------------------------------------------------------------------ watermarks
    def feeding_sessions(self, start: float, end: float, eligible: Eligible,
                         owner: str | None, pin: Pin | None = None) -> list[str]:
        """Sessions of ``owner`` with material in the window that may feed rollups,
        sorted. A session without a recorded owner feeds none (it is nobody's)."""
        return sorted({s for s, source, who in self.sessions_between(start, end, pin)
                       if who is not None and who == owner and eligible(s, source)})

    def owners_between(self, start: float, end: float, eligible: Eligible) -> list[str]:
        """Every owner with a session that may feed rollups in the window, sorted."""
        return sorted({who for s, source, who in self.sessions_between(start, end)
                       if who is not None and eligible(s, source)})

    def current_mark(self, kind: str, key: str, time_zone: str, eligible: Eligible,
                     owner: str, pin: Pin | None = None) -> str:
        """What a period's rollup of ``owner`` would be built from now ("" = nothing
        to roll up).

        A day: the material fingerprint of the owner's feeding sessions, "" when they
        have nothing in it (``material_mark``: leaves wholly inside the day, and the
        day's other messages, a spanning leaf's part among them, raw). A week
        or a month: each child period's rollup id and a digest of the child's own
        watermark (not a clock), ``pending`` for a child with material but no rollup
        yet, ``-`` for an empty child; so a rebuilt day changes its week's mark and
        its month's. With a pin: the mark the period had then (a rollup above the pin
        did not exist yet).
        """
        tz = timekeys.zone(time_zone)
        start, end = timekeys.bounds(kind, key, tz)
        if kind == "day":
            sessions = self.feeding_sessions(start, end, eligible, owner, pin)
            if not sessions:
                return ""
            mark, has_sources = self.material_mark(start, end, sessions, pin)
            return f"s{len(sessions)}|{mark}" if has_sources else ""
        marks = []
        for child_kind, child_key in timekeys.children_of(kind, key):
            child = self.get_rollup(child_kind, child_key, time_zone, owner)
            if child is not None and pin is not None and child["rollup_id"] > pin.rollup_id:
                child = None
            if child is not None:
                digest = hashlib.sha1(child["watermark"].encode()).hexdigest()[:12]
                marks.append(f"{child['rollup_id']}@{digest}")
            else:
                marks.append("pending" if self.current_mark(child_kind, child_key, time_zone,
                                                            eligible, owner, pin) else "-")
        return "" if all(m == "-" for m in marks) else ",".join(marks)

    def freshness(self, rollup: dict, eligible: Eligible, memo: dict | None = None,
                  pin: Pin | None = None) -> str:
        """``ready`` when a rollup and every rollup under it match their sources now
        (with a pin: their sources as they were then), else ``stale`` (a late message, a
        new summary, a rebuilt or missing child). A rollup rebuilt in place since a pin
        keeps its id but not its watermark, so it is stale as of the pin.

        ``memo`` (rollup_id -> state) shares answers across the calls of one scan,
        where a month, its weeks and their days would otherwise each be checked again;
        it must not outlive a write, nor be shared between two pins."""
        memo = {} if memo is None else memo
        key = rollup["rollup_id"]
        if key not in memo:
            memo[key] = self._freshness(rollup, eligible, memo, pin)
        return memo[key]

    def _freshness(self, rollup: dict, eligible: Eligible, memo: dict, pin: Pin | None) -> str:
        if self.current_mark(rollup["kind"], rollup["period_key"], rollup["time_zone"],
                             eligible, rollup["owner"], pin) != rollup["watermark"]:
            return "stale"
        children = [c["id"] for c in self.sources(rollup["rollup_id"]) if c["kind"] == "rollup"]
        for child in self.get_rollups(children).values():
            if self.freshness(child, eligible, memo, pin) != "ready":
                return "stale"
        return "ready"

    # ------------------------------------------------------------------ rollups
    def get_rollup(self, kind: str, key: str, time_zone: str, owner: str) -> dict | None:
        """One owner's rollup of a period, or None."""
        with self.db.reading() as conn:
            row = conn.execute(f"SELECT {ROLLUP_COLUMNS} FROM rollups WHERE kind = ?"
                               " AND period_key = ? AND time_zone = ? AND owner = ?",
                               (kind, key, time_zone, owner)).fetchone()
        return dict(row) if row else None

    def get_rollups(self, rollup_ids: Iterable[int]) -> dict[int, dict]:
        """Rollups by id (missing ids absent)."""
        ids = list(dict.fromkeys(int(i) for i in rollup_ids))
        if not ids:
            return {}
        with self.db.reading() as conn:
            return {r["rollup_id"]: dict(r) for r in conn.execute(
                f"SELECT {ROLLUP_COLUMNS} FROM rollups WHERE rollup_id IN ({_in(ids)})", ids)}

    def rollups_inside(self, start: float, end: float, time_zone: str,
                       owners: Sequence[str] | None, pin: Pin | None = None) -> list[dict]:
        """Rollups of a zone (of these owners; None = every owner; at or below the pin)
        whose whole period lies inside the window, newest first."""
        where, params = _session_filter("owner", owners)
        bound, pinned = _pinned(pin, "rollup_id", "rollup")
        where, params = where + bound, params + pinned
        with self.db.reading() as conn:
            return [dict(r) for r in conn.execute(
                f"SELECT {ROLLUP_COLUMNS} FROM rollups WHERE time_zone = ? AND period_start >= ?"
                f" AND period_end <= ?{where} ORDER BY period_end DESC, period_start, owner",
                (time_zone, start, end, *params))]

    def rollup_owners(self, time_zone: str, since: float) -> list[str]:
        """Owners with a rollup of a zone whose period ends after ``since``."""
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT DISTINCT owner FROM rollups WHERE time_zone = ? AND period_end > ?"
                " ORDER BY 1", (time_zone, since))]

    def rollups_of(self, owner: str, time_zone: str, since: float) -> list[dict]:
        """An owner's rollups of a zone whose period ends after ``since`` (a pass's
        lookback), oldest first."""
        with self.db.reading() as conn:
            return [dict(r) for r in conn.execute(
                f"SELECT {ROLLUP_COLUMNS} FROM rollups WHERE owner = ? AND time_zone = ?"
                " AND period_end > ? ORDER BY period_start", (owner, time_zone, since))]

    def rollup_zones(self) -> list[str]:
        """Every zone name rollups are stored under, as stored (one small index scan)."""
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT DISTINCT time_zone FROM rollups ORDER BY 1")]

    def rename_zone(self, old: str, new: str) -> tuple[list[int], int]:
        """Move every rollup stored under ``old`` to ``new``, two names of one zone (the
        same periods, the same bounds), in one transaction: it is found under the one
        key again, not rebuilt beside it. Where ``new`` already holds the same period
        of the same owner, that one stays and the other is deleted with every rollup
        built on it (derived data: the next pass rebuilds what is missing). The owner
        is never changed. Returns the ids deleted and how many rollups moved."""
        with self.db.transaction() as conn:
            clash = [r[0] for r in conn.execute(
                "SELECT a.rollup_id FROM rollups a JOIN rollups b ON b.kind = a.kind"
                " AND b.period_key = a.period_key AND b.owner = a.owner AND b.time_zone = ?"
                " WHERE a.time_zone = ?", (new, old))]
            gone = delete_with_ancestors_in(conn, clash)
            moved = conn.execute("UPDATE rollups SET time_zone = ? WHERE time_zone = ?",
                                 (new, old)).rowcount
        return gone, moved

    def delete_with_ancestors(self, rollup_ids: Iterable[int]) -> list[int]:
        """Delete rollups and every rollup built on them (their weeks and months, now
        wrong), lineage and sessions with them, in one transaction; the ids deleted.
        For a period that has nothing of its own to roll up any more."""
        with self.db.transaction() as conn:
            return delete_with_ancestors_in(conn, rollup_ids)

    def all_rollups(self, limit: int = 10_000) -> list[dict]:
        """Every rollup (newest period first), for status and the doctor."""
        with self.db.reading() as conn:
            return [dict(r) for r in conn.execute(
                f"SELECT {ROLLUP_COLUMNS} FROM rollups ORDER BY period_start DESC LIMIT ?",
                (limit,))]

    def count_rollups(self) -> int:
        """How many rollups exist (every zone)."""
        with self.db.reading() as conn:
            return conn.execute("SELECT count(*) FROM rollups").fetchone()[0]

    def save_rollup(self, rollup: NewRollup, now: float) -> int:
        """Write a rollup, or rewrite the one of the same period in place (its id, and
        so its parents' lineage, stays), with its sources and sessions: one transaction."""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT rollup_id FROM rollups WHERE kind = ? AND period_key = ?"
                               " AND time_zone = ? AND owner = ?",
                               (rollup.kind, rollup.period_key, rollup.time_zone,
                                rollup.owner)).fetchone()
            values = (rollup.period_start, rollup.period_end, rollup.text, rollup.token_count,
                      rollup.source_token_count, rollup.level, rollup.model,
                      rollup.message_count, len(set(rollup.session_ids)), rollup.time_from,
                      rollup.time_to, rollup.watermark, now)
            if row is None:
                rollup_id = conn.execute(
                    "INSERT INTO rollups(kind, period_key, time_zone, owner, period_start,"
                    " period_end, text, token_count, source_token_count, level, model,"
                    " message_count, session_count, time_from, time_to, watermark, built_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rollup.kind, rollup.period_key, rollup.time_zone, rollup.owner,
                     *values)).lastrowid
            else:
                rollup_id = row[0]
                conn.execute(
                    "UPDATE rollups SET period_start = ?, period_end = ?, text = ?,"
                    " token_count = ?, source_token_count = ?, level = ?, model = ?,"
                    " message_count = ?, session_count = ?, time_from = ?, time_to = ?,"
                    " watermark = ?, built_at = ? WHERE rollup_id = ?", (*values, rollup_id))
                conn.execute("DELETE FROM rollup_sources WHERE rollup_id = ?", (rollup_id,))
                conn.execute("DELETE FROM rollup_sessions WHERE rollup_id = ?", (rollup_id,))
            column = {"rollup": 0, "node": 1, "message": 2}
            rows = []
            for ordinal, (kind, child) in enumerate(rollup.sources):
                ids: list = [None, None, None]
                ids[column[kind]] = int(child)
                rows.append((rollup_id, ordinal, *ids))
            conn.executemany("INSERT INTO rollup_sources(rollup_id, ordinal, child_rollup_id,"
                             " child_node_id, child_store_id) VALUES (?, ?, ?, ?, ?)", rows)
            conn.executemany("INSERT INTO rollup_sessions(rollup_id, session_id) VALUES (?, ?)",
                             [(rollup_id, s) for s in sorted(set(rollup.session_ids))])
            return rollup_id

    def sources(self, rollup_id: int, offset: int = 0, limit: int = -1) -> list[dict]:
        """A rollup's children in order: ``{ordinal, kind, id}`` (rollup | node | message)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT ordinal, child_rollup_id, child_node_id, child_store_id"
                " FROM rollup_sources WHERE rollup_id = ? ORDER BY ordinal LIMIT ? OFFSET ?",
                (rollup_id, row_limit(limit), offset)).fetchall()
        out = []
        for r in rows:
            kind, child = next((k, v) for k, v in zip(("rollup", "node", "message"), r[1:])
                               if v is not None)
            out.append({"ordinal": r[0], "kind": kind, "id": child})
        return out

    def source_count(self, rollup_id: int) -> int:
        """How many children a rollup has."""
        with self.db.reading() as conn:
            return conn.execute("SELECT count(*) FROM rollup_sources WHERE rollup_id = ?",
                                (rollup_id,)).fetchone()[0]

    def sessions_of(self, rollup_id: int) -> list[str]:
        """Every session whose material lies under a rollup."""
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT session_id FROM rollup_sessions WHERE rollup_id = ? ORDER BY session_id",
                (rollup_id,))]

    def parents_of(self, kind: str, child_id: int) -> list[int]:
        """Rollups built directly on a rollup, node or message."""
        column = {"rollup": "child_rollup_id", "node": "child_node_id",
                  "message": "child_store_id"}[kind]
        with self.db.reading() as conn:
            return [r[0] for r in conn.execute(
                f"SELECT rollup_id FROM rollup_sources WHERE {column} = ?", (child_id,))]

    def lineage_problems(self, limit: int = 20) -> list[dict]:
        """Rollup sources that point at nothing (a node or message removed since)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                """
                SELECT s.rollup_id, s.ordinal, s.child_node_id, s.child_store_id
                FROM rollup_sources s
                WHERE (s.child_node_id IS NOT NULL AND NOT EXISTS
                        (SELECT 1 FROM nodes n WHERE n.node_id = s.child_node_id))
                   OR (s.child_store_id IS NOT NULL AND NOT EXISTS
                        (SELECT 1 FROM messages m WHERE m.store_id = s.child_store_id))
                LIMIT ?
                """, (limit,)).fetchall()
        return [{"rollup_id": r[0], "ordinal": r[1], "missing":
                 f"node {r[2]}" if r[2] is not None else f"message {r[3]}"} for r in rows]

    def descendant_store_ids(self, rollup_id: int) -> list[int]:
        """Every raw message under a rollup, through child rollups and summary nodes,
        in lineage order (one recursive query; one recursive term that left-joins both
        kinds of children, because PostgreSQL allows a single recursive reference)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                """
                WITH RECURSIVE walk(rollup_id, node_id, store_id, path) AS (
                    SELECT ?, CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), ''
                    UNION ALL
                    SELECT s.child_rollup_id, COALESCE(s.child_node_id, e.child_node_id),
                           COALESCE(s.child_store_id, e.child_store_id),
                           walk.path || printf('%08d.', COALESCE(s.ordinal, e.ordinal))
                    FROM walk
                    LEFT JOIN rollup_sources s ON s.rollup_id = walk.rollup_id
                    LEFT JOIN node_edges e ON e.parent_id = walk.node_id
                    WHERE s.rollup_id IS NOT NULL OR e.parent_id IS NOT NULL
                )
                SELECT store_id FROM walk WHERE store_id IS NOT NULL ORDER BY path
                """, (rollup_id,)).fetchall()
        return [r[0] for r in rows]


def delete_with_ancestors_in(conn, rollup_ids: Iterable[int]) -> list[int]:
    """``Timeline.delete_with_ancestors`` inside the caller's transaction."""
    ids = list(dict.fromkeys(int(i) for i in rollup_ids))
    if not ids:
        return []
    found: set[int] = set()
    for chunk in chunked(ids):
        found.update(r[0] for r in conn.execute(
            f"""
            WITH RECURSIVE up(rollup_id) AS (
                SELECT rollup_id FROM rollups WHERE rollup_id IN ({_in(chunk)})
                UNION
                SELECT s.rollup_id FROM rollup_sources s JOIN up
                    ON s.child_rollup_id = up.rollup_id
            )
            SELECT rollup_id FROM up
            """, chunk))
    doomed = sorted(found, reverse=True)
    for table in ("rollup_sources", "rollup_sessions", "rollups"):
        for part in chunked(doomed):
            conn.execute(f"DELETE FROM {table} WHERE rollup_id IN ({_in(part)})", part)
    return doomed


def delete_sessions_in(conn, session_ids: Sequence[str]) -> int:
    """Delete, inside the caller's transaction (``doctor clean``), every rollup over one
    of these sessions, with the weeks and months built on it; how many went. A rollup
    keeps no foreign key to its sources, so without this one whose period has left the
    lookback window (never rebuilt again) would point at removed rows for good: a
    doctor warning no build could clear. Within the window the next pass rebuilds the
    period from what is left."""
    ids = list(dict.fromkeys(session_ids))
    if not ids:
        return 0
    under = {r[0] for chunk in chunked(ids) for r in conn.execute(
        f"SELECT DISTINCT rollup_id FROM rollup_sessions WHERE session_id IN ({_in(chunk)})",
        chunk)}
    return len(delete_with_ancestors_in(conn, sorted(under)))
