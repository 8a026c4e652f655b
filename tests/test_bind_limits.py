"""Id lists that grow with the user's data are never bound one parameter per id: past the
engines' limits the statement fails (SQLite: SQLITE_MAX_VARIABLE_NUMBER, 32,766 on most
builds, 250,000 on Debian's; PostgreSQL: 65,535 per statement), and a session with that
many carried nodes could no longer use trove_query_state or trove_grep."""
import json
import sqlite3

import pytest

from hermes_trove.evidence import assertions
from hermes_trove.storage import database
from hermes_trove.storage.owners import LOCAL_OWNER, Owners
from test_tools import NOW, Env, call

# the limit a test lowers SQLite's connection to: a slice of ids and a few more parameters
SQLITE_TEST_LIMIT = database.IN_CHUNK + 50
PG_LIMIT = 65535            # PostgreSQL's, fixed by its wire protocol


@pytest.fixture
def tight(tmp_path, backend):
    """``(env, many)``: an Env whose engine refuses more than ``many - 1`` bound
    parameters in one statement. SQLite's limit is lowered on the shared connection (the
    error a 32,766-variable build gives past its own); PostgreSQL's cannot be, so there
    the lists are made longer than 65,535."""
    env = Env(tmp_path, backend[1], assertions_enabled="true")
    if env.db.dialect == "sqlite":
        env.db.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_TEST_LIMIT)
        many = SQLITE_TEST_LIMIT + 100
    else:
        many = PG_LIMIT + 100
    yield env, many
    database.forget_database(backend[1])


def filler_nodes(env, session: str, count: int) -> list[int]:
    """``count`` empty leaf nodes of ``session``, made by one statement (no bound list)."""
    with env.db.transaction() as conn:
        first = conn.execute("SELECT COALESCE(MAX(node_id), 0) FROM nodes").fetchone()[0]
        conn.execute(
            "INSERT INTO nodes(session_id, depth, text, token_count, source_token_count,"
            " message_count, level, created_at) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL"
            " SELECT i + 1 FROM n WHERE i < ?) SELECT ?, 0, 'filler', 1, 1, 0, 3, 0 FROM n",
            (count, session))
    return list(range(first + 1, first + count + 1))


def carry_many(env, session: str, count: int) -> None:
    """Carry ``count`` filler nodes of session A into ``session`` (one statement)."""
    filler_nodes(env, "A", count)
    with env.db.transaction() as conn:
        conn.execute("INSERT INTO session_carry(session_id, node_id, ordinal)"
                     " SELECT ?, node_id, node_id FROM nodes WHERE text = 'filler'", (session,))


def test_query_state_reads_carried_rows_past_the_parameter_limit(tight):
    """The carried closure was bound as one ``IN (?, ...)`` parameter per node."""
    env, many = tight
    row = env.ingest("A", [{"role": "user", "content": "My address is 12 Rua Augusta."}])[0]
    leaf = env.node("A", "Summary: the address.", store_ids=[row])
    assertions.save(env.db, "A", assertions.deterministic(env.store.get_message(row)), row)
    env.store.ensure_session("C")
    Owners(env.db).record("C", LOCAL_OWNER)
    env.dag.carry_nodes("C", [leaf])
    carry_many(env, "C", many)
    out = call(env.ctx("C"), "trove_query_state")
    assert "error" not in out, out
    assert [a["subject"] for a in out["assertions"]] == ["address"]


def test_grep_searches_summaries_with_a_carried_closure_past_the_parameter_limit(tight):
    """trove_grep's summary corpus read the carried closure's nodes with one parameter
    per node (``Dag.get_nodes``)."""
    env, many = tight
    row = env.ingest("A", [{"role": "user", "content": "The harbour crane is orange."}])[0]
    leaf = env.node("A", "Summary: the harbour crane is orange.", store_ids=[row])
    env.store.ensure_session("C")
    Owners(env.db).record("C", LOCAL_OWNER)
    env.dag.carry_nodes("C", [leaf])
    carry_many(env, "C", many)
    out = call(env.ctx("C"), "trove_grep", query="harbour crane")
    assert "error" not in out, out
    assert leaf in [r.get("node_id") for r in out["results"]]


def test_doctor_clean_apply_removes_more_sessions_than_the_parameter_limit(tmp_path):
    """doctor clean scans up to 100,000 sessions and removed every safe one with one
    parameter per session (twice over for the session rows) in each table's DELETE:
    with many junk sessions (a cron job's runs) the whole clean failed. SQLite only: on
    PostgreSQL the same slices run, and 65,536 sessions would take the scan minutes."""
    import dataclasses
    from hermes_trove.operators import actions as ops, housekeeping
    env = Env(tmp_path, doctor_clean_apply_enabled="true")
    env.db.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_TEST_LIMIT)
    count = SQLITE_TEST_LIMIT + 100
    try:
        with env.db.transaction() as conn:
            conn.execute(
                "INSERT INTO sessions(session_id, canonical_id, source, created_at, updated_at)"
                " WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
                " SELECT 'empty-' || i, 'empty-' || i, 'cli', 0, 0 FROM n", (count,))
            conn.execute("INSERT INTO session_owners(session_id, owner, recorded_at)"
                         " SELECT session_id, ?, 0 FROM sessions WHERE session_id LIKE 'empty-%'",
                         (LOCAL_OWNER,))
        config = dataclasses.replace(env.config, doctor_clean_apply_enabled=True)
        out = housekeeping.clean_apply(ops.open_target(config, writable=True),
                                       now=10 * 86400.0, min_idle_seconds=0)
        assert out["status"] == "cleaned", out
        assert len(out["removed_sessions"]) == count
        assert out["removed"]["session_rows"] == count and out["removed"]["owner_rows"] == count
        with env.db.reading() as conn:
            left = conn.execute("SELECT count(*) FROM sessions WHERE session_id LIKE"
                                " 'empty-%'").fetchone()[0]
        assert left == 0 and env.store.get_session("A") is not None
    finally:
        database.forget_database(str(tmp_path / "trove.db"))


