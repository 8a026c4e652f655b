"""The message store: sessions, raw messages with their identity, message search.

Every raw message the host shows the engine lands here exactly once, exactly as
received (see ``codec``), before anything is summarized. Rows are never
deleted or rewritten by the engine; the store_id is monotonic, so "after
store_id N" is a stable cursor.

All SQL about sessions and messages lives in this module. Summary nodes live
in ``dag``; the connection and schema in ``database`` and ``migrations``.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .storage import codec, identity, scans, timekeys, views
from .storage.alignment import Alignment, KnownTail, _Identified  # noqa: F401 (KnownTail: the API)
from .storage.alignment_legacy import legacy_alignment
from .storage.database import Database, chunked
from .storage.postgres import search as pg_search
from .storage.sessionset import session_filter
from .storage.timeline import MESSAGE_TIME
from .storage.writer import StatementWriter

UNKNOWN_SOURCE = "unknown"
# The substring scan holds the shared connection one page at a time, for so long overall.
SCAN_PAGE_ROWS = 200
SCAN_SECONDS = 2.0
# New rows are written by multi-row INSERT statements of up to this many rows. The FTS
# trigger makes each statement run in a savepoint at which FTS5 (3.40) flushes its
# pending terms into a new segment, so one statement per row wrote a tiny segment per
# message and merged them all back later: 3x the cost of the same rows 100 at a time.
INSERT_ROWS_PER_STATEMENT = 100
INSERT_COLUMNS = ("session_id", "conversation_id", "source", "role", "content", "content_format",
                  "tool_calls", "tool_call_id", "tool_name", "extra", "search_text",
                  "content_hash", "ordinal", "message_at", "created_at", "token_count")

MESSAGE_COLUMNS = (
    "store_id, session_id, conversation_id, source, role, content, content_format, tool_calls,"
    " tool_call_id, tool_name, extra, content_hash, ordinal, message_at, created_at,"
    " token_count, pinned"
)


@dataclass(frozen=True)
class IngestResult:
    """What one ingest did: the store_id of each shown message, how many were new,
    which shown messages are the engine's own (its summary block and
    acknowledgement), the view it left, the session a list belonged to when it
    was another session's (nothing of it stored), and where the new rows stand."""

    store_ids: list[int | None]
    inserted: int
    engine: list[bool] | None = None
    view: "identity.View | None" = None
    foreign_of: str | None = None
    new_positions: tuple[int, ...] = ()


def hex_tag(prefix: str, value: str) -> str:
    """The FTS tag token for a value, as the schema's triggers compute it
    (``prefix`` + lower-case hex of the UTF-8 bytes): one token whatever the value."""
    return prefix + value.encode("utf-8", "surrogatepass").hex()


def session_tag(session_id: str) -> str:
    """FTS token that scopes a search to one (canonical) session."""
    return hex_tag("s", session_id)


def role_tag(role: str) -> str:
    """FTS token for a message role."""
    return hex_tag("r", role)


def source_tag(source: str) -> str:
    """FTS token for a message source/platform."""
    return hex_tag("p", normalize_source(source))


def normalize_source(source: str | None) -> str:
    """The stored source/platform: never blank, ``unknown`` when not known."""
    text = (source or "").strip()
    return codec.safe_text(text) if text else UNKNOWN_SOURCE


def row_to_dict(row) -> dict:
    """A sqlite3.Row as a plain dict."""
    return {key: row[key] for key in row.keys()}


