"""One refused statement fails one call, not the store (docs/architecture.md, "Faults").

A statement the database refuses (a bug, a schema this version does not expect, a
constraint) is not an outage: the engine must not switch to running without its
store for it, its message must name the failing operation and send nobody to check
a server, and every message must still end up stored exactly once. Each fault here
is a real driver error: the matched statement is replaced by one the engine refuses
(PostgreSQL 15: a subquery without an alias; SQLite: an unknown table).
"""

import json
import re
import sqlite3
from collections import Counter

import pytest

from hermes_trove import on_post_llm_call
from hermes_trove.storage import database, faults

from enginekit import coding_turn, make_engine
from hostkit import fake_llm  # noqa: F401 (fixture)

BAD_SQL = {"sqlite": "SELECT * FROM no_such_table", "postgresql": "SELECT * FROM (SELECT 1)"}


class RefusingConnection:
    """The shared connection, except that statements matching ``pattern`` are replaced
    by one the engine refuses: the first ``times`` of them (None: all while armed)."""

    def __init__(self, conn, pattern: str, bad_sql: str, times: int | None = 1):
        self._conn, self._pattern, self._bad = conn, re.compile(pattern), bad_sql
        self.times, self.refused, self.armed = times, 0, True

    def execute(self, sql, *args):
        if (self.armed and self._pattern.search(sql)
                and (self.times is None or self.refused < self.times)):
            self.refused += 1
            sql, args = self._bad, ()
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def refuse(monkeypatch, engine, pattern, times=1, bad_sql=None):
    """Replace the engine's shared connection by a ``RefusingConnection``."""
    db = engine.store.db
    dialect = getattr(db, "dialect", "sqlite")
    proxy = RefusingConnection(db.conn, pattern, bad_sql or BAD_SQL[dialect], times)
    monkeypatch.setattr(db, "conn", proxy)
    return proxy


def assert_stored_once(engine, messages):
    rows = engine.store.session_messages("sess", limit=100_000)
    seen = Counter((r["role"], r["content"]) for r in rows)
    want = Counter((m["role"], m["content"]) for m in messages)
    assert seen == want, (seen - want, want - seen)


