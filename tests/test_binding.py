"""Session binding without the host: switch kinds, the lazy check, review forks.

The real-host proofs are in test_host_sessions.py; these pin the rules fast.
"""

import contextvars
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_trove.binding import forks, switches
from hermes_trove.engine import find_engine
from enginekit import host_tokens, make_engine

HARNESS = ("Review the conversation above and update the skill library. Be ACTIVE ...\n\n"
           "You can only call memory and skill management tools.")


class FakeSessionDB:
    """The one method of hermes_state.SessionDB that bind_session_state reads."""

    def __init__(self, rows=None):
        self.rows = dict(rows or {})

    def get_session(self, session_id):
        return self.rows.get(session_id)


def turn(text, reply="ok"):
    return [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]


def user_rows(engine, session):
    return [r["content"] for r in engine.store.session_messages(session, limit=1000)
            if r["role"] == "user"]


# ---------------------------------------------------------------- fork recognition
@pytest.mark.parametrize("content", [
    HARNESS,
    "  Review the conversation above and consider saving to memory if appropriate.",
    "Review the conversation above and update two things:\n\n**Memory**",
    [{"type": "text", "text": HARNESS}],
])
def test_review_harness_prompts_are_recognised(content):
    assert forks.is_review_harness({"role": "user", "content": content})


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": HARNESS},
    {"role": "user", "content": "Please review the conversation above and update the skill library"},
    {"role": "user", "content": None},
    "not a dict",
])
def test_other_messages_are_not_harness(message):
    assert not forks.is_review_harness(message)


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.text(max_size=30)),
                max_size=8), st.integers(min_value=0, max_value=8))
def test_user_part_drops_a_fork_turn_and_nothing_else(items, at):
    messages = [{"role": r, "content": t} for r, t in items
                if not t.lstrip().startswith("Review the conversation above")]
    fork_turn = [{"role": "user", "content": HARNESS},
                 {"role": "assistant", "content": "", "tool_calls": []},
                 {"role": "tool", "content": "denied"},
                 {"role": "assistant", "content": "Nothing to save."}]
    assert forks.user_part(messages + fork_turn) == messages
    assert forks.user_part(messages) is messages
    # harness text followed by a newer user message is the user's conversation
    at = min(at, len(messages))
    later = messages[:at] + fork_turn + [{"role": "user", "content": "and now?"}]
    assert forks.user_part(later) is later