class Store(Alignment):
    """Sessions and raw messages in one trove database."""

    def __init__(self, db: Database):
        self.db = db

    # ------------------------------------------------------------------ sessions
    def ensure_session(self, session_id: str, *, conversation_id: str | None = None,
                       source: str | None = None, parent_session_id: str | None = None,
                       canonical_id: str | None = None) -> str:
        """Create the session row if missing (or fill its blanks); return its canonical id.

        ``canonical_id`` makes ``session_id`` an alias whose messages are stored
        under another session (the host's compaction boundary and renamed forks
        continue one conversation under a new id).
        """
        if not session_id:
            raise ValueError("session id must not be empty")
        now = time.time()
        with self.db.transaction() as conn:
            row = conn.execute("SELECT canonical_id FROM sessions WHERE session_id = ?",
                               (session_id,)).fetchone()
            if row is None:
                target = canonical_id or session_id
                if canonical_id and canonical_id != session_id:
                    target = self._canonical(conn, canonical_id)
                conn.execute(
                    "INSERT INTO sessions(session_id, canonical_id, conversation_id, source,"
                    " parent_session_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (session_id, target, conversation_id, normalize_source(source),
                     parent_session_id, now, now),
                )
                return target
            conn.execute(
                "UPDATE sessions SET conversation_id = COALESCE(conversation_id, ?),"
                " source = CASE WHEN source = 'unknown' THEN ? ELSE source END,"
                " parent_session_id = COALESCE(parent_session_id, ?), updated_at = ?"
                " WHERE session_id = ?",
                (conversation_id, normalize_source(source), parent_session_id, now, session_id),
            )
            return row["canonical_id"]

    @staticmethod
    def _canonical(conn, session_id: str) -> str:
        row = conn.execute("SELECT canonical_id FROM sessions WHERE session_id = ?",
                           (session_id,)).fetchone()
        return row["canonical_id"] if row else session_id

    def canonical_session(self, session_id: str) -> str:
        """The session whose rows hold ``session_id``'s messages (itself unless an alias)."""
        with self.db.reading() as conn:
            return self._canonical(conn, session_id)

    def get_session(self, session_id: str) -> dict | None:
        """The session row as a dict (``state`` decoded), or None."""
        with self.db.reading() as conn:
            row = conn.execute("SELECT * FROM sessions WHERE session_id = ?",
                               (session_id,)).fetchone()
        if row is None:
            return None
        info = row_to_dict(row)
        info["state"] = json.loads(info["state"] or "{}")
        return info

    def update_session_state(self, session_id: str, patch: dict) -> dict:
        """Merge ``patch`` into the session's JSON state (engine bookkeeping); return it."""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT state FROM sessions WHERE session_id = ?",
                               (session_id,)).fetchone()
            if row is None:
                raise KeyError(session_id)
            state = json.loads(row["state"] or "{}")
            state.update(patch)
            conn.execute("UPDATE sessions SET state = ?, updated_at = ? WHERE session_id = ?",
                         (codec.dump_json(state), time.time(), session_id))
            return state

    def set_replay_floor(self, session_id: str, store_id: int) -> None:
        """Raw messages at or below ``store_id`` are no longer replayed into the prompt."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE sessions SET replay_floor = MAX(replay_floor, ?)"
                         " WHERE session_id = ?", (store_id, session_id))

    def list_sessions(self, limit: int = 100, offset: int = 0) -> list[dict]:
        """Sessions with message counts and time range, most recently updated first.
        The range is of the messages' own times (``MESSAGE_TIME``), as every other read
        shows them: an imported history spans when it was said, not when it was stored."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.canonical_id, s.conversation_id, s.source,"
                " s.parent_session_id, s.created_at, s.updated_at,"
                " (SELECT count(*) FROM messages m WHERE m.session_id = s.session_id) AS messages,"
                f" (SELECT min({MESSAGE_TIME}) FROM messages m WHERE m.session_id = s.session_id)"
                "   AS first_at,"
                f" (SELECT max({MESSAGE_TIME}) FROM messages m WHERE m.session_id = s.session_id)"
                "   AS last_at"
                " FROM sessions s ORDER BY s.updated_at DESC LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return [row_to_dict(r) for r in rows]

    # ------------------------------------------------------------------ ingest
    def ingest(self, session_id: str, messages: Sequence[dict], *,
               skip: Sequence[bool] | None = None, conversation_id: str | None = None,
               source: str | None = None, count_tokens: Callable[[dict], int] | None = None,
               known: KnownTail | None = None, now: float | None = None,
               encoded: Sequence[codec.EncodedMessage | None] | None = None,
               after_block: bool = False, shown: identity.Shown | None = None,
               hint: identity.View | None = None) -> IngestResult:
        """Store every shown message not already stored; return each one's store_id.

        Which shown message is which row is decided by ``storage/identity``: with
        ``shown`` (the engine's path) the list is read against the session's views
        (``hint``: the view this engine copy wrote last, which spares the read
        when the list just extends it) and the view is updated in the same
        transaction; without it (imports, replays, tests of the old rule) by the
        anchored rule, ``known`` and ``after_block`` telling it where the list
        starts. ``skip[i]`` marks messages that are not to be stored. ``encoded``
        may carry encodings the caller already has (None where skipped). The
        whole call is one transaction: either every new message is stored, each
        with its ``count_tokens`` count (0 without it), or none is.
        ``count_tokens`` runs while earlier rows of the batch are being written
        (see ``StatementWriter``), so it must not use this database.
        """
        skip = list(skip) if skip is not None else [False] * len(messages)
        if encoded is None:
            encoded = [None if s else codec.encode_message(codec.clean_message(m))
                       for m, s in zip(messages, skip)]
        hashes = [None if e is None else e.content_hash for e in encoded]
        stamp = time.time() if now is None else now
        stored_source = normalize_source(source)
        with self.db.transaction() as conn:
            canonical = self._canonical(conn, session_id)
            if shown is not None:
                found = self._identify(conn, canonical, shown, hashes, hint, known)
            else:
                flags = [False] * len(messages)
                fps = [None if e is None else identity.fingerprint_encoded(e) for e in encoded]
                found = _Identified(legacy_alignment(conn, canonical, fps, known,
                                                     after_block, hashes), flags)
            alignment = found.store_ids
            new = [i for i, enc in enumerate(encoded) if enc is not None and alignment[i] is None
                   and not found.engine[i] and i not in found.foreign]
            # an element that replays a new one in the same list shares its new row
            fresh = set(new)
            replays = {i: j for i, j in found.same_as.items() if i in fresh and j in fresh}
            new = [i for i in new if i not in replays]
            next_ordinal = self._next_ordinals(conn, canonical,
                                               {encoded[i].content_hash for i in new})
            copied = self._copied_times(conn, shown, encoded, new) \
                if shown is not None and shown.copy_from else {}
            per_statement = _rows_per_statement(conn)
            # Each statement's rows are built (their tokens counted) while the rows
            # before them are written, on a helper thread when there are several.
            sizes = _statement_sizes(len(new), per_statement)
            with StatementWriter(conn, threaded=len(sizes) > 1) as writer:
                start = 0
                for size in sizes:
                    values: list = []
                    for i in new[start:start + size]:
                        enc = encoded[i]
                        ordinal = next_ordinal[enc.content_hash]
                        next_ordinal[enc.content_hash] = ordinal + 1
                        tokens = count_tokens(messages[i]) if count_tokens else 0
                        values += (canonical, conversation_id, stored_source, enc.role,
                                   enc.content, enc.content_format, enc.tool_calls,
                                   enc.tool_call_id, enc.tool_name, enc.extra, enc.search_text,
                                   enc.content_hash, ordinal,
                                   timekeys.settled_time(enc.message_at, stamp)
                                   or copied.get(i), stamp, int(tokens))
                    writer.execute(_insert_sql(size), values)
                    start += size
            inserted = len(new)
            if inserted:
                # One writer holds the lock, store_id is AUTOINCREMENT and a multi-row
                # INSERT writes its rows in order: the batch got consecutive ids ending
                # at the last one inserted.
                last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                for offset, i in enumerate(new):
                    alignment[i] = last - inserted + 1 + offset
                for i, j in replays.items():
                    alignment[i] = alignment[j]
                conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?",
                             (stamp, session_id))
            view = None
            if shown is not None and not found.foreign:
                view = self._remember(conn, canonical, shown, alignment, found.engine, stamp,
                                      hint if found.settled else None)
        return IngestResult(store_ids=alignment, inserted=inserted, engine=found.engine,
                            view=view, foreign_of=found.foreign_of,
                            new_positions=tuple(new))

    def _copied_times(self, conn, shown: identity.Shown, encoded: Sequence,
                      new: list[int]) -> dict[int, float]:
        """The times a /branch's copy of its parent's history keeps: per new element
        before the turn's message, the time of the parent's row with its text, found
        in order (the next such row after the one found before it).

        Why: the CLI's messages carry no timestamp, so the copy was dated when the
        branch stored it; the branch's day then held the parent's whole history
        again, and its day rollup summarized it a second time (the week counted it
        twice). Only the date is taken: which row is which stays identity's."""
        limit = len(shown.fps) if shown.turn_index is None else shown.turn_index
        wanted = [i for i in new if i < limit]
        if not wanted:
            return {}
        parent = self._canonical(conn, shown.copy_from)
        digests = sorted({encoded[i].content_hash for i in wanted})
        rows: list = []
        for chunk in chunked(digests):
            rows += conn.execute(
                f"SELECT store_id, content_hash, {MESSAGE_TIME} FROM messages"
                f" WHERE session_id = ? AND content_hash IN ({','.join('?' * len(chunk))})",
                (parent, *chunk)).fetchall()
        rows.sort(key=lambda r: r[0])
        times, cursor = {}, 0
        for i in wanted:
            found = next((k for k in range(cursor, len(rows))
                          if rows[k][1] == encoded[i].content_hash), None)
            if found is not None:
                times[i], cursor = rows[found][2], found + 1
        return times

    @staticmethod
    def _next_ordinals(conn, session_id: str, digests: set[str]) -> dict[str, int]:
        """The next free ordinal of each content hash in a session (one indexed query
        per 500 hashes)."""
        found = {digest: 0 for digest in digests}
        ordered = sorted(digests)
        for chunk in chunked(ordered):
            for digest, highest in conn.execute(
                    f"SELECT content_hash, MAX(ordinal) FROM messages WHERE session_id = ?"
                    f" AND content_hash IN ({','.join('?' * len(chunk))}) GROUP BY content_hash",
                    (session_id, *chunk)):
                found[digest] = highest + 1
        return found


    # ------------------------------------------------------------------ reads
    def get_messages(self, store_ids: Iterable[int]) -> dict[int, dict]:
        """Stored rows by store_id (missing ids are absent from the result)."""
        ids = list(dict.fromkeys(int(i) for i in store_ids))
        found: dict[int, dict] = {}
        with self.db.reading() as conn:
            for chunk in chunked(ids):
                marks = ",".join("?" * len(chunk))
                for row in conn.execute(
                        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE store_id IN ({marks})",
                        chunk):
                    found[row["store_id"]] = row_to_dict(row)
        return found

    def neighbour_ids(self, store_ids: Iterable[int],
                      roles: Sequence[str] = ("user", "assistant")) -> dict[int, tuple]:
        """Per store_id, the previous and next row of its session with one of ``roles``
        (``None`` at either end): the turns around a hit, for search's context arm."""
        ids = list(dict.fromkeys(int(i) for i in store_ids))
        marks = ",".join("?" * len(roles))
        found: dict[int, tuple] = {}
        with self.db.reading() as conn:
            for chunk in chunked(ids):
                rows = conn.execute(
                    f"SELECT m.store_id,"
                    f" (SELECT max(p.store_id) FROM messages p WHERE p.session_id = m.session_id"
                    f"  AND p.store_id < m.store_id AND p.role IN ({marks})),"
                    f" (SELECT min(n.store_id) FROM messages n WHERE n.session_id = m.session_id"
                    f"  AND n.store_id > m.store_id AND n.role IN ({marks}))"
                    f" FROM messages m WHERE m.store_id IN ({','.join('?' * len(chunk))})",
                    [*roles, *roles, *chunk]).fetchall()
                found.update({r[0]: (r[1], r[2]) for r in rows})
        return found

    def get_message(self, store_id: int) -> dict | None:
        """One stored row by store_id, or None."""
        return self.get_messages([store_id]).get(int(store_id))

    def session_messages(self, session_id: str, after_store_id: int = 0,
                         limit: int = 100) -> list[dict]:
        """One ordered page of a session's raw rows after a store_id cursor."""
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND store_id > ?"
                " ORDER BY store_id LIMIT ?",
                (self._canonical(conn, session_id), after_store_id, limit)).fetchall()
        return [row_to_dict(r) for r in rows]

    def count_messages(self, session_id: str | None = None) -> int:
        """Stored rows in one session (canonical) or in the whole database."""
        with self.db.reading() as conn:
            if session_id is None:
                return conn.execute("SELECT count(*) FROM messages").fetchone()[0]
            return conn.execute("SELECT count(*) FROM messages WHERE session_id = ?",
                                (self._canonical(conn, session_id),)).fetchone()[0]

    def position_in_session(self, session_id: str, store_id: int) -> int:
        """How many of the session's own rows are at or before ``store_id``: its place
        in the session (1 = first). Store ids are global, so another session's rows
        lie between two of this session's: a label must count in the session."""
        with self.db.reading() as conn:
            return conn.execute("SELECT count(*) FROM messages WHERE session_id = ? AND "
                                "store_id <= ?", (self._canonical(conn, session_id),
                                                  int(store_id))).fetchone()[0]

    def last_store_id(self, session_id: str | None = None) -> int:
        """The highest store_id in one session or the database (0 when empty)."""
        with self.db.reading() as conn:
            if session_id is None:
                return conn.execute("SELECT COALESCE(MAX(store_id), 0) FROM messages").fetchone()[0]
            return conn.execute("SELECT COALESCE(MAX(store_id), 0) FROM messages"
                                " WHERE session_id = ?", (self._canonical(conn, session_id),)
                                ).fetchone()[0]

    def replace_with_placeholder(self, store_id: int, original: str, placeholder: str) -> bool:
        """Transcript GC: swap a row's exact text for its externalized placeholder.

        The only rewrite of a stored message, and only of an unpinned text row whose
        content is still exactly ``original`` (the caller has checked the payload file
        holds those bytes). Same store_id, same identity; FTS follows by trigger."""
        with self.db.transaction() as conn:
            cur = conn.execute(
                "UPDATE messages SET content = ?, search_text = NULL WHERE store_id = ?"
                " AND pinned = 0 AND content_format = 'text' AND content = ?",
                (placeholder, store_id, original))
            return cur.rowcount == 1

    # ------------------------------------------------------------------ search
    def fts_candidates(self, match: str, *, limit: int, ranked: bool = True) -> list[tuple]:
        """Rows matching an FTS5 expression: ``(store_id, bm25)`` best first.

        ``match`` must come from ``search`` (user text is never passed raw). With
        ``ranked=False`` rows come in index order, which is fast at any size.
        """
        order = "ORDER BY rank" if ranked else ""
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return pg_search.match_ids(conn, "messages", "store_id", match, limit=limit,
                                           ranked=ranked)
            return [tuple(r) for r in conn.execute(
                f"SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ? {order} LIMIT ?",
                (match, limit))]

    def substring_scan(self, sessions: str | Sequence[str] | None, needles: Sequence[str], *,
                       limit: int, max_rows: int, max_seconds: float = SCAN_SECONDS,
                       page_rows: int = SCAN_PAGE_ROWS) -> list[int]:
        """store_ids (newest first) whose text contains every needle, scanning at most
        ``max_rows`` of the newest rows of ``sessions`` (one session, a scope rendered by
        ``session_filter``, or None: all): the bounded fallback for text FTS5 tokenizes
        badly (CJK runs, emoji, symbols). One scan for the whole scope, never one per
        session (an owner may have tens of thousands).

        The scan goes page by page and takes the shared connection only for one
        page at a time, so a writer (another agent's compaction) waits at most one
        page; it stops after ``max_seconds`` with what it found so far."""
        if isinstance(sessions, str):
            sessions = (sessions,)
        term, scoped = session_filter("session_id", sessions)
        scope = f"{term} AND " if term else ""
        if getattr(self.db, "trigram", False) and needles and min(map(len, needles)) >= 3:
            with self.db.reading() as conn:  # a server with pg_trgm: the index answers
                return pg_search.substring_ids(conn, (term, scoped), needles, limit=limit)
        conds = " AND ".join("instr(t, ?) > 0" for _ in needles) or "1"
        lowered = [n.lower() for n in needles]

        def page(cursor: int, size: int) -> tuple[str, list]:
            return (f"SELECT store_id, {conds} FROM (SELECT store_id,"
                    f" lower(COALESCE(search_text, content, '')) AS t FROM messages"
                    f" WHERE {scope}store_id < ? ORDER BY store_id DESC LIMIT ?) AS page",
                    lowered + scoped + [cursor, size])
        return scans.newest_first(self.db, page, limit=limit, max_rows=max_rows,
                                  max_seconds=max_seconds, page_rows=page_rows)

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str, default: str | None = None) -> str | None:
        """A value from the database's key/value bookkeeping table."""
        with self.db.reading() as conn:
            row = conn.execute("SELECT value FROM trove_meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        """Store a bookkeeping value (FTS check time, last backup path, ...)."""
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO trove_meta(key, value) VALUES (?, ?)"
                         " ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    # ------------------------------------------------------------------ import ledger
    def imported_rows(self, import_id: str, source_kind: str) -> dict[str, object]:
        """``{source_key: target_id}`` of the source rows an import already wrote,
        so a rerun of the same import skips them (empty before schema 2)."""
        with self.db.reading() as conn:
            ledger = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'import_ledger'").fetchone()
            if ledger is None:
                return {}
            return {r[0]: r[1] for r in conn.execute(
                "SELECT source_key, target_id FROM import_ledger"
                " WHERE import_id = ? AND source_kind = ?", (import_id, source_kind))}

    def record_imported_rows(self, import_id: str, source_kind: str,
                             rows: Sequence[tuple[str, str, object]]) -> int:
        """Remember which target each imported source row became:
        ``rows`` holds ``(source_key, target_kind, target_id)``; known keys are kept."""
        stamp = time.time()
        with self.db.transaction() as conn:
            cur = conn.executemany(
                "INSERT OR IGNORE INTO import_ledger(import_id, source_kind, source_key,"
                " target_kind, target_id, imported_at) VALUES (?, ?, ?, ?, ?, ?)",
                [(import_id, source_kind, key, kind, target, stamp) for key, kind, target in rows])
            return cur.rowcount

    # ------------------------------------------------------------------ search and health reads
    def match_message_ids(self, match: str, *, limit: int, ranked: bool,
                          below_store_id: int | None = None, time_from: float | None = None,
                          time_to: float | None = None,
                          sessions: Sequence[str] | None = None) -> list[tuple[int, float | None]]:
        """store_ids matching an FTS5 expression built by ``search``: ranked best first
        ``(store_id, bm25)``, or newest first ``(store_id, None)`` (unranked, cheap at any size).

        ``below_store_id`` hides the current turn; the time bounds apply to
        ``COALESCE(message_at, created_at)`` (``time_to`` exclusive); ``sessions`` keeps
        rows of a scope too many sessions to name as tags in the expression (a join,
        ``session_filter``; None: the expression alone decides)."""
        if self.db.dialect == "postgresql":
            where, params = _match_filters(match, below_store_id, time_from, time_to,
                                           "m.store_id", sessions)
            with self.db.reading() as conn:
                return pg_search.match_ids(conn, "messages", "store_id", match, limit=limit,
                                           ranked=ranked, where=where[1:], params=params[1:])
        where, params = _match_filters(match, below_store_id, time_from, time_to,
                                       sessions=sessions)
        join = ("" if time_from is None and time_to is None and sessions is None
                else " CROSS JOIN messages m ON m.store_id = f.rowid")
        rank = "f.rank" if ranked else "NULL"
        order = "f.rank" if ranked else "f.rowid DESC"
        sql = (f"SELECT f.rowid, {rank} FROM messages_fts f{join} WHERE {' AND '.join(where)}"
               f" ORDER BY {order} LIMIT ?")
        with self.db.reading() as conn:
            return [(r[0], r[1]) for r in conn.execute(sql, params + [limit])]

    def count_message_matches(self, match: str, *, cap: int,
                              below_store_id: int | None = None) -> int:
        """How many rows match an FTS5 expression, counting no further than ``cap``
        (unranked, so cheap: a document-frequency estimate for ranking)."""
        bound = " AND rowid < ?" if below_store_id is not None else ""
        params = [match] + ([below_store_id] if below_store_id is not None else []) + [cap]
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return pg_search.count_matches(
                    conn, "messages", "store_id", match, cap=cap,
                    where=["m.store_id < ?"] if below_store_id is not None else [],
                    params=params[1:-1])
            return conn.execute(
                f"SELECT count(*) FROM (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
                f"{bound} LIMIT ?)", params).fetchone()[0]

    def match_message_sessions(self, match: str, *, limit: int,
                               below_store_id: int | None = None,
                               time_from: float | None = None,
                               time_to: float | None = None) -> list[tuple[int, str]]:
        """``(store_id, session_id)`` of the newest ``limit`` rows matching an FTS5
        expression built by ``search`` (unranked, newest first). The FTS index drives
        the loop (``CROSS JOIN``), so the session costs one rowid lookup per row: the
        caller can filter by session after the match instead of intersecting a big
        session tag's posting list inside it."""
        if self.db.dialect == "postgresql":
            where, params = _match_filters(match, below_store_id, time_from, time_to, "m.store_id")
            with self.db.reading() as conn:
                return pg_search.match_ids(conn, "messages", "store_id", match, limit=limit,
                                           ranked=False, where=where[1:], params=params[1:],
                                           session=True)
        where, params = _match_filters(match, below_store_id, time_from, time_to)
        sql = ("SELECT f.rowid, m.session_id FROM messages_fts f CROSS JOIN messages m"
               f" ON m.store_id = f.rowid WHERE {' AND '.join(where)}"
               " ORDER BY f.rowid DESC LIMIT ?")
        with self.db.reading() as conn:
            return [(r[0], r[1]) for r in conn.execute(sql, params + [limit])]

    def recent_share(self, session_ids: Sequence[str], window: int) -> float:
        """The share of the newest ``window`` store_ids that belong to these (canonical)
        sessions (index range counts only; 0.0 on an empty store)."""
        term, scoped = session_filter("session_id", session_ids)
        with self.db.reading() as conn:
            top = conn.execute("SELECT COALESCE(MAX(store_id), 0) FROM messages").fetchone()[0]
            if not top or not session_ids:
                return 0.0
            low = max(0, top - window)
            inside = conn.execute(
                f"SELECT count(*) FROM messages WHERE {term} AND store_id > ?",
                scoped + [low]).fetchone()[0]
        return inside / max(1, top - low)

    def fts_row_counts(self) -> dict:
        """Rows in ``messages`` and documents in its FTS index (they should be equal)."""
        docs = ("(SELECT count(*) FROM messages WHERE fts IS NOT NULL)"
                if self.db.dialect == "postgresql" else "(SELECT count(*) FROM messages_fts_docsize)")
        with self.db.reading() as conn:  # one statement: both counts from one snapshot
            rows, docs = conn.execute(f"SELECT (SELECT count(*) FROM messages), {docs}").fetchone()
        return {"rows": rows, "fts_docs": docs}

    def largest_messages(self, limit: int = 5, max_rows: int = 50_000) -> list[dict]:
        """The biggest of the newest ``max_rows`` rows by content + tool-call characters
        (candidates for externalization); bounded so a diagnosis stays quick."""
        with self.db.reading() as conn:
            return [row_to_dict(r) for r in conn.execute(
                "SELECT store_id, session_id, role, content_format, chars FROM ("
                " SELECT store_id, session_id, role, content_format,"
                " COALESCE(length(content), 0) + COALESCE(length(tool_calls), 0) AS chars"
                " FROM messages ORDER BY store_id DESC LIMIT ?) AS newest ORDER BY chars DESC LIMIT ?",
                (max_rows, limit))]

    def table_sizes(self) -> dict[str, int] | None:
        """Bytes per table/index from the ``dbstat`` table, or None where SQLite lacks it."""
        try:
            with self.db.reading() as conn:
                return {r[0]: r[1] for r in conn.execute(
                    "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC")}
        except sqlite3.Error:
            return None

    # ------------------------------------------------------------------ operator maintenance
    # What /trove and scripts/trove.py need beyond the engine's own reads and writes.
    # Every write here runs only after operator_actions has written a backup.
    BLANK_SOURCE = "trim(COALESCE(source, ''), ' ' || char(9, 10, 13)) = ''"

    def count_sessions(self) -> int:
        """How many session rows (aliases included) the database holds, for status."""
        with self.db.reading() as conn:
            return conn.execute("SELECT count(*) FROM sessions").fetchone()[0]

    def blank_source_rows(self, examples: int = 5) -> dict:
        """Rows whose source is blank or whitespace-only (legacy data written before
        ``normalize_source`` or by hand; the schema's CHECK only forbids ``''``), so
        ``doctor source`` can show what it would set to ``unknown``."""
        with self.db.reading() as conn:
            found = {}
            for table, key in (("messages", "store_id"), ("sessions", "session_id")):
                found[table] = conn.execute(
                    f"SELECT count(*) FROM {table} WHERE {self.BLANK_SOURCE}").fetchone()[0]
                found[f"{table}_examples"] = [r[0] for r in conn.execute(
                    f"SELECT {key} FROM {table} WHERE {self.BLANK_SOURCE} ORDER BY {key} LIMIT ?",
                    (examples,))]
        return found

    def fix_blank_sources(self) -> dict:
        """Set every blank or whitespace-only source to ``unknown`` in one transaction
        (the messages' FTS tags follow by trigger); return how many rows changed."""
        with self.db.transaction() as conn:
            return {table: conn.execute(
                f"UPDATE {table} SET source = '{UNKNOWN_SOURCE}' WHERE {self.BLANK_SOURCE}"
            ).rowcount for table in ("messages", "sessions")}

    @staticmethod
    def activity_in(conn, canonical_ids: Sequence[str]) -> dict[str, tuple[int, float]]:
        """Per canonical session, inside the caller's transaction: how many messages its
        rows hold and when any of them was last touched, so a clean-up can see that a
        session changed since it was judged (and leave it)."""
        ids = list(dict.fromkeys(canonical_ids))
        if not ids:
            return {}
        found: dict[str, tuple[int, float]] = {}
        for chunk in chunked(ids):      # a canonical id's rows all fall in its own slice
            found.update((r[0], (r[1], r[2])) for r in conn.execute(
                "SELECT s.canonical_id, sum((SELECT count(*) FROM messages m"
                " WHERE m.session_id = s.session_id)), max(COALESCE(s.updated_at, 0.0))"
                f" FROM sessions s WHERE s.canonical_id IN ({','.join('?' * len(chunk))})"
                " GROUP BY s.canonical_id", chunk))
        return found

    def delete_sessions_in(self, conn, session_ids: Sequence[str]) -> dict:
        """Delete these canonical sessions' messages and session rows (aliases included)
        inside the caller's transaction, so summary nodes (``Dag.delete_session_nodes_in``)
        go in the same unit; the FTS delete trigger keeps the index in step."""
        ids = list(dict.fromkeys(session_ids))
        removed = {"messages": 0, "session_rows": 0}
        for chunk in chunked(ids):
            removed["messages"] += conn.execute(
                f"DELETE FROM messages WHERE session_id IN ({','.join('?' * len(chunk))})",
                chunk).rowcount
        views.delete_sessions_in(conn, ids)
        for column in ("canonical_id", "session_id"):      # aliases, then the rows themselves
            for chunk in chunked(ids):
                removed["session_rows"] += conn.execute(
                    f"DELETE FROM sessions WHERE {column} IN ({','.join('?' * len(chunk))})",
                    chunk).rowcount
        return removed

    def rebuild_message_fts(self) -> None:
        """Rebuild the message full-text index from the messages table (doctor repair)."""
        with self.db.transaction() as conn:
            conn.execute("REINDEX INDEX messages_fts" if self.db.dialect == "postgresql"
                         else "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")

    def reindex_all(self) -> None:
        """Rebuild every ordinary index of the file: the fix for index damage that
        ``PRAGMA quick_check`` reports (doctor repair; table damage needs a backup). On a
        server, every table of trove's schema (``REINDEX SCHEMA`` cannot run in a
        transaction; ``REINDEX TABLE`` can, so the unit of work stays one)."""
        with self.db.transaction() as conn:
            if self.db.dialect != "postgresql":
                conn.execute("REINDEX")
                return
            for (statement,) in conn.execute(
                    "SELECT format('REINDEX TABLE %I', tablename) FROM pg_tables"
                    " WHERE schemaname = current_schema() ORDER BY tablename").fetchall():
                conn.execute(statement)

    def message_age_profile(self, now: float, edges_seconds: Sequence[float]) -> list[dict]:
        """Messages per age bucket (``edges_seconds`` ascending; the last bucket is older
        than the last edge): count, characters, tokens and sessions, for retention planning.
        A full scan of the table, so it belongs to an operator command, never a turn."""
        cases = " ".join(f"WHEN t >= {float(now - edge)!r} THEN {i}"
                         for i, edge in enumerate(edges_seconds))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT CASE {cases} ELSE {len(edges_seconds)} END AS bucket, count(*),"
                " sum(chars), sum(token_count), count(DISTINCT session_id) FROM ("
                f" SELECT {MESSAGE_TIME} AS t, token_count, session_id,"
                " COALESCE(length(content), 0) + COALESCE(length(tool_calls), 0) AS chars"
                " FROM messages) AS aged GROUP BY bucket ORDER BY bucket").fetchall()
        return [{"bucket": r[0], "messages": r[1], "chars": r[2] or 0, "tokens": r[3] or 0,
                 "sessions": r[4]} for r in rows]

    def largest_sessions(self, limit: int = 10) -> list[dict]:
        """Sessions holding the most characters, with counts and time range (retention)."""
        with self.db.reading() as conn:
            return [row_to_dict(r) for r in conn.execute(
                "SELECT session_id, count(*) AS messages,"
                " sum(COALESCE(length(content), 0) + COALESCE(length(tool_calls), 0)) AS chars,"
                f" sum(token_count) AS tokens, min({MESSAGE_TIME}) AS first_at,"
                f" max({MESSAGE_TIME}) AS last_at"
                " FROM messages GROUP BY session_id ORDER BY chars DESC LIMIT ?", (limit,))]


