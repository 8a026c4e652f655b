"""Numbered schema migrations, applied once each, in order, and recorded.

Every schema change is one small function registered with ``@migration``. The
database remembers what ran in ``trove_migrations`` and stamps the newest
version into ``PRAGMA user_version`` so opening a database costs one pragma
read, not a table scan. A database stamped newer than this code is refused:
old code must never write into a schema it does not understand.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Callable

from . import codec
from .payloads import REF_PREFIX

MIGRATIONS: list[tuple[int, str, Callable[[sqlite3.Connection], None]]] = []


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer hermes-trove than this one."""


def registrar(registry: list):
    """A ``@migration(n)`` decorator that registers into ``registry`` in order (SQLite's
    list here, the server's in ``storage/postgres/schema.py``)."""

    def migration(version: int):
        """Register ``fn`` as schema migration number ``version`` (1, 2, 3, ...)."""

        def decorate(fn):
            if registry and registry[-1][0] != version - 1:
                raise ValueError(f"migration {version} registered out of order")
            registry.append((version, fn.__name__, fn))
            return fn

        return decorate

    return migration


migration = registrar(MIGRATIONS)


def latest_version() -> int:
    """The schema version this code writes."""
    return MIGRATIONS[-1][0]


# How the FTS columns of a message row are computed; shared by the view and the triggers
# so a rebuild and incremental sync can never disagree.
def _message_body(t: str) -> str:
    return f"COALESCE({t}.search_text, {t}.content)"


def _message_tags(t: str) -> str:
    return (f"'s' || lower(hex({t}.session_id)) || ' r' || lower(hex({t}.role))"
            f" || ' p' || lower(hex({t}.source))")


def _node_tags(t: str) -> str:
    return f"'s' || lower(hex({t}.session_id)) || ' d' || {t}.depth"


