"""One store contract, two engines: what only a second engine can show.

The tool and engine suites (test_tools.py, test_engine.py) run on both engines
through the ``backend`` fixture (tests/pgkit.py); these tests cover what they do
not: the PostgreSQL schema's migrations, writers on two connections at once, the
session locks across connections, the search dialect, the URL's secrecy, a
missing psycopg, and ``trove.py migrate`` both ways.
"""
import sqlite3
import sys
import threading

import pytest

from hermes_trove.dag import Dag, NewNode
from hermes_trove.recall import query_plan, search as search_module
from hermes_trove.recall.query_plan import scoped, tag_scope
from hermes_trove.storage import alignment_rows, database, locks, migrations
from hermes_trove.storage.postgres import connection, schema, search
from hermes_trove.store import Store, decode_row
from hermes_trove.storage.vectors import SpaceIdentity, VectorRow, VectorStore
from hermes_trove.operators import actions as ops, migrate

from pgkit import PgSchema, c_locale_url, require_pg


def turns(tag: str, count: int) -> list[dict]:
    out = []
    for t in range(count):
        out.append({"role": "user", "content": f"{tag} question {t} about kumquat {t % 7}"})
        out.append({"role": "assistant", "content": f"{tag} answer {t}", "tool_calls": None})
    return out


# ---------------------------------------------------------------- no server needed
def test_fts5_expressions_become_tsqueries_with_bound_text():
    expr = scoped('"staging port" OR "6543"', tag_scope(["A"], role="user"))
    sql, params = search.tsquery(expr)
    assert sql.count("trove_phrase(") == 1 and sql.count("phraseto_tsquery(") == 1
    assert sql.count("?::tsquery") == 2
    assert params == ["'s41':D", "'r75736572':D", "staging port", "6543"]
    sql, params = search.tsquery('"kumquat" NOT body : ("secret")')
    assert "&& !!" in sql and params == ["kumquat", "secret"]
    with pytest.raises(ValueError):
        search.tsquery('("unbalanced"')


def test_statements_are_rewritten_outside_string_literals_only():
    sql = connection.translate("INSERT OR IGNORE INTO t(a) VALUES (?) -- '?%'")
    assert sql.startswith("INSERT INTO t(a) VALUES (%s)") and sql.endswith("ON CONFLICT DO NOTHING")
    assert connection.translate("SELECT 'a?b%' WHERE x LIKE ?") == "SELECT 'a?b%%' WHERE x ILIKE %s"
    assert "GREATEST(replay_floor, %s)" in connection.translate("SET f = MAX(replay_floor, ?)")
    upsert = connection.translate("INSERT OR REPLACE INTO session_views(session_id, origin, slot,"
                                  " entries) VALUES (?, ?, ?, ?)")
    assert upsert.endswith("ON CONFLICT (session_id, origin, slot) DO UPDATE SET"
                           " entries = EXCLUDED.entries")


def test_a_url_is_shown_without_its_password():
    url = "postgresql://trove:s3cr3t@db.example:5432/trove?sslmode=require&password=s3cr3t"
    assert connection.display_name(url) == "postgresql://trove@db.example:5432/trove"
    with pytest.raises(database.DatabaseError) as caught:
        database.get_database("postgresql://trove:s3cr3t@127.0.0.1:1/trove?connect_timeout=2")
    assert "s3cr3t" not in str(caught.value) and "127.0.0.1:1" in str(caught.value)


@pytest.mark.parametrize("url", [
    "postgresql://trove:s3cr3t%zz@127.0.0.1:1/trove",           # a stray % in the password
    "postgresql://trove@127.0.0.1:1/trove?password=s3cr3t%zz",  # ... or in the parameter
])
def test_a_url_libpq_cannot_read_never_echoes_its_password(url):
    """libpq quotes the piece of a URL it cannot read ("invalid percent-encoded token:
    ..."): the error must still not carry the password."""
    pytest.importorskip("psycopg")
    with pytest.raises(database.DatabaseError) as caught:
        database.get_database(url)
    assert "s3cr3t" not in str(caught.value) and "percent-encoded" in str(caught.value)


def test_without_psycopg_a_url_is_a_clear_error_not_a_crash(monkeypatch):
    connection._psycopg.cache_clear()
    monkeypatch.setitem(sys.modules, "psycopg", None)
    try:
        with pytest.raises(database.DatabaseError, match="psycopg 3 is not installed"):
            database.get_database("postgresql://u:pw@127.0.0.1:1/x")
    finally:
        connection._psycopg.cache_clear()


