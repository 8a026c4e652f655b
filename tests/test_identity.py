"""storage/identity: which shown message is which row (issue #24).

Pure parts (fingerprints, the sequence diff, the reading rules) with hypothesis,
then the engine's entry points on the lists the host hands over: in-place
edits, an identical re-send after /undo, a stale pre-compaction list, the
previous session's transcript at exit, two engine copies on one session."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_trove as plugin
from hermes_trove.compaction import assemble
from hermes_trove.storage import codec, identity, sequences

from enginekit import host_tokens, make_engine


def fp_of(message: dict) -> str:
    return identity.fingerprint_encoded(codec.encode_message(codec.clean_message(message)))


def turn(user: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


# ---------------------------------------------------------------- fingerprints
def test_fingerprints_ignore_what_the_host_rewrites():
    base = {"role": "assistant", "content": "ok"}
    assert fp_of(base) == fp_of({"role": "assistant", "content": "ok \n"})
    assert fp_of(base) == fp_of({**base, "reasoning": "thought", "finish_reason": "stop",
                                 "_db_persisted": True, "timestamp": 1.5})
    user = {"role": "user", "content": "hello"}
    assert fp_of(user) == fp_of({**user, "api_content": "hello\n\n[policy]"})
    fenced = {"role": "user", "content": "hello<memory-context>recalled</memory-context>"}
    assert fp_of(user) == fp_of(fenced)
    # What does differ: role, text, the tool call and its result's id.
    assert fp_of(base) != fp_of({"role": "user", "content": "ok"})
    assert fp_of(base) != fp_of({"role": "assistant", "content": "okay"})
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    respaced = copy.deepcopy(call)
    respaced["tool_calls"][0]["function"]["arguments"] = '{ "a":1 }'
    respaced["tool_calls"][0]["call_id"] = "c1"
    assert fp_of(call) == fp_of(respaced)
    other = copy.deepcopy(call)
    other["tool_calls"][0]["id"] = "c2"
    assert fp_of(call) != fp_of(other)


# ---------------------------------------------------------------- the sequence diff
def _lcs_length(a, b) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            table[i][j] = (table[i + 1][j + 1] + 1 if a[i] is not None and a[i] == b[j]
                           else max(table[i + 1][j], table[i][j + 1]))
    return table[0][0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcd") | st.none(), max_size=30),
       st.lists(st.sampled_from("abcd"), max_size=30))
def test_lcs_pairs_is_a_longest_common_subsequence(a, b):
    pairs = sequences.lcs_pairs(a, b)
    assert all(a[i] == b[j] and a[i] is not None for i, j in pairs)
    assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))
    assert len(pairs) == _lcs_length(a, b)


def test_lcs_prefers_the_newest_copy_of_a_repeated_message():
    # "ok" shown once against a view holding it three times: the newest copy.
    assert sequences.lcs_pairs(["x", "ok", "y"], ["w", "ok", "ok", "ok", "z"]) == [(1, 3)]
    # A common prefix is the same list: its copies line up from the start.
    assert sequences.lcs_pairs(["x", "ok"], ["x", "ok", "ok"]) == [(0, 0), (1, 1)]


def test_lcs_keeps_a_lists_exchanges_together_before_taking_the_newest_copies():
    # A list shows (T, ok) twice where its view holds it once, then an exchange the view
    # lacks (a retry's first attempt), the view's last one and a new message. The newest
    # copies would split "q" from its "ok"; as long a pairing that keeps more pairs next
    # to each other wins (host walk 3320002).
    shown = ["q", "ok", "T", "ok", "T", "ok", "T", "r1", "T", "r2", "new"]
    assert sequences.lcs_pairs(shown, ["q", "ok", "T", "ok", "T", "r2"]) == [
        (0, 0), (1, 1), (2, 2), (3, 3), (8, 4), (9, 5)]
    # Where keeping them together gains nothing, the newest copies still win.
    assert sequences.lcs_pairs(["T", "ok", "T", "ok", "x"], ["y", "T", "ok"]) == [(2, 1), (3, 2)]


def view(*pairs) -> identity.View:
    return identity.View(entries=list(pairs), session="s")


def test_a_list_read_against_its_own_view_keeps_every_row():
    v = view(("a", 1), ("b", 2), ("c", 3))
    reading = identity.read(["a", "b", "c"], [v])
    assert reading.store_ids == [1, 2, 3] and not reading.gaps
    # Extended: the new element is a trailing run to look up, after row 3.
    reading = identity.read(["a", "b", "c", "d"], [v])
    assert reading.store_ids[:3] == [1, 2, 3] and reading.gaps == [(3, 4, 3, None)]
    # Replaced in the middle: one run between rows 1 and 3; the rest keep their rows.
    reading = identity.read(["a", "x", "c"], [v])
    assert reading.store_ids == [1, None, 3] and reading.gaps == [(1, 2, 1, 3)]


def test_the_turns_user_message_and_what_follows_are_new():
    v = view(("u1", 1), ("a1", 2), ("u2", 3), ("a2", 4))
    # /undo, then the same text sent again: rule 2 makes it (and its reply) new.
    reading = identity.read(["u1", "a1", "u2", "a2"], [v], turn_index=2)
    assert reading.store_ids == [1, 2, None, None] and not reading.gaps


def test_the_engines_block_decides_between_views():
    long_view = view(*[("u", k) if k % 2 else ("a", k) for k in range(1, 21)])
    returned = view(("blk", identity.BLOCK_ID), ("u", 19), ("a", 20))
    reading = identity.read(["blk", "u", "a"], [long_view, returned])
    assert reading.view is returned and reading.store_ids == [identity.BLOCK_ID, 19, 20]


def test_a_restored_list_with_older_copies_first_pairs_the_later_ones():
    # /retry keeps its first attempt in the host's state.db: a restore shows
    # u(1) ok(2) u(3) r(4) before u(5) ok(6), which this copy's view holds alone.
    v = view(("u", 5), ("ok", 6), ("y", 7), ("a", 8))
    reading = identity.read(["u", "ok", "u", "r", "u", "ok", "y", "a"], [v])
    assert reading.store_ids[4:] == [5, 6, 7, 8]
    # The older copies are a run before row 5, to look up among the rows before it.
    assert reading.gaps == [(0, 4, None, 5)]
    assert sequences.lcs_pairs(["u", "ok", "u", "ok"], ["u", "ok"]) == [(2, 0), (3, 1)]


def test_a_view_that_explains_more_wins_over_one_the_list_merely_goes_on_from():
    short = view(("u", 5), ("ok", 6))
    longer = view(("u", 5), ("ok", 6), ("y", 7), ("a", 8), ("z", 9))
    reading = identity.read(["u", "ok", "y", "a", "z", "new"], [longer, short], turn_index=5)
    assert reading.view is longer and reading.store_ids[:5] == [5, 6, 7, 8, 9]
    reading = identity.read(["u", "ok", "y", "a", "z", "new"], [short, longer], turn_index=5)
    assert reading.view is longer


def test_a_repeated_block_replays_what_followed_it():
    # The host appended the returned list [block, a, b] to its transcript twice; a
    # /resume shows both copies, then the new turn.
    returned = view(("blk", identity.BLOCK_ID), ("a", 20), ("b", 21))
    shown = ["blk", "a", "b", "blk", "a", "b", "turn"]
    reading = identity.read(shown, [returned], turn_index=6)
    assert reading.store_ids[:6] == [identity.BLOCK_ID, 20, 21, identity.BLOCK_ID, 20, 21]
    assert not reading.gaps
    # Without a repeated block a repeated run is not a replay: it is looked up.
    reading = identity.read(["blk", "a", "b", "a", "b", "turn"], [returned], turn_index=5)
    assert reading.store_ids[3:5] == [None, None] and reading.gaps == [(3, 5, 21, None)]


def test_replies_follow_the_message_they_answer():
    ids = identity.replies_follow([1, None, 3, 4, 5], ["u", "u2", "a", "u", "a"],
                                  ["user", "user", "assistant", "user", "assistant"],
                                  [False] * 5)
    # The reply after a new request is new; the next stored request ends that.
    assert ids == [1, None, None, 4, 5]


def test_align_gap_in_the_middle_and_after_the_last_match():
    rows = [(5, "x"), (6, "y"), (7, "z")]
    assert identity.align_gap(["y"], rows, trailing=False, taken=set()) == [6]
    assert identity.align_gap(["y"], rows, trailing=False, taken={6}) == [None]
    # Trailing: in order, stopping at the first that does not line up.
    assert identity.align_gap(["x", "q", "z"], rows, trailing=True, taken=set()) == [5, None, None]


def test_a_list_is_another_sessions_only_when_that_session_explains_it():
    other = identity.View(entries=[("a", 1), ("b", 2), ("c", 3)], session="old")
    assert identity.foreign_owner(["a", "b", "c"], 0, [other]) is other
    assert identity.foreign_owner(["a"], 0, [other]) is None  # one message proves nothing
    assert identity.foreign_owner(["a", "x", "y", "z"], 0, [other]) is None
    assert identity.foreign_owner(["a", "b", "c"], 3, [other]) is None  # its own explain it


def test_a_list_cut_short_keeps_each_element_at_its_place():
    # /retry replaced the last reply with one of the same text, then /undo cut the
    # list back: the remaining reply is the view's at its place, not the twin.
    v = view(("u", 1), ("ok", 2), ("u", 3), ("ok", 4), ("u", 5), ("ok", 9))
    reading = identity.read(["u", "ok", "u", "ok"], [v])
    assert reading.store_ids == [1, 2, 3, 4]


def test_a_replay_ending_like_what_followed_it_pairs_copy_with_copy():
    # Both copies end with "ok", and the second goes on with a turn answered "ok":
    # each copy's "ok" is the other's at its place, not the newer one (host walk 90004).
    known = view(("blk", identity.BLOCK_ID), ("ok", 20), ("c", 21), ("ok", 22),
                 ("x", 23), ("ok", 24), ("y", 33), ("ok", 34))
    copy_ = ["blk", "ok", "c", "ok", "x", "ok"]
    reading = identity.read(copy_ + copy_ + ["y", "ok", "turn"], [known], turn_index=14)
    once = [identity.BLOCK_ID, 20, 21, 22, 23, 24]
    assert reading.store_ids == once + once + [33, 34, None]
    assert not reading.same_as


def test_copies_of_new_elements_after_a_repeated_block_share_one_row():
    # Both copies of a restored list show an exchange no view knows: one row for both.
    returned = view(("blk", identity.BLOCK_ID), ("a", 20))
    shown = ["blk", "a", "x", "y", "blk", "a", "x", "y", "turn"]
    reading = identity.read(shown, [returned], turn_index=8)
    assert reading.store_ids[5] == 20
    assert reading.same_as == {6: 2, 7: 3}
    assert identity.share_rows([None, 4, None], {2: 0}) == [None, 4, None]
    assert identity.share_rows([7, None, None], {2: 0}) == [7, None, 7]
    assert identity.share_rows([None, None, 8], {2: 0}) == [8, None, 8]


def test_timed_copies_are_one_message_shown_twice():
    fps = ["u", "a", "u", "a", "u"]
    stamps = [1.5, 2.5, 1.5, 2.5, 9.0]
    assert identity.timed_copies(fps, stamps) == {2: 0, 3: 1}
    # A re-sent text has its own timestamp; without timestamps nothing is a copy.
    assert identity.timed_copies(["u", "u"], [1.0, 2.0]) == {}
    assert identity.timed_copies(["u", "u"], [None, None]) == {}
    assert identity.timed_copies([None, None], [1.0, 1.0]) == {}


# ---------------------------------------------------------------- through the engine
def compact(engine, messages: list[dict]) -> list[dict]:
    return engine.compress(messages, current_tokens=host_tokens(messages), force=True)


def stored(engine, session: str = "sess") -> list[tuple[str, str]]:
    return [(r["role"], r["content"]) for r in engine.store.session_messages(session, limit=5000)]


def long_history(turns: int) -> list[dict]:
    return [m for t in range(turns) for m in turn(f"question {t} " + "word " * 40,
                                                  "ok" if t % 3 else f"answer {t}\n")]


def test_a_whitespace_edit_of_a_tail_message_stores_nothing_again(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=30)
    out = compact(engine, long_history(60))
    rows = len(stored(engine))
    edited = [dict(m) for m in out]
    k = next(i for i, m in enumerate(edited)
             if m["role"] == "assistant" and not assemble.is_trove_message(m))
    edited[k]["content"] = edited[k]["content"].strip() + " "   # "ok" -> "ok "
    for m in edited:   # Hermes restores text through sanitize_context(...).strip()
        if isinstance(m.get("content"), str) and not assemble.is_trove_message(m):
            m["content"] = m["content"].strip()
    engine.ingest(edited + [{"role": "user", "content": "next"}])
    assert len(stored(engine)) == rows + 1
    assert stored(engine)[-1] == ("user", "next")


def stored_then_shown_without_views(tmp_path, users: list[str], edit) -> tuple:
    """A session of ``users`` turns stored by one engine, its views then lost (a
    database from before views), and the transcript, changed by ``edit`` with the
    next question after it, read by another process: (rows before, rows after)."""
    a = make_engine(tmp_path, window=256_000)
    history = []
    for t, text in enumerate(users):
        history += turn(text, f"answer {t}\n")
        a.note_user_turn(history[-2])
        a.ingest(history)
        a.turn_done()
    rows = stored(a)
    with a.store.db.transaction() as conn:
        conn.execute("DELETE FROM session_views")
    shown = copy.deepcopy(history)
    edit(shown)
    shown.append({"role": "user", "content": "next question"})
    b = make_engine(tmp_path, window=256_000)  # another process: no reading of its own
    b.note_user_turn(shown[-1])
    b.ingest(shown)
    return rows, stored(b)


def strip_all(shown: list[dict]) -> None:
    """Hermes restores text through ``sanitize_context(...).strip()``."""
    for m in shown:
        m["content"] = m["content"].strip()


def edit_one_reply(shown: list[dict]) -> None:
    shown[-3]["content"] += " "     # "answer 4\n" -> "answer 4\n "


@pytest.mark.parametrize("edit", [strip_all, edit_one_reply])
def test_a_whitespace_edit_in_a_list_no_view_explains_stores_nothing_again(tmp_path, edit):
    """Rule 6 (a list no view explains: here a database from before views) compares
    the fingerprint every other rule does. By the exact content hash, a transcript the
    host restored through ``.strip()`` anchored nowhere and was stored again whole,
    and a reply the host edited in place by whitespace, with everything after it,
    was stored again."""
    rows, after = stored_then_shown_without_views(
        tmp_path, [f"question {t} " + "word " * 10 for t in range(6)], edit)
    assert after == rows + [("user", "next question")]


def test_a_stripped_first_message_that_a_later_row_repeats_still_anchors_at_its_own_row(tmp_path):
    """Rule 6 anchors a list no view explains at the stored copies of its first
    message: by the exact hash first. When the host stripped that message and the
    user later sent the stripped text again, the exact hash finds only the later
    send; the list's own first row (stored with its whitespace) must still be tried,
    or everything before the later send is stored again."""
    rows, after = stored_then_shown_without_views(
        tmp_path, ["hello there\n", "tell me more", "and then?", "hello there"], strip_all)
    assert after == rows + [("user", "next question")]


def test_an_identical_resend_after_undo_is_a_new_row(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    history = turn("first message", "reply one") + turn("second message", "reply two")
    engine.ingest(history)
    engine.turn_done()   # post_llm_call
    # /undo drops the second turn; the user presses Enter on the same text.
    again = history[:2] + [{"role": "user", "content": "second message"}]
    engine.note_user_turn(again[-1])
    engine.ingest(again + [{"role": "assistant", "content": "reply two"}])
    engine.turn_done()
    assert stored(engine) == [("user", "first message"), ("assistant", "reply one"),
                              ("user", "second message"), ("assistant", "reply two"),
                              ("user", "second message"), ("assistant", "reply two")]
    # The same list shown again (a hook, exit) adds nothing.
    engine.ingest(again + [{"role": "assistant", "content": "reply two"}])
    assert len(stored(engine)) == 6


def test_a_retry_after_a_compress_between_turns_is_a_new_row(tmp_path):
    # A /compress between turns stores the list's last exchange when no earlier list
    # did (a fresh /branch). Its user message was answered: it is not the next turn's,
    # so an identical re-send by /retry is a new row (host walk 80001).
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    history = long_history(30) + turn("continue", "reply one")
    out = compact(engine, history)
    rows = len(stored(engine))
    again = out[:-2] + [{"role": "user", "content": "continue"}]   # /retry
    engine.note_user_turn(again[-1])
    engine.ingest(again + [{"role": "assistant", "content": "reply two"}])
    assert len(stored(engine)) == rows + 2
    assert stored(engine)[-4:] == [("user", "continue"), ("assistant", "reply one"),
                                   ("user", "continue"), ("assistant", "reply two")]


def test_a_turn_the_hooks_name_to_another_copy_is_stored_once(tmp_path):
    # Two engine copies on one session in one process: the hooks reach the copy
    # bound last, the host compacts through its own agent's copy in the middle of
    # the turn (after a tool call). The turn is the session's, not the copy's
    # (host walk 100018, in-process: the turn's message was stored by both).
    own = make_engine(tmp_path, window=64_000)
    other = make_engine(tmp_path, window=64_000)
    history = long_history(4)
    own.ingest(history)
    ask = {"role": "user", "content": "question 1 " + "word " * 40}   # an earlier text again
    plugin.on_pre_llm_call(session_id="sess", conversation_history=history + [ask])
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "file body"}
    own.ingest(history + [ask, call, result])        # a compaction's list, mid-turn
    done = history + [ask, call, result, {"role": "assistant", "content": "done"}]
    plugin.on_post_llm_call(session_id="sess", conversation_history=done)
    rows = stored(other)
    assert rows.count(("user", ask["content"])) == 2   # turn 1's and this one
    assert len(rows) == len(history) + 4


def test_an_acknowledgement_away_from_its_block_is_never_stored(tmp_path):
    # The host may restore the engine's acknowledgement after a turn rather than right
    # after its block (a compacted list appended to its transcript again, host walk
    # 120017): it is still the engine's, never a row.
    engine = make_engine(tmp_path, window=64_000)
    ack = {"role": "assistant", "content": assemble.ACK_TEXT}
    engine.ingest(turn("hello", "hi") + [{"role": "user", "content": "go on"}, ack]
                  + turn("next", "fine"))
    assert stored(engine) == [("user", "hello"), ("assistant", "hi"), ("user", "go on"),
                              ("user", "next"), ("assistant", "fine")]


def test_a_turn_stored_by_its_own_compaction_is_not_stored_twice(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    history = long_history(40)
    engine.ingest(history)
    engine.turn_done()
    new = {"role": "user", "content": "question 0 " + "word " * 40}   # same text as turn 0
    out = compact(engine, history + [new])          # the turn-start compaction stores it
    engine.note_user_turn(out[-1])                  # then pre_llm_call
    engine.ingest(out + [{"role": "assistant", "content": "fine"}])
    engine.turn_done()
    contents = [c for _, c in stored(engine)]
    assert contents.count(new["content"]) == 2 and contents[-1] == "fine"


def test_the_pre_compaction_list_after_a_compaction_stores_nothing(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=8)
    history = long_history(50)
    compact(engine, history)
    rows = len(stored(engine))
    engine.on_session_end("sess", history)          # commit_memory_session(old list)
    engine.on_session_end("sess", copy.deepcopy(history))
    assert len(stored(engine)) == rows


def test_the_previous_sessions_transcript_at_exit_is_not_stored_under_the_new_one(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    history = long_history(6)
    engine.ingest(history)
    engine.on_session_start("other-session", platform="cli")
    engine.on_session_end("other-session", history)   # the CLI at exit after /new
    assert stored(engine, "other-session") == []
    assert len(stored(engine)) == len(history)
    # A first turn of the new session is stored there, even when it repeats text.
    first = [{"role": "user", "content": history[0]["content"]}]
    engine.note_user_turn(first[0])
    engine.ingest(first + [{"role": "assistant", "content": "hi"}])
    assert [c for _, c in stored(engine, "other-session")] == [history[0]["content"], "hi"]


def test_the_previous_sessions_transcript_at_exit_is_its_own_after_a_busy_gateway(tmp_path):
    """Rule 4 read only the newest views of all other sessions: after a gateway on
    the same database had written more of them, the CLI's previous session's
    transcript at exit was stored again under the new session. The sessions the
    copy was bound to are read first."""
    engine = make_engine(tmp_path, window=64_000)
    history = long_history(6)
    engine.ingest(history)
    engine.turn_done()
    engine.on_session_start("other-session", platform="cli")
    gateway = make_engine(tmp_path, window=64_000, session=None)
    for user in range(10):
        gateway.on_session_start(f"telegram-{user}", platform="telegram")
        chat = []
        for t in range(4):
            chat += turn(f"user {user} says {t}", f"reply {user}.{t}")
            gateway.note_user_turn(chat[-2])
            gateway.ingest(chat)
            gateway.turn_done()
    engine.on_session_end("other-session", history)   # the CLI at exit after /new
    assert stored(engine, "other-session") == []
    assert len(stored(engine)) == len(history)


def test_earlier_sessions_are_the_copys_own_newest_first_and_bounded():
    earlier = ()
    for leaving, joining in [(None, "s1"), ("s1", "s2"), ("s2", "s1"), ("s1", "s3"),
                             ("s3", "s4"), ("s4", "s5"), ("s5", "s5")]:
        earlier = identity.earlier_sessions(earlier, leaving, joining)
    assert earlier == ("s4", "s3", "s1", "s2")     # s5 is the session bound now
    assert identity.earlier_sessions(("s1", "s2"), "s2", "s1") == ("s2",)


def test_two_copies_on_one_session_see_each_others_compactions(tmp_path):
    a = make_engine(tmp_path, window=64_000, fresh_tail_count=6)
    b = copy.deepcopy(a)
    b.on_session_start("sess", platform="cli")
    shared = long_history(20)
    a.ingest(shared)
    hist_a, hist_b = list(shared), copy.deepcopy(shared)
    for t in range(30):
        for name, engine, hist in (("A", a, hist_a), ("B", b, hist_b)):
            hist += turn(f"{name} step {t} " + "text " * 30, "ok")
            engine.note_user_turn(hist[-2])
            engine.ingest(hist)
            engine.turn_done()
    out_b = compact(b, hist_b)
    node = max(n["node_id"] for n in b.dag.frontier("sess"))
    hist_a += turn("a again " + "x " * 20, "ok")
    out_a = compact(a, hist_a)
    block = next(m["content"] for m in out_a if assemble.is_trove_message(m)
                 and m["role"] == "user")
    assert f"node {node}" in block or f"n{node}" in block
    rows = stored(a)
    expected = len(shared) + 2 * 2 * 30 + 2
    assert len(rows) == expected, "a message was stored twice or lost"
    assert out_b  # b's own prompt is still valid
    assert assemble.sequence_problems(out_a) == []


def stamped(messages: list[dict], start: float = 1_796_000_000.0) -> list[dict]:
    """Messages as the host restores them from its state.db: each with a timestamp."""
    return [dict(m, timestamp=start + k * 0.37) for k, m in enumerate(messages)]


def test_a_transcript_the_host_restores_twice_is_stored_once(tmp_path):
    # After an /undo the CLI may write its whole list to state.db again; a later
    # /resume restores both copies, with the original timestamps.
    engine = make_engine(tmp_path, window=64_000)
    history = stamped(long_history(5))
    engine.ingest(history)
    rows = len(stored(engine))
    doubled = history + copy.deepcopy(history) + [{"role": "user", "content": "go on"}]
    engine.note_user_turn(doubled[-1])
    ids = engine.ingest(doubled)
    assert len(stored(engine)) == rows + 1
    assert ids[:len(history)] == ids[len(history):2 * len(history)]
    # A fresh engine copy that never saw the list (a restart) stores it once too.
    fresh = make_engine(tmp_path / "second", window=64_000)
    fresh.ingest(stamped(long_history(3)) * 2)
    assert len(stored(fresh)) == 6


def test_a_repeated_block_with_new_messages_after_both_copies_stores_them_once(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = compact(engine, long_history(30))
    rows = len(stored(engine))
    extra = turn("a question the engine never saw", "its answer")
    restored = out + extra + copy.deepcopy(out) + copy.deepcopy(extra)
    engine.ingest(restored + [{"role": "user", "content": "next"}])
    contents = [c for _, c in stored(engine)]
    assert len(contents) == rows + 3
    assert contents.count("a question the engine never saw") == 1


def test_a_text_re_sent_after_a_doubled_compacted_transcript_is_a_new_message(tmp_path):
    """The host restored its compacted transcript twice, block included, with the
    original timestamps (rule 7: the later copy is the earlier); the user then re-sends
    the last question's text, and the turn's compaction pass (before ``pre_llm_call``)
    shows the list ending with it. Rule 5 must not read it as the replay of the earlier
    copy's question: the later copy's elements hold their places (host walk 610001: the
    re-send was read as the old row, left out of the prompt and lost)."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = stamped(compact(engine, long_history(30)))
    rows = len(stored(engine))
    question = next(m["content"] for m in reversed(out) if m["role"] == "user")
    resent = {"role": "user", "content": question}
    ids = engine.ingest(out + copy.deepcopy(out) + [resent])
    assert len(stored(engine)) == rows + 1 and ids[-1] not in ids[:-1]
    assert [c for _, c in stored(engine)].count(question) == 2


