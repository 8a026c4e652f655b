"""The doctor's apply paths (clean, repair, source) and backup on both engines.

``tests/test_command.py`` checks these commands in depth on SQLite, reading the
file with ``sqlite3``; here the same commands run through ``command.handle`` once
on SQLite and once on a PostgreSQL schema (the ``backend`` fixture), and every
check reads through the store's own connection, so it means the same on both.
What only one engine has (FTS5 shadow tables, a file to damage) stays in
test_command.py; on PostgreSQL the search columns are computed by the server.
"""
import json
from pathlib import Path

import pytest

from enginekit import close_databases, drive, make_engine
from hermes_trove import command
from hermes_trove.operators import actions as ops
from hermes_trove.storage import database
from test_cli import run
from test_command import backup_path, clean_world


@pytest.fixture(autouse=True)
def on_engine(engines_on_backend, backend, tmp_path, monkeypatch):
    """HERMES_HOME under tmp_path; on PostgreSQL, TROVE_DATABASE_URL names the schema
    (for the engines the test makes and for the operator commands alike)."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    if engines_on_backend == "postgresql":
        monkeypatch.setenv("TROVE_DATABASE_URL", backend[1])
    yield engines_on_backend
    for key in list(database._registry):
        database.forget_database(key)


def column(db, sql, *params) -> list:
    """The first column of a query on the store's connection (either engine)."""
    with db.reading() as conn:
        return [r[0] for r in conn.execute(sql, params)]


def assert_backup(text: str, engine: str) -> None:
    """The apply answer names a backup written first: a SQLite copy or a pg_dump archive."""
    path = backup_path(text)
    assert path.exists() and path.stat().st_size > 0
    assert path.read_bytes().startswith(b"PGDMP" if engine == "postgresql" else b"SQLite format 3")


def test_clean_removes_the_same_sessions_on_both_engines(on_engine, tmp_path, monkeypatch):
    engine, other = clean_world(tmp_path, monkeypatch)
    db = engine.store.db
    scan = command.handle("doctor clean")
    assert "7 candidates" in scan and "5 safe to remove, 2 protected" in scan
    assert "protected: live session" in scan
    text = command.handle("doctor clean apply")
    assert_backup(text, on_engine)
    assert "removed 5 sessions" in text
    assert "rows deleted: 307 messages, 0 nodes, 0 edges, 0 carry rows, 6 session rows" in text
    assert set(column(db, "SELECT session_id FROM sessions")) == {
        "sess", "real-2", "hb-old", "trove-ephemeral-live"}
    assert not column(db, "SELECT owner FROM session_owners WHERE session_id = 'hb-1'")
    counts = engine.store.fts_row_counts()
    assert counts["rows"] == counts["fts_docs"]  # the search index followed the deletes
    assert not engine.store.match_message_ids('"quick"', limit=10, ranked=False)
    assert engine.store.match_message_ids('"parser"', limit=10, ranked=False)
    assert "nothing to do: no safe candidates" in command.handle("doctor clean apply")
    assert other.canonical_id == "trove-ephemeral-live"


def test_repair_on_a_healthy_store_is_a_noop_and_apply_rebuilds_behind_a_backup(on_engine,
                                                                                tmp_path,
                                                                                monkeypatch):
    engine = make_engine(tmp_path, window=1_000_000, fresh_tail_count=8,
                         fts_integrity_check_interval_hours=0)
    messages, _, _ = drive(engine, 10)
    engine.ingest(messages)
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    assert "no problems" in command.handle("doctor repair")
    # the rebuild steps themselves run on both engines and change no row
    before = column(engine.store.db, "SELECT content_hash FROM messages ORDER BY store_id")
    engine.store.rebuild_message_fts()
    engine.dag.rebuild_node_fts()
    engine.store.reindex_all()
    assert column(engine.store.db, "SELECT content_hash FROM messages ORDER BY store_id") == before
    assert engine.store.fts_row_counts() == {"rows": 40, "fts_docs": 40}
    assert engine.store.match_message_ids('"handler_3"', limit=5, ranked=True)
    assert "no problems" in command.handle("doctor repair")


def test_source_fix_sets_blank_sources_and_search_tags_follow(on_engine, tmp_path, monkeypatch):
    engine = make_engine(tmp_path, window=1_000_000, fresh_tail_count=8)
    messages, _, _ = drive(engine, 5)
    engine.ingest(messages)
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    db = engine.store.db
    with db.transaction() as conn:
        conn.execute("UPDATE messages SET source = ' ' WHERE store_id IN (3, 4)")
    assert "2 messages and 0 sessions" in command.handle("doctor source")
    text = command.handle("doctor source apply")
    assert_backup(text, on_engine)
    assert column(db, "SELECT source FROM messages WHERE store_id IN (3, 4) ORDER BY 1") == [
        "unknown", "unknown"]
    unknown_tag = "p" + "unknown".encode().hex()
    assert sorted(i for i, _ in engine.store.match_message_ids(
        f'tags : "{unknown_tag}"', limit=10, ranked=False)) == [3, 4]
    assert "no blank or whitespace-only sources" in command.handle("doctor source")


def test_backup_is_written_and_recorded_on_both_engines(on_engine, tmp_path, monkeypatch):
    engine = make_engine(tmp_path, window=1_000_000)
    engine.ingest([{"role": "user", "content": "keep this"}])
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    text = command.handle("backup")
    written = Path(engine.store.get_meta(ops.LAST_BACKUP_KEY))
    assert written.exists() and written.parent == tmp_path / "backups"
    assert str(written) in text


def test_status_and_doctor_without_a_live_engine_read_the_configured_database(on_engine, tmp_path,
                                                                             backend):
    # from outside a session (no live engine) the commands open what the settings name:
    # with TROVE_DATABASE_URL they said "none yet at $HERMES_HOME/trove.db" and never
    # asked the server
    engine = make_engine(tmp_path, window=1_000_000, fts_integrity_check_interval_hours=0)
    engine.ingest([{"role": "user", "content": "keep this"},
                   {"role": "assistant", "content": "kept"}])
    close_databases()
    shown = engine.config.database_display.split("?")[0]      # a server without its options
    status = command.handle("status")
    assert f"database: {shown} (" in status and ": 2 messages" in status, status
    doctor = command.handle("doctor")
    assert "no trove database" not in doctor and "] messages_fts_rows: " in doctor, doctor
    env = {"TROVE_DATABASE_URL": backend[1]} if on_engine == "postgresql" else {}
    done = run(tmp_path, "doctor", "--json", env=env)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["database_path"].startswith(shown)
    assert "messages_fts_rows" in {c["name"] for c in report["checks"]}


def test_repair_finds_an_invalid_server_index_and_rebuilds_it(on_engine, tmp_path, monkeypatch):
    """PostgreSQL's damage: a search index left invalid (a failed build). SQLite's (an
    FTS5 index out of step with its rows) is test_command.py's repair test."""
    if on_engine != "postgresql":
        pytest.skip("the SQLite twin is test_command.py::test_repair_diagnoses_then_rebuilds")
    engine = make_engine(tmp_path, window=1_000_000, fts_integrity_check_interval_hours=0)
    messages, _, _ = drive(engine, 5)
    engine.ingest(messages)
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    with engine.store.db.transaction() as conn:   # the test server's user is a superuser
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid ="
                     " to_regclass('messages_fts')")
    preview = command.handle("doctor repair")
    assert "messages_fts: the index is invalid" in preview and "would: rebuild" in preview
    text = command.handle("doctor repair apply")
    assert_backup(text, on_engine)
    assert "after: no problems" in text
    assert "no problems" in command.handle("doctor repair")