# ---------------------------------------------------------------- both engines
def test_writers_on_two_connections_store_every_row_once(backend):
    """Two connections (two processes' worth) ingest at once: each list is stored
    once, ids never collide and each session's rows keep their order."""
    name, target = backend
    first = database.get_database(target)
    second = (database.Database(target) if name == "sqlite" else
              database._open(target))  # a second connection to the same database
    try:
        lists = {"one": turns("one", 60), "two": turns("two", 60)}
        results, errors = {}, []

        def work(db, session):
            try:
                store = Store(db)
                for end in range(10, 121, 10):  # a growing list, as the host shows it
                    results[session] = store.ingest(session, lists[session][:end]).store_ids
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(db, s))
                   for db, s in ((first, "one"), (second, "two"))]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        assert not errors
        store = Store(first)
        ids = results["one"] + results["two"]
        assert len(set(ids)) == 240 and store.count_messages() == 240
        for session in ("one", "two"):
            rows = store.get_messages(results[session])
            assert [decode_row(rows[i]) for i in results[session]] == lists[session]
            assert results[session] == sorted(results[session])
    finally:
        second.close()


def test_substring_and_cjk_search_find_the_same_rows(backend):
    store = Store(database.get_database(backend[1]))
    ids = store.ingest("A", [{"role": "user", "content": "東京タワーの高さは333メートル"},
                             {"role": "user", "content": "path src/a_b.py:12 failed"},
                             {"role": "user", "content": "nothing here"}]).store_ids
    assert store.substring_scan("A", ["タワー"], limit=5, max_rows=100) == [ids[0]]
    assert store.substring_scan(None, ["a_b.py"], limit=5, max_rows=100) == [ids[1]]
    expr = scoped('"src" AND "a" AND "b" AND "py"', tag_scope(["A"]))
    assert [i for i, _ in store.match_message_ids(expr, limit=5, ranked=True)] == [ids[1]]


def test_the_identity_reads_gap_count_runs_on_both_engines(backend):
    """The count of rows between two of a view's rows (storage/alignment_rows.py): on
    PostgreSQL 15 its unnamed subquery was an error, and every turn whose list it
    read went unstored from then on (host walk 310003 on PostgreSQL)."""
    store = Store(database.get_database(backend[1]))
    ids = store.ingest("A", turns("A", 3)).store_ids
    with store.db.reading() as conn:
        assert alignment_rows.rows_between(conn, "A", ids[0], ids[5], 10) == 4
        assert alignment_rows.rows_between(conn, "A", ids[0], ids[5], 2) == 2   # counted up to enough
        assert alignment_rows.rows_between(conn, "B", ids[0], ids[5], 10) == 0


def test_accents_and_case_fold_the_same_on_both_engines(backend):
    """SQLite's FTS5 folds accents (unicode61 remove_diacritics 2); the server's
    tsvector words do too (trove_words): either spelling finds either text."""
    store = Store(database.get_database(backend[1]))
    ids = store.ingest("A", [{"role": "user", "content": "Un café NAÏVE à Ångström"},
                             {"role": "user", "content": "plain cafe naive angstrom"},
                             {"role": "user", "content": "東京 한국어 Łódź"}]).store_ids

    def found(expr):
        return sorted(i for i, _ in store.match_message_ids(expr, limit=10, ranked=False))

    for word in ('"cafe"', '"café"', '"CAFÉ"', '"naive"', '"naïve"', '"angstrom"',
                 '"Ångström"'):
        assert found(word) == ids[:2], word
    assert found('"un café"') == [ids[0]]          # a phrase keeps its order
    assert found('"lodz"') == []                    # Ł has no decomposition, as in SQLite
    assert found('"łódź"') == found('"łodz"') == [ids[2]]
    assert found('"한국어"') == [ids[2]]


def test_a_prefix_of_no_word_matches_nothing_on_both_engines(backend):
    """``"+++"*`` has no word to take as a prefix: FTS5 matches nothing, and so must
    the server (a bare ``:*`` tsquery was a syntax error there)."""
    store = Store(database.get_database(backend[1]))
    ids = store.ingest("A", [{"role": "user", "content": "alpha beta gamma"}]).store_ids
    for expr in ('"+++"*', '"alpha" OR "%%"*'):
        for ranked in (True, False):
            assert [i for i, _ in store.match_message_ids(expr, limit=5, ranked=ranked)] == (
                ids if "alpha" in expr else []), expr
        assert store.count_message_matches(expr, cap=5) == (1 if "alpha" in expr else 0)
    assert [i for i, _ in store.match_message_ids('"alpha be"*', limit=5, ranked=False)] == ids