def test_compress_returns_a_message_shown_twice_once(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=40)
    history = stamped(long_history(6))
    doubled = history + copy.deepcopy(history) + [{"role": "user", "content": "go on"}]
    out = engine.compress(doubled, current_tokens=host_tokens(doubled), force=True)
    texts = [m.get("content") for m in out if not assemble.is_trove_message(m)]
    assert texts == [m["content"] for m in history] + ["go on"]



def test_a_doubled_transcript_of_the_previous_session_at_exit_stores_nothing(tmp_path):
    # The CLI hands the previous session's list at exit under the new id; that list
    # was restored twice from state.db (rule 7) and carries no block this session knows.
    engine = make_engine(tmp_path, window=64_000)
    history = stamped(long_history(6))
    engine.ingest(history)
    engine.on_session_start("other-session", platform="cli")
    engine.on_session_end("other-session", history + copy.deepcopy(history))
    assert stored(engine, "other-session") == []
    assert len(stored(engine)) == len(history)


def test_the_other_sessions_compacted_list_at_exit_stores_nothing(tmp_path):
    # /new, a compaction there, /resume back, exit: the CLI hands the other session's
    # compacted list (its block, then "ok" and the rest) under the resumed id. Its
    # "ok" lines up with this session's, so this session's views explain a little of
    # it; the other session's view, its block included, explains it (host walk 80000).
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=3)
    history = long_history(4)
    engine.ingest(history)
    engine.on_session_start("other-session", platform="cli")
    out = compact(engine, long_history(30)[6:] + turn("go on", "ok"))
    assert any(assemble.is_trove_message(m) for m in out)
    other_rows = len(stored(engine, "other-session"))
    engine.on_session_start("sess", platform="cli")
    engine.on_session_end("sess", out)
    assert stored(engine) == [(m["role"], m["content"]) for m in history]
    assert len(stored(engine, "other-session")) == other_rows


