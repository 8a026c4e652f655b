"""The PostgreSQL schema: numbered migrations, applied once each, in order, recorded.

The tables and columns are those of the SQLite schema at its migration 11 (see
``storage/migrations.py`` and docs/architecture.md), so every statement the store
runs means the same on both engines. What differs is how search is indexed:

* full-text: a stored ``fts`` tsvector column per searchable table (body words at
  weight A, the scope tags ``s<hex session> r<hex role> p<hex source>`` at weight
  D) with a GIN index. Words are split the way SQLite's unicode61 tokenizer splits
  them (every run of letters and digits, case folded), so a query built for FTS5
  finds the same rows; the first ``FTS_CHARS`` characters of a message are indexed
  (a tsvector is capped at 1 MB).
* substring: a pg_trgm GIN index when the extension can be created (migration 2).

Each migration runs in one transaction under the writer lock, so two processes
opening a new database at once apply it once. The ledger is ``trove_migrations``;
the version is its highest row.
"""

from __future__ import annotations

import time
from typing import Callable

from ..migrations import (apply_pending, drop_rollups_mixing_owners, registrar,
                          reindex_image_payload_refs)
from .connection import Connection

FTS_CHARS = 262_144
# How words were split by migration 1 (kept: a released migration never changes).
_WORDS_V1 = "regexp_replace(lower({0}), '[^[:alnum:]]+', ' ', 'g')"
# How words are split for the index and for queries since migration 3: unicode61's
# rule with ``remove_diacritics 2``, as SQLite's FTS5 tables use it, in SQL.
WORDS = "trove_words({0})"
# Case folded; accents removed (NFD, then the combining marks U+0300-U+036F go, so
# "café" is "cafe" and "naïve" one word); every run of other non-alphanumerics is a
# separator. An ASCII text (byte length = character length) skips the normalization:
# it has no accent, and most text is ASCII. normalize() is built in (PostgreSQL 13+,
# a UTF-8 database): no extension is needed. IMMUTABLE, so a generated column may
# use it and the planner folds it over a bound query.
# (Migration 3's definition, kept as released; migration 5 replaced it.)
_TROVE_WORDS_V3 = (
    "CREATE OR REPLACE FUNCTION trove_words(value text) RETURNS text LANGUAGE sql"
    " IMMUTABLE PARALLEL SAFE AS $$ SELECT regexp_replace(CASE WHEN octet_length(value)"
    " = char_length(value) THEN lower(value) ELSE regexp_replace(normalize(lower(value),"
    " NFD), '[\\u0300-\\u036f]+', '', 'g') END, '[^[:alnum:]]+', ' ', 'g') $$")
# Since migration 5 the text is read as it was received: the adapter stores a NUL as
# U+E000 "0" (``connection.ESCAPE``), and that "0" glued itself to the next word
# ("a\0b" was indexed as "a 0b", so "b" was not found). Both escape pairs are a
# separator first (a NUL is one for FTS5 too). The pairs only occur in non-ASCII text.
TROVE_WORDS = (
    "CREATE OR REPLACE FUNCTION trove_words(value text) RETURNS text LANGUAGE sql"
    " IMMUTABLE PARALLEL SAFE AS $$ SELECT regexp_replace(CASE WHEN octet_length(value)"
    " = char_length(value) THEN lower(value) ELSE regexp_replace(normalize(lower("
    "regexp_replace(value, '\\ue000[0\\ue000]', ' ', 'g')), NFD), '[\\u0300-\\u036f]+',"
    " '', 'g') END, '[^[:alnum:]]+', ' ', 'g') $$")
