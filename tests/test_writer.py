"""storage.writer: statements of one transaction on a helper thread, in order, no thread left."""
import sqlite3
import threading

import pytest

from hermes_trove.storage.writer import StatementWriter


def _conn():
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    conn.execute("BEGIN")
    return conn


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trove-ingest-writer"]


@pytest.mark.parametrize("threaded", [True, False])
def test_statements_run_in_order_and_the_helper_is_gone_after_close(threaded):
    conn = _conn()
    with StatementWriter(conn, threaded=threaded) as writer:
        for i in range(50):
            writer.execute("INSERT INTO t (v) VALUES (?)", (f"v{i}",))
    assert not _writers()
    assert [r[0] for r in conn.execute("SELECT v FROM t ORDER BY id")] == [f"v{i}" for i in range(50)]


def test_a_statement_error_reaches_the_caller_and_stops_the_rest():
    conn = _conn()
    with pytest.raises(sqlite3.IntegrityError):
        with StatementWriter(conn, threaded=True) as writer:
            writer.execute("INSERT INTO t (v) VALUES (?)", ("a",))
            writer.execute("INSERT INTO t (v) VALUES (?)", (None,))  # NOT NULL fails
            for _ in range(20):
                writer.execute("INSERT INTO t (v) VALUES (?)", ("after",))
    assert not _writers()
    assert [r[0] for r in conn.execute("SELECT v FROM t")] == ["a"]


def test_an_error_of_the_caller_drops_what_is_queued_and_joins():
    conn = _conn()
    gate = threading.Event()
    conn.create_function("wait_gate", 0, lambda: gate.wait(5) and 1)
    with pytest.raises(RuntimeError, match="caller broke"):
        with StatementWriter(conn, threaded=True) as writer:
            writer.execute("INSERT INTO t (v) VALUES (wait_gate())", ())
            for _ in range(5):
                writer.execute("INSERT INTO t (v) VALUES ('queued')", ())
            # the first statement is still running when the caller fails
            threading.Timer(0.2, gate.set).start()
            raise RuntimeError("caller broke")
    assert not _writers()
    assert conn.execute("SELECT count(*) FROM t WHERE v = 'queued'").fetchone()[0] == 0
