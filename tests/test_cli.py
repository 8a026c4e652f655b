"""scripts/trove.py as a subprocess on a database with several sessions: every command
with and without --json, exact export and expand, planted facts, clean errors."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from enginekit import drive, make_engine
from hermes_trove.storage import database, payloads
from hermes_trove.storage.database import Database
from hermes_trove.store import Store, decode_row

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "trove.py"
FACT = "The staging database lives at pg-staging-7.internal on port 6543."
BIG = "".join(f"line {i}: exact payload ✓\n" for i in range(3000))  # ~75K chars, many pages
LOG = "".join(f"{i:05d} GET /api/items/{i} 200 {i % 97}ms\n" for i in range(900))  # externalized
ODD = [{"type": "text", "text": "naïve café ☕ and a lone \ud800 surrogate"},
       {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A HERMES_HOME whose trove.db holds three sessions: a compacted coding session
    (alpha), one with a planted fact and odd messages (beta), and a tiny ephemeral one."""
    root = tmp_path_factory.mktemp("cli-home")
    alpha = make_engine(root, window=16_000, session="alpha", fts_integrity_check_interval_hours=0)
    messages, _, outputs = drive(alpha, 30)
    alpha.ingest(messages)
    assert outputs and alpha.dag.stats()["nodes"]
    beta = make_engine(root, session="beta", fts_integrity_check_interval_hours=0)
    beta.ingest([{"role": "user", "content": "Where does the staging database live?"},
                 {"role": "assistant", "content": FACT},
                 {"role": "user", "content": ODD, "name": "ana"},
                 {"role": "assistant", "content": None, "tool_calls": [{
                     "id": "c1", "type": "function",
                     "function": {"name": "cat", "arguments": "{\"path\": \"log.txt\"}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "name": "cat", "content": BIG},
                 {"role": "assistant", "content": "done"}])
    tiny = make_engine(root, session="trove-ephemeral-1", fts_integrity_check_interval_hours=0,
                       large_output_externalization_enabled="true")
    tiny.ingest([{"role": "user", "content": "hi"},
                 {"role": "assistant", "content": None, "tool_calls": [{
                     "id": "c2", "type": "function",
                     "function": {"name": "dump", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c2", "name": "dump", "content": LOG}])
    for key in list(database._registry):
        database.forget_database(key)
    return root


def run(home, *args, env=None):
    """Run the CLI with ``home`` as HERMES_HOME; a traceback is always a failure."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("TROVE_") and k != "HERMES_SESSION_ID"}
    environ.update({"HERMES_HOME": str(home), **(env or {})})
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=environ,
                          capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def run_json(home, *args, **kw):
    """Run with --json and return the parsed report (the command must succeed)."""
    done = run(home, *args, "--json", **kw)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stored_rows(home, session):
    """Every row of a session, read directly (what export and expand must reproduce)."""
    db = Database(str(home / "trove.db"))
    try:
        return Store(db).session_messages(session, limit=10_000)
    finally:
        db.close()


COMMANDS = [["status"], ["doctor"], ["doctor", "clean"], ["doctor", "repair"],
            ["doctor", "source"], ["doctor", "retention"], ["backup"], ["sessions"],
            ["grep", "staging database"], ["grep", "handler_3", "--session", "alpha"],
            ["expand", "n1"], ["expand", "m2"], ["load-session", "beta", "--limit", "2"]]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_command_with_and_without_json(home, args):
    text = run(home, *args)
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() and not text.stdout.lstrip().startswith("{")
    report = run_json(home, *args)
    assert isinstance(report, dict) and "error" not in report
    explicit = run(home, "--db", home / "trove.db", *args, "--json")
    assert explicit.returncode == 0 and json.loads(explicit.stdout).keys() == report.keys()


def test_status_and_doctor_agree_with_the_database(home):
    report = run_json(home, "status")
    assert json.loads(run(home, "--json", "status").stdout).keys() == report.keys()
    assert report["database"]["path"] == str(home / "trove.db")
    assert report["database"]["messages"] == sum(
        len(stored_rows(home, s)) for s in ("alpha", "beta", "trove-ephemeral-1"))
    assert report["session"] is None and report["live_engine"] is False
    doctor = run_json(home, "doctor")
    checks = {c["name"]: c["status"] for c in doctor["checks"]}
    assert checks["messages_fts_rows"] == "ok" and checks["session_bound"] == "skipped"
    written = run_json(home, "backup")
    assert Path(written["path"]).exists()
    assert run_json(home, "status")["last_backup"]["path"] == written["path"]
    assert f"last backup: {written['path']}" in run(home, "status").stdout


def test_sessions_lists_counts_and_time_ranges(home):
    report = run_json(home, "sessions")
    by_id = {s["session_id"]: s for s in report["sessions"]}
    assert report["total"] == 3 and set(by_id) == {"alpha", "beta", "trove-ephemeral-1"}
    assert by_id["beta"]["messages"] == len(stored_rows(home, "beta"))
    assert by_id["alpha"]["nodes"] > 0 and by_id["alpha"]["first_at"] <= by_id["alpha"]["last_at"]
    table = run(home, "sessions").stdout.splitlines()
    assert table[0].split() == ["session", "title", "alias", "of", "source", "messages",
                                "nodes", "first", "last"]
    assert any(line.startswith("beta ") for line in table)


def test_sessions_show_when_the_messages_were_said_not_stored(tmp_path):
    # an imported history: said on the 16th, stored on the 19th; sessions shows the same
    # times as load-session, grep and doctor retention (the messages' own)
    said = datetime(2026, 3, 16, 10, tzinfo=timezone.utc).timestamp()
    store = Store(database.get_database(str(tmp_path / "trove.db")))
    store.ensure_session("imported", source="cli")
    store.ingest("imported", [{"role": "user", "content": "hi", "timestamp": said},
                              {"role": "assistant", "content": "hello", "timestamp": said + 60}],
                 now=said + 3 * 86400, source="cli")
    database.forget_database(str(tmp_path / "trove.db"))
    row = run_json(tmp_path, "sessions")["sessions"][0]
    assert (row["first_at"], row["last_at"]) == (said, said + 60)
    assert run_json(tmp_path, "doctor", "retention")["largest_sessions"][0]["first_at"] == said
    line = next(x for x in run(tmp_path, "sessions").stdout.splitlines()
                if x.startswith("imported "))
    assert "2026-03-16T10:00" in line and "2026-03-19" not in line


@pytest.mark.parametrize("to_file", [False, True])
def test_export_round_trips_exactly(home, tmp_path, to_file):
    for session in ("beta", "alpha"):
        if to_file:
            out = tmp_path / f"{session}.jsonl"
            done = run(home, "export", session, "--out", out)
            assert done.returncode == 0 and str(out) in done.stdout
            text = out.read_text(encoding="utf-8")
        else:
            done = run(home, "export", session)
            assert done.returncode == 0 and "exported" in done.stderr
            text = done.stdout
        lines = text.splitlines()
        assert [json.loads(line) for line in lines] == [
            decode_row(r) for r in stored_rows(home, session)]
    assert json.loads(lines[0]) != {}
    as_json = run(home, "export", "beta", "--json")  # JSONL is already JSON: unchanged
    assert as_json.returncode == 0
    assert as_json.stdout == run(home, "export", "beta").stdout
    report = run_json(home, "export", "beta", "--out", tmp_path / "b.jsonl")
    assert report["messages"] == len(stored_rows(home, "beta"))


def test_grep_finds_the_planted_fact(home):
    scoped = run_json(home, "grep", "where is the staging database port", "--session", "beta")
    top = scoped["results"][0]
    assert top["kind"] == "message" and "pg-staging-7" in top["snippet"]
    everywhere = run_json(home, "grep", "staging database port", "--all")
    assert any(r.get("session_id") == "beta" and "pg-staging-7" in r["snippet"]
               for r in everywhere["results"])
    assert "pg-staging-7" in run(home, "grep", "staging database port").stdout
    assert run_json(home, "grep", "pg-staging-7", "--session", "alpha")["results"] == []


def test_expand_returns_exact_text(home):
    by_content = {r["content"]: r["store_id"] for r in stored_rows(home, "beta")}
    fact_id, big_id = by_content[FACT], by_content[BIG]
    fact = run_json(home, "expand", f"m{fact_id}")["message"]
    assert fact["content"] == FACT and fact["pages"] == 1
    assert FACT in run(home, "expand", f"m{fact_id}", "--session", "beta").stdout
    big = run_json(home, "expand", f"m{big_id}")["message"]
    assert big["content"] == BIG and big["pages"] > 1 and big["has_more"] is False
    calls = next(r for r in stored_rows(home, "beta") if r["tool_calls"])
    assert run_json(home, "expand", f"m{calls['store_id']}")["message"]["tool_calls"] == \
        calls["tool_calls"]
    node = run_json(home, "expand", "1")
    assert node["node_id"] == 1 and node["sources"]


def test_expand_a_payload_ref_returns_the_exact_original(home):
    ref = payloads.ref_for(payloads.encode_text(LOG))
    placeholder = stored_rows(home, "trove-ephemeral-1")[-1]["content"]
    assert ref in placeholder and len(placeholder) < len(LOG)  # the row holds a placeholder
    page = run_json(home, "expand", ref)
    assert page["content"] == LOG and page["has_more"] is False and page["pages"] > 1
    assert LOG in run(home, "expand", ref, "--session", "trove-ephemeral-1").stdout
    missing = run(home, "expand", "trove-payload:" + "0" * 64)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_load_session_pages_with_a_cursor(home):
    first = run_json(home, "load-session", "beta", "--limit", "2")
    assert len(first["messages"]) == 2 and first["has_more"]
    second = run_json(home, "load-session", "beta", "--after", first["next_cursor"],
                      "--limit", "2")
    ids = [m["store_id"] for m in first["messages"] + second["messages"]]
    assert ids == [r["store_id"] for r in stored_rows(home, "beta")][:4]
    assert "next page: --after" in run(home, "load-session", "beta", "--limit", "2").stdout


def test_dag_writes_a_page(home, tmp_path):
    out = tmp_path / "page.html"
    report = run_json(home, "dag", "alpha", "--out", out)
    assert report["nodes"] > 0 and out.read_text(encoding="utf-8").startswith("<!doctype html>")
    assert "wrote" in run(home, "dag", "alpha", "--out", out, "--force").stdout


@pytest.mark.parametrize("args,message", [
    (["--db", "/nonexistent/trove.db", "status"], "no trove database at /nonexistent/trove.db"),
    (["expand", "zz9"], "is not an id"),
    (["expand", "n99999"], "node_id 99999 not found"),
    (["expand", "m99999"], "store_id 99999 not found"),
    (["load-session", "nope"], "session 'nope' not found"),
    (["export", "nope"], "session 'nope' not found"),
    (["grep", "x", "--session", "nope"], "session 'nope' not found"),
    (["doctor", "retention", "--apply"], "--apply needs"),
    (["embed", "warmup", "--apply"], "--apply needs"),
    (["embed", "prune", "--apply"], "TROVE_EMBEDDINGS_ENABLED"),
    (["doctor", "clean", "--apply"], "TROVE_DOCTOR_CLEAN_APPLY_ENABLED=true"),
    (["replay", "/nonexistent/chat.jsonl"], "No such file"),
])
def test_errors_exit_2_with_a_clear_message(home, args, message):
    done = run(home, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    if "--json" not in args:
        assert run(home, *args, "--json").returncode == 2


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    bogus = tmp_path / "notes.db"
    bogus.write_text("not sqlite at all " * 100)
    done = run(tmp_path, "--db", bogus, "status")
    assert done.returncode == 2 and f"{bogus} is not a trove database" in done.stderr


def snapshot(folder):
    """Every file in a folder with its bytes (what a read-only command must not change)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def foreign_files(folder):
    """An unrelated SQLite file (rollback journal, like a host's state.db with a
    ``sessions`` table), a WAL-mode one, and a 0-byte file."""
    folder.mkdir()
    state = sqlite3.connect(folder / "state.db")
    state.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, title TEXT)")
    state.execute("INSERT INTO sessions VALUES ('s1', 'hello')")
    state.commit()
    state.close()
    wal = sqlite3.connect(folder / "wal.db")
    wal.execute("PRAGMA journal_mode = WAL")
    wal.execute("CREATE TABLE t (x)")
    wal.commit()
    wal.close()
    (folder / "empty.db").write_bytes(b"")
    return ["state.db", "wal.db", "empty.db"]


def older_trove_file(db):
    """A trove database at the first schema version (what a read must not migrate)."""
    from hermes_trove.storage import migrations
    conn = sqlite3.connect(db, isolation_level=None)
    version, _, first = migrations.MIGRATIONS[0]
    conn.execute("CREATE TABLE trove_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                 " applied_at REAL NOT NULL)")
    first(conn)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    return version


READ_COMMANDS = [["status"], ["doctor"], ["doctor", "clean"], ["doctor", "repair"],
                 ["doctor", "source"], ["doctor", "retention"], ["sessions"], ["grep", "x"],
                 ["expand", "n1"], ["load-session", "s1"], ["export", "s1"]]


@pytest.mark.parametrize("args", READ_COMMANDS + [["backup"], ["doctor", "repair", "--apply"]],
                         ids=" ".join)
def test_a_foreign_file_is_named_and_left_untouched(tmp_path, args):
    folder = tmp_path / "foreign"
    names = foreign_files(folder)
    before = snapshot(folder)
    for name in names:
        done = run(tmp_path, "--db", folder / name, *args)
        assert done.returncode == 2, done.stdout
        assert f"error: {folder / name} is not a trove database" in done.stderr
    assert snapshot(folder) == before


@pytest.mark.parametrize("args", READ_COMMANDS[:7], ids=" ".join)
def test_read_commands_do_not_write_a_trove_database(home, tmp_path, args):
    db = tmp_path / "ro" / "trove.db"
    db.parent.mkdir()
    shutil.copy(home / "trove.db", db)
    conn = sqlite3.connect(db)  # a checkpointed copy in rollback mode: any WAL switch shows
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    before = snapshot(db.parent)
    done = run(home, "--db", db, *args)
    assert done.returncode in (0, 1), done.stderr
    assert snapshot(db.parent) == before


def test_a_migrate_dry_run_writes_nothing_and_names_what_it_cannot_use(home, tmp_path):
    # the dry run opened both sides with get_database: it created a missing target (and
    # its folder) or source, added trove's tables to a foreign file and switched Hermes's
    # state.db to WAL, and still said "nothing written"
    folder = tmp_path / "m"
    foreign_files(folder)
    db = folder / "trove.db"
    shutil.copy(home / "trove.db", db)
    conn = sqlite3.connect(db)  # rollback mode: a WAL switch or a migration shows
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    version = older_trove_file(folder / "old.db")
    before = snapshot(folder), sorted(folder.rglob("*"))
    dry = run(tmp_path, "--db", db, "migrate", "--to", folder / "new" / "other.db")
    assert dry.returncode == 0 and "dry run: nothing written" in dry.stdout, dry.stderr
    assert "messages             source" in dry.stdout and "target had         0" in dry.stdout
    for args, message in [
            (("--db", folder / "typo" / "trove.db", "--to", folder / "out.db"),
             "no trove database at"),
            (("--db", db, "--to", folder / "state.db"), "state.db is not a trove database"),
            (("--db", folder / "state.db", "--to", folder / "out.db"), "is not a trove database"),
            (("--db", folder / "empty.db", "--to", folder / "out.db"), "is not a trove database"),
            (("--db", folder / "old.db", "--to", folder / "out.db"), f"schema version {version}"),
            (("--db", db, "--to", folder / "old.db"), f"schema version {version}"),
            (("--db", db, "--to", db), "the same database")]:
        done = run(tmp_path, *args[:2], "migrate", *args[2:])
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    assert (snapshot(folder), sorted(folder.rglob("*"))) == before
    copied = run(tmp_path, "--db", db, "migrate", "--to", folder / "new" / "other.db", "--apply")
    assert copied.returncode == 0 and "counts verified" in copied.stdout, copied.stderr
    assert (folder / "new" / "other.db").is_file()


@pytest.mark.parametrize("command", ["export", "dag"])
def test_out_never_overwrites_the_database_or_an_existing_file(home, tmp_path, command):
    db = tmp_path / "safe" / "trove.db"
    db.parent.mkdir()
    shutil.copy(home / "trove.db", db)
    (db.parent / "trove.db-wal").write_bytes(b"")
    (db.parent / "link.db").symlink_to(db)
    kept = tmp_path / "kept.txt"
    kept.write_text("mine")
    before = snapshot(db.parent)
    for out, why in [(db, "it is the trove database"), (str(db) + "-wal", "database file -wal"),
                     (str(db) + "-shm", "database file -shm"),
                     (db.parent / "link.db", "it is the trove database"),
                     (kept, "the file exists (pass --force"), (tmp_path, "is a directory")]:
        for force in ([], ["--force"]):
            if why.startswith("the file exists") and force:
                continue
            done = run(home, "--db", db, command, "beta", "--out", out, *force)
            assert done.returncode == 2 and why in done.stderr, (out, done.stderr)
    after = snapshot(db.parent)
    after.pop("trove.db-shm")  # a reader of a WAL database maps it; the data files stay
    assert after == before and kept.read_text() == "mine"
    done = run(home, "--db", db, command, "beta", "--out", kept, "--force")
    assert done.returncode == 0 and kept.read_text() != "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".kept")] == []


def test_apply_paths_back_up_first(home, tmp_path):
    db = tmp_path / "copy" / "trove.db"
    db.parent.mkdir()
    shutil.copy(home / "trove.db", db)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE messages SET source = '  ' WHERE store_id IN (1, 2)")
    conn.commit()
    conn.close()
    preview = run_json(home, "--db", db, "doctor", "source")
    assert preview["status"] == "preview" and preview["found"]["messages"] == 2
    fixed = run_json(home, "--db", db, "doctor", "source", "--apply")
    backup = Path(fixed["backup"]["path"])
    assert backup.parent == db.parent / "backups" and fixed["changed"]["messages"] == 2
    assert sqlite3.connect(backup).execute(
        "SELECT count(*) FROM messages WHERE source = '  '").fetchone() == (2,)
    assert run_json(home, "--db", db, "doctor", "repair", "--apply")["status"] == "ok"
    enabled = {"TROVE_DOCTOR_CLEAN_APPLY_ENABLED": "true"}
    scan = run_json(home, "--db", db, "doctor", "clean", env=enabled)
    assert [c["session_id"] for c in scan["candidates"]] == ["trove-ephemeral-1"]
    done = run(home, "--db", db, "doctor", "clean", "--apply", env=enabled)
    assert done.returncode == 0 and "nothing to do" in done.stdout  # just active: protected
    assert "may be live in a running Hermes" in done.stdout


def test_replay_into_a_new_and_an_existing_database(home, tmp_path):
    transcript = tmp_path / "chat.jsonl"
    turns = [m for t in range(6) for m in (
        {"role": "user", "content": f"question {t} about the build"},
        {"role": "assistant", "content": f"answer {t}: run make {t}"})]
    transcript.write_text("\n".join(json.dumps(m) for m in turns), encoding="utf-8")
    db = tmp_path / "replayed" / "trove.db"
    report = run_json(home, "--db", db, "replay", transcript, "--window", "32000")
    assert report["stored"] == report["messages"] == 12 and report["backup"] is None
    again = run_json(home, "--db", db, "replay", transcript, "--session", "second")
    assert again["stored"] == 12 and Path(again["backup"]["path"]).exists()
    assert "replayed 12 messages" in run(home, "replay", transcript).stdout