# Since migration 9 the words are those of SQLite's unicode61 tokenizer whatever the
# database's locale: lower() and the [[:alnum:]] class run under a Unicode-aware
# collation named here (``word_collation``; a database made with the C locale knows
# no letter beyond ASCII, so it indexed no Greek, Cyrillic or CJK word at all, and a
# Turkish one lowers "I" to a dotless i). As unicode61 does: a combining accent
# (U+0300-U+036F) is dropped, a final sigma is a sigma, and a precomposed letter loses
# its accents only when it is a Latin one (decomposed, an accent right after an ASCII
# letter goes: "é" is "e", while Greek "ώ" and Cyrillic "ё", "й" keep theirs; NFC puts
# them back together). ``recall/query_plan.fold`` is the same rule for the query side.
# The escape pairs of a NUL are separators (migration 5).
_TROVE_WORDS_V9 = (
    "CREATE OR REPLACE FUNCTION trove_words(value text) RETURNS text LANGUAGE sql"
    " IMMUTABLE PARALLEL SAFE AS $$ SELECT regexp_replace((CASE WHEN octet_length(value)"
    " = char_length(value) THEN lower(value COLLATE {c}) ELSE normalize(regexp_replace("
    "normalize(translate(lower(regexp_replace(regexp_replace(value, '\\ue000[0\\ue000]',"
    " ' ', 'g'), '[\\u0300-\\u036f]+', '', 'g') COLLATE {c}), U&'\\03C2', U&'\\03C3'),"
    " NFD), '([a-z])[\\u0300-\\u036f]+', '\\1', 'g'), NFC) END) COLLATE {c},"
    " '[^[:alnum:]]+', ' ', 'g') $$")
# Unicode-aware collations, best first: glibc's C.UTF-8 as initdb imports it (closest
# to unicode61: letter numbers such as "Ⅻ" are word characters), then ICU's root
# locale. A server with neither keeps its own locale.
WORD_COLLATIONS = ("C.utf8", "C.UTF-8", "und-x-icu")


def word_collation(conn: Connection) -> str:
    """The quoted name of the collation ``trove_words`` lowers and splits under: the
    first of ``WORD_COLLATIONS`` this database has for UTF-8, else ``"default"``."""
    names = {r[0] for r in conn.execute(
        "SELECT collname FROM pg_collation WHERE collencoding IN (-1, 6)")}
    chosen = next((name for name in WORD_COLLATIONS if name in names), "default")
    return '"' + chosen + '"'


def trove_words_definition(conn: Connection) -> str:
    """The statement that (re)creates ``trove_words`` the way this code splits words."""
    return _TROVE_WORDS_V9.format(c=word_collation(conn))

# A phrase as a tsquery (since migration 10), over words already split by
# ``trove_words``. A tsvector holds no position past 16,383: every later word of a long
# message (a big tool output) sits at that one position, so "a <-> b" never matched a
# phrase past it, while FTS5 finds it anywhere. So the phrase is also tried with its
# last words sharing that position: "a <-> b <0> c" for a phrase crossing it, "a <0> b
# <0> c" past it (a position two words share exists only there). Crossings after the
# 16th word of a phrase are not tried (the query would grow as its square).
TROVE_PHRASE = (
    "CREATE OR REPLACE FUNCTION trove_phrase(words text) RETURNS tsquery LANGUAGE sql"
    " IMMUTABLE PARALLEL SAFE AS $$ SELECT CASE WHEN cardinality(w) < 2"
    " THEN phraseto_tsquery('simple', words) ELSE phraseto_tsquery('simple', words)"
    " || to_tsquery('simple', (SELECT string_agg('(' || (SELECT string_agg(CASE WHEN i = 1"
    " THEN '' WHEN i <= k THEN ' <-> ' ELSE ' <0> ' END || quote_literal(w[i]), '' ORDER BY i)"
    " FROM generate_subscripts(w, 1) i) || ')', ' | ') FROM generate_series(1,"
    " least(cardinality(w) - 1, 16)) k)) END FROM (SELECT array_remove(string_to_array("
    "trim(words), ' '), '') AS w) words_of $$")

MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = []


migration = registrar(MIGRATIONS)


def latest_version() -> int:
    """The PostgreSQL schema version this code writes."""
    return MIGRATIONS[-1][0]


def schema_version(conn: Connection) -> int:
    """The highest applied migration (0 for an empty schema)."""
    if not conn.execute("SELECT to_regclass('trove_migrations')").fetchone()[0]:
        return 0
    return conn.execute("SELECT COALESCE(max(version), 0) FROM trove_migrations").fetchone()[0]


