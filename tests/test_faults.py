"""Faults the agent must survive: racing first opens, broken databases, bad inputs."""

import multiprocessing
import sqlite3

from hermes_trove.storage import migrations


def _open_new(path: str, barrier, results) -> None:
    from hermes_trove.storage import database
    from hermes_trove.store import Store
    database._registry.clear()  # a forked child owns none of the parent's connections
    barrier.wait()
    try:
        store = Store(database.get_database(path))
        store.ensure_session("s")
        results.put("ok")
    except Exception as exc:  # reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")


def test_several_processes_open_a_new_database_at_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    failures = []
    for trial in range(20):
        path = str(tmp_path / f"race-{trial}.db")
        barrier, results = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=_open_new, args=(path, barrier, results)) for _ in range(3)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        failures += [o for o in outcomes if o != "ok"]
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == migrations.latest_version()
        assert [r[0] for r in conn.execute("SELECT version FROM trove_migrations")] == [
            v for v, _, _ in migrations.MIGRATIONS]
        conn.close()
    assert failures == []
