"""The /trove slash command: every subcommand and apply path through the handler,
backups written before any change, refusals, and one real-host run."""
import sqlite3
import time
from pathlib import Path

import pytest

import hostkit as hk
from enginekit import drive, make_engine
import hermes_trove
from hermes_trove import command
from hermes_trove.storage import database
from hermes_trove.operators import actions as ops
from hermes_trove.operators import housekeeping
from hermes_trove.dag import NewNode
from hermes_trove.storage.database import Database
from hostkit import trove_host  # noqa: F401 (fixture; fake_llm is overridden below)

ISSUE_COMMANDS = ["status", "doctor", "doctor clean", "doctor clean apply", "doctor repair",
                  "doctor repair apply", "doctor source", "doctor source apply",
                  "doctor retention", "backup", "rotate", "rotate apply", "help"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test gets its own HERMES_HOME and no calling session; connections closed after."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    yield
    for key in list(database._registry):
        database.forget_database(key)


@pytest.fixture
def live(tmp_path, monkeypatch):
    """A unit engine bound to session ``sess`` with 20 turns stored, called from ``sess``."""
    engine = make_engine(tmp_path, window=1_000_000, fresh_tail_count=8,
                         fts_integrity_check_interval_hours=0)
    messages, _, _ = drive(engine, 20)
    engine.ingest(messages)
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    return engine


def rows(path, sql, *params):
    """Read a database file directly (the live one or a backup)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def snapshot(path) -> dict:
    """Every row of the tables an action could change."""
    return {t: rows(path, f"SELECT * FROM {t} ORDER BY 1")
            for t in ("sessions", "messages", "nodes", "node_edges", "session_carry")}


def backup_path(text: str) -> Path:
    """The backup file an apply answer names."""
    line = next(l for l in text.splitlines() if l.startswith("backup written first: "))
    return Path(line.split(": ", 1)[1].split(" (")[0])


# ---------------------------------------------------------------- registration and help
class FakeCtx:
    """Records what the plugin registers, like the host's PluginContext."""

    def __init__(self):
        self.commands, self.hooks, self.engines = {}, {}, []

    def register_context_engine(self, engine):
        self.engines.append(engine)

    def register_hook(self, name, fn):
        self.hooks[name] = fn

    def register_command(self, name, handler, description="", args_hint=""):
        self.commands[name] = (handler, description, args_hint)


@pytest.mark.parametrize("enabled", [False, True])
def test_registered_only_when_the_setting_is_on(monkeypatch, enabled):
    if enabled:
        monkeypatch.setenv("TROVE_ENABLE_SLASH_COMMAND", "true")
    ctx = FakeCtx()
    hermes_trove.register(ctx)
    assert ("trove" in ctx.commands) is enabled
    if enabled:
        handler, description, hint = ctx.commands["trove"]
        assert handler is command.handle and description and "rotate" in hint


def test_help_lists_every_command():
    text = command.handle("help")
    for words in ISSUE_COMMANDS:
        assert f"/trove {words} " in text, words
    assert set(ISSUE_COMMANDS) <= {" ".join(w) for w in command.ACTIONS}
    assert "TROVE_DOCTOR_CLEAN_APPLY_ENABLED" in text


@pytest.mark.parametrize("args", ["frobnicate", "doctor clean now", "rotate apply please",
                                  "status extra"])
def test_unknown_subcommand_gives_help_not_a_traceback(live, args):
    text = command.handle(args)
    assert text.startswith(f"/trove: unknown subcommand {args!r}")
    assert "/trove doctor clean apply" in text and "Traceback" not in text


# ---------------------------------------------------------------- status
def test_status_names_the_session_last_rotate_and_last_backup(live):
    text = command.handle("")
    assert text == command.handle("status")
    assert "session: sess" in text and "80 messages" in text
    assert "last rotate: never" in text and "last backup: none recorded" in text
    command.handle("rotate apply")
    written = command.handle("backup").split(": ", 1)[1].split(" (")[0]
    text = command.handle("status")
    state = live.store.get_session("sess")["state"]
    assert f"backup {state['last_rotate_backup']}" in text
    assert command.when(state["last_rotate_at"]) in text
    assert f"last backup: {written} at " in text


def test_status_without_a_live_engine_reads_the_configured_database(tmp_path, monkeypatch):
    engine = make_engine(tmp_path, session="other")
    engine.ingest([{"role": "user", "content": "hello"}])
    monkeypatch.setenv("HERMES_SESSION_ID", "not-a-live-session")
    assert command.resolve_target().engine is None
    text = command.handle("status")
    assert str(tmp_path / "trove.db") in text and "1 messages" in text
    assert "no live trove engine" in text
    assert "session: not-a-live-session (nothing stored for it)" in text
    monkeypatch.setenv("HERMES_SESSION_ID", "other")  # a live engine in this process again
    assert "session: other" in command.handle("status")


def test_status_without_any_database_answers_clearly(tmp_path):
    text = command.handle("status")
    assert f"database: none yet at {tmp_path / 'trove.db'}" in text
    assert not (tmp_path / "trove.db").exists()  # a status must not create one


# ---------------------------------------------------------------- read-only commands
@pytest.mark.parametrize("args", ["doctor", "doctor full", "doctor clean", "doctor repair",
                                  "doctor source", "doctor retention", "rotate"])
def test_read_only_commands_change_nothing(live, args):
    db = live.config.resolved_database_path
    before = snapshot(db)
    text = command.handle(args)
    assert "Traceback" not in text and "failed" not in text
    assert snapshot(db) == before
    assert not (db.parent / "backups").exists()


def test_doctor_reports_every_check(live):
    text = command.handle("doctor")
    assert text.startswith("trove doctor: overall ")
    for name in ("journal_mode", "quick_check", "messages_fts_rows", "session_bound"):
        assert f"] {name}: " in text


def test_retention_buckets_by_age(live):
    text = command.handle("doctor retention")
    assert "< 1 day" in text and "sess: 80 messages" in text
    later = housekeeping.retention(ops.open_target(live.config, live),
                                   now=time.time() + 40 * ops.DAY)
    assert [b["age"] for b in later["messages_by_age"]] == ["30-90 days"]
    assert later["messages_by_age"][0]["messages"] == 80


# ---------------------------------------------------------------- backup and rotate
def test_backup_is_a_consistent_online_copy(live):
    text = command.handle("backup")
    path = Path(text.split(": ", 1)[1].split(" (")[0])
    assert path.parent == live.config.resolved_database_path.parent / "backups"
    assert rows(path, "SELECT count(*) FROM messages") == [(80,)]
    assert rows(path, "PRAGMA journal_mode") == [("delete",)]
    assert live.store.get_meta(ops.LAST_BACKUP_KEY) == str(path)


def test_two_backups_in_one_second_never_replace_each_other(live, monkeypatch):
    """Backup names have a one-second resolution: the second backup of a second got the
    first one's name and replaced it, so a pre-clean copy could be lost to a rerun."""
    from hermes_trove.storage import backup as backups
    frozen = time.gmtime()
    monkeypatch.setattr(backups.time, "gmtime", lambda *args: frozen)
    written = lambda text: Path(text.split(": ", 1)[1].split(" (")[0])  # noqa: E731
    first = written(command.handle("backup"))
    live.ingest([{"role": "user", "content": "one more message after the first backup"}])
    second = written(command.handle("backup"))
    assert first != second and first.exists() and second.exists()
    assert second.name == first.stem + "-1.db"
    assert rows(first, "SELECT count(*) FROM messages") == [(80,)]
    assert rows(second, "SELECT count(*) FROM messages") == [(81,)]
    assert not [p for p in first.parent.iterdir() if ".tmp-" in p.name]


def test_rotate_preview_apply_and_noop_through_the_handler(live):
    db = live.config.resolved_database_path
    preview = command.handle("rotate")
    assert "(preview): 72 older messages" in preview and "newest 8 stay verbatim" in preview
    assert live.dag.stats()["nodes"] == 0
    before = snapshot(db)
    applied = command.handle("rotate apply")
    assert "72 older messages" in applied and "were summarized" in applied
    backup = backup_path(applied)
    assert backup.name.endswith("rotate-latest.db")
    assert snapshot(backup) == before  # the backup holds the state before the rotate
    assert live.dag.stats()["nodes"] >= 1 and live.store.get_session("sess")["replay_floor"] > 0
    assert "nothing to do: already rotated" in command.handle("rotate")
    assert "nothing to do" in command.handle("rotate apply")


def test_rotate_refuses_an_ignored_session(tmp_path, monkeypatch):
    engine = make_engine(tmp_path, session=None, ignore_session_patterns="cron-*")
    engine.on_session_start("cron-7", platform="cli")
    monkeypatch.setenv("HERMES_SESSION_ID", "cron-7")
    for args in ("rotate", "rotate apply"):
        text = command.handle(args)
        assert "refused" in text and "ignored" in text and "cron-*" in text


def test_rotate_without_a_live_engine_is_refused(live, monkeypatch):
    monkeypatch.setenv("HERMES_SESSION_ID", "someone-else")
    assert "refused: no live trove session" in command.handle("rotate apply")


# ---------------------------------------------------------------- doctor clean
def test_clean_apply_is_refused_without_the_setting(live):
    db = live.config.resolved_database_path
    live.store.ensure_session("empty-1")
    before = snapshot(db)
    text = command.handle("doctor clean apply")
    assert "refused" in text and "TROVE_DOCTOR_CLEAN_APPLY_ENABLED=true" in text
    assert snapshot(db) == before and not (db.parent / "backups").exists()


def junk_database(tmp_path, **settings):
    """A live session plus junk of every kind, one protected by a carried node."""
    engine = make_engine(tmp_path, window=1_000_000, **settings)
    store, dag = engine.store, engine.dag

    def add(session, messages):
        store.ensure_session(session, source="cli")
        return store.ingest(session, messages).store_ids

    add("sess", [{"role": "user", "content": "real work on the parser"},
                 {"role": "assistant", "content": "parser fixed"}])
    store.ensure_session("empty-1")
    store.ensure_session("empty-alias", canonical_id="empty-1")
    add("trove-ephemeral-abc", [{"role": "user", "content": "quick question"},
                                {"role": "assistant", "content": "quick answer"}])
    add("hb-1", [{"role": "user", "content": "Read HEARTBEAT.md; reply HEARTBEAT_OK"},
                 {"role": "assistant", "content": "HEARTBEAT_OK"}])
    add("job-9", [{"role": "user", "content": "nightly report for the team"},
                  {"role": "assistant", "content": "report sent"}])
    add("real-2", [{"role": "user", "content": "HEARTBEAT_OK"},
                   {"role": "user", "content": "now a real question about deploys"}])
    add("spam-3", [{"role": "user", "content": "a long real looking conversation"}]
        + [{"role": "assistant", "content": f"reply {i}"} for i in range(300)])
    ids = add("hb-old", [{"role": "user", "content": "[Cron delivery: digest] ping"},
                         {"role": "assistant", "content": "pong"}])
    node = dag.add_node(NewNode(session_id="hb-old", depth=0, text="cron ping summary",
                                token_count=3, source_token_count=4, level=3, model="det",
                                child_store_ids=ids))
    dag.carry_nodes("sess", [node])
    other = make_engine(tmp_path, window=1_000_000, session="trove-ephemeral-live", **settings)
    other.ingest([{"role": "user", "content": "live ephemeral"}])
    return engine, other


def clean_world(tmp_path, monkeypatch):
    """``junk_database`` with the clean rules on, called from ``sess`` with no idle wait,
    hb-1 owned by another person (the clean tests here and in test_backend_operators)."""
    from hermes_trove.storage.owners import Owners
    engine, other = junk_database(tmp_path, doctor_clean_apply_enabled="true",
                                  ignore_message_patterns="^nightly report",
                                  ignore_session_patterns="spam-*")
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    monkeypatch.setattr(housekeeping, "CLEAN_MIN_IDLE_SECONDS", 0)
    Owners(engine.store.db).record("hb-1", "telegram:user:5")
    return engine, other


def test_clean_scan_and_apply_remove_only_safe_candidates(tmp_path, monkeypatch):
    engine, other = clean_world(tmp_path, monkeypatch)
    db = engine.config.resolved_database_path
    scan = command.handle("doctor clean")
    assert "7 candidates" in scan and "5 safe to remove, 2 protected" in scan
    for line in ("remove spam-3 [ignored_pattern]", "remove empty-1 [empty]",
                 "remove trove-ephemeral-abc [ephemeral]",
                 "remove hb-1 [noise]", "remove job-9 [noise]",
                 "keep   hb-old [noise]", "keep   trove-ephemeral-live [ephemeral]"):
        assert line in scan, line
    assert "protected: its summaries are used by other sessions: sess (carried" in scan
    assert "protected: live session" in scan
    before = snapshot(db)
    text = command.handle("doctor clean apply")
    backup = backup_path(text)
    assert snapshot(backup) == before  # written before anything was removed
    assert "removed 5 sessions" in text
    assert "rows deleted: 307 messages, 0 nodes, 0 edges, 0 carry rows, 6 session rows" in text
    left = {r[0] for r in rows(db, "SELECT session_id FROM sessions")}
    assert left == {"sess", "real-2", "hb-old", "trove-ephemeral-live"}
    assert not rows(db, "SELECT owner FROM session_owners WHERE session_id = 'hb-1'")
    assert rows(db, "SELECT DISTINCT session_id FROM messages ORDER BY 1") == [
        ("hb-old",), ("real-2",), ("sess",), ("trove-ephemeral-live",)]
    counts = engine.store.fts_row_counts()
    assert counts["rows"] == counts["fts_docs"]  # the FTS delete trigger kept step
    assert not rows(db, "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'quick'")
    assert "nothing to do: no safe candidates" in command.handle("doctor clean apply")
    assert other.canonical_id == "trove-ephemeral-live"


def test_clean_protects_recently_active_sessions(tmp_path, monkeypatch):
    engine, _ = junk_database(tmp_path, doctor_clean_apply_enabled="true")
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    scan = command.handle("doctor clean")
    assert "0 safe to remove" in scan and "may be live in a running Hermes" in scan
    assert "nothing to do" in command.handle("doctor clean apply")
    later = housekeeping.clean_scan(ops.open_target(engine.config, engine), now=time.time() + 7200)
    assert {c["session_id"] for c in later["candidates"] if c["safe"]} == {
        "empty-1", "trove-ephemeral-abc", "hb-1"}


def test_clean_never_proposes_real_work(tmp_path):
    from test_noise import chat, debugging_session
    engine, _ = junk_database(tmp_path)
    for session, messages in (("debug-62", debugging_session()), ("cron-q", chat((
            "cron: how should we schedule the nightly backups?",
            "Use a systemd timer at 03:15 UTC with RandomizedDelaySec; " * 12)))):
        engine.store.ensure_session(session, source="cli")
        engine.store.ingest(session, messages)
    scan = housekeeping.clean_scan(ops.open_target(engine.config, engine), now=time.time() + 7200)
    found = {c["session_id"]: c for c in scan["candidates"]}
    assert "debug-62" not in found and "cron-q" not in found
    assert "no tool use" in found["hb-1"]["reason"] and "HEARTBEAT" in found["hb-1"]["reason"]


# ---------------------------------------------------------------- doctor repair
def drop_from_message_fts(db, store_id: int = 2) -> None:
    """Damage the message index: delete one row's FTS entry (what repair must find)."""
    conn = sqlite3.connect(db)
    row = conn.execute("SELECT store_id, body, tags FROM messages_fts_source"
                       " WHERE store_id = ?", (store_id,)).fetchone()
    conn.execute("INSERT INTO messages_fts(messages_fts, rowid, body, tags)"
                 " VALUES ('delete', ?, ?, ?)", row)
    conn.commit()
    conn.close()


def test_repair_diagnoses_then_rebuilds_behind_a_backup(live):
    db = str(live.config.resolved_database_path)
    drop_from_message_fts(db)
    preview = command.handle("doctor repair")
    assert "messages_fts_rows: 80 rows, 79 indexed" in preview and "would: rebuild" in preview
    assert live.store.fts_row_counts()["fts_docs"] == 79
    text = command.handle("doctor repair apply")
    backup = backup_path(text)
    assert rows(backup, "SELECT count(*) FROM messages_fts_docsize") == [(79,)]  # pre-change
    assert "changed: rebuild messages_fts" in text and "after: no problems" in text
    assert live.store.fts_row_counts() == {"rows": 80, "fts_docs": 80}
    assert "no problems" in command.handle("doctor repair")
    assert live.store.get_meta("fts_checked_at")


# ---------------------------------------------------------------- doctor source
def legacy_database(path: Path) -> None:
    """A database from before the schema forbade blank sources: the current schema
    without its CHECK (source <> '') clauses, stamped current so no migration runs."""
    fresh = Database(str(path.with_name("fresh.db")))
    objects = fresh.conn.execute("SELECT type, name, sql FROM sqlite_master"
                                 " WHERE sql IS NOT NULL").fetchall()
    versions = fresh.conn.execute("SELECT * FROM trove_migrations").fetchall()
    fresh.close()
    virtual = [n for _, n, s in objects if s.upper().startswith("CREATE VIRTUAL TABLE")]
    order = {"table": 0, "view": 1, "index": 2, "trigger": 3}
    conn = sqlite3.connect(path)
    for kind, name, sql in sorted(objects, key=lambda o: order[o[0]]):
        if name.startswith("sqlite_") or (kind == "table" and any(
                name.startswith(v + "_") for v in virtual)):
            continue  # SQLite's own tables and FTS5 shadow tables come by themselves
        conn.execute(sql.replace("CHECK (source <> '')", ""))
    conn.executemany("INSERT INTO trove_migrations VALUES (?, ?, ?)",
                     [tuple(v) for v in versions])
    conn.execute(f"PRAGMA user_version = {max(v[0] for v in versions)}")
    conn.execute("INSERT INTO sessions(session_id, canonical_id, source, created_at, updated_at)"
                 " VALUES ('old', 'old', '', 1, 1)")
    for digest, source in (("h1", ""), ("h2", "  "), ("h3", "\t"), ("h4", "telegram")):
        conn.execute("INSERT INTO messages(session_id, source, role, content, content_format,"
                     " content_hash, ordinal, created_at) VALUES ('old', ?, 'user',"
                     " 'legacy hello', 'text', ?, 0, 1)", (source, digest))
    conn.commit()
    conn.close()


def test_source_fix_on_a_legacy_database(tmp_path):
    db = tmp_path / "trove.db"
    legacy_database(db)
    preview = command.handle("doctor source")
    assert "3 messages and 1 sessions with a blank source" in preview
    assert "would: set source to 'unknown'" in preview
    before = snapshot(db)
    text = command.handle("doctor source apply")
    assert snapshot(backup_path(text)) == before
    assert "set source to 'unknown' on 3 messages and 1 sessions" in text
    assert rows(db, "SELECT source FROM messages ORDER BY store_id") == [
        ("unknown",), ("unknown",), ("unknown",), ("telegram",)]
    unknown_tag = "p" + "unknown".encode().hex()
    assert len(rows(db, "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?",
                    f'tags : "{unknown_tag}"')) == 3  # the FTS tags followed the update
    assert "no blank or whitespace-only sources" in command.handle("doctor source")
    assert "no problems" in command.handle("doctor repair")


def test_source_fix_on_whitespace_rows_the_current_schema_allows(live):
    db = live.config.resolved_database_path
    conn = sqlite3.connect(db)
    conn.execute("UPDATE messages SET source = ' ' WHERE store_id IN (3, 4)")
    conn.commit()
    conn.close()
    assert "2 messages and 0 sessions" in command.handle("doctor source")
    text = command.handle("doctor source apply")
    assert rows(backup_path(text), "SELECT count(*) FROM messages WHERE source = ' '") == [(2,)]
    assert rows(db, "SELECT source FROM messages WHERE store_id IN (3, 4)") == [
        ("unknown",), ("unknown",)]


# ---------------------------------------------------------------- the real host
@pytest.fixture
def fake_llm(monkeypatch):
    """hostkit's fake model, with /trove switched on before the host loads the plugin
    (``trove_host`` depends on this fixture, so the setting is in place at discovery)."""
    monkeypatch.setenv("TROVE_ENABLE_SLASH_COMMAND", "true")
    monkeypatch.setenv("TROVE_FRESH_TAIL_COUNT", "2")
    with hk.FakeOpenAIServer() as server:
        yield server


@pytest.mark.host
def test_trove_command_in_the_real_host(trove_host):
    agent = hk.make_agent()
    hk.run_turns(agent, ["first question about the parser", "second question",
                         "third question"])
    status = hk.run_slash_command("trove", "status")
    assert f"session: {agent.session_id}" in status
    assert "6 messages" in status and "engine: host binding" in status
    preview = hk.run_slash_command("trove", "rotate")
    assert "(preview): 4 older messages" in preview and "newest 2 stay verbatim" in preview
    assert "unknown subcommand" in hk.run_slash_command("trove", "nope")


def test_clean_removes_the_vectors_of_the_rows_it_deletes(tmp_path, monkeypatch):
    """Issue 25: no vector outlives its row, so ``embeddings.pending`` never goes negative."""
    from hermes_trove.storage.vectors import SpaceIdentity, VectorRow, VectorStore
    engine, _ = junk_database(tmp_path, doctor_clean_apply_enabled="true")
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    monkeypatch.setattr(housekeeping, "CLEAN_MIN_IDLE_SECONDS", 0)
    vectors = VectorStore(engine.store.db)
    space = vectors.space_id(SpaceIdentity("test", "m", "r", 2))
    db = engine.config.resolved_database_path
    every = rows(db, "SELECT store_id FROM messages")
    nodes = rows(db, "SELECT node_id FROM nodes")
    vectors.write(space, [VectorRow("m", r[0], 0, f"h{r[0]}", b"\0" * 8) for r in every]
                  + [VectorRow("n", n[0], 0, f"n{n[0]}", b"\0" * 8) for n in nodes])
    assert vectors.counts(space) == {"indexed": len(every) + len(nodes), "pending": 0}
    text = command.handle("doctor clean apply")
    assert "removed" in text
    assert not rows(db, "SELECT e.ref_id FROM embedding_vectors e WHERE e.kind = 'm' AND NOT"
                        " EXISTS (SELECT 1 FROM messages m WHERE m.store_id = e.ref_id)")
    left = rows(db, "SELECT count(*) FROM messages")[0][0]
    assert vectors.counts(space) == {"indexed": left + len(nodes), "pending": 0}


def test_a_heartbeat_configuration_chat_survives_clean(tmp_path, monkeypatch):
    """Issue 25: a real 4-message chat that mentions HEARTBEAT_OK is not noise."""
    engine, _ = junk_database(tmp_path, doctor_clean_apply_enabled="true")
    engine.store.ensure_session("hb-config", source="cli")
    engine.store.ingest("hb-config", [
        {"role": "user", "content": "Make the heartbeat reply HEARTBEAT_OK when idle."},
        {"role": "assistant", "content": "Done: HEARTBEAT.md now ends with that rule."},
        {"role": "user", "content": "Also put the door code 2468 in HEARTBEAT.md."},
        {"role": "assistant", "content": "Added the door code."}])
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    monkeypatch.setattr(housekeeping, "CLEAN_MIN_IDLE_SECONDS", 0)
    command.handle("doctor clean apply")
    db = engine.config.resolved_database_path
    assert rows(db, "SELECT count(*) FROM messages WHERE session_id = 'hb-config'") == [(4,)]