def migrate(conn: Connection, too_new: type[Exception]) -> list[int]:
    """Apply every pending migration, each in its own transaction; return those applied.
    A schema newer than this code raises ``too_new``."""
    current = schema_version(conn)
    if current > latest_version():
        raise too_new(
            f"trove schema version {current} on the PostgreSQL server is newer than this "
            f"hermes-trove (supports up to {latest_version()}); update the plugin")
    return apply_pending(
        conn, MIGRATIONS, current, schema_version,
        lambda: conn.execute("CREATE TABLE IF NOT EXISTS trove_migrations (version INTEGER"
                             " PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION"
                             " NOT NULL)"),
        lambda version, name: conn.execute(
            "INSERT INTO trove_migrations(version, name, applied_at) VALUES (?, ?, ?)",
            (version, name, time.time())))


def _tags(*parts: str) -> str:
    return " || ' ' || ".join(parts)


def _hex(prefix: str, column: str) -> str:
    return f"'{prefix}' || trove_hex({column})"


MESSAGE_BODY = "COALESCE(search_text, content, '')"
_MESSAGE_TAGS = _tags(_hex("s", "session_id"), _hex("r", "role"), _hex("p", "source"))
_NODE_TAGS = _tags(_hex("s", "session_id"), "'d' || depth")


def _fts(words: str, body: str, tags: str) -> str:
    """A tsvector column's expression: body words at weight A, scope tags at weight D."""
    return (f"setweight(to_tsvector('simple', {words.format(f'left({body}, {FTS_CHARS})')}),"
            f" 'A') || setweight(to_tsvector('simple', {tags}), 'D')")


MESSAGE_FTS = _fts(WORDS, MESSAGE_BODY, _MESSAGE_TAGS)
NODE_FTS = _fts(WORDS, "text", _NODE_TAGS)