def test_words_after_a_nul_byte_are_found_on_both_engines(backend):
    """A NUL separates words, as in FTS5: the server stores it escaped (U+E000 "0"),
    and that escape must not glue a "0" to the next word of a message or a summary."""
    db = database.get_database(backend[1])
    store, dag = Store(db), Dag(db)
    ids = store.ingest("A", [{"role": "tool", "tool_call_id": "c1",
                              "content": "header\0zebra payload"},
                             {"role": "user", "content": "caf\u00e9\0walrus"}]).store_ids
    node = dag.add_node(NewNode(session_id="A", depth=0, text="summary\0okapi seen",
                                token_count=5, source_token_count=10, level=1, model="m",
                                child_store_ids=ids))

    def found(expr):
        return sorted(i for i, _ in store.match_message_ids(expr, limit=10, ranked=False))

    assert found('"zebra"') == [ids[0]] and found('"header zebra"') == [ids[0]]
    assert found('"walrus"') == [ids[1]] and found('"cafe"') == [ids[1]]
    assert found('"0zebra"') == found('"0walrus"') == []
    assert store.count_message_matches('"zebra"', cap=10) == 1
    assert [n for n, _ in dag.match_node_ids('"okapi"', limit=5, ranked=False)] == [node]
    assert dag.match_node_ids('"0okapi"', limit=5, ranked=False) == []


def test_a_phrase_past_the_tsvectors_last_position_is_found_on_both_engines(backend):
    """A tsvector keeps no position past 16,383: every later word of a long tool output
    sat at that one position and no phrase there matched on the server (FTS5 finds it
    anywhere); a quoted search fell back to "partial matches" with rows lacking it."""
    store = Store(database.get_database(backend[1]))
    filler = " ".join(f"w{i % 50}" for i in range(16_380))
    ids = store.ingest("A", [
        {"role": "tool", "tool_call_id": "c1", "content": filler + " x zebra okapi gnu"},
        {"role": "tool", "tool_call_id": "c2", "content": filler + " zebra okapi gnu"},
        {"role": "tool", "tool_call_id": "c3", "content": filler + " a b c d zebra okapi gnu"},
        {"role": "user", "content": "zebra alone, okapi alone, gnu alone"},
        {"role": "user", "content": "gnu zebra okapi in another order"}]).store_ids

    def found(expr):
        return sorted(i for i, _ in store.match_message_ids(expr, limit=10, ranked=False))

    assert found('"zebra okapi gnu"') == ids[:3]             # crossing it, and past it
    assert found('"zebra okapi"') == [*ids[:3], ids[4]]
    assert found('"gnu zebra"') == [ids[4]]
    assert found('"okapi zebra"') == found('"w3 zebra"') == []
    assert found('"gnu" NOT body : ("okapi zebra")') == ids    # not the phrase: kept
    assert found('"gnu" NOT body : ("okapi gnu")') == ids[3:]
    assert store.count_message_matches('"zebra okapi gnu"', cap=10) == 3
    corpus = search_module.MessageCorpus(store, search_module.MessageScope(
        ("A",), current_session="A"))
    outcome = search_module.ranked_search(corpus, query_plan.parse_query('"okapi gnu"'), 10)
    assert sorted(h.key for h in outcome.hits) == ids[:3] and not outcome.notes


# ---------------------------------------------------------------- PostgreSQL only
@pytest.fixture
def pg():
    require_pg()
    created = PgSchema()
    yield created
    created.drop()


def test_server_migrations_are_numbered_recorded_and_applied_once(pg):
    db = database.get_database(pg.url)
    versions = [r[0] for r in db.conn.execute("SELECT version FROM trove_migrations ORDER BY 1")]
    assert versions == list(range(1, schema.latest_version() + 1))
    assert db.missing_objects == [] and db.schema_version() == schema.latest_version()
    database.forget_database(pg.url)
    again = database.get_database(pg.url)
    assert schema.migrate(again.conn, migrations.SchemaTooNewError) == []
    again.conn.execute("INSERT INTO trove_migrations VALUES (999, 'future', 0)")
    database.forget_database(pg.url)
    with pytest.raises(migrations.SchemaTooNewError, match="newer than this hermes-trove"):
        database.get_database(pg.url)


