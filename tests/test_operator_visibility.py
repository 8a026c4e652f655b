"""Users and operators see what is happening (issue 26): /trove grep, --mode, the
optional families in status, progress of long work, CLI hints that name CLI commands."""
import io
import json
import os
import sqlite3

import pytest

from enginekit import close_databases, make_engine, operator_home
from fake_openai import FakeOpenAIServer
from hermes_trove import command
from hermes_trove.compaction import rollups
from hermes_trove.operators import families
from hermes_trove.operators.progress import Progress
from hermes_trove.recall import semantic
from hermes_trove.recall.meter import RateMeter
from test_cli import run, snapshot
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FACT = "The BlueHeron relay answers on port 7311 behind the Oslo gateway."


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    operator_home(monkeypatch, tmp_path)
    yield
    semantic.forget_shared()
    close_databases()


@pytest.fixture
def fake():
    with FakeOpenAIServer() as server:
        yield server


def two_sessions(home):
    """Two sessions of one owner, the fact in the second; connections closed after."""
    first = make_engine(home, session="first")
    first.ingest([{"role": "user", "content": "where is the relay?"},
                  {"role": "assistant", "content": "I do not know yet."}])
    second = make_engine(home, session="second")
    second.ingest([{"role": "user", "content": "note this down"},
                   {"role": "assistant", "content": FACT}])
    import threading   # the background FTS check reads on a connection of its own
    for thread in threading.enumerate():
        if thread.name.startswith("trove-") and thread is not threading.current_thread():
            thread.join(timeout=30)
    close_databases()


def cli_env(home, **extra):
    return {"HERMES_HOME": str(home), **extra}


# ---------------------------------------------------------------- item 12: /trove grep
def test_slash_grep_prints_what_the_cli_prints_and_writes_nothing(tmp_path):
    two_sessions(tmp_path)
    conn = sqlite3.connect(tmp_path / "trove.db")  # rollback mode: any write shows
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    before = snapshot(tmp_path)
    chat = command.handle("grep BlueHeron relay")
    shell = run(tmp_path, "grep", "BlueHeron relay", "--color", "never").stdout.rstrip("\n")
    assert chat == shell
    assert "second" in chat and "BlueHeron relay answers on port 7311" in chat
    assert snapshot(tmp_path) == before                              # read-only
    one = command.handle("grep --session first BlueHeron")
    assert one == run(tmp_path, "grep", "BlueHeron", "--session", "first",
                      "--color", "never").stdout.rstrip("\n")
    assert "no matches" in one                                       # the fact is in second


def test_slash_grep_errors_and_echo_keep_the_users_case(tmp_path):
    two_sessions(tmp_path)
    assert "unknown subcommand 'Grp BlueHeron'" in command.handle("Grp BlueHeron")
    assert "no query" in command.handle("grep")
    assert "whole numbers" in command.handle("grep --limit ten BlueHeron")
    assert "session 'nope' not found" in command.handle("grep --session nope BlueHeron")
    assert "mode must be one of" in command.handle("grep --mode vectors BlueHeron")
    assert "/trove grep QUERY" in command.handle("help")


def test_slash_grep_refuses_a_limit_below_one_as_the_cli_does(tmp_path):
    # --limit 0 was read as "no limit given" and listed the default 10 hits
    two_sessions(tmp_path)
    for bad in ("--limit 0", "--limit -3", "--offset -1"):
        answer = command.handle(f"grep {bad} BlueHeron")
        assert "--limit must be at least 1 and --offset at least 0" in answer, answer
        assert "answers on port 7311" not in answer
    assert "answers on port 7311" in command.handle("grep --limit 1 BlueHeron")


# ---------------------------------------------------------------- item 4: grep --mode
def test_cli_grep_mode_semantic_runs_on_the_index(tmp_path, fake):
    two_sessions(tmp_path)
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url}
    off = json.loads(run(tmp_path, "grep", "relay port", "--mode", "semantic", "--json").stdout)
    assert off["mode"] == "full_text"
    assert any("semantic search is unavailable" in n for n in off["notes"])
    cold = run(tmp_path, "grep", "relay port", "--mode", "semantic", env=env).stdout
    assert "search mode: full_text" in cold and "no vectors cover this scope yet" in cold
    assert run(tmp_path, "embed", "backfill", "--apply", env=env).returncode == 0
    for mode in ("semantic", "hybrid"):
        done = json.loads(run(tmp_path, "grep", "relay port", "--mode", mode, "--json",
                              env=env).stdout)
        assert done["mode"] == mode and not done.get("notes")
        assert any("BlueHeron" in r["snippet"] for r in done["results"])
    assert "search mode: semantic" in run(tmp_path, "grep", "relay", "--mode", "semantic",
                                           env=env).stdout
    bad = run(tmp_path, "grep", "relay", "--mode", "vectors")
    assert bad.returncode == 2 and "invalid choice: 'vectors'" in bad.stderr


