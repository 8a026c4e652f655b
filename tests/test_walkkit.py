"""The walk's oracle catches what it must: a duplicate, a loss, a misfiled row, a
phantom, a second branch copy (checked on a hand-made trove.db, no host)."""
from collections import Counter
import sqlite3

import walkkit as wk


def store(tmp_path, rows, aliases=()):
    db = sqlite3.connect(tmp_path / "trove.db")
    db.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, canonical_id TEXT)")
    db.execute("CREATE TABLE messages (store_id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT)")
    for session in {s for s, _, _ in rows} | {a for a, _ in aliases}:
        db.execute("INSERT INTO sessions VALUES (?, ?)", (session, dict(aliases).get(session, session)))
    db.executemany("INSERT INTO messages(session_id, role, content) VALUES (?, ?, ?)", rows)
    db.commit()
    db.close()
    return tmp_path


def oracle(shown):
    o = wk.Oracle()
    for session, role, text in shown:
        o.shown(session, {"role": role, "content": text})
    return o


SHOWN = [("s1", "user", "hello"), ("s1", "assistant", "ok"), ("s1", "user", "hello"),
         ("s1", "assistant", "ok"), ("s2", "user", "other")]


def test_exact_store_is_clean_and_whitespace_does_not_count(tmp_path):
    rows = [(s, r, t + (" \n" if i == 1 else "")) for i, (s, r, t) in enumerate(SHOWN)]
    problems = oracle(SHOWN).check(store(tmp_path, rows))
    assert problems.total == 0, problems.details


def test_each_kind_of_problem_is_counted(tmp_path):
    rows = list(SHOWN[:4]) + [("s1", "user", "hello"),            # a third "hello": duplicate
                              ("s1", "user", "other"),            # shown only in s2: misfiled
                              ("s1", "user", "[block] summaries")]  # never shown: phantom
    problems = oracle(SHOWN).check(store(tmp_path, rows))         # s2's "other" is lost
    assert (problems.duplicates, problems.lost, problems.misfiled, problems.phantom) == (1, 1, 1, 1)


def test_aliases_resolve_to_their_canonical_session(tmp_path):
    shown = [("alias", "user", "hi"), ("alias", "assistant", "yo")]
    home = store(tmp_path, [("root", "user", "hi"), ("root", "assistant", "yo")],
                 aliases=[("alias", "root")])
    assert oracle(shown).check(home).total == 0


def test_a_branch_holds_zero_or_one_copy_never_two(tmp_path):
    o = oracle([("p", "user", "q1"), ("p", "assistant", "a1")])
    o.branched("b", [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}])
    o.shown("b", {"role": "user", "content": "q2"})
    parent = [("p", "user", "q1"), ("p", "assistant", "a1")]
    for copies, clean in ((0, True), (1, True), (2, False)):
        home = tmp_path / str(copies)
        home.mkdir()
        rows = parent + [("b", "user", "q1"), ("b", "assistant", "a1")] * copies + [("b", "user", "q2")]
        assert (o.check(store(home, rows)).total == 0) is clean, copies


def test_a_branch_first_ingested_after_an_undo_holds_the_shorter_copy(tmp_path):
    # /branch, /undo, then a /compress as the branch's first ingest (host walk 160013):
    # the branch's copy is the list the engine was handed, without the undone exchange
    whole = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    o = oracle([("p", m["role"], m["content"]) for m in whole])
    o.branched("b", whole)
    o.first_ingest("b", whole[:2])
    o.first_ingest("b", whole)                     # later lists are no new candidate
    parent = [("p", m["role"], m["content"]) for m in whole]
    for branch_rows, clean in ((whole[:2], True), (whole, True), (whole + whole[:2], False)):
        home = tmp_path / str(len(branch_rows))
        home.mkdir()
        rows = parent + [("b", m["role"], m["content"]) for m in branch_rows]
        assert (o.check(store(home, rows)).total == 0) is clean, len(branch_rows)