def test_session_locks_are_advisory_locks_other_connections_see(pg):
    db = database.get_database(pg.url)
    Store(db).ensure_session("S")
    other = database._open(pg.url)  # another process's connection
    try:
        with locks.session_compaction(pg.url, "S", timeout=1):
            slot = locks._slot("S")
            key = locks.pg_locks._key(other.conn, locks.pg_locks.COMPACTION, slot)
            assert other.conn.execute("SELECT pg_try_advisory_lock(?)", key).fetchone()[0] is False
        assert other.conn.execute("SELECT pg_try_advisory_lock(?)", key).fetchone()[0] is True
        other.conn.execute("SELECT pg_advisory_unlock(?)", key)
        locks.hold_sessions(pg.url, {"S"})
        assert locks.pg_locks.held_elsewhere(other, locks.pg_locks.HOLD, slot)
        locks.hold_sessions(pg.url, set())
        assert not locks.pg_locks.held_elsewhere(other, locks.pg_locks.HOLD, slot)
    finally:
        other.close()


def test_migrate_a_file_to_the_server_and_back(pg, tmp_path):
    source = str(tmp_path / "trove.db")
    store, dag = Store(database.get_database(source)), Dag(database.get_database(source))
    messages = turns("fleet", 40) + [{"role": "tool", "tool_call_id": "c1", "content": "a\0b"}]
    ids = store.ingest("A", messages).store_ids
    leaf = dag.add_node(NewNode(session_id="A", depth=0, text="kumquat summary", token_count=3,
                                source_token_count=100, level=3, model="deterministic",
                                child_store_ids=ids[:10]))
    dry = migrate.migrate(source, pg.url, apply=False)
    assert dry["mode"] == "dry_run" and database.get_database(pg.url).conn.execute(
        "SELECT count(*) FROM messages").fetchone()[0] == 0
    done = migrate.migrate(source, pg.url, apply=True)
    assert done["verified"], done
    again = migrate.migrate(source, pg.url, apply=True)
    assert again["verified"] and sum(t["copied"] for t in again["tables"]) == 0
    server = Store(database.get_database(pg.url))
    rows = server.get_messages(ids)
    assert [decode_row(rows[i]) for i in ids] == messages  # exact, NUL byte included
    assert [n for n, _ in Dag(server.db).match_node_ids('"kumquat"', limit=5, ranked=False)] == [leaf]
    assert server.ingest("A", messages + [{"role": "user", "content": "new"}]).inserted == 1
    back = str(tmp_path / "back.db")
    assert migrate.migrate(pg.url, back, apply=True)["verified"]
    returned = Store(database.get_database(back))
    rows = returned.get_messages(ids)
    assert [decode_row(rows[i]) for i in ids] == messages
    assert returned.count_messages() == len(messages) + 1
    assert returned.fts_row_counts() == {"rows": len(messages) + 1, "fts_docs": len(messages) + 1}
    for path in (source, back):
        database.forget_database(path)


def test_migrate_refuses_a_server_holding_another_hosts_rows(pg, tmp_path):
    """Another host's store_id 1 is another message: the copy skipped the source's rows
    whose keys the server had (reported "verified") and filed the source's vectors
    under a space id the server uses for another model; now nothing is written."""
    def host(target, text, identity):
        db = database.get_database(target)
        ids = Store(db).ingest(text, [{"role": "user", "content": text}]).store_ids
        vectors = VectorStore(db)
        vectors.write(vectors.space_id(identity),
                      [VectorRow("m", ids[0], 0, text, b"\0" * 4 * identity.dim)])
    source = str(tmp_path / "trove.db")
    host(source, "the laptop's row", SpaceIdentity("openai", "a", "u", 8))
    host(pg.url, "the server's row", SpaceIdentity("local", "m", "r", 4))
    before = database.get_database(pg.url).conn.execute(
        "SELECT count(*) FROM sessions").fetchone()[0]
    for apply in (False, True):
        with pytest.raises(ops.OperatorError, match="other rows under this source's keys"):
            migrate.migrate(source, pg.url, apply=apply)
    assert database.get_database(pg.url).conn.execute(
        "SELECT count(*) FROM sessions").fetchone()[0] == before
    database.forget_database(source)