_SCHEMA = [
    # lower-case hex of the UTF-8 bytes, as SQLite's lower(hex(x)) (convert_to is only
    # STABLE because of client encodings; the server's UTF-8 bytes of a text are fixed)
    "CREATE OR REPLACE FUNCTION trove_hex(value text) RETURNS text LANGUAGE sql IMMUTABLE"
    " PARALLEL SAFE AS $$ SELECT encode(convert_to(value, 'UTF8'), 'hex') $$",
    "CREATE TABLE trove_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        canonical_id TEXT NOT NULL,
        conversation_id TEXT,
        source TEXT NOT NULL DEFAULT 'unknown' CHECK (source <> ''),
        parent_session_id TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        replay_floor BIGINT NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT '{}')""",
    "CREATE INDEX sessions_canonical ON sessions(canonical_id)",
    "CREATE INDEX sessions_conversation ON sessions(conversation_id)",
    f"""CREATE TABLE messages (
        store_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
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
        message_at DOUBLE PRECISION,
        created_at DOUBLE PRECISION NOT NULL,
        token_count INTEGER NOT NULL DEFAULT 0,
        pinned INTEGER NOT NULL DEFAULT 0,
        fts tsvector GENERATED ALWAYS AS ({_fts(_WORDS_V1, MESSAGE_BODY, _MESSAGE_TAGS)}) STORED,
        UNIQUE (session_id, content_hash, ordinal))""",
    "CREATE INDEX messages_session ON messages(session_id, store_id)",
    "CREATE INDEX messages_fts ON messages USING gin (fts)",
    "CREATE INDEX messages_rollup_time ON messages((COALESCE(message_at, created_at)))",
    f"""CREATE TABLE nodes (
        node_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL,
        depth INTEGER NOT NULL CHECK (depth >= 0),
        text TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        source_token_count INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        first_store_id BIGINT,
        last_store_id BIGINT,
        time_from DOUBLE PRECISION,
        time_to DOUBLE PRECISION,
        level INTEGER NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        topics TEXT NOT NULL DEFAULT '[]',
        created_at DOUBLE PRECISION NOT NULL,
        fts tsvector GENERATED ALWAYS AS ({_fts(_WORDS_V1, "text", _NODE_TAGS)}) STORED)""",
    "CREATE INDEX nodes_session ON nodes(session_id, depth, node_id)",
    "CREATE INDEX nodes_time ON nodes(time_to, time_from)",
    "CREATE INDEX nodes_fts ON nodes USING gin (fts)",
    """CREATE TABLE node_edges (
        parent_id BIGINT NOT NULL REFERENCES nodes(node_id),
        ordinal INTEGER NOT NULL,
        child_node_id BIGINT REFERENCES nodes(node_id),
        child_store_id BIGINT REFERENCES messages(store_id),
        CHECK ((child_node_id IS NULL) <> (child_store_id IS NULL)),
        PRIMARY KEY (parent_id, ordinal))""",
    "CREATE INDEX edges_child_node ON node_edges(child_node_id, parent_id)"
    " WHERE child_node_id IS NOT NULL",
    "CREATE INDEX edges_child_message ON node_edges(child_store_id, parent_id)"
    " WHERE child_store_id IS NOT NULL",
    """CREATE TABLE session_carry (
        session_id TEXT NOT NULL,
        node_id BIGINT NOT NULL REFERENCES nodes(node_id),
        ordinal INTEGER NOT NULL,
        PRIMARY KEY (session_id, node_id))""",
    """CREATE TABLE import_ledger (
        import_id TEXT NOT NULL,
        source_kind TEXT NOT NULL,
        source_key TEXT NOT NULL,
        target_kind TEXT NOT NULL,
        target_id TEXT NOT NULL,
        imported_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (import_id, source_kind, source_key))""",
    """CREATE TABLE session_owners (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        platform TEXT,
        user_id TEXT,
        chat_id TEXT,
        conversation_id TEXT,
        recorded_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX session_owners_owner ON session_owners(owner, session_id)",
    """CREATE TABLE prep_summaries (
        session_id TEXT NOT NULL,
        first_store_id BIGINT NOT NULL,
        last_store_id BIGINT NOT NULL,
        store_ids TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('claimed', 'ready')),
        owner TEXT NOT NULL,
        lease_until DOUBLE PRECISION NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        summary TEXT,
        PRIMARY KEY (session_id, first_store_id))""",
    """CREATE TABLE prep_condensed (
        session_id TEXT NOT NULL,
        group_key TEXT NOT NULL,
        depth INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('claimed', 'ready')),
        owner TEXT NOT NULL,
        lease_until DOUBLE PRECISION NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        summary TEXT,
        PRIMARY KEY (session_id, group_key))""",
    """CREATE TABLE evidence_assertions (
        assertion_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        subject_key TEXT NOT NULL,
        value TEXT NOT NULL,
        valid_from DOUBLE PRECISION,
        store_id BIGINT NOT NULL,
        start INTEGER NOT NULL,
        "end" INTEGER NOT NULL,
        quote TEXT NOT NULL,
        extractor TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        UNIQUE (store_id, start, "end", kind, subject_key))""",
    "CREATE INDEX evidence_assertions_subject ON evidence_assertions(subject_key, valid_from)",
    "CREATE INDEX evidence_assertions_session ON evidence_assertions(session_id, valid_from)",
    "CREATE TABLE evidence_scan (session_id TEXT PRIMARY KEY, last_store_id BIGINT NOT NULL)",
    """CREATE TABLE evidence_views (
        view_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL,
        question TEXT NOT NULL,
        body TEXT NOT NULL,
        trace_hash TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX evidence_views_session ON evidence_views(session_id, created_at)",
    """CREATE TABLE rollups (
        rollup_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('day', 'week', 'month')),
        period_key TEXT NOT NULL,
        time_zone TEXT NOT NULL,
        owner TEXT NOT NULL,
        period_start DOUBLE PRECISION NOT NULL,
        period_end DOUBLE PRECISION NOT NULL,
        text TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        source_token_count INTEGER NOT NULL,
        level INTEGER NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        message_count INTEGER NOT NULL,
        session_count INTEGER NOT NULL,
        time_from DOUBLE PRECISION,
        time_to DOUBLE PRECISION,
        watermark TEXT NOT NULL,
        built_at DOUBLE PRECISION NOT NULL,
        UNIQUE (kind, period_key, time_zone, owner))""",
    "CREATE INDEX rollups_period ON rollups(time_zone, owner, period_start, period_end)",
    """CREATE TABLE rollup_sources (
        rollup_id BIGINT NOT NULL REFERENCES rollups(rollup_id) ON DELETE CASCADE,
        ordinal INTEGER NOT NULL,
        child_rollup_id BIGINT REFERENCES rollups(rollup_id),
        child_node_id BIGINT,
        child_store_id BIGINT,
        PRIMARY KEY (rollup_id, ordinal),
        CHECK ((child_rollup_id IS NOT NULL)::int + (child_node_id IS NOT NULL)::int
               + (child_store_id IS NOT NULL)::int = 1))""",
    "CREATE INDEX rollup_sources_rollup ON rollup_sources(child_rollup_id)"
    " WHERE child_rollup_id IS NOT NULL",
    "CREATE INDEX rollup_sources_node ON rollup_sources(child_node_id)"
    " WHERE child_node_id IS NOT NULL",
    "CREATE INDEX rollup_sources_message ON rollup_sources(child_store_id)"
    " WHERE child_store_id IS NOT NULL",
    """CREATE TABLE rollup_sessions (
        rollup_id BIGINT NOT NULL REFERENCES rollups(rollup_id) ON DELETE CASCADE,
        session_id TEXT NOT NULL,
        PRIMARY KEY (rollup_id, session_id))""",
    """CREATE TABLE embedding_spaces (
        space_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        revision TEXT NOT NULL,
        dim INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        UNIQUE (provider, model, revision, dim))""",
    """CREATE TABLE embedding_vectors (
        space_id BIGINT NOT NULL REFERENCES embedding_spaces(space_id),
        kind TEXT NOT NULL,
        ref_id BIGINT NOT NULL,
        chunk INTEGER NOT NULL,
        text_hash TEXT NOT NULL,
        vector BYTEA)""",
    "CREATE UNIQUE INDEX embedding_vectors_key ON embedding_vectors(space_id, kind, ref_id, chunk)",
    "CREATE INDEX embedding_vectors_by_hash ON embedding_vectors(space_id, text_hash)",
    """CREATE TABLE session_views (
        session_id TEXT NOT NULL,
        origin TEXT NOT NULL,
        slot INTEGER NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        digest TEXT NOT NULL,
        entries TEXT NOT NULL,
        meta TEXT,
        PRIMARY KEY (session_id, origin, slot))""",
    "CREATE INDEX session_views_recent ON session_views(session_id, updated_at)",
    "CREATE INDEX session_views_updated ON session_views(updated_at)",
    # The schema's object names where the store's SQL looks for them (an import
    # ledger check, the doctor's structural check), as SQLite's catalogue shows them.
    """CREATE VIEW sqlite_master AS
        SELECT c.relname::text AS name, CASE c.relkind WHEN 'r' THEN 'table'
               WHEN 'v' THEN 'view' WHEN 'i' THEN 'index' ELSE 'other' END AS type
        FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace""",
]


@migration(1)
def pg001_schema(conn: Connection) -> None:
    """The whole schema as SQLite has it after its migration 11, with tsvector search."""
    for statement in _SCHEMA:
        conn.execute(statement)


@migration(2)
def pg002_trigram_index(conn: Connection) -> None:
    """A pg_trgm index for substring search (CJK runs, symbols) when the server has the
    extension; without it substring search scans, as on SQLite."""
    available = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm')"
    ).fetchone()[0]
    if not available:
        return
    conn.execute("SAVEPOINT trgm")
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception:  # not allowed to create it here: an operator enables it (README)
        conn.execute("ROLLBACK TO SAVEPOINT trgm")
        return
    trgm = conn.execute(
        "SELECT n.nspname FROM pg_opclass o JOIN pg_namespace n ON n.oid = o.opcnamespace"
        " WHERE o.opcname = 'gin_trgm_ops'").fetchone()[0]
    conn.execute(f"CREATE INDEX messages_trgm ON messages USING gin"
                 f" ((COALESCE(search_text, content)) {trgm}.gin_trgm_ops)")


@migration(3)
def pg003_accent_folding(conn: Connection) -> None:
    """Accents folded in full-text search as SQLite's FTS5 folds them (``unicode61
    remove_diacritics 2``): "cafe" finds "café" on both engines. The tsvector columns
    are recomputed with ``trove_words`` (a generated column's expression cannot be
    altered before PostgreSQL 17: the column is dropped and added again, which rewrites
    both tables once, in this migration's one transaction) and their GIN indexes rebuilt."""
    conn.execute(_TROVE_WORDS_V3)
    for table, expression in (("messages", MESSAGE_FTS), ("nodes", NODE_FTS)):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN fts")
        conn.execute(f"ALTER TABLE {table} ADD COLUMN fts tsvector"
                     f" GENERATED ALWAYS AS ({expression}) STORED")
        conn.execute(f"CREATE INDEX {table}_fts ON {table} USING gin (fts)")


@migration(4)
def pg004_payloads(conn: Connection) -> None:
    """Externalized payloads as rows (``storage/postgres/payloads``): hosts sharing the
    server restore and expand each other's large outputs (SQLite keeps files)."""
    conn.execute("CREATE TABLE IF NOT EXISTS payloads (sha256 TEXT PRIMARY KEY,"
                 " kind TEXT NOT NULL, mime TEXT, size BIGINT NOT NULL,"
                 " created_at DOUBLE PRECISION NOT NULL, data BYTEA NOT NULL)")


@migration(5)
def pg005_nul_is_a_separator(conn: Connection) -> None:
    """Words after a NUL byte are found as on SQLite (``TROVE_WORDS``): the stored
    escape of a NUL was read as a "0" glued to the next word. Only rows holding the
    escape character have other words now; they alone are rewritten (an UPDATE
    recomputes a row's generated ``fts``), after one scan of each table."""
    conn.execute(TROVE_WORDS)
    conn.execute(f"UPDATE messages SET content = content"
                 f" WHERE strpos({MESSAGE_BODY}, U&'\\E000') > 0")
    conn.execute("UPDATE nodes SET text = text WHERE strpos(text, U&'\\E000') > 0")


@migration(6)
def pg006_image_payload_refs_searchable(conn: Connection) -> None:
    """SQLite's migration 12 on the server: an image part's payload ref becomes a search
    token of its row (``migrations.reindex_image_payload_refs``; the UPDATE recomputes
    each changed row's generated ``fts``)."""
    reindex_image_payload_refs(conn)


@migration(7)
def pg007_rollups_of_one_owner(conn: Connection) -> None:
    """SQLite's migration 13 on the server: no rollup holds another owner's session
    (``migrations.drop_rollups_mixing_owners``)."""
    drop_rollups_mixing_owners(conn)



@migration(8)
def pg008_placeholders_are_not_embedded(conn: Connection) -> None:
    """SQLite's migration 14 on the server: messages embedded with their payload
    placeholders as words are embedded again without them
    (``VectorStore.drop_placeholder_vectors_in``)."""
    from ..vectors import VectorStore   # here: vectors needs database, which needs us
    VectorStore.drop_placeholder_vectors_in(conn)


@migration(9)
def pg009_words_of_any_locale(conn: Connection) -> None:
    """Words are split and folded as SQLite's FTS5 does them whatever the database's
    locale (``_TROVE_WORDS_V9``): on a C-locale database no word beyond ASCII was
    indexed or searchable, a final sigma was a letter of its own, and Greek and
    Cyrillic accents were dropped where SQLite keeps them. Only rows holding a
    non-ASCII character can change (ASCII text folds the same either way); they alone
    are rewritten (an UPDATE recomputes a row's generated ``fts``)."""
    conn.execute(trove_words_definition(conn))
    conn.execute(f"UPDATE messages SET content = content"
                 f" WHERE octet_length({MESSAGE_BODY}) <> char_length({MESSAGE_BODY})")
    conn.execute("UPDATE nodes SET text = text WHERE octet_length(text) <> char_length(text)")


@migration(10)
def pg010_phrases_past_the_last_position(conn: Connection) -> None:
    """A phrase past a tsvector's last position (16,383) is found, as FTS5 finds it
    (``TROVE_PHRASE``; queries only, no row changes)."""
    conn.execute(TROVE_PHRASE)


@migration(11)
def pg011_embedding_probes(conn: Connection) -> None:
    """SQLite's migration 15 on the server: each embedding space keeps its model's
    vector of the fixed probe text (``recall.probe``)."""
    conn.execute("ALTER TABLE embedding_spaces ADD COLUMN IF NOT EXISTS probe BYTEA")


REQUIRED_OBJECTS = ("sessions", "messages", "messages_fts", "nodes", "node_edges", "nodes_fts",
                    "session_carry", "trove_meta", "session_views", "session_owners")


def structural_check(conn: Connection) -> list[str]:
    """Names of required tables and search indexes that are missing (catalogue read only;
    an empty schema, opened read-only before its first migration, misses them all)."""
    if not conn.execute("SELECT to_regclass('sqlite_master')").fetchone()[0]:
        return list(REQUIRED_OBJECTS)
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    return [name for name in REQUIRED_OBJECTS if name not in present]
