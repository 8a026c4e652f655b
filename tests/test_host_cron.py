"""Cron runs inside the real hermes-agent 0.19.0 host (fake model on 127.0.0.1).

cron/scheduler.py ``run_job`` builds one ``AIAgent(platform="cron",
session_id="cron_<job>_<YYYYmmdd_HHMMSS>")`` per run and runs its turn on a worker
thread in a copy of the run's context. Two runs of a job started in the same second
(a tick in parallel mode beside a manual run) share that id; each must be stored once,
in its own session, under the job's owner, however their hook calls interleave.
"""

import sqlite3
import threading

import pytest

from claimkit import claimed_elsewhere
from hostkit import fake_llm, trove_host  # noqa: F401 (fixtures)

pytestmark = pytest.mark.host


def stored(home):
    """{session: [(role, content), ...]} and {session: owner} of the trove database."""
    db = sqlite3.connect(home / "trove.db")
    try:
        texts: dict[str, list] = {}
        for session, role, content in db.execute(
                "SELECT session_id, role, content FROM messages ORDER BY store_id"):
            texts.setdefault(session, []).append((role, content))
        return texts, dict(db.execute("SELECT session_id, owner FROM session_owners"))
    finally:
        db.close()


def test_two_concurrent_runs_of_one_job_in_one_second_keep_their_own_turns(trove_host,
                                                                           monkeypatch):
    """Both runs' agents are built (both engine copies bound to the one host id) before
    either turn ends. The hooks name only the host id, and reached the copy bound last:
    the first run's turn was stored in the second run's session (``<id>-2`` held both
    runs, the first run's own session nothing)."""
    from cron import jobs, scheduler

    both_asked = threading.Barrier(2, timeout=30)

    def responder(body):   # each run's first model call waits for the other's
        user = [m for m in body["messages"] if m.get("role") == "user"][-1]["content"]
        if body["messages"][-1].get("role") == "user":
            try:
                both_asked.wait()
            except threading.BrokenBarrierError:
                pass
        return "reply to " + ("one" if "run one" in str(user) else "two")

    trove_host.server.responder = responder
    job = jobs.create_job("check the pump", "every 1h", deliver="local",
                          origin={"platform": "telegram", "chat_id": "9", "user_id": "9"})
    frozen = scheduler._hermes_now()
    monkeypatch.setattr(scheduler, "_hermes_now", lambda: frozen)
    outcomes = []
    runs = [threading.Thread(target=lambda p=p: outcomes.append(
                scheduler.run_job(dict(jobs.get_job(job["id"]), prompt=p))[0]))
            for p in ("run one: pressure 41 psi", "run two: the pump is off")]
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)
    assert outcomes == [True, True]
    texts, owners = stored(trove_host.hermes_home)
    run_id = f"cron_{job['id']}_{frozen.strftime('%Y%m%d_%H%M%S')}"
    assert sorted(texts) == [run_id, f"{run_id}-2"], texts
    for session, rows in texts.items():
        (user_role, prompt), (reply_role, reply) = rows   # one turn each, stored once
        assert (user_role, reply_role) == ("user", "assistant")
        mine = "one" if "run one" in prompt else "two"
        assert f"run {mine}" in prompt and reply == f"reply to {mine}"
        assert owners[session] == f"cron:job:{job['id']}"


def test_a_finished_run_lets_its_claim_go_for_every_other_process(trove_host, monkeypatch,
                                                                  tmp_path):
    """A gateway that ran one job and then idled kept the run's claim on its session
    until its next bind: no other process could take that session meanwhile. The claim
    lasts the run (another process cannot take it while the model answers) and goes
    when the host ends the run (its ``on_session_end`` hook)."""
    from cron import jobs, scheduler
    job = jobs.create_job("check the pump", "every 1h", deliver="local",
                          origin={"platform": "telegram", "chat_id": "9", "user_id": "9"})
    frozen = scheduler._hermes_now()
    monkeypatch.setattr(scheduler, "_hermes_now", lambda: frozen)
    run_id = f"cron_{job['id']}_{frozen.strftime('%Y%m%d_%H%M%S')}"
    db = str(trove_host.hermes_home / "trove.db")
    during = []

    def responder(body):
        during.extend(claimed_elsewhere(db, tmp_path, run_id))
        return "pressure is fine"

    trove_host.server.responder = responder
    outcome = scheduler.run_job(dict(jobs.get_job(job["id"])))
    assert outcome[0] is True, outcome
    assert during and not any(during)            # held while the run lasted
    assert claimed_elsewhere(db, tmp_path, run_id) == [True]
    texts, _ = stored(trove_host.hermes_home)
    assert [role for role, _ in texts[run_id]] == ["user", "assistant"]