# ---------------------------------------------------------------- item 2: the families
def test_status_shows_each_optional_family(tmp_path, fake, monkeypatch):
    two_sessions(tmp_path)
    off = run(tmp_path, "status").stdout
    assert "embeddings: off (TROVE_EMBEDDINGS_ENABLED is false)" in off
    assert "rollups: off (TROVE_ROLLUPS_ENABLED is false)" in off
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url,
           "TROVE_ROLLUPS_ENABLED": "true"}
    before = run(tmp_path, "status", env=env).stdout
    assert "embeddings: on (openai fake-embed): 0 indexed, 4 pending" in before
    assert "rollups: on: ready 0, pending 0, stale 0, open " in before
    assert "last pass: none recorded" in before
    run(tmp_path, "embed", "backfill", "--apply", env=env)
    after = run(tmp_path, "status", env=env).stdout
    assert "4 indexed, 0 pending" in after and "caught up" in after
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    chat = command.handle("status")                 # the slash command, no live engine
    assert "embeddings: on (openai fake-embed): 4 indexed, 0 pending" in chat
    assert "rollups: on: ready 0" in chat
    report = json.loads(run(tmp_path, "status", "--json", env=env).stdout)
    assert report["embeddings"]["indexed"] == 4 and report["rollups"]["enabled"] is True


def test_rollup_status_names_the_last_pass_and_what_it_built(tmp_path):
    line = families.rollups_line({"enabled": True, "counts": {"ready": 2, "open": 1},
                                  "last_pass": {"at": 0.0, "built": ["day 2026-11-30"],
                                                "waiting": 1, "errors": ["week x: boom"]}},
                                 command.when)
    assert line.startswith("rollups: on: ready 2, pending 0, stale 0, open 1; last pass ")
    assert "built day 2026-11-30, 1 waiting, error: week x: boom" in line
    engine = make_engine(tmp_path, session="s", rollups_enabled="true")
    engine.ingest([{"role": "user", "content": "old day", "timestamp": 1_700_000_000.0}])
    report = rollups.PassReport(built=[{"kind": "day", "key": "2023-11-14"}])
    rollups.record_pass(engine.store, report, 1_700_100_000.0)
    assert rollups.last_pass(engine.store) == {"at": 1_700_100_000.0, "built": ["day 2023-11-14"],
                                               "waiting": 0, "errors": []}


def test_embedding_line_shows_rate_time_left_and_the_last_error():
    line = families.embeddings_line({"enabled": True, "available": True, "provider": "local",
                                     "model": "m", "indexed": 64, "pending": 62,
                                     "texts_per_second": 2.5, "eta_seconds": 24.8,
                                     "worker_error": "TimeoutError: slow"})
    assert line == ("embeddings: on (local m): 64 indexed, 62 pending, 2.5 texts/s, "
                    "about 25 s left, last error: TimeoutError: slow")
    loading = families.embeddings_line({"enabled": True, "available": False,
                                        "provider": "local", "reason": "the model is loading"})
    assert loading == "embeddings: on (local) but not available: the model is loading"


def test_rate_meter_counts_work_time_not_pauses():
    now = [100.0]
    meter = RateMeter(clock=lambda: now[0])
    assert meter.report(10) == {"texts_per_second": None, "eta_seconds": None,
                                "texts_this_process": 0}
    meter.record(32, 4.0)
    now[0] += 60                      # a long idle pause between batches is not work
    meter.record(32, 4.0)
    assert meter.report(80) == {"texts_per_second": 8.0, "eta_seconds": 10.0,
                                "texts_this_process": 64}
    assert meter.report(0)["eta_seconds"] == 0.0
    now[0] += 1000                    # old batches leave the window
    assert meter.rate() is None


# ---------------------------------------------------------------- item 3: progress
def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise():
    now = [0.0]
    piped, tty = io.StringIO(), io.StringIO()
    lines = Progress("embed backfill", piped, clock=lambda: now[0], tty=False)
    bar = Progress("embed backfill", tty, clock=lambda: now[0], tty=True)
    for done in (10, 20):
        now[0] += 1.0
        lines(done, 40)
        bar(done, 40)
    lines.finish("done")
    bar.finish("done")
    assert piped.getvalue().splitlines() == [
        "embed backfill: 10/40 (25%), 10.0/s, about 3 s left",
        "embed backfill: 20/40 (50%), 10.0/s, about 2 s left",
        "embed backfill: done after 2.0 s"]
    assert tty.getvalue().count("\r[") == 2 and "[###############---------------]" in \
        tty.getvalue() and tty.getvalue().endswith("\nembed backfill: done after 2.0 s\n")