def test_a_user_who_types_the_harness_text_loses_nothing(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    history = turn("hello") + [{"role": "user", "content": HARNESS},
                               {"role": "assistant", "content": "ok then"}]
    engine.compress(history)
    history += turn("next question")
    engine.compress(history)
    assert not engine.review_fork
    assert user_rows(engine, "s1") == ["hello", HARNESS, "next question"]


# ---------------------------------------------------------------- switch kinds
def test_bind_session_state_new_branch_resume(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    engine.ingest(turn("one in s1"))
    db = FakeSessionDB()
    engine.on_session_reset()
    engine.bind_session_state(db, "s2")  # /new: the host has no row yet
    assert (engine.session_id, engine.last_switch["kind"]) == ("s2", "new")
    engine.ingest(turn("one in s2"))
    db.rows["s3"] = {"id": "s3", "parent_session_id": "s2"}
    engine.bind_session_state(db, "s3")  # /branch: child row of the session we were in
    assert engine.last_switch["kind"] == "branch"
    engine.bind_session_state(db, "s1")  # /resume: trove stores s1 already
    assert engine.last_switch["kind"] == "resume"
    engine.ingest(turn("one in s1") + turn("two in s1"))
    assert user_rows(engine, "s1") == ["one in s1", "two in s1"]
    assert user_rows(engine, "s2") == ["one in s2"]
    assert engine.store.get_session("s2")["parent_session_id"] == "s1"
    assert engine.store.get_session("s1")["parent_session_id"] is None


def test_a_branchs_pre_compaction_list_at_exit_stores_nothing(tmp_path):
    # /compress twice, /branch, exit: the host hands the branch the parent's list from
    # before the last /compress. It is the parent's (rule 4): the branch stores its own
    # copy from the first list of its own, never from one handed over (host walk 110001).
    engine = make_engine(tmp_path, session="s1", window=64_000, fresh_tail_count=3)
    history = [m for t in range(30) for m in turn(f"question {t} " + "word " * 40)]
    first = engine.compress(history, current_tokens=host_tokens(history), force=True)
    stale = first + turn("yes") + turn("continue")
    engine.ingest(stale)
    engine.compress(stale, current_tokens=host_tokens(stale), force=True)
    parent = user_rows(engine, "s1")
    db = FakeSessionDB()
    db.rows["b"] = {"id": "b", "parent_session_id": "s1"}
    engine.on_session_reset()
    engine.bind_session_state(db, "b")
    assert engine.last_switch["kind"] == "branch"
    engine.on_session_end("b", stale)
    assert user_rows(engine, "b") == [] and user_rows(engine, "s1") == parent
    engine.ingest(stale + turn("on the branch"))          # its first turn: its own copy
    assert user_rows(engine, "b")[-3:] == ["yes", "continue", "on the branch"]
    assert user_rows(engine, "s1") == parent


def test_a_host_row_of_another_lineage_is_a_resume_without_carry(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    found = switches.classify(engine.store, old_session_id="s1", new_session_id="old-host",
                              host_row={"parent_session_id": "elsewhere"})
    assert found.kind == switches.RESUME
    assert switches.carry_into(engine.dag, found, old_canonical="s1", new_canonical="old-host",
                               retain_depth=0) == []


def test_switching_away_unregisters_the_old_id(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    assert find_engine("s1") is engine
    engine.bind_session_state(None, "s2")
    assert find_engine("s1") is None and find_engine("s2") is engine


def test_a_second_copy_on_the_session_neither_hides_nor_takes_away_the_first(tmp_path):
    # Two CLIs in one process (or a gateway hygiene agent beside the session's own):
    # hooks reach the copy bound last, and the session keeps a live copy when that
    # one leaves (host walk 100002, in-process: the other CLI's turns went unstored).
    first = make_engine(tmp_path, session="s1")
    second = make_engine(tmp_path, session="s1")
    assert find_engine("s1") is second
    second.bind_session_state(None, "s2")
    assert find_engine("s1") is first and find_engine("s2") is second
    first.bind_session_state(None, "s3")
    assert find_engine("s1") is None


def test_same_id_bind_is_a_no_op(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    engine.bind_session_state(None, "s1")
    assert engine.last_switch == {}


# ---------------------------------------------------------------- the lazy check
def test_lazy_check_follows_an_unannounced_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_SESSION_ID", "s1")
    engine = make_engine(tmp_path, session="s1")
    engine.compress(turn("in s1"))
    monkeypatch.setenv("HERMES_SESSION_ID", "s-unannounced")
    engine.compress(turn("in the new one"))
    assert engine.session_id == "s-unannounced"
    assert user_rows(engine, "s-unannounced") == ["in the new one"]
    assert user_rows(engine, "s1") == ["in s1"]


def test_lazy_check_never_takes_a_session_another_engine_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_SESSION_ID", "parent")
    parent = make_engine(tmp_path, session="parent")
    # A subagent starts in the same thread: the host moves HERMES_SESSION_ID to it.
    monkeypatch.setenv("HERMES_SESSION_ID", "child")
    child = make_engine(tmp_path, session="child")
    parent.compress(turn("parent turn"))
    assert parent.session_id == "parent" and child.session_id == "child"
    assert user_rows(parent, "parent") == ["parent turn"]


def test_an_unchanged_stale_hint_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_SESSION_ID", "stale-from-elsewhere")
    engine = make_engine(tmp_path, session="s1")
    engine.compress(turn("hello"))
    assert engine.session_id == "s1"


# ---------------------------------------------------------------- review forks
def test_a_review_fork_engine_never_writes_and_reads_the_user_session(tmp_path):
    user = make_engine(tmp_path, session="user-session")
    user.ingest(turn("the launch code word is heliotrope"))
    fork = make_engine(tmp_path, session="fork-throwaway")  # the fork's own start
    snapshot = turn("the launch code word is heliotrope")
    fork_messages = snapshot + [{"role": "user", "content": HARNESS}]
    forks.note_review_session("user-session")  # what its pre_llm_call hook saw
    try:
        answer = json.loads(fork.handle_tool_call("trove_grep", {"query": "heliotrope"},
                                                  messages=fork_messages))
    finally:
        forks.note_review_session(None)
    assert fork.review_fork
    assert [r["store_id"] for r in answer["results"]]
    assert fork.compress(fork_messages) == fork_messages
    assert fork.ingest(fork_messages) == [None] * len(fork_messages)
    assert fork.store.count_messages("fork-throwaway") == 0
    assert user_rows(user, "user-session") == ["the launch code word is heliotrope"]


def test_the_users_engine_drops_a_fork_tail_shown_to_it(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    shown = turn("real question") + [{"role": "user", "content": HARNESS},
                                     {"role": "assistant", "content": "Nothing to save."}]
    ids = engine.ingest(shown)
    assert ids[2:] == [None, None] and None not in ids[:2]
    assert not engine.review_fork  # only the engine that is handed the fork's list is one
    assert user_rows(engine, "s1") == ["real question"]


# ---------------------------------------------------------------- any sequence of switches
OPS = st.lists(st.sampled_from(["turn", "turn", "new", "resume", "branch"]), max_size=14)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, picks=st.lists(st.integers(min_value=0, max_value=20), min_size=14,
                               max_size=14))
def test_every_typed_turn_is_stored_once_under_its_session(tmp_path_factory, ops, picks):
    """Replay the CLI's switch sequences (turns stored by the post_llm_call path,
    on_session_end on /new and at exit, no hook before /resume or /branch):
    each typed turn lands once in the session it was typed in; other sessions hold
    it only as a branch's copied history."""
    engine = make_engine(tmp_path_factory.mktemp("seq"), session="s0")
    db = FakeSessionDB({"s0": {"parent_session_id": None}})
    history, typed, parent = {"s0": []}, {"s0": []}, {"s0": None}
    current, made = "s0", 1
    for n, (op, pick) in enumerate(zip(ops, picks)):
        if op == "turn":
            history[current] += turn(f"typed turn {n} in {current}", reply="same reply")
            typed[current].append(f"typed turn {n} in {current}")
            engine.ingest(list(history[current]))
            continue
        engine.on_session_reset()
        if op == "resume":
            others = sorted(s for s in history if s != current)
            if not others:
                continue
            current = others[pick % len(others)]
        else:
            new = f"s{made}"
            made += 1
            if op == "new":
                engine.on_session_end(current, list(history[current]))
                history[new], parent[new] = [], None
            else:
                db.rows[new] = {"parent_session_id": current}
                history[new], parent[new] = list(history[current]), current
            typed[new] = []
            current = new
        engine.bind_session_state(db, current)
        if op == "new":
            db.rows[current] = {"parent_session_id": None}  # the CLI creates it after
        assert engine.session_id == current
    engine.on_session_end(current, list(history[current]))

    def ancestors(session):
        while parent.get(session):
            session = parent[session]
            yield session

    for session in history:
        stored = user_rows(engine, session)
        for text in typed[session]:
            assert stored.count(text) == 1, (session, text, stored)
        allowed = set(typed[session]).union(*(typed[a] for a in ancestors(session)))
        assert set(stored) <= allowed, (session, stored)


def test_on_session_end_files_messages_under_the_session_the_host_names(tmp_path):
    """Should the host end a session this copy already left, its messages go to that
    session, never to the one the engine is bound to now."""
    engine = make_engine(tmp_path, session="s1")
    engine.ingest(turn("first in s1"))
    engine.bind_session_state(None, "s2")
    engine.on_session_end("s1", turn("first in s1") + turn("late in s1"))
    assert user_rows(engine, "s1") == ["first in s1", "late in s1"]
    assert user_rows(engine, "s2") == []
    engine.on_session_end("s2", turn("in s2"))
    assert user_rows(engine, "s2") == ["in s2"]


def test_become_review_fork_removes_only_an_empty_throwaway_session(tmp_path):
    user = make_engine(tmp_path, session="user-1")
    user.ingest(turn("mine"))
    fork = make_engine(tmp_path, session="fork-1")
    fork.become_review_fork("user-1")
    assert fork.review_fork and fork.store.get_session("fork-1") is None
    assert fork.ingest(turn("fork text") + [{"role": "user", "content": HARNESS}]) == [None] * 3
    # a session with rows, or the user's own, is never removed
    other = make_engine(tmp_path, session="busy")
    other.ingest(turn("busy text"))
    other.become_review_fork("user-1")
    user.become_review_fork("user-1")
    assert other.store.get_session("busy") is not None
    assert user.store.get_session("user-1") is not None


def test_a_branchs_copy_keeps_its_parents_times(tmp_path):
    """The CLI's messages carry no timestamp: the branch's copy of its parent's history
    is dated as the parent's rows are, so a day's rollup never holds it twice; the
    branch's own turn is dated now."""
    engine = make_engine(tmp_path, session="s1")
    old = time.time() - 10 * 86400
    history = [dict(m, timestamp=old + k * 60) for t in range(3)
               for k, m in enumerate(turn(f"question {t}", "ok"), start=2 * t)]
    engine.ingest(history)
    db = FakeSessionDB()
    db.rows["b"] = {"id": "b", "parent_session_id": "s1"}
    engine.on_session_reset()
    engine.bind_session_state(db, "b")
    assert engine.last_switch["kind"] == "branch"
    shown = [{k: v for k, v in m.items() if k != "timestamp"} for m in history]
    engine.note_user_turn(turn("on the branch")[0])
    engine.ingest(shown + turn("on the branch")[:1])
    times = [(r["content"], r["message_at"] or r["created_at"])
             for r in engine.store.session_messages("b", limit=100)]
    assert [t for _, t in times[:-1]] == [old + k * 60 for k in range(6)]
    assert times[-1][0] == "on the branch" and times[-1][1] > time.time() - 60


CRON_RUN = "cron_a1b2c3_20261205_041815"


def cron_run(tmp_path):
    """One cron run's engine copy as AIAgent init binds it: platform-less
    ``bind_session_state`` first, then ``on_session_start(platform="cron")``."""
    engine = make_engine(tmp_path, session=None)
    engine.bind_session_state(None, CRON_RUN)
    engine.on_session_start(CRON_RUN, platform="cron")
    return engine


def stored_texts(engine, session):
    return [r["content"] for r in engine.store.session_messages(session, 0, 1000)]


def test_two_cron_runs_started_in_one_second_store_into_two_sessions(tmp_path):
    """The host's run id has whole seconds: two runs of one job in the same second
    shared it, and both runs' messages landed in one session. Concurrent (neither
    has stored anything yet) and one after the other, each run is its own session."""
    first, second = cron_run(tmp_path), cron_run(tmp_path)
    first.ingest([{"role": "user", "content": "run one"}, {"role": "assistant", "content": "a"}])
    second.ingest([{"role": "user", "content": "run two"}, {"role": "assistant", "content": "b"}])
    assert first.canonical_id == CRON_RUN and second.canonical_id == f"{CRON_RUN}-2"
    assert stored_texts(first, CRON_RUN) == ["run one", "a"]
    assert stored_texts(first, f"{CRON_RUN}-2") == ["run two", "b"]
    third = cron_run(tmp_path)              # later, the same second again: a third session
    assert third.canonical_id == f"{CRON_RUN}-3"
    assert first.owner == second.owner == third.owner


def test_one_cron_run_stays_one_session_across_rebinds_and_compactions(tmp_path):
    """A run's own copy keeps its session: the host's second bind at agent init, an
    in-place compaction boundary and a repeated start never move it to a new one."""
    first, second = cron_run(tmp_path), cron_run(tmp_path)
    first.ingest([{"role": "user", "content": "run one"}])
    second.ingest([{"role": "user", "content": "run two"}])
    for engine in (first, second):
        own = engine.canonical_id
        engine.on_session_start(CRON_RUN, platform="cron", boundary_reason="compression",
                                old_session_id=CRON_RUN)
        engine.on_session_start(CRON_RUN, platform="cron")
        engine.bind_session_state(None, CRON_RUN)
        assert engine.canonical_id == own
    second.ingest([{"role": "user", "content": "run two"}, {"role": "user", "content": "more"}])
    assert stored_texts(second, f"{CRON_RUN}-2") == ["run two", "more"]
    assert stored_texts(first, CRON_RUN) == ["run one"]
    assert make_engine(tmp_path, session="cron-notes").canonical_id == "cron-notes"


def test_hooks_of_two_runs_sharing_one_host_id_reach_each_runs_own_copy(tmp_path):
    """cron/scheduler.py builds each run's agent and runs its turn in one context (a
    copy of it): the hooks name only the host id, and reached the copy bound last, so
    the first run's turn was stored in the second run's session."""
    from hermes_trove import on_post_llm_call, on_pre_llm_call
    contexts = [contextvars.copy_context() for _ in range(2)]
    first, second = (ctx.run(cron_run, tmp_path) for ctx in contexts)
    turns = {first: turn("run one", "a"), second: turn("run two", "b")}
    ctx_of = dict(zip((first, second), contexts))
    for engine in (first, second):   # both turns start before either ends
        ctx_of[engine].run(on_pre_llm_call, session_id=CRON_RUN,
                           conversation_history=turns[engine][:1], platform="cron")
    for engine in (first, second):
        ctx_of[engine].run(on_post_llm_call, session_id=CRON_RUN,
                           conversation_history=turns[engine], platform="cron")
    assert (first.canonical_id, second.canonical_id) == (CRON_RUN, f"{CRON_RUN}-2")
    assert stored_texts(first, CRON_RUN) == ["run one", "a"]
    assert stored_texts(first, f"{CRON_RUN}-2") == ["run two", "b"]
    assert find_engine(CRON_RUN) is second   # outside both contexts: the copy bound last


def test_two_runs_bound_at_once_on_two_threads_choose_two_sessions(tmp_path, monkeypatch):
    """Both runs' copies found the host id free (neither bound yet) before either bound
    it, and both stored into one session."""
    from hermes_trove.binding import cron
    real = cron.run_session
    both_checked = threading.Barrier(2, timeout=10)

    def run_session(store, dag, session_id, canonical, taken, bound=(None, None)):
        def taken_then_wait(candidate):
            found = taken(candidate)
            if not getattr(waited, "done", False):
                waited.done = True
                try:
                    both_checked.wait()
                except threading.BrokenBarrierError:
                    pass
            return found
        return real(store, dag, session_id, canonical, taken_then_wait, bound)

    waited = threading.local()
    monkeypatch.setattr(cron, "run_session", run_session)
    engines = []
    threads = [threading.Thread(target=lambda: engines.append(cron_run(tmp_path)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(e.canonical_id for e in engines) == [CRON_RUN, f"{CRON_RUN}-2"]


CHILD_RUN = """
import os, sys, time
sys.path[:0] = [{scripts!r}, {tests!r}]
from _bootstrap import load_package
load_package()
from enginekit import make_engine
engine = make_engine({home!r}, session=None)
engine.bind_session_state(None, {run!r})
engine.on_session_start({run!r}, platform="cron")
print(engine.canonical_id, flush=True)
while not os.path.exists({go!r}):
    time.sleep(0.01)
engine.ingest([{{"role": "user", "content": "run one"}}, {{"role": "assistant", "content": "a"}}])
print("stored", flush=True)
"""


def test_a_run_in_another_process_that_stored_nothing_yet_keeps_its_session(tmp_path):
    """A scheduler's tick and a manual ``hermes cron run`` are two processes: the second
    run took the host id's session while the first had stored nothing, and the two
    runs' messages landed in one session."""
    tests = Path(__file__).resolve().parent
    go = tmp_path / "go"
    code = CHILD_RUN.format(scripts=str(tests.parent / "scripts"), tests=str(tests),
                            home=str(tmp_path), run=CRON_RUN, go=str(go))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HERMES_HOME": str(tmp_path)})
    try:
        assert child.stdout.readline().strip() == CRON_RUN, child.stderr.read()
        here = cron_run(tmp_path)
        here.ingest(turn("run two", "b"))
        go.touch()
        assert child.communicate(timeout=60)[0].strip() == "stored"
    finally:
        child.kill()
    assert here.canonical_id == f"{CRON_RUN}-2"
    assert stored_texts(here, CRON_RUN) == ["run one", "a"]
    assert stored_texts(here, f"{CRON_RUN}-2") == ["run two", "b"]