def test_a_branch_whose_first_turn_is_a_compacting_retry_holds_the_list_the_retry_sent(tmp_path):
    # /branch, then a /retry as the branch's first turn that compacts (host walk 1540000):
    # the retry sent [q1, a1] (its own q2 new); the turn's compaction summarized q1, so
    # the list it leaves shows only a1, and the list at the branch point still holds the
    # retried q2 and a2: neither is the copy, the list the retry was sent with is
    whole = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    o = oracle([("p", m["role"], m["content"]) for m in whole])
    o.branched("b", whole)
    o.retrying("b", whole)
    o.first_ingest("b", [{"role": "user", "content": "[block] q1"}, whole[1]])
    for m in whole[2:]:
        o.shown("b", dict(m))                      # the retry's send and its reply
    parent = [("p", m["role"], m["content"]) for m in whole]
    for branch_rows, clean in ((whole, True), (whole + whole[:1], False)):
        home = tmp_path / str(len(branch_rows))
        home.mkdir()
        rows = parent + [("b", m["role"], m["content"]) for m in branch_rows]
        assert (o.check(store(home, rows)).total == 0) is clean, len(branch_rows)


def test_a_branch_a_second_cli_restored_before_its_first_turn_may_hold_that_copy(tmp_path):
    # /branch, /undo, a second CLI restores the branch (q1..a2), the first CLI's /undo
    # and re-send of q2 is its first list (copy q1, a1), then the second CLI's turn shows
    # q2, a2 too (host walk 2400000): the branch holds the restored list's copy, once
    whole = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"},
             {"role": "user", "content": "q3"}, {"role": "assistant", "content": "a3"}]
    o = oracle([("p", m["role"], m["content"]) for m in whole])
    o.branched("b", whole)
    o.opened("b", whole[:4])
    o.first_ingest("b", whole[:2])
    sends = [("b", "user", "q2"), ("b", "assistant", "ok"), ("b", "user", "q4"),
             ("b", "assistant", "a4")]
    for _, role, text in sends:
        o.shown("b", {"role": role, "content": text})
    parent = [("p", m["role"], m["content"]) for m in whole]
    for copied, clean in ((2, True), (4, True), (6, True), (5, False)):
        home = tmp_path / str(copied)
        home.mkdir()
        rows = parent + [("b", m["role"], m["content"]) for m in whole[:copied]] + sends
        assert (o.check(store(home, rows)).total == 0) is clean, copied
    o = oracle([("p", m["role"], m["content"]) for m in whole])
    o.branched("b", whole)
    o.first_ingest("b", whole[:2])
    o.opened("b", whole[:4])                       # after the first ingest: no candidate
    home = tmp_path / "late"
    home.mkdir()
    rows = parent + [("b", m["role"], m["content"]) for m in whole[:4]]
    assert o.check(store(home, rows)).total == 2


def request(*messages):
    return {"messages": [{"role": "system", "content": "you are a test"}, *messages]}


def after_compaction(o, block, sent, threshold=3000):
    """The checks of the first request after a compaction: block, ack, the turn."""
    body = request(block, {"role": "assistant", "content": "ok"}, {"role": "user", "content": sent})
    return wk.check_request(body, sent, o, threshold=threshold, context_length=100_000,
                            compacted=True, previous_pair=[])


def test_over_the_threshold_after_a_compaction_spares_only_a_turn_too_big_for_it():
    block = {"role": "user", "content": "[trove context: summaries]\n" + "s " * 200}
    big_turn, small_turn = "word " * 4000, "a short question"   # ~5K host tokens; a few
    o = oracle([("s1", "user", big_turn), ("s1", "user", small_turn)])
    # the turn alone is over the threshold: nothing a compaction could drop
    assert not after_compaction(o, block, big_turn).over_threshold
    # a small turn under summaries that are over alone: the compaction's fault
    big_block = dict(block, content=block["content"] + "x" * 40_000)
    found = after_compaction(o, big_block, small_turn)
    assert found.over_threshold and found.tail_size == 1


def test_a_tail_is_starved_only_when_the_exchange_fits_by_both_counters():
    """The engine's budget holds the provider's count under its target too: a CJK
    exchange the host counts at a fifth of its tokens did not fit, and keeping only
    the turn is no starvation."""
    block = {"role": "user", "content": "[trove context: summaries]\n" + "s " * 100}
    turn = "a short question"
    o = oracle([("s1", "user", turn)])

    def starved(previous_text):
        pair = [{"role": "user", "content": previous_text}, {"role": "assistant", "content": "ok"}]
        body = request(block, {"role": "assistant", "content": "ok"}, {"role": "user", "content": turn})
        return wk.check_request(body, turn, o, threshold=3000, context_length=100_000,
                                compacted=True, previous_pair=pair).starved

    assert starved("word " * 300)          # ~375 host tokens, ~300 real: it fit
    assert not starved("灰度发布" * 900)     # ~900 host tokens, ~3,600 real: it did not