def test_cli_backfill_prints_a_line_per_batch_and_says_done(tmp_path, fake):
    two_sessions(tmp_path)
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url,
           "TROVE_EMBEDDING_BATCH_SIZE": "1"}
    done = run(tmp_path, "embed", "backfill", "--apply", env=env)
    batches = [l for l in done.stderr.splitlines() if l.startswith("embed backfill: ")]
    assert [b.split(" (")[0] for b in batches[:4]] == [
        f"embed backfill: {i}/4" for i in (1, 2, 3, 4)]
    assert batches[-1].startswith("embed backfill: done, the index is caught up after")
    assert "done: the index is caught up" in done.stdout and "/trove" not in done.stdout


# ---------------------------------------------------------------- item 17: CLI hints
def test_cli_hints_name_cli_commands(tmp_path, fake, monkeypatch):
    two_sessions(tmp_path)
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url,
           "TROVE_ROLLUPS_ENABLED": "true"}
    preview = run(tmp_path, "embed", "backfill", env=env).stdout
    assert "apply: trove.py embed backfill --apply" in preview and "/trove" not in preview
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert "apply: /trove embed backfill apply" in command.handle("embed backfill")


# ---------------------------------------------------------------- item 16: carried
def test_describe_says_carried_only_for_a_carried_node(tmp_path):
    from enginekit import drive
    engine = make_engine(tmp_path, window=16_000, session="alpha")
    drive(engine, 30)
    node = engine.dag.frontier("alpha")[0]["node_id"]
    other = make_engine(tmp_path, session="beta")
    other.ingest([{"role": "user", "content": "hello"}])
    close_databases()
    shell = json.loads(run(tmp_path, "describe", f"n{node}", "--json").stdout)
    assert shell["carried"] is False                      # the operator reads; nothing carried
    assert "carried: False" in run(tmp_path, "describe", f"n{node}").stdout
    mine = json.loads(engine.handle_tool_call("trove_describe", {"node_id": node}))
    assert mine["carried"] is False
    engine.dag.carry_nodes("beta", [node])
    carried = json.loads(other.handle_tool_call("trove_describe", {"node_id": node}))
    assert carried["carried"] is True and carried["session_id"] == "alpha"


# ---------------------------------------------------------------- item 18: titles
def test_session_titles_from_the_host_work_where_an_id_does(tmp_path):
    from hermes_state import SessionDB
    two_sessions(tmp_path)
    host = SessionDB(db_path=tmp_path / "state.db")
    host.create_session("second", source="cli")
    host.set_session_title("second", "first-session")
    host.close()
    listing = run(tmp_path, "sessions").stdout
    header, *lines = listing.splitlines()
    assert header.split()[:2] == ["session", "title"]
    assert any(l.split()[:2] == ["second", "first-session"] for l in lines)
    by_title = json.loads(run(tmp_path, "load-session", "first-session", "--json").stdout)
    assert [m["content"] for m in by_title["messages"]][-1] == FACT
    grep = run(tmp_path, "grep", "BlueHeron", "--session", "First-Session").stdout
    assert "BlueHeron relay" in grep
    assert "BlueHeron relay" in command.handle("grep --session first-session BlueHeron")
    missing = run(tmp_path, "export", "no-such-title")
    assert missing.returncode == 2 and "neither as an id nor as a session title" in \
        missing.stderr


# ---------------------------------------------------------------- item 20: the DAG page
def test_dag_labels_count_in_the_session_and_the_page_is_readable(tmp_path):
    from enginekit import coding_turn
    from hermes_trove.operators.dagview import dag_data
    alpha = make_engine(tmp_path, window=16_000, session="alpha")
    beta = make_engine(tmp_path, session="beta")
    history = []
    for turn in range(30):            # two sessions written turn by turn: ids interleave
        history += coding_turn(turn)
        alpha.ingest(history)
        beta.ingest([{"role": "user", "content": f"beta turn {turn}"}])
    alpha.compress(history, current_tokens=60_000)
    data = dag_data(alpha.store, alpha.dag, "alpha")
    leaf = next(n for n in data["nodes"] if n["depth"] == 0)
    assert leaf["last"] - leaf["first"] + 1 > leaf["messages"]     # store ids span beta's
    own = [r[0] for r in sqlite3.connect(tmp_path / "trove.db").execute(
        "SELECT store_id FROM messages WHERE session_id = 'alpha' ORDER BY store_id")]
    assert leaf["span"] == [own.index(leaf["first"]) + 1, own.index(leaf["last"]) + 1]
    assert leaf["span"][1] - leaf["span"][0] + 1 < leaf["last"] - leaf["first"] + 1
    assert "' msgs' +" in (ROOT / "operators" / "dagview.py").read_text()
    close_databases()
    out = tmp_path / "dag.html"
    done = run(tmp_path, "dag", "alpha", "--out", out)
    assert done.returncode == 0, done.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert (out.stat().st_mode & 0o777) == 0o666 & ~umask
    out.chmod(0o640)
    run(tmp_path, "dag", "alpha", "--out", out, "--force")
    assert out.stat().st_mode & 0o777 == 0o640                    # a replaced file keeps its