def test_a_migrate_dry_run_never_creates_or_migrates_the_server_schema(pg, tmp_path,
                                                                      monkeypatch):
    # the dry run opened the server with get_database, which creates or migrates its schema
    source = str(tmp_path / "trove.db")
    Store(database.get_database(source)).ingest("A", turns("dry", 3))
    database.forget_database(source)
    tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = ?"
    plain = connection.Connection(pg.url)
    try:
        dry = migrate.migrate(source, pg.url, apply=False)
        assert plain.execute(tables, (pg.name,)).fetchone()[0] == 0   # still an empty schema
        assert {t["target_rows_before"] for t in dry["tables"]} == {0}
        assert dry["target"] == connection.display_name(pg.url)
        with monkeypatch.context() as patch:           # a server at an older schema version
            patch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])
            database.get_database(pg.url)
            database.forget_database(pg.url)
        with pytest.raises(ops.OperatorError, match="schema version 2.*--apply does"):
            migrate.migrate(source, pg.url, apply=False)
        assert schema.schema_version(plain) == 2
        assert migrate.migrate(source, pg.url, apply=True)["verified"]
        back = tmp_path / "back" / "trove.db"            # and back: nothing made on either side
        again = migrate.migrate(pg.url, str(back), apply=False)
        assert again["tables"][2] == {"table": "messages", "source_rows": 6,
                                      "target_rows_before": 0}
        assert not back.parent.exists()
    finally:
        plain.close()
        database.forget_database(pg.url)


def test_migration_3_refolds_the_words_of_an_existing_schema(pg, monkeypatch):
    """A server schema from before accent folding (migrations 1-2) keeps every row and
    finds it by the folded spelling once migration 3 has run."""
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])
        old = Store(database.get_database(pg.url))
        ids = old.ingest("A", [{"role": "user", "content": "Un café à Ångström"}]).store_ids
        assert old.db.schema_version() == 2
        database.forget_database(pg.url)
    store = Store(database.get_database(pg.url))
    assert store.db.schema_version() == schema.latest_version() >= 3
    assert [i for i, _ in store.match_message_ids('"cafe"', limit=5, ranked=False)] == ids
    assert store.fts_row_counts() == {"rows": 1, "fts_docs": 1}


def test_migration_5_reindexes_the_words_after_a_nul_of_existing_rows(pg, monkeypatch):
    """Rows stored before migration 5 (a NUL's escape read as "0" + the next word)
    are found by that word once it has run; rows without a NUL are left alone."""
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:4])
        old = Store(database.get_database(pg.url))
        ids = old.ingest("A", [{"role": "user", "content": "header\0zebra"},
                               {"role": "user", "content": "plain zebra"}]).store_ids
        assert old.db.schema_version() == 4
        database.forget_database(pg.url)
    store = Store(database.get_database(pg.url))
    assert store.db.schema_version() == schema.latest_version() >= 5
    assert sorted(i for i, _ in store.match_message_ids('"zebra"', limit=5, ranked=False)) == ids
    assert store.get_messages(ids)[ids[0]]["content"] == "header\0zebra"


def test_migration_9_finds_non_latin_words_of_a_c_locale_database(monkeypatch):
    """On a database made with the C locale, lower() and [[:alnum:]] know no letter
    beyond ASCII: before migration 9 no Greek, Cyrillic or Korean word of a message or
    a summary was indexed. Its rows are found once it has run; the text is unchanged."""
    created = PgSchema(c_locale_url())
    try:
        with monkeypatch.context() as patch:
            patch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:8])
            db = database.get_database(created.url)
            ids = Store(db).ingest("A", [{"role": "user", "content": "ΛΌΓΟΣ Привет 한국어"},
                                         {"role": "user", "content": "plain ascii"}]).store_ids
            node = Dag(db).add_node(NewNode(session_id="A", depth=0, text="Ωμέγα ёлка",
                                            token_count=5, source_token_count=10, level=1,
                                            model="m", child_store_ids=ids))
            assert db.schema_version() == 8
            database.forget_database(created.url)
        db = database.get_database(created.url)
        store, dag = Store(db), Dag(db)
        assert db.schema_version() == schema.latest_version() >= 9
        for word in ('"λόγος"', '"ΛΌΓΟΣ"', '"привет"', '"한국어"'):
            assert [i for i, _ in store.match_message_ids(word, limit=5, ranked=False)] == \
                ids[:1], word
        assert [n for n, _ in dag.match_node_ids('"ёлка"', limit=5, ranked=False)] == [node]
        assert store.get_messages(ids)[ids[0]]["content"] == "ΛΌΓΟΣ Привет 한국어"
    finally:
        database.forget_database(created.url)
        created.drop()


def test_a_failed_search_inside_a_transaction_is_a_sqlite_error_and_rolls_back(pg):
    """The planner setting of a count (``index_first``) never masks the statement's own
    error, and the rollback leaves sequential scans allowed again."""
    db = database.get_database(pg.url)
    with pytest.raises(sqlite3.OperationalError):
        with db.transaction() as conn:
            with conn.index_first():
                conn.execute("SELECT no_such_column FROM messages")
    assert db.conn.execute("SHOW enable_seqscan").fetchone()[0] == "on"