@migration(1)
def m001_initial_schema(conn: sqlite3.Connection) -> None:
    """The whole initial schema: sessions, messages, summary nodes, edges, FTS."""
    run_script(conn, f"""
    CREATE TABLE trove_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        canonical_id TEXT NOT NULL,
        conversation_id TEXT,
        source TEXT NOT NULL DEFAULT 'unknown' CHECK (source <> ''),
        parent_session_id TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        replay_floor INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX sessions_canonical ON sessions(canonical_id);
    CREATE INDEX sessions_conversation ON sessions(conversation_id);

    CREATE TABLE messages (
        store_id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        conversation_id TEXT,
        source TEXT NOT NULL DEFAULT 'unknown' CHECK (source <> ''),
        role TEXT NOT NULL,
        content TEXT,
        content_format TEXT NOT NULL CHECK (content_format IN ('text', 'json', 'null', 'absent')),
        tool_calls TEXT,
        tool_call_id TEXT,
        tool_name TEXT,
        extra TEXT,
        search_text TEXT,
        content_hash TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        message_at REAL,
        created_at REAL NOT NULL,
        token_count INTEGER NOT NULL DEFAULT 0,
        pinned INTEGER NOT NULL DEFAULT 0,
        UNIQUE (session_id, content_hash, ordinal)
    );
    CREATE INDEX messages_session ON messages(session_id, store_id);
    CREATE INDEX messages_created ON messages(created_at);

    CREATE VIEW messages_fts_source AS
        SELECT m.store_id AS store_id, {_message_body('m')} AS body, {_message_tags('m')} AS tags
        FROM messages AS m;
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        body, tags, content='messages_fts_source', content_rowid='store_id',
        tokenize='unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, body, tags)
        VALUES (new.store_id, {_message_body('new')}, {_message_tags('new')});
    END;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, body, tags)
        VALUES ('delete', old.store_id, {_message_body('old')}, {_message_tags('old')});
    END;
    CREATE TRIGGER messages_fts_update
    AFTER UPDATE OF content, search_text, session_id, role, source ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, body, tags)
        VALUES ('delete', old.store_id, {_message_body('old')}, {_message_tags('old')});
        INSERT INTO messages_fts(rowid, body, tags)
        VALUES (new.store_id, {_message_body('new')}, {_message_tags('new')});
    END;

    CREATE TABLE nodes (
        node_id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        depth INTEGER NOT NULL CHECK (depth >= 0),
        text TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        source_token_count INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        first_store_id INTEGER,
        last_store_id INTEGER,
        time_from REAL,
        time_to REAL,
        level INTEGER NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        topics TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL
    );
    CREATE INDEX nodes_session ON nodes(session_id, depth, node_id);
    CREATE INDEX nodes_time ON nodes(time_to, time_from);

    CREATE TABLE node_edges (
        parent_id INTEGER NOT NULL REFERENCES nodes(node_id),
        ordinal INTEGER NOT NULL,
        child_node_id INTEGER REFERENCES nodes(node_id),
        child_store_id INTEGER REFERENCES messages(store_id),
        CHECK ((child_node_id IS NULL) <> (child_store_id IS NULL)),
        PRIMARY KEY (parent_id, ordinal)
    ) WITHOUT ROWID;
    CREATE INDEX edges_child_node ON node_edges(child_node_id, parent_id)
        WHERE child_node_id IS NOT NULL;
    CREATE INDEX edges_child_message ON node_edges(child_store_id, parent_id)
        WHERE child_store_id IS NOT NULL;

    CREATE TABLE session_carry (
        session_id TEXT NOT NULL,
        node_id INTEGER NOT NULL REFERENCES nodes(node_id),
        ordinal INTEGER NOT NULL,
        PRIMARY KEY (session_id, node_id)
    ) WITHOUT ROWID;

    CREATE VIEW nodes_fts_source AS
        SELECT n.node_id AS node_id, n.text AS body, {_node_tags('n')} AS tags FROM nodes AS n;
    CREATE VIRTUAL TABLE nodes_fts USING fts5(
        body, tags, content='nodes_fts_source', content_rowid='node_id',
        tokenize='unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER nodes_fts_insert AFTER INSERT ON nodes BEGIN
        INSERT INTO nodes_fts(rowid, body, tags) VALUES (new.node_id, new.text, {_node_tags('new')});
    END;
    CREATE TRIGGER nodes_fts_delete AFTER DELETE ON nodes BEGIN
        INSERT INTO nodes_fts(nodes_fts, rowid, body, tags)
        VALUES ('delete', old.node_id, old.text, {_node_tags('old')});
    END;
    CREATE TRIGGER nodes_fts_update AFTER UPDATE OF text, session_id, depth ON nodes BEGIN
        INSERT INTO nodes_fts(nodes_fts, rowid, body, tags)
        VALUES ('delete', old.node_id, old.text, {_node_tags('old')});
        INSERT INTO nodes_fts(rowid, body, tags) VALUES (new.node_id, new.text, {_node_tags('new')});
    END;
    """)


def run_script(conn: sqlite3.Connection, script: str) -> None:
    """Execute several statements inside the caller's transaction.

    ``executescript`` would COMMIT first, breaking one-transaction-per-migration,
    so statements are split with SQLite's own completeness test instead.
    """
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            conn.execute(pending)
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement in migration: {pending[:80]!r}")


def _ensure_ledger(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS trove_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )


def schema_version(conn: sqlite3.Connection) -> int:
    """The version stamped in the database header (0 for a new database)."""
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection) -> list[int]:
    """Apply every pending migration, each in its own transaction; return those applied.

    Raises ``SchemaTooNewError`` when the database is newer than this code.
    """
    current = schema_version(conn)
    if current > latest_version():
        raise SchemaTooNewError(
            f"trove database schema version {current} is newer than this hermes-trove "
            f"(supports up to {latest_version()}); update the plugin or use another "
            f"TROVE_DATABASE_PATH"
        )
    def record(version: int, name: str) -> None:
        conn.execute("INSERT INTO trove_migrations(version, name, applied_at) VALUES (?, ?, ?)",
                     (version, name, time.time()))
        conn.execute(f"PRAGMA user_version = {int(version)}")

    return apply_pending(conn, MIGRATIONS, current, schema_version,
                         lambda: _ensure_ledger(conn), record)