# ---------------------------------------------------------------- an owner's many sessions
def owned_sessions(env, owner: str, count: int) -> None:
    """``count`` sessions of ``owner``, each with one message (a cron job's runs: one
    session per run), made by three statements (no bound list)."""
    with env.db.transaction() as conn:
        conn.execute(
            "INSERT INTO sessions(session_id, canonical_id, source, created_at, updated_at)"
            " WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " SELECT 'run-' || i, 'run-' || i, 'cron', 0, 0 FROM n", (count,))
        conn.execute("INSERT INTO session_owners(session_id, owner, recorded_at)"
                     " SELECT session_id, ?, 0 FROM sessions WHERE session_id LIKE 'run-%'",
                     (owner,))


@pytest.fixture
def crowded(tight):
    """``(env, rows)``: the local owner holds more sessions than the engine binds
    parameters, another owner holds one (so "all" is a filter, not every session);
    ``rows`` are the store ids of A's message, a cron run's and the other owner's."""
    env, many = tight
    mine = env.ingest("A", [{"role": "user", "content": "The lighthouse keeper paints "
                                                        "the door teal."}], at=NOW - 7200)[0]
    run = env.ingest("B", [{"role": "user", "content": "Cron report: the lighthouse "
                                                       "lamp was checked."}], at=NOW - 3600)[0]
    env.store.ensure_session("X", source="telegram")
    Owners(env.db).record("X", "telegram:user:9")
    theirs = env.ingest("X", [{"role": "user", "content": "Secret: the lighthouse "
                                                          "vault code is 4411."}], at=NOW - 1800)[0]
    for session, text in (("A", "My address is 12 Rua Augusta."), ("X", "My address is 9 Elm Road.")):
        row = env.ingest(session, [{"role": "user", "content": text}], at=NOW - 600)[0]
        assertions.save(env.db, session, assertions.deterministic(env.store.get_message(row)), row)
    owned_sessions(env, LOCAL_OWNER, many)
    return env, (mine, run, theirs)


def test_grep_and_recall_scope_all_past_the_parameter_limit(crowded):
    """An owner with more sessions than the engine's parameter limit (a cron job makes
    one per run): every "all" search bound one parameter per session."""
    env, (mine, run, theirs) = crowded
    leaf = env.node("B", "Summary: the lighthouse lamp passed its check.", store_ids=[run])
    hidden = env.node("X", "Summary: the lighthouse vault code.", store_ids=[theirs])
    for name, args in (("trove_grep", {"session_scope": "all"}), ("trove_recall", {})):
        out = call(env.ctx("A"), name, query="lighthouse", **args)
        assert "error" not in out, (name, out)
        found = {r.get("store_id") for r in out["results"]}
        assert {mine, run} <= found and theirs not in found, (name, out)
        nodes = {r.get("node_id") for r in out["results"]}
        assert hidden not in nodes, (name, out)
        assert name == "trove_grep" or leaf in nodes, out   # grep "all": raw rows only


def test_grep_scope_all_finds_text_fts_cannot_split_past_the_parameter_limit(crowded):
    """The substring fallback (CJK) scanned once per session of the scope."""
    env, (mine, run, theirs) = crowded
    row = env.ingest("B", [{"role": "user", "content": "灯塔守护者把门漆成了青色"}])[0]
    out = call(env.ctx("A"), "trove_grep", query="漆成了青", session_scope="all")
    assert "error" not in out, out
    assert row in [r.get("store_id") for r in out["results"]]


def test_query_state_and_recent_scope_all_past_the_parameter_limit(crowded):
    env, (mine, run, theirs) = crowded
    state = call(env.ctx("A"), "trove_query_state", session_scope="all")
    assert "error" not in state, state
    assert [a["subject"] for a in state["assertions"]] == ["address"], state
    assert "Rua Augusta" in json.dumps(state) and "Elm Road" not in json.dumps(state)
    recent = call(env.ctx("A"), "trove_recent", session_scope="all", period="last 7 days")
    assert "error" not in recent, recent
    listed = json.dumps(recent)
    assert "teal" in listed and "vault code" not in listed


def test_vector_search_scope_all_past_the_parameter_limit(crowded):
    """The vector arm's coverage count and its vector read bound the scope's sessions."""
    from fake_openai import FakeOpenAIServer
    from hermes_trove.config import load_config
    from hermes_trove.recall import semantic
    env, (mine, run, theirs) = crowded
    with FakeOpenAIServer() as fake:
        config = load_config(environ={
            "TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
            "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url},
            hermes_home=env.tmp)
        found = semantic.Semantic.open(env.db, config)
        semantic.backfill(env.db, found.provider, config, apply=True)
        ctx = env.ctx("A", config=config, semantic=found)
        out = call(ctx, "trove_grep", query="lighthouse lamp", session_scope="all",
                   mode="semantic")
    assert "error" not in out, out
    assert out["mode"] == "semantic", out
    found_ids = {r.get("store_id") for r in out["results"]}
    assert run in found_ids and theirs not in found_ids, out