def test_a_branch_copy_of_a_replayed_transcript_counts_each_message_once():
    block = {"role": "user", "content": "[trove context: summaries of earlier turns] n1"}
    turn_a = [{"role": "user", "content": "[T1] a"}, {"role": "assistant", "content": "ok"}]
    turn_b = [{"role": "user", "content": "[T2] b"}, {"role": "assistant", "content": "ok"}]
    replayed = [block] + turn_a + turn_b + [block] + [dict(m) for m in turn_a + turn_b]
    restored = {id(m) for m in replayed}
    assert wk.without_replays(replayed, restored) == [block] + turn_a + turn_b + [block]
    # a text sent again after the restore is a new message, not a replay
    resent = replayed[:-2] + [dict(turn_b[0]), dict(turn_b[1])]
    assert wk.without_replays(resent, restored) == [block] + turn_a + turn_b + [block] + resent[-2:]
    # what differs after the later copy is kept from there on; no replay without a block
    edited = [block] + turn_a + [block, dict(turn_a[0]), {"role": "assistant", "content": "new"}]
    assert wk.without_replays(edited, {id(m) for m in edited}) == [block] + turn_a + [block, edited[-1]]
    twice = turn_a + [dict(m) for m in turn_a]
    assert wk.without_replays(twice, {id(m) for m in twice}) == twice
    oracle = wk.Oracle()
    oracle.restored(replayed)
    for m in turn_a + turn_b:
        oracle.shown("parent", m)
    oracle.branched("branch", replayed)
    assert Counter({("user", "[T1] a"): 1, ("assistant", "ok"): 2,
                    ("user", "[T2] b"): 1}) in oracle.branch_copy["branch"]


def test_the_soaks_step_weights_override_the_defaults_and_refuse_what_they_do_not_know():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import soak

    def error(message):
        raise ValueError(message)

    weights = soak.step_weights(wk.STEP_WEIGHTS, ["branch=10", "chat=0"], error)
    assert weights["branch"] == 10 and weights["chat"] == 0
    assert weights["undo"] == wk.STEP_WEIGHTS["undo"]
    assert wk.STEP_WEIGHTS["chat"] == 40   # the defaults are not changed in place
    for bad in (["nosuch=1"], ["branch=-1"], ["branch"], [f"{n}=0" for n in wk.STEP_WEIGHTS]):
        try:
            soak.step_weights(wk.STEP_WEIGHTS, bad, error)
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")


def test_a_branch_of_a_doubled_restore_may_hold_one_copy():
    """After an /undo the CLI may write its list twice with the original timestamps
    and a /resume restores both copies (identity's rule 7: one message shown twice).
    A /branch of that list is right with one copy of each message, wrong with two;
    a text re-sent with a timestamp of its own is a message of its own."""
    first = [{"role": "user", "content": "hello", "timestamp": 1.0},
             {"role": "assistant", "content": "hi", "timestamp": 2.0},
             {"role": "user", "content": "hello", "timestamp": 3.0}]   # re-sent
    doubled = first + [dict(m) for m in first]
    assert [m["timestamp"] for m in wk.without_timed_copies(doubled)] == [1.0, 2.0, 3.0]
    untimed = [{"role": "user", "content": "hello"}, {"role": "user", "content": "hello"}]
    assert len(wk.without_timed_copies(untimed)) == 2
    o = wk.Oracle()
    for m in first:
        o.shown("parent", m)
    o.branched("branch", doubled)
    one_copy = [("parent", m["role"], m["content"]) for m in first] + \
               [("branch", m["role"], m["content"]) for m in first]
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        assert o.check(store(Path(tmp), one_copy)).total == 0
    with tempfile.TemporaryDirectory() as tmp:
        one_reply_twice = one_copy + [("branch", "assistant", "hi")]
        assert o.check(store(Path(tmp), one_reply_twice)).duplicates == 1