def _rows_per_statement(conn: sqlite3.Connection) -> int:
    """How many rows one INSERT may carry: ``INSERT_ROWS_PER_STATEMENT``, fewer where
    this SQLite allows fewer bound variables (999 before 3.32)."""
    try:
        variables = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    except (AttributeError, sqlite3.Error):  # Python < 3.11
        variables = 999
    return max(1, min(INSERT_ROWS_PER_STATEMENT, variables // len(INSERT_COLUMNS)))


def _statement_sizes(total: int, per_statement: int) -> list[int]:
    """How many rows each INSERT of a batch writes: ``per_statement`` at a time, and
    when a helper thread writes them (several statements) the last ``per_statement``
    in halving statements, so little is left to write once the last row is built."""
    sizes, left = [], total
    while left > per_statement:
        sizes.append(per_statement)
        left -= per_statement
    while sizes and left > max(1, per_statement // 8):
        half = (left + 1) // 2
        sizes.append(half)
        left -= half
    return sizes + [left] if left else sizes


@functools.lru_cache(maxsize=32)
def _insert_sql(rows: int) -> str:
    """The INSERT of ``rows`` new message rows in one statement (see
    ``INSERT_ROWS_PER_STATEMENT``); the few sizes in use stay cached."""
    one = "(" + ", ".join("?" * len(INSERT_COLUMNS)) + ")"
    return (f"INSERT INTO messages({', '.join(INSERT_COLUMNS)}) VALUES "
            + ", ".join([one] * rows))


def _match_filters(match: str, below_store_id: int | None, time_from: float | None,
                   time_to: float | None, rowid: str = "f.rowid",
                   sessions: Sequence[str] | None = None) -> tuple[list[str], list]:
    """WHERE terms and parameters of a message match (FTS table ``f``, messages ``m``):
    the expression, the current-turn bound, the time bounds on
    ``COALESCE(message_at, created_at)`` (``time_to`` exclusive) and the sessions."""
    where, params = ["messages_fts MATCH ?"], [match]
    for term, value in ((f"{rowid} < ?", below_store_id),
                        ("COALESCE(m.message_at, m.created_at) >= ?", time_from),
                        ("COALESCE(m.message_at, m.created_at) < ?", time_to)):
        if value is not None:
            where.append(term)
            params.append(value)
    if sessions is not None:
        term, scoped = session_filter("m.session_id", sessions)
        where.append(term)
        params += scoped
    return where, params


def decode_row(row: dict) -> dict:
    """The original message dict of a stored row."""
    return codec.decode_message(row)
