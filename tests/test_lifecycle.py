"""The empty-session lifecycle GC (issue #17, item 3): bounded, never a row in use."""
import time

from hermes_trove.dag import Dag, NewNode
from hermes_trove.storage import lifecycle
from hermes_trove.storage.database import get_database
from hermes_trove.store import Store

from enginekit import make_engine

DAY = 86_400


def age(db, session_id, seconds):
    with db.transaction() as conn:
        conn.execute("UPDATE sessions SET updated_at = updated_at - ? WHERE session_id = ?",
                     (seconds, session_id))


def sessions(db):
    with db.reading() as conn:
        return {r[0] for r in conn.execute("SELECT session_id FROM sessions")}


def test_prunes_only_old_empty_unreferenced_rows(tmp_path):
    db = get_database(tmp_path / "t.db")
    store, dag = Store(db), Dag(db)
    for name in ("empty1", "empty2", "fresh-empty", "with-msg", "with-node", "parent"):
        store.ensure_session(name)
    store.ensure_session("alias", canonical_id="parent")
    [store_id] = store.ingest("with-msg", [{"role": "user", "content": "keep me"}]).store_ids
    dag.add_node(NewNode(session_id="with-node", depth=0, text="s", token_count=1,
                         source_token_count=2, level=3, model="deterministic",
                         child_store_ids=[store_id]))
    for name in sessions(db) - {"fresh-empty"}:
        age(db, name, 2 * DAY)
    result = lifecycle.prune_empty_sessions(db, threshold=1, max_age_hours=24)
    assert result == {"candidates": 2, "pruned": 2}
    assert sessions(db) == {"fresh-empty", "with-msg", "with-node", "parent", "alias"}


def test_below_threshold_nothing_is_pruned_and_bound_sessions_are_kept(tmp_path):
    db = get_database(tmp_path / "t.db")
    store = Store(db)
    for n in range(3):
        store.ensure_session(f"e{n}")
        age(db, f"e{n}", 2 * DAY)
    assert lifecycle.prune_empty_sessions(db, threshold=4, max_age_hours=24)["pruned"] == 0
    assert len(sessions(db)) == 3
    result = lifecycle.prune_empty_sessions(db, threshold=2, max_age_hours=24, keep=("e1",))
    assert result["pruned"] == 2 and sessions(db) == {"e1"}


def test_one_run_is_bounded(tmp_path):
    db = get_database(tmp_path / "t.db")
    now = time.time()
    with db.transaction() as conn:
        conn.executemany("INSERT INTO sessions(session_id, canonical_id, created_at, updated_at)"
                         " VALUES (?, ?, ?, ?)",
                         [(f"s{n}", f"s{n}", now - 2 * DAY, now - 2 * DAY)
                          for n in range(lifecycle.MAX_PRUNE + 20)])
    assert lifecycle.prune_empty_sessions(db, threshold=1, max_age_hours=24)["pruned"] == \
        lifecycle.MAX_PRUNE
    assert len(sessions(db)) == 20


def test_engine_prunes_at_session_start_when_enabled(tmp_path):
    engine = make_engine(tmp_path, session="first", empty_lifecycle_gc_threshold=2)
    db = engine.store.db
    for n in range(3):
        engine.store.ensure_session(f"old{n}")
        age(db, f"old{n}", 2 * DAY)
    engine.on_session_start("second", platform="cli")
    assert {"old0", "old1", "old2"} <= sessions(db)  # the first start ran it: not due yet
    with db.transaction() as conn:  # an hour later
        conn.execute("UPDATE trove_meta SET value = value - 3601 WHERE key = ?",
                     (lifecycle.LAST_RUN_KEY,))
    engine.on_session_start("third", platform="cli")
    assert sessions(db) == {"first", "second", "third"}
    assert engine.get_status()["empty_lifecycle_gc"]["pruned"] == 3

    off = make_engine(tmp_path / "off", session="a", empty_lifecycle_gc_enabled="false",
                      empty_lifecycle_gc_threshold=1)
    off.store.ensure_session("old")
    age(off.store.db, "old", 2 * DAY)
    off.on_session_start("b", platform="cli")
    assert "old" in sessions(off.store.db)