def apply_pending(conn, registry: list, current: int, version_of: Callable, ensure_ledger:
                  Callable, record: Callable) -> list[int]:
    """Apply the migrations of ``registry`` above ``current``, each in its own write
    transaction (``BEGIN IMMEDIATE``: the file's lock, or the server's writer lock),
    re-reading the version inside it, then ``record`` it; return those applied.
    Shared by both engines so "once, in order, recorded" has one implementation."""
    applied = []
    for version, name, fn in registry:
        if version <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process (a gateway and a cron run opening a new database at the
            # same moment) may have applied it while this one waited for the write lock.
            current = version_of(conn)
            if version <= current:
                conn.execute("COMMIT")
                continue
            ensure_ledger()
            fn(conn)
            record(version, name)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied


@migration(2)
def m002_import_ledger(conn: sqlite3.Connection) -> None:
    """Which source rows an import already wrote, so rerunning an import adds nothing.

    One row per imported source row (a message, summary or session of an
    external history such as OpenClaw's) and the target it became: a message
    store_id, a node_id or a session id (``target_id`` has no type affinity).
    """
    run_script(conn, """
    CREATE TABLE import_ledger (
        import_id TEXT NOT NULL,
        source_kind TEXT NOT NULL,
        source_key TEXT NOT NULL,
        target_kind TEXT NOT NULL,
        target_id NOT NULL,
        imported_at REAL NOT NULL,
        PRIMARY KEY (import_id, source_kind, source_key)
    ) WITHOUT ROWID;
    """)


@migration(3)
def m003_session_owners(conn: sqlite3.Connection) -> None:
    """Who each session belongs to, so one person's agent in a shared gateway cannot
    search another person's sessions (see ``storage.owners``).

    ``owner`` is the key cross-session tools compare; the other columns record
    what the host said (platform, gateway user / chat id, conversation key) for
    operators. A session without a row (older data, imports) belongs to the
    profile's local owner.
    """
    run_script(conn, """
    CREATE TABLE session_owners (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        platform TEXT,
        user_id TEXT,
        chat_id TEXT,
        conversation_id TEXT,
        recorded_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX session_owners_owner ON session_owners(owner, session_id);
    """)


@migration(4)
def m004_prepared_summaries(conn: sqlite3.Connection) -> None:
    """Leaf summaries prepared in the background before the trigger (issue #17).

    One row per chunk of raw messages a worker claimed (``state='claimed'``,
    with a lease) or finished (``'ready'``, the summary as JSON). The primary
    key makes the claim: two processes can never prepare the same chunk, and
    an expired lease lets another take it over. ``source_hash`` covers the
    chunk's store_ids and content hashes, so a summary whose sources changed
    (undo, edits) is never used.
    """
    run_script(conn, """
    CREATE TABLE prep_summaries (
        session_id TEXT NOT NULL,
        first_store_id INTEGER NOT NULL,
        last_store_id INTEGER NOT NULL,
        store_ids TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('claimed', 'ready')),
        owner TEXT NOT NULL,
        lease_until REAL NOT NULL,
        created_at REAL NOT NULL,
        summary TEXT,
        PRIMARY KEY (session_id, first_store_id)
    ) WITHOUT ROWID;
    """)


@migration(5)
def m005_evidence_sidecars(conn: sqlite3.Connection) -> None:
    """Opt-in evidence state: extracted assertions and stored evidence views.

    ``evidence_assertions`` holds one row per assertion (fact, preference,
    recommendation, commitment, action, status) with its subject, value, the
    time it became valid and its exact ref (store_id, start, end, quote) into
    ``messages``; written only when TROVE_ASSERTIONS_ENABLED is on.
    ``evidence_views`` keeps what one trove_retrieve turn gathered (question,
    slots, refs, trace and its hash) so a later turn can cite it; written only
    when TROVE_RETRIEVE_ENABLED is on. ``evidence_scan`` remembers, per
    session, the highest store_id already read by the extractor.
    """
    run_script(conn, """
    CREATE TABLE evidence_assertions (
        assertion_id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        subject_key TEXT NOT NULL,
        value TEXT NOT NULL,
        valid_from REAL,
        store_id INTEGER NOT NULL,
        start INTEGER NOT NULL,
        end INTEGER NOT NULL,
        quote TEXT NOT NULL,
        extractor TEXT NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (store_id, start, end, kind, subject_key)
    );
    CREATE INDEX evidence_assertions_subject ON evidence_assertions(subject_key, valid_from);
    CREATE INDEX evidence_assertions_session ON evidence_assertions(session_id, valid_from);
    CREATE TABLE evidence_scan (
        session_id TEXT PRIMARY KEY,
        last_store_id INTEGER NOT NULL
    );
    CREATE TABLE evidence_views (
        view_id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        question TEXT NOT NULL,
        body TEXT NOT NULL,
        trace_hash TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX evidence_views_session ON evidence_views(session_id, created_at);
    """)


@migration(6)
def m006_rollups(conn: sqlite3.Connection) -> None:
    """Day / week / month rollups over every session, with exact lineage.

    ``rollups`` holds one summary per calendar period of one time zone and the
    watermark of the sources it was built from (a changed watermark = stale).
    ``rollup_sources`` is its ordered lineage: a child rollup, a summary node
    or a raw message (exactly one per row); node and message children have no
    foreign key, so removing an old session never fails on a rollup: the
    doctor reports the dangling lineage and the next build replaces it.
    ``rollup_sessions`` lists every session under a rollup, so a reader's
    scope is checked without walking the lineage. The expression index lets
    time-window reads of messages use the same time the tools show.
    """
    run_script(conn, """
    CREATE TABLE rollups (
        rollup_id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL CHECK (kind IN ('day', 'week', 'month')),
        period_key TEXT NOT NULL,
        time_zone TEXT NOT NULL,
        period_start REAL NOT NULL,
        period_end REAL NOT NULL,
        text TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        source_token_count INTEGER NOT NULL,
        level INTEGER NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        message_count INTEGER NOT NULL,
        session_count INTEGER NOT NULL,
        time_from REAL,
        time_to REAL,
        watermark TEXT NOT NULL,
        built_at REAL NOT NULL,
        UNIQUE (kind, period_key, time_zone)
    );
    CREATE INDEX rollups_period ON rollups(time_zone, period_start, period_end);

    CREATE TABLE rollup_sources (
        rollup_id INTEGER NOT NULL REFERENCES rollups(rollup_id) ON DELETE CASCADE,
        ordinal INTEGER NOT NULL,
        child_rollup_id INTEGER REFERENCES rollups(rollup_id),
        child_node_id INTEGER,
        child_store_id INTEGER,
        PRIMARY KEY (rollup_id, ordinal),
        CHECK ((child_rollup_id IS NOT NULL) + (child_node_id IS NOT NULL)
               + (child_store_id IS NOT NULL) = 1)
    ) WITHOUT ROWID;
    CREATE INDEX rollup_sources_rollup ON rollup_sources(child_rollup_id)
        WHERE child_rollup_id IS NOT NULL;
    CREATE INDEX rollup_sources_node ON rollup_sources(child_node_id)
        WHERE child_node_id IS NOT NULL;
    CREATE INDEX rollup_sources_message ON rollup_sources(child_store_id)
        WHERE child_store_id IS NOT NULL;

    CREATE TABLE rollup_sessions (
        rollup_id INTEGER NOT NULL REFERENCES rollups(rollup_id) ON DELETE CASCADE,
        session_id TEXT NOT NULL,
        PRIMARY KEY (rollup_id, session_id)
    ) WITHOUT ROWID;

    CREATE INDEX messages_rollup_time ON messages(COALESCE(message_at, created_at));
    """)


@migration(7)
def m007_embedding_vectors(conn: sqlite3.Connection) -> None:
    """Vectors of raw messages and summary nodes for semantic search (opt-in).

    ``embedding_spaces`` names each exact identity that produced vectors
    (provider, model, revision, dimension), so switching models never mixes
    vectors and switching back reuses them. ``embedding_vectors`` holds one row
    per (space, kind 'm' message / 'n' node, id, chunk); a row whose text had
    nothing to embed is kept with a NULL vector so it is not retried. The
    session is not copied: searches join the live row, so a row re-filed to
    another session is found there. ``text_hash`` lets identical texts share
    one embedding call. A rowid table, not WITHOUT ROWID: rows of 1.5 KB are far
    past the size where SQLite advises against WITHOUT ROWID (lookups by key ran
    several times slower that way).
    """
    run_script(conn, """
    CREATE TABLE embedding_spaces (
        space_id INTEGER PRIMARY KEY,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        revision TEXT NOT NULL,
        dim INTEGER NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (provider, model, revision, dim)
    );
    CREATE TABLE embedding_vectors (
        space_id INTEGER NOT NULL REFERENCES embedding_spaces(space_id),
        kind TEXT NOT NULL,
        ref_id INTEGER NOT NULL,
        chunk INTEGER NOT NULL,
        text_hash TEXT NOT NULL,
        vector BLOB
    );
    CREATE UNIQUE INDEX embedding_vectors_key ON embedding_vectors(space_id, kind, ref_id, chunk);
    CREATE INDEX embedding_vectors_by_hash ON embedding_vectors(space_id, text_hash);
    """)


@migration(8)
def m008_prepared_condensations(conn: sqlite3.Connection) -> None:
    """Condensed summaries prepared in the background (issue #17).

    Beside the prepared leaves of migration 4, a worker predicts which groups of
    summaries the next compaction will merge and summarizes them ahead. A group
    is keyed by the exact texts of its children (``group_key``), so an entry is
    used only when compaction merges those very summaries, whether they were
    written before or are written from prepared leaves in the same compaction.
    ``claimed``/``ready`` and the lease work as for leaves.
    """
    run_script(conn, """
    CREATE TABLE prep_condensed (
        session_id TEXT NOT NULL,
        group_key TEXT NOT NULL,
        depth INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('claimed', 'ready')),
        owner TEXT NOT NULL,
        lease_until REAL NOT NULL,
        created_at REAL NOT NULL,
        summary TEXT,
        PRIMARY KEY (session_id, group_key)
    ) WITHOUT ROWID;
    """)


@migration(9)
def m009_drop_unused_created_index(conn: sqlite3.Connection) -> None:
    """Drop ``messages_created``: no query reads messages by ``created_at`` alone
    (time windows use ``messages_rollup_time`` on the message's own time, per-session
    ranges use ``messages_session``), yet every stored message paid for it. Ingest
    through the host's windows ran about 8% faster without it (issue #17 item 5)."""
    conn.execute("DROP INDEX IF EXISTS messages_created")


@migration(10)
def m010_session_views(conn: sqlite3.Connection) -> None:
    """The lists the engine knows the rows of (issue #24): per session and engine
    copy (``origin``) a few views, each the fingerprint and store_id of every
    element of a list it stored or returned, in the host's order. Shown lists are
    read against them (``storage/identity``), so identity no longer depends on
    guessing where a list starts in the stored history. ``slot`` is a small ring
    per origin; ``digest`` lets an identical view be recognised without a write."""
    run_script(conn, """
    CREATE TABLE session_views (
        session_id TEXT NOT NULL,
        origin TEXT NOT NULL,
        slot INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        digest TEXT NOT NULL,
        entries TEXT NOT NULL,
        meta TEXT,
        PRIMARY KEY (session_id, origin, slot)
    );
    CREATE INDEX session_views_recent ON session_views(session_id, updated_at);
    CREATE INDEX session_views_updated ON session_views(updated_at);
    """)


@migration(11)
def m011_rollups_per_owner(conn: sqlite3.Connection) -> None:
    """Rollups per owner (issue 25): one summary per ``(kind, period_key, time_zone,
    owner)``, so a summarizer prompt never holds two people's words and each
    gateway user gets rollups of their own sessions.

    SQLite cannot change a UNIQUE constraint in place, so the three rollup tables
    are rebuilt under new names and swapped in. A rollup whose sessions all have
    one recorded owner keeps its id, text and lineage under that owner; one that
    mixes owners (or covers a session with no owner) is dropped with every rollup
    built on it: rollups are derived data, and the next pass rebuilds them per
    owner from the messages and summaries, which are untouched.
    """
    run_script(conn, """
    CREATE TABLE rollups_v11 (
        rollup_id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL CHECK (kind IN ('day', 'week', 'month')),
        period_key TEXT NOT NULL,
        time_zone TEXT NOT NULL,
        owner TEXT NOT NULL,
        period_start REAL NOT NULL,
        period_end REAL NOT NULL,
        text TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        source_token_count INTEGER NOT NULL,
        level INTEGER NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        message_count INTEGER NOT NULL,
        session_count INTEGER NOT NULL,
        time_from REAL,
        time_to REAL,
        watermark TEXT NOT NULL,
        built_at REAL NOT NULL,
        UNIQUE (kind, period_key, time_zone, owner)
    );
    CREATE TEMP TABLE rollup_owner_v11 AS
        SELECT rs.rollup_id AS rollup_id, min(o.owner) AS owner
        FROM rollup_sessions rs LEFT JOIN session_owners o ON o.session_id = rs.session_id
        GROUP BY rs.rollup_id
        HAVING count(o.owner) = count(*) AND count(DISTINCT o.owner) = 1;
    INSERT INTO rollups_v11(rollup_id, kind, period_key, time_zone, owner, period_start,
                            period_end, text, token_count, source_token_count, level, model,
                            message_count, session_count, time_from, time_to, watermark,
                            built_at)
        SELECT r.rollup_id, r.kind, r.period_key, r.time_zone, k.owner, r.period_start,
               r.period_end, r.text, r.token_count, r.source_token_count, r.level, r.model,
               r.message_count, r.session_count, r.time_from, r.time_to, r.watermark,
               r.built_at
        FROM rollups r JOIN rollup_owner_v11 k ON k.rollup_id = r.rollup_id;
    CREATE TABLE rollup_sources_v11 (
        rollup_id INTEGER NOT NULL REFERENCES rollups_v11(rollup_id) ON DELETE CASCADE,
        ordinal INTEGER NOT NULL,
        child_rollup_id INTEGER REFERENCES rollups_v11(rollup_id),
        child_node_id INTEGER,
        child_store_id INTEGER,
        PRIMARY KEY (rollup_id, ordinal),
        CHECK ((child_rollup_id IS NOT NULL) + (child_node_id IS NOT NULL)
               + (child_store_id IS NOT NULL) = 1)
    ) WITHOUT ROWID;
    CREATE TABLE rollup_sessions_v11 (
        rollup_id INTEGER NOT NULL REFERENCES rollups_v11(rollup_id) ON DELETE CASCADE,
        session_id TEXT NOT NULL,
        PRIMARY KEY (rollup_id, session_id)
    ) WITHOUT ROWID;
    INSERT INTO rollup_sessions_v11
        SELECT rs.rollup_id, rs.session_id FROM rollup_sessions rs
        WHERE rs.rollup_id IN (SELECT rollup_id FROM rollups_v11);
    DROP TABLE rollup_owner_v11;
    """)
    # A kept rollup built on a dropped one goes too (a week over a mixed day), until
    # every kept rollup's children are kept.
    while True:
        gone = conn.execute(
            "DELETE FROM rollups_v11 WHERE rollup_id IN (SELECT s.rollup_id FROM"
            " rollup_sources s WHERE s.child_rollup_id IS NOT NULL AND s.child_rollup_id"
            " NOT IN (SELECT rollup_id FROM rollups_v11))").rowcount
        if not gone:
            break
        conn.execute("DELETE FROM rollup_sessions_v11 WHERE rollup_id NOT IN"
                     " (SELECT rollup_id FROM rollups_v11)")
    run_script(conn, """
    INSERT INTO rollup_sources_v11
        SELECT s.rollup_id, s.ordinal, s.child_rollup_id, s.child_node_id, s.child_store_id
        FROM rollup_sources s WHERE s.rollup_id IN (SELECT rollup_id FROM rollups_v11);
    DROP TABLE rollup_sources;
    DROP TABLE rollup_sessions;
    DROP TABLE rollups;
    ALTER TABLE rollups_v11 RENAME TO rollups;
    ALTER TABLE rollup_sources_v11 RENAME TO rollup_sources;
    ALTER TABLE rollup_sessions_v11 RENAME TO rollup_sessions;
    CREATE INDEX rollups_period ON rollups(time_zone, owner, period_start, period_end);
    CREATE INDEX rollup_sources_rollup ON rollup_sources(child_rollup_id)
        WHERE child_rollup_id IS NOT NULL;
    CREATE INDEX rollup_sources_node ON rollup_sources(child_node_id)
        WHERE child_node_id IS NOT NULL;
    CREATE INDEX rollup_sources_message ON rollup_sources(child_store_id)
        WHERE child_store_id IS NOT NULL;
    """)


def reindex_image_payload_refs(conn, page: int = 500) -> int:
    """Give each stored row holding an externalized image part the search text it is
    written with today (``codec.encode_message``: the image's payload ref follows
    ``[image]``), so the rows referring to a payload are found by its hash whatever their
    age. Only JSON rows holding a ref can differ; the index follows the column (a trigger
    on SQLite, the generated tsvector on PostgreSQL). Both engines' migrations run this
    one function; returns how many rows changed."""
    changed, cursor = 0, 0
    while True:
        rows = conn.execute(
            "SELECT store_id, role, content, content_format, tool_calls, tool_call_id, extra,"
            " search_text FROM messages WHERE store_id > ? AND content_format = 'json'"
            " AND instr(content, ?) > 0 ORDER BY store_id LIMIT ?",
            (cursor, REF_PREFIX, page)).fetchall()
        for row in rows:
            fields = dict(zip(("store_id", "role", "content", "content_format", "tool_calls",
                               "tool_call_id", "extra"), row[:7]))
            text = codec.encode_message(codec.decode_message(fields)).search_text
            if text != row[7]:
                conn.execute("UPDATE messages SET search_text = ? WHERE store_id = ?",
                             (text, row[0]))
                changed += 1
        if len(rows) < page:
            return changed
        cursor = rows[-1][0]


@migration(12)
def m012_image_payload_refs_searchable(conn: sqlite3.Connection) -> None:
    """An image part's payload ref becomes a search token of its row, as a placeholder in
    text always was (``reindex_image_payload_refs``): a payload's referring rows were
    found only among the newest 200 rows showing ``[image]``, so older screenshots could
    no longer be expanded from the session that holds them."""
    reindex_image_payload_refs(conn)


def drop_rollups_mixing_owners(conn) -> int:
    """Delete every rollup holding a session that is not its owner's now, with every
    rollup built on it; how many went. Before ``Owners.record`` dropped them, replacing a
    session's provisional key (``gateway:user:<id>``, shared by a DM and a group chat)
    left the old key's rollups holding both new owners' sessions, for good once their
    period had left the lookback. Derived data: the next pass rebuilds what its window
    holds, per owner. Both engines' migrations run this one function."""
    from .timeline import delete_with_ancestors_in   # here: timeline needs database, which needs us
    mixed = [r[0] for r in conn.execute(
        "SELECT DISTINCT r.rollup_id FROM rollups r"
        " JOIN rollup_sessions rs ON rs.rollup_id = r.rollup_id"
        " LEFT JOIN session_owners o ON o.session_id = rs.session_id"
        " WHERE o.owner IS NULL OR o.owner <> r.owner ORDER BY 1")]
    return len(delete_with_ancestors_in(conn, mixed))


@migration(13)
def m013_rollups_of_one_owner(conn: sqlite3.Connection) -> None:
    """No rollup holds another owner's session (``drop_rollups_mixing_owners``)."""
    drop_rollups_mixing_owners(conn)


@migration(14)
def m014_placeholders_are_not_embedded(conn: sqlite3.Connection) -> None:
    """Messages embedded with their payload placeholders as words are embedded again
    without them (``VectorStore.drop_placeholder_vectors_in``)."""
    from .vectors import VectorStore   # here: vectors needs database, which needs us
    VectorStore.drop_placeholder_vectors_in(conn)


@migration(15)
def m015_embedding_probes(conn: sqlite3.Connection) -> None:
    """Each embedding space keeps the vector its model gave a fixed probe text
    (``recall.probe``): an endpoint that starts answering as another model under the
    same name is told apart, and its answers start a new space."""
    conn.execute("ALTER TABLE embedding_spaces ADD COLUMN probe BLOB")
