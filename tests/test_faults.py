"""Faults the agent must survive: racing first opens, broken databases, bad inputs."""

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hermes_trove.storage import migrations


TESTS = Path(__file__).resolve().parent
CHILD = """
import os, sys, time
sys.path[:0] = [{scripts!r}, {tests!r}]
from _bootstrap import load_package
load_package()
from hermes_trove.storage import database
from hermes_trove.store import Store
open({go!r} + f".ready-{{os.getpid()}}", "w").close()
while not os.path.exists({go!r}):
    time.sleep(0.001)
try:
{body}
    print("ok")
except Exception as exc:
    print(f"{{type(exc).__name__}}: {{exc}}")
"""


def run_together(tmp_path, body: str, count: int) -> list[str]:
    """Start ``count`` fresh interpreters (no threads or locks inherited from this one)
    that run ``body`` at the same moment; return what each printed."""
    go = tmp_path / f"go-{time.monotonic_ns()}"
    code = CHILD.format(scripts=str(TESTS.parent / "scripts"), tests=str(TESTS), go=str(go),
                        body=textwrap.indent(textwrap.dedent(body), "    "))
    env = {**os.environ, "HERMES_HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(count)]
    # every interpreter imports and reaches the barrier (says so in a file) before the go
    deadline = time.monotonic() + 120
    while (len(list(tmp_path.glob(go.name + ".ready-*"))) < count
           and time.monotonic() < deadline and all(p.poll() is None for p in procs)):
        time.sleep(0.005)
    go.touch()
    return [(p.communicate(timeout=180)[0].strip().splitlines() or ["no output"])[-1]
            for p in procs]


def test_several_processes_open_a_new_database_at_once(tmp_path):
    failures = []
    for trial in range(20):
        path = str(tmp_path / f"race-{trial}.db")
        outcomes = run_together(tmp_path, f"""
            Store(database.get_database({path!r})).ensure_session("s")
        """, 3)
        failures += [o for o in outcomes if o != "ok"]
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == migrations.latest_version()
        assert [r[0] for r in conn.execute("SELECT version FROM trove_migrations")] == [
            v for v, _, _ in migrations.MIGRATIONS]
        conn.close()
    assert failures == []


# ---------------------------------------------------------------- broken databases
import json  # noqa: E402

import pytest  # noqa: E402

from hermes_trove.compaction import assemble, fallback  # noqa: E402
from hermes_trove.storage import database  # noqa: E402

from enginekit import coding_turn, make_engine  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a test agent."}


def _filled_database(tmp_path) -> str:
    engine = make_engine(tmp_path, window=64_000)
    engine.ingest([m for t in range(60) for m in coding_turn(t)])
    path = str(engine.config.resolved_database_path)
    database.forget_database(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(3000)


def _zero_header(path):
    with open(path, "r+b") as f:
        f.write(b"\0" * 100)


def _garbage_pages(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 4096))


def _directory(path):
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    os.mkdir(path)


def _read_only(path, monkeypatch):
    """A read-only WAL database (the tests run as root, which ignores file modes, so the
    connection itself is opened read-only)."""
    connect = sqlite3.connect

    def read_only(target, *args, **kwargs):
        if str(target) == str(path):
            return connect(f"file:{target}?mode=ro", *args, uri=True, **kwargs)
        return connect(target, *args, **kwargs)
    monkeypatch.setattr(database.sqlite3, "connect", read_only)


BREAKS = {"truncated": _truncate, "zeroed_header": _zero_header,
          "garbage_pages": _garbage_pages, "directory": _directory, "read_only": None}


@pytest.mark.parametrize("kind", list(BREAKS))
def test_a_broken_database_never_breaks_the_agent(tmp_path, monkeypatch, kind):
    path = _filled_database(tmp_path)
    if kind == "read_only":
        _read_only(path, monkeypatch)
    else:
        BREAKS[kind](path)
    engine = make_engine(tmp_path, window=64_000, session=None)
    engine.on_session_start("sess", platform="cli")  # must not raise
    messages = [m for t in range(100, 160) for m in coding_turn(t)]
    for tool in ("trove_status", "trove_doctor", "trove_grep"):
        answer = json.loads(engine.handle_tool_call(tool, {"query": "handler"},
                                                    messages=messages))
        text = json.dumps(answer)
        assert "repair" in text and ("damaged" in text or "directory" in text
                                     or "cannot be" in text), (tool, answer)
        assert "no session is bound" not in text
    out = engine.compress([SYSTEM] + messages, current_tokens=engine.threshold_tokens + 1)
    assert len(out) < len(messages) and out[-1] == messages[-1]
    assert assemble.sequence_problems(out) == []
    engine.on_session_end("sess", messages)
    assert engine.get_status()["database_fault"]["repair"]


def test_the_engine_uses_the_database_again_once_it_is_repaired(tmp_path, monkeypatch):
    path = _filled_database(tmp_path)
    _zero_header(path)
    engine = make_engine(tmp_path, window=64_000)
    assert engine.database_fault is not None
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    monkeypatch.setattr(engine._faults, "at", engine._faults.at - 3600)  # the retry is due
    messages = [m for t in range(5) for m in coding_turn(t)]
    engine.on_session_start("sess", platform="cli")
    engine.ingest(messages)
    assert engine.database_fault is None
    assert engine.store.count_messages("sess") == len(messages)


# ---------------------------------------------------------------- small ones
def test_odd_token_counts_never_raise(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    assert engine.should_compress("abc") is False
    engine.update_from_response({"prompt_tokens": "abc", "completion_tokens": None,
                                 "total_tokens": float("nan")})
    assert (engine.last_prompt_tokens, engine.last_total_tokens) == (0, 0)
    engine.update_from_response({"prompt_tokens": "30000", "completion_tokens": 12.0})
    assert engine.last_prompt_tokens == 30_000 and engine.last_total_tokens == 30_012
    assert engine.should_compress() is True and engine.should_compress(-1) is False


def test_a_period_outside_the_calendar_is_a_clear_error(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    answer = json.loads(engine.handle_tool_call(
        "trove_recent", {"period": "last 999999999999 days"}))
    assert "period" in answer["error"] and "OSError" not in answer["error"]


def test_a_message_without_a_role_comes_back_without_one(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    odd = {"content": "no role here"}
    (store_id,) = engine.ingest([odd])
    from hermes_trove.store import decode_row
    assert decode_row(engine.store.get_message(store_id)) == odd
    assert engine.ingest([odd]) == [store_id]


def test_the_last_summary_error_is_cleared_by_a_success(tmp_path, monkeypatch):
    engine = make_engine(tmp_path, window=64_000)
    messages = [m for t in range(40) for m in coding_turn(t)]
    monkeypatch.setattr(engine, "_compress", lambda *a: (_ for _ in ()).throw(ValueError("x")))
    engine.compress(messages, force=True)
    assert engine._last_summary_error
    monkeypatch.undo()
    engine.compress(messages, force=True)
    assert engine._last_summary_error is None


# ---------------------------------------------------------------- compaction vs rotate
import threading  # noqa: E402
import time  # noqa: E402

RACE_SECONDS = 20


def _rows_under_two_leaves(engine) -> list:
    with engine.store.db.reading() as conn:
        return conn.execute(
            "SELECT child_store_id FROM node_edges WHERE child_store_id IS NOT NULL"
            " GROUP BY child_store_id HAVING count(*) > 1").fetchall()


def test_rotate_apply_while_the_agent_compacts_summarizes_nothing_twice(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4, leaf_chunk_tokens=400)
    messages: list = []
    stop = time.monotonic() + RACE_SECONDS
    errors: list = []

    def agent():
        nonlocal messages
        turn = 0
        while time.monotonic() < stop:
            messages = messages + coding_turn(turn, filler=5)
            turn += 1
            messages = engine.compress(messages, force=True)
            if engine._last_compress_aborted:
                errors.append(engine.last_compaction)

    def operator():
        while time.monotonic() < stop:
            result = engine.rotate(apply=True)
            if result["status"] not in ("rotated", "noop"):
                errors.append(result)

    threads = [threading.Thread(target=agent), threading.Thread(target=operator)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert engine.dag.stats("sess")["nodes"] > 0
    assert _rows_under_two_leaves(engine) == []


def test_two_processes_never_compact_the_same_backlog_twice(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    engine.ingest([m for t in range(80) for m in coding_turn(t, filler=5)])
    for _ in range(3):
        outcomes = run_together(tmp_path, """
            from enginekit import coding_turn, make_engine
            from pathlib import Path
            engine = make_engine(Path(os.environ["HERMES_HOME"]), window=64_000,
                                 fresh_tail_count=4, leaf_chunk_tokens=400)
            engine.compress([m for t in range(80) for m in coding_turn(t, filler=5)],
                            force=True)
            assert engine.last_compaction.get("outcome") != "error", engine.last_compaction
        """, 2)
        assert outcomes == ["ok", "ok"]
    assert _rows_under_two_leaves(engine) == []


# ---------------------------------------------------------------- doctor under a writer
def test_doctor_fts_counts_agree_under_a_concurrent_writer(tmp_path):
    from hermes_trove.diagnostics import health
    engine = make_engine(tmp_path, window=64_000)
    path = str(engine.config.resolved_database_path)
    writer_db = database.Database(database.resolve_path(path))  # its own connection
    from hermes_trove.store import Store
    writer, stop = Store(writer_db), threading.Event()
    # Counting a bigger table takes longer: room for a commit between two separate reads.
    writer.ingest("w", [{"role": "user", "content": f"seed {n}"} for n in range(10_000)])

    def write():
        n = 0
        while not stop.is_set():
            writer.ingest("w", [{"role": "user", "content": f"message {n}"}])
            n += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        bad = [c for _ in range(300) for c in health.check_fts(engine.store, engine.dag,
                                                                engine.config)
               if c["name"].endswith("_rows") and c["status"] != "ok"]
    finally:
        stop.set()
        thread.join()
        writer_db.close()
    assert bad == []


# ---------------------------------------------------------------- bounded recall reads
def test_a_query_of_hundreds_of_cjk_terms_is_bounded():
    from hermes_trove.recall import query_plan
    terms = " ".join(chr(0x4E00 + i) + chr(0x4E00 + 2 * i + 7) for i in range(300))
    plan = query_plan.parse_query(terms)
    assert 0 < len(plan.needles) <= query_plan.MAX_NEEDLES


def test_the_substring_scan_holds_the_connection_one_page_at_a_time(tmp_path, monkeypatch):
    from hermes_trove.store import Store
    db = database.get_database(tmp_path / "scan.db")
    store = Store(db)
    big = "日志 " * 2000
    store.ingest("s", [{"role": "tool", "tool_call_id": f"c{n}", "content": f"{big} {n}"}
                       for n in range(1000)])
    entries = {"n": 0}
    reading = type(db).reading

    def counting(self):
        entries["n"] += 1
        return reading(self)
    monkeypatch.setattr(type(db), "reading", counting)
    assert store.substring_scan("s", ["退避"], limit=5, max_rows=1000, page_rows=50) == []
    assert entries["n"] == 1000 // 50  # the lock was let go between pages
    entries["n"] = 0
    store.substring_scan("s", ["退避"], limit=5, max_rows=1000, page_rows=50, max_seconds=0)
    assert entries["n"] == 1  # out of time after the first page
    assert store.substring_scan("s", ["日志", "999"], limit=5, max_rows=1000,
                                page_rows=50) == [1000]
    database.forget_database(tmp_path / "scan.db")


def test_operator_status_and_doctor_name_the_problem_and_the_repair(tmp_path, monkeypatch):
    path = _filled_database(tmp_path)
    _zero_header(path)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    from hermes_trove import command
    for sub in ("status", "doctor"):
        text = command.handle(sub)
        assert "damaged" in text and "Repair:" in text and "backups" in text, text


# ---------------------------------------------------------------- a fault mid-session
class _HostLikeCompressor:
    """What Hermes's ``ContextCompressor`` does to a list: old tool outputs pruned to
    one-line notes, the middle replaced by a summary message, the tail kept."""

    def compress(self, messages, current_tokens=None, focus_topic=None):
        head, tail = messages[:-12], messages[-12:]
        pruned = [{**m, "content": f"[{m.get('name')}] output pruned"}
                  if m.get("role") == "tool" else m for m in head[-8:]]
        return ([{"role": "user", "content": "[CONTEXT COMPACTION — REFERENCE ONLY] summary"}]
                + pruned + tail)


def _over(engine):
    return engine.threshold_tokens + 1


@pytest.mark.parametrize("builtin", ["hermes", "unavailable"])
def test_a_database_fault_mid_session_stores_nothing_twice_once_it_recovers(
        tmp_path, monkeypatch, builtin):
    """While the database is unusable the prompt is kept bounded by a trim of the
    host's own messages (never the built-in compressor's rewritten ones): when the
    database works again, each shown message is the row it already was, and the
    engine's notice is not stored as conversation."""
    engine = make_engine(tmp_path, window=64_000)
    if builtin == "hermes":
        engine._builtin = _HostLikeCompressor()
    else:
        monkeypatch.setattr(fallback, "builtin_compressor", lambda *a: None)
    messages = [m for t in range(30) for m in coding_turn(t, filler=200)]
    engine.on_session_end("sess", messages)
    stored = engine.store.count_messages("sess")
    assert stored == len(messages)
    engine._note_fault(sqlite3.OperationalError("database or disk is full"))
    messages = messages + coding_turn(30, filler=200)
    out = engine.compress(messages, current_tokens=_over(engine))
    assert out[-1] == messages[-1] and len(out) < len(messages)
    assert assemble.sequence_problems(out) == []
    engine._faults.at -= 3600  # the retry is due: the database works again
    out = out + coding_turn(31, filler=200)
    engine.on_session_end("sess", out)
    rows = engine.store.session_messages("sess", limit=10_000)
    texts = [r["content"] for r in rows if r["content"]]
    assert len(rows) == 32 * 4, [(r["role"], str(r["content"])[:60]) for r in rows[stored:]]
    assert len(texts) == len(set(texts))
    assert not any("trimmed to fit" in t or "CONTEXT COMPACTION" in t for t in texts)


def test_a_database_error_on_a_list_with_a_non_dict_entry_never_raises(tmp_path, monkeypatch):
    engine = make_engine(tmp_path, window=64_000)
    messages = [None] + [m for t in range(30) for m in coding_turn(t, filler=200)]

    def broken(*args):
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(engine, "_compress", broken)
    out = engine.compress(messages, current_tokens=_over(engine))  # must not raise
    assert out is messages or out[-1] == messages[-1]
    assert engine.database_fault is not None


def _remove_database_files(path):
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


def _five_turns_then_the_file_removed(tmp_path, monkeypatch):
    """An engine that stored five turns, whose database files were then deleted (the
    file check runs on every read): (engine, database path, the messages)."""
    monkeypatch.setattr(database, "FILE_CHECK_SECONDS", 0.0, raising=False)
    engine = make_engine(tmp_path, window=64_000)
    path = str(engine.config.resolved_database_path)
    messages = [m for t in range(5) for m in coding_turn(t)]
    engine.on_session_end("sess", messages)
    _remove_database_files(path)
    return engine, path, messages


def test_a_database_file_deleted_under_a_running_engine_is_created_again(tmp_path, monkeypatch):
    """New turns never go to the unlinked file (lost at exit): the file at the path is
    opened again, the session recorded in it, and each message stored there once."""
    engine, path, messages = _five_turns_then_the_file_removed(tmp_path, monkeypatch)
    for t in range(5, 8):
        messages = messages + coding_turn(t)
        engine.on_session_end("sess", messages)
        engine.compress(messages, current_tokens=100)
    assert os.path.exists(path)
    conn = sqlite3.connect(path)
    texts = [r[0] for r in conn.execute("SELECT content FROM messages WHERE content != ''")]
    conn.close()
    assert len(texts) == len(set(texts)) == 8 * 3
    assert engine.store.get_session("sess") is not None


def test_a_database_file_replaced_under_a_running_engine_is_reported(tmp_path, monkeypatch):
    engine, path, messages = _five_turns_then_the_file_removed(tmp_path, monkeypatch)
    with open(path, "wb") as f:
        f.write(b"not a database at all " * 500)
    messages = messages + coding_turn(5)
    engine.on_session_end("sess", messages)
    out = engine.compress(messages, current_tokens=engine.threshold_tokens + 1)
    assert out[-1] == messages[-1]
    assert "damaged" in engine.database_fault["problem"]
    answer = json.loads(engine.handle_tool_call("trove_status", {}, messages=messages))
    assert "repair" in json.dumps(answer)


@pytest.mark.parametrize("error, says, never", [
    ("database or disk is full", "disk is full", "restore"),
    ("database is locked", "locked", "restore"),
])
def test_a_full_disk_or_a_held_lock_is_named_and_never_sent_to_a_backup(
        tmp_path, error, says, never):
    """A clear error: the repair for a full disk or a lock held by another process is
    not 'restore a backup if the file is damaged' (the file is fine)."""
    engine = make_engine(tmp_path, window=64_000)
    engine._note_fault(sqlite3.OperationalError(error))
    fault = engine.database_fault
    assert says in fault["problem"] and never not in fault["repair"], fault


@pytest.mark.parametrize("odd", ["abc", float("nan"), "40000", [], {"n": 1}])
def test_compress_with_an_odd_current_tokens_still_compacts(tmp_path, odd):
    """A count that is not a number is read like ``should_compress`` reads it ("not
    known", or the number a numeric string spells), never a TypeError that aborts
    every compaction of the turn."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [m for t in range(80) for m in coding_turn(t, filler=200)]
    out = engine.compress(messages, current_tokens=odd)
    assert engine._last_compress_aborted is False, engine.last_compaction
    assert len(out) < len(messages) and out[-1] == messages[-1]
    assert assemble.sequence_problems(out) == []


@pytest.mark.parametrize("history", [{"role": "user", "content": "hi"}, 5, "text",
                                     [None, {"role": "user", "content": "hi"}]])
def test_the_turn_hooks_never_raise_on_an_odd_history(tmp_path, history):
    """``pre_llm_call`` and ``post_llm_call`` read a history that is not a list of
    dicts as its dict messages: nothing raises into the host, the dicts are stored."""
    import hermes_trove as plugin
    engine = make_engine(tmp_path, window=64_000)
    plugin.on_pre_llm_call(session_id="sess", conversation_history=history)
    plugin.on_post_llm_call(session_id="sess", conversation_history=history)
    stored = engine.store.count_messages("sess")
    assert stored == (1 if isinstance(history, list) else 0)