def test_a_list_with_timed_copies_goes_on_with_the_same_rows(tmp_path):
    """Rule 7's later copies are left out of the view as they are left out of the
    reading, so the next turn's list (which shows them again) keeps every element's
    row: a stamped message is not swapped with an unstamped twin of the same text."""
    engine = make_engine(tmp_path, window=64_000)
    first = [{"role": "user", "content": "ok", "timestamp": 1_700_000_001},
             {"role": "assistant", "content": "ok", "timestamp": 1_700_000_002},
             {"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}]
    assert engine.ingest(first) == [1, 2, 3, 4]
    doubled = first + [dict(m) for m in first]  # the host restored its transcript twice
    assert engine.ingest(doubled) == [1, 2, 3, 4, 1, 2, 5, 6]
    turn = {"role": "user", "content": "continue"}
    engine.note_user_turn(turn)
    assert engine.ingest(doubled + [turn]) == [1, 2, 3, 4, 1, 2, 5, 6, 7]
    assert engine.store.count_messages("sess") == 7


def test_an_undone_turn_re_sent_and_compacted_in_its_turn_keeps_its_new_reply(tmp_path):
    # /undo, then the same text re-sent; the turn's compaction pass (the trigger on
    # real tokens, under the host's) stores the re-sent message as a new row, and the
    # turn ends with the same reply text as the undone turn's. The reply follows the
    # new row, not the undone one (host walk 160002: the reply was read as the undone
    # turn's and lost).
    engine = make_engine(tmp_path, window=64_000)
    base = long_history(4)
    ask = "question again " + "word " * 30
    first = base + turn(ask, "ok")
    engine.note_user_turn(first[-2])
    engine.ingest(first)
    rows = len(stored(engine))
    again = base + [{"role": "user", "content": ask}]             # /undo, the same text
    engine.note_user_turn(again[-1])
    assert engine.compress(again, current_tokens=host_tokens(again)) is again   # a no-op pass
    engine.ingest(again + [{"role": "assistant", "content": "ok"}])
    assert len(stored(engine)) == rows + 2
    assert stored(engine)[-4:] == [("user", ask), ("assistant", "ok")] * 2


def test_a_stale_list_keeps_rows_another_copy_summarized_since(tmp_path):
    # Two engine copies on one session (a second CLI). The second read a list without
    # turn b (its view: a, c, d); the first summarized b in a later compaction; then the
    # second shows its old block with b between a and c. b is that row, a summary
    # written after the block notwithstanding (host walk 160017: stored twice).
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = compact(first, long_history(30))
    a, b, c, d = (turn(f"topic {name} " + f"{name}word " * 30, "ok") for name in "abcd")
    first.ingest(out + a + b)
    first.ingest(out + a + c)                                  # /undo of b, then c
    second.ingest(out + a + c + d)
    compact(first, out + a + b + [m for t in range(8) for m in turn(f"more {t} " + "x " * 30, "ok")])
    rows = len(stored(first))
    b_row = [r["store_id"] for r in first.store.session_messages("sess", limit=5000)
             if r["content"] == b[0]["content"]]
    assert len(b_row) == 1 and first.dag.covered_store_ids(b_row)
    second.ingest(out + a + b + c + d + turn("new question", "new answer"))
    assert len(stored(first)) == rows + 2
    assert [m for m in stored(first) if m[1] == b[0]["content"]] == [("user", b[0]["content"])]


def test_a_stale_list_going_on_with_rows_summarized_since_keeps_them(tmp_path):
    # As above, with b after the last row the second copy's view holds: the first
    # copy sent b after a compaction of its own (a newer block) and summarized it
    # later. A run after the last match may be rows a compaction after the shown
    # block summarized (host walk 170009: the other CLI's turn stored T3 and its
    # reply again).
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = compact(first, long_history(30))
    a, b = (turn(f"topic {name} " + f"{name}word " * 30, "ok") for name in "ab")
    second.ingest(out + a)
    more = [m for t in range(8) for m in turn(f"more {t} " + "x " * 30, "ok")]
    newer = compact(first, out + a + more)
    compact(first, newer + b + more[:2] + [m for t in range(8) for m in turn(
        f"later {t} " + "y " * 30, "ok")])
    rows = len(stored(first))
    b_row = [r["store_id"] for r in first.store.session_messages("sess", limit=5000)
             if r["content"] == b[0]["content"]]
    assert len(b_row) == 1 and first.dag.covered_store_ids(b_row)
    second.ingest(out + a + b + turn("new question", "new answer"))
    assert len(stored(first)) == rows + 2
    assert [m for m in stored(first) if m[1] == b[0]["content"]] == [("user", b[0]["content"])]


def second_cli_sends(tmp_path, restored: list, text: str) -> None:
    """A second engine copy (the second CLI in its own process) sends ``text`` after
    the list it restored: what the host hands over is that list plus the new turn."""
    b = make_engine(tmp_path, window=256_000, fresh_tail_count=4)
    shown = restored + [{"role": "user", "content": text}]
    b.note_user_turn(shown[-1])
    b.ingest(shown)


def test_a_second_copys_list_from_before_a_retry_keeps_the_retried_attempt(tmp_path):
    """A second CLI restores the session while its last turn was sent three times
    (each with its reply); the first CLI then /retries that turn (the host drops the
    third attempt and sends the text again) and goes on for many turns, so no view
    holding the dropped attempt is left. The second CLI's next list shows the third
    attempt and its reply: they are the rows stored then, not new ones (host walk
    250002: the first CLI's views read the attempt as the retried copy, and its reply,
    lining up with nothing after that copy, was stored again)."""
    a = make_engine(tmp_path, window=256_000, fresh_tail_count=4)
    history = compact(a, long_history(12))     # both lists carry the engine's block
    for reply in ("reply 19", "reply 20", "reply 21"):     # one text sent three times
        history += turn("T12 the same question", reply)
        a.note_user_turn(history[-2])
        a.ingest(history)
        a.turn_done()
    restored = copy.deepcopy(history)                       # the second CLI's transcript
    retried = history[:-2] + turn("T12 the same question", "reply 22")
    a.note_user_turn(retried[-2])
    a.ingest(retried)
    a.turn_done()
    for t in range(40):
        retried += turn(f"later {t} " + "text " * 10, f"noted {t}")
        a.note_user_turn(retried[-2])
        a.ingest(retried)
        a.turn_done()
    rows = len(stored(a))
    second_cli_sends(tmp_path, restored, "T30 from the second CLI")
    texts = [content for _, content in stored(a)]
    assert texts.count("reply 21") == 1 and texts.count("T12 the same question") == 4
    assert len(stored(a)) == rows + 1 and texts[-1] == "T30 from the second CLI"


def test_a_second_copys_list_with_a_retried_turn_right_after_the_block_keeps_both_sends(tmp_path):
    """A turn right after the engine's block is /retried (T23 "ok", T23 "reply 46"); a
    second CLI restores that list, with the first attempt kept, before the first CLI
    /undoes the retry, sends T23 again ("ok"), goes on and compacts (summarizing both
    attempts). The second CLI's next list shows both attempts after its old block: they
    are the rows stored then. Read against the first CLI's view after the re-send, T23
    and "ok" were the re-send's rows, and the retry's T23 and reply 46, lining up with
    nothing after them, were stored again (host walk 520001: the slide back to the
    earlier rows stopped at the block)."""
    a = make_engine(tmp_path, window=256_000, fresh_tail_count=1)
    sent = {"role": "user", "content": "T23 the release train"}
    a.note_user_turn(sent)
    out = compact(a, long_history(12) + [sent])     # compacted in T23's turn: the block,
    head = out[:-1]                                  # its acknowledgement, then T23
    assert len(head) == 2 and out[-1] == sent
    a.ingest(out + [{"role": "assistant", "content": "ok"}])
    a.turn_done()

    def send(history):
        a.note_user_turn(history[-2])
        a.ingest(history[:-1])
        a.ingest(history)
        a.turn_done()

    restored = head + turn("T23 the release train", "ok") + turn("T23 the release train",
                                                                 "reply 46")
    send(head + turn("T23 the release train", "reply 46"))       # /retry
    resent = head + turn("T23 the release train", "ok")          # /undo, the same text again
    send(resent)
    for t in range(2):
        resent = resent + turn("ok", f"noted {t}")
        send(resent)
    compact(a, resent)            # the first CLI summarizes both attempts and the re-send
    rows = len(stored(a))
    second_cli_sends(tmp_path, restored, "T26 from the second CLI")
    texts = [content for _, content in stored(a)]
    assert texts.count("reply 46") == 1 and texts.count("T23 the release train") == 3
    assert len(stored(a)) == rows + 1 and texts[-1] == "T26 from the second CLI"


def test_a_turn_restored_before_a_repeated_block_keeps_the_row_another_copy_stored(tmp_path):
    """A second engine copy (a second CLI) sends a turn after the first copy's list;
    the first then compacts that list into a new block, and the host's state.db holds
    its returned list twice with the second copy's turn between the copies. Read
    against the first copy's view, the turn lay between the first copy's last row and
    the replay's (rule 5) lower first row: no row between them, and the turn was stored
    again (host walk 1620011). The run goes on after its last row."""
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = compact(first, long_history(30))
    mine = turn("topic a " + "aword " * 30, "ok") + turn("go on", "answer a\n")
    theirs = turn("continue", "answer c\n")
    first.ingest(out + mine)
    second.ingest(out + mine + theirs)
    returned = compact(first, out + mine)
    assert any(assemble.is_trove_message(m) for m in returned)
    rows = len(stored(first))
    ids = first.ingest(stamped(returned + theirs) + stamped(returned, start=1_797_000_000.0))
    assert len(stored(first)) == rows
    assert [m for m in stored(first) if m[1] == "continue"] == [("user", "continue")]
    rows_of_theirs = [r["store_id"] for r in first.store.session_messages("sess", limit=5000)
                      if r["content"] in ("continue", "answer c\n")]
    assert ids[len(returned):len(returned) + 2] == rows_of_theirs


def test_two_sends_of_a_text_restored_after_a_retrys_dropped_attempt_keep_their_rows(
        tmp_path):
    """A turn (q, ok), "go on" answered a16, a /retry of it (go on, ok: the retry's list
    drops a16's exchange), "go on" sent again (ok), a /retry of that (a19, dropping the
    second send), two more sends (a20, ok), then a restart. The host's state.db keeps the
    second send active and not the first attempt: [q, ok, go on, ok, go on, ok, go on,
    a19, ...]. The newest view lists one (go on, ok) there; read as the later copy, and
    slid once to the first, the second copy's gap lay between the retry's row and a16's
    exchange, two rows by count, and was stored again as a send of its own (host walk
    1910002: a /branch, /retry, re-sends, /compress, /retry, a restart). Rows between
    that cannot be the gap are none of it: the view's run slides on, and the copy left
    lines up with the second send's rows."""
    engine = make_engine(tmp_path, session="sess")
    base = turn("q", "ok")
    sends = [base + turn("go on", "a16"), base + turn("go on", "ok"),      # turn, /retry
             base + turn("go on", "ok") * 2,                               # sent again
             base + turn("go on", "ok") + turn("go on", "a19")]            # /retry
    sends += [sends[-1] + turn("go on", "a20"), sends[-1] + turn("go on", "a20")
              + turn("go on", "ok")]                                       # sent twice more
    for sent in sends:
        engine.note_user_turn(sent[-2])
        engine.ingest(sent[:-1])
        engine.ingest(sent)
        engine.turn_done()
    before = stored(engine)
    assert [m for _, m in before] == ["q", "ok", "go on", "a16", "go on", "ok", "go on", "ok",
                                      "go on", "a19", "go on", "a20", "go on", "ok"]
    restored = stamped(base + turn("go on", "ok") + sends[-1][2:])
    restored += [{"role": "user", "content": "T8"}]
    again = make_engine(tmp_path, session="sess")                  # a restart restores it
    again.note_user_turn(restored[-1])
    ids = again.ingest(restored)
    assert stored(again) == before + [("user", "T8")]
    rows = [r["store_id"] for r in again.store.session_messages("sess", limit=5000)]
    assert list(ids[:len(restored) - 1]) == rows[:2] + rows[4:-1]     # not a16's exchange