@pytest.mark.usefixtures("engines_on_backend")
@pytest.mark.parametrize("where", ["identity_read_once", "search_always"])
def test_a_refused_statement_fails_one_call_and_later_turns_are_stored(
        tmp_path, monkeypatch, where):
    """The finding (PostgreSQL host walk): one refused statement marked the database
    unusable for the process and told the operator to check the server."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [m for t in range(6) for m in coding_turn(t, filler=200)]
    engine.on_session_end("sess", messages)
    if where == "identity_read_once":   # the next ingest's read of the session's views
        proxy = refuse(monkeypatch, engine, r"FROM session_views", times=1)
        messages = messages + coding_turn(6, filler=200)
        engine.compress(messages, current_tokens=engine.threshold_tokens + 1)
        assert proxy.refused == 1
    else:                               # every full-text search, for the whole test
        pattern = r"messages_fts|tsquery"
        proxy = refuse(monkeypatch, engine, pattern, times=None)
    answer = json.loads(engine.handle_tool_call("trove_grep", {"query": "handler_4"},
                                                messages=messages))
    text = json.dumps(answer)
    if where == "search_always":
        assert proxy.refused >= 1 and "refused one statement" in text, text
        assert "trove_grep" in answer["error"] and "not an outage" in answer["error"]
    assert "server is up" not in text and "restore" not in text
    assert engine.database_fault is None, engine.database_fault
    for t in range(7, 10):              # later turns, through the hooks a host calls
        messages = messages + coding_turn(t, filler=200)
        engine.on_session_end("sess", messages)
        assert engine.store.count_messages("sess") == len(messages)
    on_post_llm_call("sess", list(messages))
    assert_stored_once(engine, messages)
    if where == "identity_read_once":
        error = next(e for e in engine.errors if "refused one statement" in e)
        assert "database (compress)" in error and "not an outage" in error


@pytest.mark.usefixtures("engines_on_backend")
def test_a_statement_that_always_fails_in_compress_keeps_the_prompt_bounded(
        tmp_path, monkeypatch):
    """Each compaction falls back to the trim for its own call; the store stays in use
    (turns stored once, the trim's notice never) and nothing reaches the host."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [m for t in range(30) for m in coding_turn(t, filler=200)]
    engine.on_session_end("sess", messages)
    proxy = refuse(monkeypatch, engine, r"INSERT INTO nodes\b", times=None)
    messages = messages + coding_turn(30, filler=200)
    out = engine.compress(messages, current_tokens=engine.threshold_tokens + 1)
    assert proxy.refused >= 1
    assert len(out) < len(messages) and out[-1] == messages[-1]
    assert engine.database_fault is None
    messages = out + coding_turn(31, filler=200)
    engine.on_session_end("sess", messages)
    proxy.armed = False
    stored = [m for t in range(32) for m in coding_turn(t, filler=200)]
    assert_stored_once(engine, stored)


@pytest.mark.usefixtures("engines_on_backend")
def test_an_outage_still_takes_the_store_away_until_the_retry(tmp_path, monkeypatch,
                                                               engines_on_backend):
    """A lost server connection (PostgreSQL: no SQLSTATE) or a full disk (SQLite) is an
    outage: the engine runs without the store, as before."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [m for t in range(6) for m in coding_turn(t, filler=200)]
    engine.on_session_end("sess", messages)
    def broken(*args, **kwargs):   # a new error each call (see the next test file's note)
        if engines_on_backend == "postgresql":
            error = sqlite3.OperationalError("server closed the connection unexpectedly")
            error.sqlstate = None
            raise error
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(type(engine.store), "ingest", broken)
    engine.on_session_end("sess", messages + coding_turn(6, filler=200))
    assert engine.database_fault is not None
    assert "refused one statement" not in engine.database_fault["problem"]


def _sqlite_error(sql):
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    try:
        conn.execute(sql)
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()


def test_the_drivers_code_decides_what_is_an_outage():
    closed = sqlite3.connect(":memory:")
    closed.close()
    with pytest.raises(sqlite3.ProgrammingError) as closed_error:
        closed.execute("SELECT 1")
    statement = [_sqlite_error("SELECT * FROM nope"), _sqlite_error("SELEC 1"),
                 _sqlite_error("INSERT INTO t VALUES (1), (1)"),
                 sqlite3.ProgrammingError("Incorrect number of bindings supplied")]
    outage = [sqlite3.OperationalError("database or disk is full"),
              sqlite3.OperationalError("database is locked"),
              sqlite3.DatabaseError("database disk image is malformed"), closed_error.value,
              database.DatabaseError("cannot open trove database x"),
              faults.Unavailable({})]
    for code, is_outage in (("42P01", False), ("42601", False), ("23505", False),
                            ("22001", False), ("57014", False), ("40P01", False),
                            (None, True), ("08006", True), ("53100", True), ("57P01", True),
                            ("28P01", True), ("55P03", True), ("XX001", True)):
        error = sqlite3.OperationalError(f"sqlstate {code}")
        error.sqlstate = code
        (outage if is_outage else statement).append(error)
    assert [e for e in statement if faults.is_outage(e)] == []
    assert [e for e in outage if not faults.is_outage(e)] == []
    assert not faults.is_outage(ValueError("a bug"))


def test_a_statement_error_is_described_as_one_and_names_no_password():
    error = sqlite3.OperationalError("subquery in FROM must have an alias")
    error.sqlstate = "42601"
    fault = faults.describe("postgresql://trove@db:5432/trove", error, "compress")
    assert fault["kind"] == "statement" and "compress failed" in fault["problem"]
    assert "server" not in fault["repair"] and "credentials" not in fault["repair"]
    outage = sqlite3.OperationalError("connection refused")
    outage.sqlstate = None
    assert "server is up" in faults.describe("postgresql://trove@db/trove", outage)["repair"]


# ---------------------------------------------------------------- through the real host
@pytest.mark.parametrize("engine_name", ["sqlite", "postgresql"])
def test_a_statement_refused_in_a_tool_call_leaves_the_real_host_storing(
        tmp_path, fake_llm, engine_name):
    """Real Hermes: the first statement of a trove_grep call is refused. The model is
    told what failed (no server, no backup), the store stays in use, and every user
    text and answer of the session is stored exactly once."""
    import hostkit as hk
    from pgkit import require_pg, store_env
    if engine_name == "postgresql":
        require_pg()

    def responder(body):
        last = body.get("messages", [])[-1]
        if not hk.is_main_request(body):
            return hk.Reply(text="- summary")
        if last.get("role") == "tool":
            return hk.Reply(text="Checked the archive.")
        if "search the archive" in json.dumps(last):
            return hk.ToolCall("trove_grep", {"query": "module_1"})
        return hk.Reply(text="Answer: " + str(last.get("content"))[:40])

    fake_llm.responder = responder
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with store_env(engine_name == "postgresql") as env, hk.host_env(home, extra_env=env):
        agent = hk.make_agent()
        engine = hk.live_engine(agent)
        texts = [f"Task {i}: look at module_{i}." for i in range(4)]
        results = hk.run_turns(agent, texts)
        proxies = []
        tool_call = engine.handle_tool_call

        def refusing_tool_call(name, args, **kwargs):
            if not proxies:   # the first statement of the first trove tool call
                db = engine.store.db
                proxies.append(RefusingConnection(
                    db.conn, r".", BAD_SQL[getattr(db, "dialect", "sqlite")], times=1))
                db.conn = proxies[0]
            return tool_call(name, args, **kwargs)
        engine.handle_tool_call = refusing_tool_call
        more = ["Please search the archive for module_1."] + [
            f"Task {i}: look at module_{i}." for i in range(4, 7)]
        results += hk.run_turns(agent, more, history=results[-1]["messages"])
        hk.end_session(agent, results[-1]["messages"])
        assert proxies and proxies[0].refused == 1
        engine.store.db.conn = proxies[0]._conn
        assert engine.database_fault is None, engine.database_fault
        answer = next(m for m in results[4]["messages"] if m.get("role") == "tool")["content"]
        assert "server is up" not in answer and "restore" not in answer, answer
        rows = engine.store.session_messages(engine.canonical_id, limit=10_000)
    seen = Counter((r["role"], r["content"]) for r in rows if r["role"] in ("user",
                                                                             "assistant"))
    for text in texts + more:
        assert seen[("user", text)] == 1, (text, seen)
    answers = [c for (role, c) in seen if role == "assistant" and c.startswith("Answer: ")]
    assert len(answers) == len(texts + more) - 1
    assert [key for key, count in seen.items() if count != 1] == []


@pytest.mark.usefixtures("engines_on_backend")
def test_a_statement_refused_when_the_session_starts_still_stores_its_turns(
        tmp_path, monkeypatch):
    """The session's own row could not be written at ``on_session_start``: the engine
    stays bound, the store in use, and the first ingest records the session."""
    engine = make_engine(tmp_path, window=64_000, session="warmup")
    proxy = refuse(monkeypatch, engine, r"INTO sessions", times=1)
    engine.on_session_start("sess", platform="cli")
    assert proxy.refused == 1 and engine.database_fault is None
    assert engine.session_id == "sess"
    messages = []
    for t in range(4):
        messages = messages + coding_turn(t)
        on_post_llm_call("sess", list(messages))
        engine.on_session_end("sess", messages)
    assert_stored_once(engine, messages)


def test_a_server_outage_names_its_own_repair():
    """A full disk or a held lock on the server is not repaired by checking that the
    server is up or the credentials (the one repair every server fault had)."""
    for code, words in (("53100", "free space"), ("55P03", "pg_stat_activity"),
                        ("25006", "primary"), ("42501", "grant"), (None, "server is up")):
        error = sqlite3.OperationalError(f"sqlstate {code}")
        error.sqlstate = code
        fault = faults.describe("postgresql://trove@db/trove", error)
        assert words in fault["repair"], (code, fault)
        assert "kind" not in fault


def test_a_connection_the_server_closed_is_opened_again(tmp_path, monkeypatch):
    """The server ends the shared connection (a restart, a failover, an idle timeout):
    an outage while it lasts, and after the retry a new connection, not the dead one
    for the rest of the process (every later turn was unstored until exit)."""
    from pgkit import PG_URL, PgSchema, require_pg
    require_pg()
    import psycopg
    import enginekit
    schema = PgSchema()
    try:
        monkeypatch.setattr(enginekit, "DATABASE_URL", schema.url)
        engine = make_engine(tmp_path, window=64_000)
        messages = coding_turn(0)
        engine.on_session_end("sess", messages)
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)",
                          (engine.store.db.conn.raw.info.backend_pid,))
        messages = messages + coding_turn(1)
        engine.on_session_end("sess", messages)
        assert engine.database_fault is not None          # an outage, as before
        engine._faults.at -= 3600                          # the retry is due
        messages = messages + coding_turn(2)
        engine.on_session_end("sess", messages)
        assert engine.database_fault is None
        assert_stored_once(engine, messages)
    finally:
        schema.drop()


@pytest.mark.usefixtures("engines_on_backend")
def test_the_turn_hook_follows_the_outage_rule_too(tmp_path, monkeypatch):
    """``post_llm_call`` stores each turn; an outage it meets is an outage for the
    engine (noted, retried every 30 s, no attempt per turn: on a server each was a
    connection attempt of up to 10 s), a refused statement fails that turn alone."""
    from hermes_trove.store import Store
    engine = make_engine(tmp_path, window=64_000)
    messages = coding_turn(0)
    on_post_llm_call("sess", list(messages))
    real_ingest, calls = Store.ingest, []

    def full(self, *args, **kwargs):
        calls.append(1)
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(Store, "ingest", full)
    for t in (1, 2, 3):
        messages = messages + coding_turn(t)
        on_post_llm_call("sess", list(messages))
    assert len(calls) == 1 and engine.database_fault is not None
    monkeypatch.setattr(Store, "ingest", real_ingest)
    engine._faults.at -= 3600                              # the retry is due
    messages = messages + coding_turn(4)
    on_post_llm_call("sess", list(messages))
    assert engine.database_fault is None
    assert_stored_once(engine, messages)


@pytest.mark.parametrize("error_class, text", [
    (sqlite3.IntegrityError, "UNIQUE constraint failed: messages.store_id"),
    (sqlite3.ProgrammingError, "Incorrect number of bindings supplied"),
    (sqlite3.InterfaceError, "Error binding parameter 1: type 'dict' is not supported"),
    (sqlite3.DataError, "string or blob too big")])
def test_a_driver_error_of_one_path_never_takes_the_store(tmp_path, monkeypatch, error_class,
                                                          text):
    """SQLite's own statement errors raised by the store's write, three turns in a row:
    nothing reaches the host, the store stays in use, and once the write works the
    host's next list stores every message once."""
    from hermes_trove.store import Store
    engine = make_engine(tmp_path, window=64_000)
    messages = coding_turn(0)
    engine.on_session_end("sess", messages)
    real_ingest = Store.ingest

    def refused(self, *args, **kwargs):
        # a new error each time: a shared instance's traceback kept this test's engine
        # alive after it, and the next test file's /trove status found it
        raise error_class(text)
    monkeypatch.setattr(Store, "ingest", refused)
    for t in (1, 2, 3):
        messages = messages + coding_turn(t)
        on_post_llm_call("sess", list(messages))
        engine.compress(messages, current_tokens=engine.threshold_tokens + 1)
        engine.on_session_end("sess", messages)
        assert engine.database_fault is None
    monkeypatch.setattr(Store, "ingest", real_ingest)
    messages = messages + coding_turn(4)
    on_post_llm_call("sess", list(messages))
    assert_stored_once(engine, messages)