def test_a_send_merged_into_a_given_up_turns_message_is_that_send():
    """After a turn the host gave up on, its next send is merged into the dangling
    user message ("A\n\nB"): the walk reads that message as the send (shown once, the
    request ending with it), and no other text as it."""
    history = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "ok"},
               {"role": "user", "content": "refused\n\nB"}, {"role": "assistant", "content": "x"}]
    assert wk.is_send_of("refused\n\nB", "B") and wk.is_send_of("B", "B")
    assert not wk.is_send_of("refused B", "B") and not wk.is_send_of("B\n\nC", "B")
    assert wk.new_messages_of_turn(history, "B") == history[2:]
    assert wk.new_messages_of_turn(history, "refused") == []
    assert wk.host_list_of_turn(history[:3], "B") == history[:3]


def test_only_a_smaller_window_refused_without_its_limit_blinds_the_trigger_checks():
    """A provider refusing without naming its smaller window leaves the host (and trove's
    trigger) at the configured one: the walk then judges the window only. Named, or no
    smaller, the trigger checks stay."""
    import clikit as ck
    from types import SimpleNamespace
    gate = ck.RealWindow(lambda body: "ok", 24576, report=False)
    host = SimpleNamespace(server=SimpleNamespace(responder=gate))
    assert ck.unnamed_window(host, 65536) and ck.window_in_force(host, 65536) == 24576
    assert not ck.unnamed_window(host, 16384)
    gate.report = True
    assert not ck.unnamed_window(host, 65536)
    gate.report, gate.window = False, None
    assert not ck.unnamed_window(host, 65536)


# ---------------------------------------------------------------- review forks (reviewkit)
def _main(*messages):
    return {"stream": True, "messages": [{"role": "system", "content": "sys"}, *messages]}


def _text(reply):
    return reply if isinstance(reply, str) else ("call", reply.name)


def test_a_forks_requests_leave_the_parents_scripted_replies_as_the_seed_has_them():
    import reviewkit

    turns = [_main({"role": "user", "content": f"[T{i}] question {i}"}) for i in range(12)]
    fork = _main({"role": "user", "content": "[T1] question 1"},
                 {"role": "user", "content": reviewkit.HARNESS + " and update the skill library."})
    plain, with_forks = wk.ScriptedModel(7), wk.ScriptedModel(7)
    expected = [_text(plain(body)) for body in turns]
    got, fork_replies = [], []
    for body in turns:
        fork_replies.append(_text(with_forks(fork)))
        got.append(_text(with_forks(body)))
    assert got == expected
    # the fork's own answers: its reply or a tool the host allows a fork, never a parent reply
    assert all(r[1] in ("memory", "skills_list") if isinstance(r, tuple)
               else r.startswith(reviewkit.FORK_MARK) for r in fork_replies)
    assert {type(r) for r in fork_replies} == {str, tuple}
    after_tool = fork["messages"] + [{"role": "tool", "tool_call_id": "c1", "content": "{}"}]
    assert with_forks({"stream": True, "messages": after_tool}).startswith(reviewkit.FORK_MARK)


def test_a_forks_changes_to_the_store_and_its_text_in_any_row_are_found(tmp_path):
    import reviewkit

    home = store(tmp_path, [("s1", "user", "hello"), ("s1", "assistant", "ok")])
    before = reviewkit.store_snapshot(home)
    assert reviewkit.fork_problems(before, reviewkit.store_snapshot(home)) == []
    assert reviewkit.leaked_rows(home) == []
    db = sqlite3.connect(home / "trove.db")
    db.execute("INSERT INTO sessions VALUES ('fork-throwaway', 'fork-throwaway')")
    db.execute("INSERT INTO messages(session_id, role, content) VALUES (?, ?, ?)",
               ("s1", "user", reviewkit.HARNESS + " and consider saving to memory"))
    db.execute("UPDATE messages SET content = 'okay' WHERE content = 'ok'")
    db.commit()
    db.close()
    problems = reviewkit.fork_problems(before, reviewkit.store_snapshot(home))
    assert [p.split(":")[0] for p in problems] == ["a fork changed messages",
                                                   "a fork changed sessions"]
    assert "2 row(s) added, 1 removed or changed" in problems[0]
    assert len(reviewkit.leaked_rows(home)) == 1
