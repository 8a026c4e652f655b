"""A cron run's claim on its session (``storage.locks.claim_run``), on both engines.

A run's session is taken in the step that finds it free, so two runs of one job
started in the same second, in two processes, never both store into it
(binding/cron.py). On SQLite the claim is a byte-range lock of ``<database>.locks``,
on PostgreSQL an advisory lock: both must let exactly one process have a run, die
with a crashed process, tell two different runs apart however their ids hash, and
be let go when the run ends, not at the process's next bind.
"""
import hashlib
import signal
import time

import pytest

import hermes_trove
from hermes_trove.storage import database, locks
from claimkit import answers, claimed_elsewhere, claimer
from enginekit import make_engine

pytestmark = pytest.mark.usefixtures("engines_on_backend")

RUN = "cron_a1b2c3_20261205_041815"


def target(backend, tmp_path) -> str:
    """The database of the test, made (migrated) before any other process opens it."""
    name, db = backend
    database.get_database(db)
    return db


def until(predicate, seconds: float = 15.0) -> bool:
    """Whether ``predicate()`` turned true within ``seconds`` (a server notices a dead
    client's connection a moment after the kernel closes it)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_two_processes_racing_for_one_run_one_takes_it_until_it_dies(backend, tmp_path):
    """Both claim the same run at the same moment: exactly one gets it, nobody else
    (this process included) can take it while that one lives, and a crash (kill -9)
    lets it go: the claim never outlives its process or its connection."""
    db = target(backend, tmp_path)
    go, done = tmp_path / "go", [tmp_path / "done0", tmp_path / "done1"]
    children = [claimer(db, go, done[n], RUN) for n in range(2)]
    try:
        go.touch()
        outcomes = [answers(child)[0] for child in children]
        assert sorted(outcomes) == [False, True]
        winner, loser = outcomes.index(True), outcomes.index(False)
        assert not locks.claim_run(db, RUN)
        assert claimed_elsewhere(db, tmp_path, RUN) == [False]
        done[loser].touch()
        children[loser].communicate(timeout=30)   # the loser leaving changes nothing
        assert not locks.claim_run(db, RUN)
        children[winner].send_signal(signal.SIGKILL)
        children[winner].wait(30)
        assert until(lambda: locks.claim_run(db, RUN))
    finally:
        for path in done:
            path.touch()
        for child in children:
            child.kill()
            child.communicate(timeout=30)


def colliding_ids() -> tuple[str, str]:
    """Two run ids the old claim key (a 20-bit slot of the id's hash) could not tell
    apart: the second run was sent to ``<id>-2`` though nobody ran it."""
    seen: dict[int, str] = {}
    for n in range(1_000_000):
        run = f"cron_job{n}_20261205_041815"
        slot = int.from_bytes(hashlib.sha256(run.encode()).digest()[:8], "big") % (1 << 20)
        if slot in seen:
            return seen[slot], run
        seen[slot] = run
    raise AssertionError("no collision found")


def test_two_runs_whose_ids_shared_a_lock_slot_are_claimed_apart(backend, tmp_path):
    """Another process holds one run: a different run whose id fell into the same slot
    of the old 2^20-slot key is still free; the held one is not."""
    db = target(backend, tmp_path)
    held, other = colliding_ids()
    go, done = tmp_path / "go", tmp_path / "done"
    child = claimer(db, go, done, held)
    try:
        go.touch()
        assert answers(child) == [True]
        assert locks.claim_run(db, other)
        assert not locks.claim_run(db, held)
    finally:
        done.touch()
        child.communicate(timeout=30)


def cron_run(tmp_path):
    """One cron run's engine copy as AIAgent init binds it."""
    engine = make_engine(tmp_path, session=None)
    engine.bind_session_state(None, RUN)
    engine.on_session_start(RUN, platform="cron")
    return engine


def test_a_finished_run_lets_its_claim_go_at_once(backend, tmp_path):
    """The host fires the ``on_session_end`` hook at the end of every run; a cron run
    has one. The run's claim was kept until this process bound another session, so a
    long-lived gateway that ran one job and idled kept it from every other process."""
    first = cron_run(tmp_path)
    db = str(first.store.db.path)
    second = cron_run(tmp_path)                        # the same second, in this process
    assert (first.canonical_id, second.canonical_id) == (RUN, f"{RUN}-2")
    assert claimed_elsewhere(db, tmp_path, RUN, f"{RUN}-2") == [False, False]
    hermes_trove.on_session_end(session_id=RUN, platform="cron")    # the copy bound last: the second run
    assert claimed_elsewhere(db, tmp_path, RUN, f"{RUN}-2") == [False, True]
    first.ingest([{"role": "user", "content": "run one"}])
    for other in ("cli-session", None, 7, ["odd"]):   # not a run (or not an id): nothing moves
        hermes_trove.on_session_end(session_id=other, platform="cli")
    assert claimed_elsewhere(db, tmp_path, RUN) == [False]
    assert second.canonical_id == f"{RUN}-2"          # the copy itself stays bound
