"""What a new operator hits first: bounded counts, grep paging and highlights, CLI hints,
exit codes, broken pipes, replay input checks, rotate and status before any work."""
import json
import shutil
import subprocess
import sys

import pytest

from enginekit import make_engine
from hermes_trove import command
from hermes_trove.storage import database
from test_command import drop_from_message_fts
from test_cli import SCRIPT, home, older_trove_file, run, run_json  # noqa: F401 (fixture)


@pytest.mark.parametrize("args,message", [
    (["grep", "x", "--limit", "0"], "--limit: must be between 1 and 50, not 0"),
    (["grep", "x", "--limit", "-5"], "--limit: must be between 1 and 50, not -5"),
    (["grep", "x", "--limit", "100000"], "must be between 1 and 50, not 100,000"),
    (["grep", "x", "--offset", "-1"], "--offset: must be between 0 and 49"),
    (["grep", "x", "--offset", "45", "--limit", "10"], "offset + limit must stay within"),
    (["load-session", "beta", "--limit", "0"], "--limit: must be between 1 and 200"),
    (["load-session", "beta", "--limit", "500"], "--limit: must be between 1 and 200"),
    (["sessions", "--limit", "0"], "--limit: must be between 1"),
    (["replay", "x.jsonl", "--window", "0"], "--window: must be at least 4,096, not 0"),
    (["grep", "x", "--limit", "ten"], "'ten' is not a whole number"),
])
def test_counts_out_of_range_are_errors_not_clamped(home, args, message):
    done = run(home, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert done.stderr.count("--limit") <= 2  # the usage line and the error, no repetition


def test_grep_pages_with_an_offset(home):
    whole = run_json(home, "grep", "module", "--limit", "6")
    ids = [(r["kind"], r.get("store_id"), r.get("node_id")) for r in whole["results"]]
    assert len(ids) == 6
    first = run_json(home, "grep", "module", "--limit", "3")
    second = run_json(home, "grep", "module", "--limit", "3", "--offset", "3")
    page = lambda r: [(x["kind"], x.get("store_id"), x.get("node_id")) for x in r["results"]]  # noqa
    assert page(first) == ids[:3] and page(second) == ids[3:6]
    assert first["next_offset"] == 3
    assert "more results: --offset 3" in run(home, "grep", "module", "--limit", "3").stdout


def test_grep_highlights_matches_on_request(home):
    plain = run(home, "grep", "staging database", "--session", "beta").stdout
    assert "\033[" not in plain  # a pipe gets the exact snippet
    colored = run(home, "grep", "staging database", "--session", "beta", "--color", "always")
    assert "\033[1;31mstaging\033[0m" in colored.stdout.lower() and not colored.stderr


def test_repair_exits_1_on_problems_and_hints_name_cli_commands(home, tmp_path):
    db = tmp_path / "broken" / "trove.db"
    db.parent.mkdir()
    shutil.copy(home / "trove.db", db)
    drop_from_message_fts(db)
    done = run(home, "--db", db, "doctor", "repair")
    assert done.returncode == 1
    assert "apply: trove.py doctor repair --apply" in done.stdout and "/trove" not in done.stdout
    fixed = run(home, "--db", db, "doctor", "repair", "--apply")
    assert fixed.returncode == 0 and "after: no problems" in fixed.stdout
    assert run(home, "--db", db, "doctor", "repair").returncode == 0
    status = run(home, "--db", db, "status").stdout
    assert "/trove " not in status


def test_export_into_a_closed_pipe_exits_quietly(home):
    script = (f"'{sys.executable}' '{SCRIPT}' export beta | head -c 10 > /dev/null; "
              "echo rc=${PIPESTATUS[0]}")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={"HERMES_HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert done.stderr == "" and "rc=0" in done.stdout


def test_replay_refuses_a_line_without_a_valid_role(home, tmp_path):
    transcript = tmp_path / "chat.jsonl"
    transcript.write_text(json.dumps({"role": "user", "content": "hi"}) + "\n"
                          + json.dumps({"role": "robot", "content": "beep"}) + "\n")
    db = tmp_path / "out" / "trove.db"
    done = run(home, "--db", db, "replay", transcript)
    assert done.returncode == 2 and "message 2 has no valid role ('robot'" in done.stderr
    assert "nothing was stored" in done.stderr and not db.exists()


def test_replay_says_what_it_stored(home, tmp_path):
    transcript = tmp_path / "chat.jsonl"
    transcript.write_text("\n".join(json.dumps({"role": r, "content": f"{r} {i}"})
                                    for i in range(3) for r in ("user", "assistant")))
    done = run(home, "--db", tmp_path / "r" / "trove.db", "replay", transcript)
    assert "stored 6 messages in session replay-session" in done.stdout


def test_slash_status_before_the_first_message_shows_the_host_session(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    monkeypatch.setenv("HERMES_SESSION_ID", "20261202_050000_abc123")
    text = command.handle("status")
    assert "database: none yet at" in text and "20261202_050000_abc123" in text
    assert "plugin: " in text and not (tmp_path / "trove.db").exists()


def test_rotate_on_a_small_never_rotated_session_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    engine = make_engine(tmp_path, window=1_000_000, fresh_tail_count=8)
    engine.ingest([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    monkeypatch.setenv("HERMES_SESSION_ID", "sess")
    try:
        text = command.handle("rotate")
        assert "nothing to rotate yet: all 2 live messages are the fresh tail" in text
        assert "already rotated" not in text
    finally:
        for key in list(database._registry):
            database.forget_database(key)


def test_slash_reads_never_convert_a_foreign_configured_file(tmp_path, monkeypatch):
    import sqlite3
    state = tmp_path / "state.db"
    conn = sqlite3.connect(state)
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY)")
    conn.commit()
    conn.close()
    before = state.read_bytes()
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    monkeypatch.setenv("TROVE_DATABASE_PATH", str(state))
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    for words in ("status", "doctor", "doctor clean", "doctor retention", "backup"):
        text = command.handle(words)
        assert f"{state} is not a trove database" in text, text
    assert state.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "state.db"]


def test_an_older_trove_schema_is_read_only_refused_and_migrated_by_a_write(tmp_path):
    db = tmp_path / "old.db"
    version = older_trove_file(db)
    before = db.read_bytes()
    done = run(tmp_path, "--db", db, "status")
    assert done.returncode == 2 and f"has trove schema version {version}" in done.stderr
    assert "a read does not migrate" in done.stderr and db.read_bytes() == before
    assert run(tmp_path, "--db", db, "backup").returncode == 0
    assert run(tmp_path, "--db", db, "status").returncode == 0


def test_a_rotate_preview_without_a_live_engine_migrates_nothing(tmp_path, monkeypatch):
    # the preview opened the file for writing: an older schema was migrated (and -wal,
    # -shm created) before the answer said there was no live session to rotate
    version = older_trove_file(tmp_path / "trove.db")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    try:
        text = command.handle("rotate")
    finally:
        for key in list(database._registry):
            database.forget_database(key)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert f"has trove schema version {version}" in text and "a read does not migrate" in text
