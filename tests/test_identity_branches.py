"""storage/identity on /branch flows and restored attempts (issue #24): a /retry on a
branch before its first turn, the copied exchange the host keeps active in the branch's
state.db, an /undo and the text sent again, and a second CLI's restores of all that
(host walks 490000, 500000, 630003, 640000, 1590006, 1640002, 1710006, 2400000,
3330003, 3320002). The helpers are test_identity's."""

import copy

import pytest

from enginekit import make_engine
from hermes_trove.storage import views
from test_identity import compact, long_history, stamped, stored, turn
from test_identity_blocks import _turns


class _HostSessions:
    """The one method of the host's SessionDB that bind_session_state reads."""

    def __init__(self, rows):
        self.rows = rows

    def get_session(self, session_id):
        return self.rows.get(session_id)


def _to_branch(engine) -> "_HostSessions":
    """/branch: the host resets the engine and binds it to "branch", a child of "parent"
    (returns the host's sessions, for a later switch back)."""
    host = _HostSessions({"parent": {"id": "parent"},
                          "branch": {"id": "branch", "parent_session_id": "parent"}})
    engine.on_session_reset()
    engine.bind_session_state(host, "branch")
    return host


@pytest.mark.parametrize("first", ["first message", "second message"])
def test_a_branchs_copied_attempt_restored_after_its_retry_is_a_send_of_its_own(tmp_path, first):
    """/branch, then /retry on the branch before any other turn: the branch's first
    list (the retry's) lacks the parent's last exchange that the host copied into the
    branch and keeps active in its state.db. After an /undo of the retry a restore of
    the branch ends with that copied exchange (u2, a2): u2 is not the re-send's row but
    a send of its own, stored with a2, and a2 is no second reply of the re-send (host
    walk 490000: u2 lost, a2 stored after a2'). The same when u2's text was sent
    before too (a repeated "continue": host walk 500000)."""
    engine = make_engine(tmp_path, session="parent")
    history = []
    for user, reply in ((first, "reply 1"), ("second message", "reply 2")):
        history += turn(user, reply)
        engine.note_user_turn(history[-2])
        engine.ingest(history)
        engine.turn_done()
    restored = copy.deepcopy(history)            # what the branch's state.db keeps active
    host = _to_branch(engine)                    # /branch
    assert engine.last_switch["kind"] == "branch"
    retried = history[:-2] + turn("second message", "reply 3")    # /retry on the branch
    engine.note_user_turn(retried[-2])
    engine.ingest(retried[:-1])
    engine.ingest(retried)
    engine.turn_done()
    engine.on_session_reset()                    # /undo of the retry, then away and back
    engine.bind_session_state(host, "parent")
    engine.on_session_reset()
    engine.bind_session_state(host, "branch")
    restored += [{"role": "user", "content": "third message"}]
    engine.note_user_turn(restored[-1])
    engine.ingest(restored)
    assert stored(engine, "branch") == [
        ("user", first), ("assistant", "reply 1"),
        ("user", "second message"), ("assistant", "reply 3"),
        ("user", "second message"), ("assistant", "reply 2"), ("user", "third message")]
    engine.ingest(restored)                      # the same list again: nothing new
    assert len(stored(engine, "branch")) == 7
    assert [m for _, m in stored(engine, "parent")] == [
        first, "reply 1", "second message", "reply 2"]


def _parent_then_branch(tmp_path):
    """A parent's two turns (first message / reply 1, second message / reply 2), then a
    /branch: the engine bound to the branch and the parent's history (the branch's copy)."""
    engine = make_engine(tmp_path, session="parent")
    history = []
    for user, reply in (("first message", "reply 1"), ("second message", "reply 2")):
        history += turn(user, reply)
        engine.note_user_turn(history[-2])
        engine.ingest(history)
        engine.turn_done()
    _to_branch(engine)                           # /branch
    return engine, history


def _branch_retried_then_re_sent(tmp_path):
    """A parent's two turns, a /branch, a /retry on the branch before any other turn
    (its first list lacks the copied exchange u2, a2 that the branch's state.db keeps
    active), an /undo of the retry and the same text sent again (u2'', "ok"): the
    engine, the parent's history (the branch's copy) and the re-send's list."""
    engine, history = _parent_then_branch(tmp_path)
    retried = history[:-2] + turn("second message", "reply 3")    # /retry on the branch
    engine.note_user_turn(retried[-2])
    engine.ingest(retried[:-1])
    engine.ingest(retried)
    engine.turn_done()
    resent = history[:-2] + turn("second message", "ok")          # /undo, the text again
    engine.note_user_turn(resent[-2])
    engine.ingest(resent[:-1])
    engine.ingest(resent)
    engine.turn_done()
    return engine, copy.deepcopy(history), resent


def test_a_branchs_copied_send_restored_before_its_re_send_is_a_send_of_its_own(tmp_path):
    """After ``_branch_retried_then_re_sent`` a second CLI restores the branch: [..., u2,
    a2, u2'', ok, ...]. u2 lines up, between two matched rows, with the retry's undone
    u2' (answered by a3 in a view); a2 with nothing. One send has one reply: u2 is a
    send of its own, stored with a2 (host walk 630003: a2 stored, u2 lost)."""
    _, restored, resent = _branch_retried_then_re_sent(tmp_path)
    other = make_engine(tmp_path, session="branch")               # a second CLI's restore
    restored += copy.deepcopy(resent[-2:]) + [{"role": "user", "content": "third message"}]
    other.note_user_turn(restored[-1])
    other.ingest(restored)
    assert stored(other, "branch") == [
        ("user", "first message"), ("assistant", "reply 1"),
        ("user", "second message"), ("assistant", "reply 3"),
        ("user", "second message"), ("assistant", "ok"),
        ("user", "second message"), ("assistant", "reply 2"), ("user", "third message")]
    other.ingest(restored)                       # the same list again: nothing new
    assert len(stored(other, "branch")) == 9


def test_a_copied_exchange_another_cli_stored_later_keeps_its_rows_in_a_restore(tmp_path):
    """After ``_branch_retried_then_re_sent`` a second CLI restores the branch and stores
    the copied exchange (u2, a2) with its turn, after rows the first CLI stored since;
    the first CLI goes on without them. A restore of the whole branch, read against the
    first CLI's newest view, has u2, a2 in the gap between their neighbours, whose rows
    by store order are the undone retry's: the second CLI's view lists u2, a2 there, and
    they are those rows (host walk 630003: the exchange stored again, step 54)."""
    first, copied, resent = _branch_retried_then_re_sent(tmp_path)
    listed = copy.deepcopy(resent)
    other_list = copy.deepcopy(copied + resent[-2:]) + turn("other CLI turn", "reply 5")
    listed += turn("first CLI turn", "reply 4")                   # before the other's turn
    first.note_user_turn(listed[-2])
    first.ingest(listed)
    first.turn_done()
    other = make_engine(tmp_path, session="branch")               # restored before that turn
    other.note_user_turn(other_list[-2])
    other.ingest(other_list[:-1])
    other.ingest(other_list)
    other.turn_done()
    for t in range(3):                                            # the first CLI goes on
        listed += turn(f"first CLI later turn {t}", f"later reply {t}")
        first.note_user_turn(listed[-2])
        first.ingest(listed)
        first.turn_done()
    rows = stored(first, "branch")
    assert rows.count(("user", "second message")) == 3 and ("assistant", "reply 2") in rows
    restored = (copy.deepcopy(other_list[:-2]) + turn("first CLI turn", "reply 4")
                + copy.deepcopy(other_list[-2:]) + copy.deepcopy(listed[len(resent) + 2:])
                + [{"role": "user", "content": "after the resume"}])
    again = make_engine(tmp_path, session="branch")               # /resume of the branch
    again.note_user_turn(restored[-1])
    again.ingest(restored)
    assert stored(again, "branch") == rows + [("user", "after the resume")]


def test_a_restored_attempt_stored_after_the_rows_around_it_keeps_its_row(tmp_path):
    """A /retry's first attempt the host keeps in state.db ("continue", "ok") is shown
    restored after the retried exchange and before the next turn. A list that went on
    from an older view stored the attempt after every other row; a later view without
    it explains the restored list best, and its reading (the latest of equal elements)
    gave the retried exchange's rows to the attempt: the retried exchange lay between
    two consecutive rows and was stored again (host walk 640000). The attempt's
    timestamps name its rows."""
    engine = make_engine(tmp_path, window=64_000)
    head = stamped(long_history(4))
    t1 = 1_796_100_000.0
    ok_ok = [{"role": "user", "content": "ok", "timestamp": t1},
             {"role": "assistant", "content": "ok", "timestamp": t1}]
    retried = turn("continue", "ok")                    # live: no timestamp
    attempt = [{"role": "user", "content": "continue", "timestamp": t1 + 0.5},
               {"role": "assistant", "content": "ok", "timestamp": t1 + 0.6}]
    later = turn("question 21", "reply 21") + turn("question 22", "reply 22") \
        + turn("question 23", "reply 23")
    engine.ingest(head + ok_ok + retried)
    engine.ingest(head + ok_ok + retried + later)
    # a second copy's list goes on from the first view: the attempt after the retry
    engine.ingest(head + ok_ok + retried + attempt + turn("question 26", "reply 26"))
    rows = len(stored(engine))
    # restored from state.db: every message with a time, the attempt's as it was stored
    again = [dict(m, timestamp=t1 + 0.2 + k * 0.01) for k, m in enumerate(retried)]
    restored = head + ok_ok + again + attempt + later + turn("question 26", "reply 26")
    engine.ingest(copy.deepcopy(restored))
    assert len(stored(engine)) == rows


def test_a_restored_retry_chain_whose_last_send_is_undone_keeps_its_rows(tmp_path):
    """A turn sent four times (/retry, re-sends): state.db keeps every attempt, and a
    /resume restores them all; the last one is undone and the text sent again. The
    newest view holds only the last two sends; its reading (the latest of equal
    elements) gave the first send the third's row and the second send the fourth's,
    the first reply lined up with nothing between them and the third send with its
    reply with nothing after the last row: all three were stored again (host walk
    680002). A whitespace edit kept the whole-history reading from lining the list up.
    The sends move back onto the rows before the view's, and the run goes on after
    them."""
    engine = make_engine(tmp_path, window=64_000)
    head = long_history(4) + turn("yes", "ok")
    ask = "question 28 " + "word " * 30
    engine.ingest(head + turn(ask, "reply 47"))
    engine.ingest(head + turn(ask, "ok"))                      # /undo, the text again
    engine.ingest(head + turn(ask, "reply 49"))                # /retry
    engine.ingest(head + turn(ask, "reply 49") + turn(ask, "ok"))   # the text again
    rows = len(stored(engine))
    # /resume: state.db keeps every attempt; a whitespace edit of an older reply
    restored = stamped(head + turn(ask, "reply 47") + turn(ask, "ok") + turn(ask, "reply 49")
                       + turn(ask, "ok"))
    restored[len(head) - 1]["content"] += " "
    # /undo of the last send, and the text sent again
    again = copy.deepcopy(restored[:-2]) + [{"role": "user", "content": ask}]
    engine.note_user_turn(again[-1])
    engine.ingest(again)
    assert len(stored(engine)) == rows + 1


def test_a_restored_retry_chain_read_as_going_on_from_its_view_keeps_its_rows(tmp_path):
    """A turn sent four times: answered "ok", /retry (reply 9), /undo and the text sent
    again ("ok"), /retry (reply 9). A /resume restores the attempts state.db keeps
    active (the first send, the re-send, the last retry); the last is undone and the
    text sent again. The view of the re-send's list ([head, T, "ok"]) is the restored
    list's start, so its rows went to the first send; the re-send then lined up with the
    last retry's row, which a view lists answered by reply 9, and read as a send of its
    own it was stored again with its "ok" (host walk 1110000). The view's rows are the
    re-send's (the run after them repeats them), and the first send takes the equal
    rows before them."""
    engine = make_engine(tmp_path, window=64_000)
    head = long_history(4)
    ask = "question 17 " + "word " * 30
    for reply in ("ok", "reply 9", "ok", "reply 9"):   # chat, /retry, /undo + send, /retry
        history = head + turn(ask, reply)
        engine.note_user_turn(history[-2])
        engine.ingest(history)
        engine.turn_done()
    rows = len(stored(engine))
    # /resume: the first send, the re-send and the last retry are active in state.db
    restored = stamped(head + turn(ask, "ok") + turn(ask, "ok") + turn(ask, "reply 9"))
    again = copy.deepcopy(restored[:-2]) + [{"role": "user", "content": ask}]
    engine.note_user_turn(again[-1])
    engine.ingest(again)
    assert len(stored(engine)) == rows + 1
    engine.ingest(again + [{"role": "assistant", "content": "reply 10"}])
    assert len(stored(engine)) == rows + 2
    # each restored attempt is its own row: the first send's, then the re-send's
    ids = [r["store_id"] for r in engine.store.session_messages("sess", limit=5000)]
    sends = ids[len(head):]
    with engine.store.db.reading() as conn:
        newest = views.load(conn, "sess")[0]
    assert [sid for _, sid in newest.entries][-6:] == sends[:2] + sends[4:6] + sends[8:]


@pytest.mark.parametrize("second, new", [("reply 2 again", 1), ("reply 2 retried", 3)])
def test_a_transcript_written_twice_around_a_re_sent_turn_keeps_its_rows(tmp_path, second, new):
    """A turn undone and its text sent again (two rows of that text), then a /compress
    between turns: the host writes the list it returns to its state.db twice, stamping
    the messages that carry no timestamp anew at each write, and a /resume restores
    both copies, the whole written twice more with the same timestamps. Rule 7 reads
    the later copies of the first message and its reply as nothing; the re-sent turn
    after them, stamped anew, is the same message as the one before them. The view
    read that one as the re-send, and the second copy, after the copies read as
    nothing, lined up with no row after it: stored again as a third send (soak seed
    1130002, rare flows weighted up). A second copy that differs (a /retry's new
    reply) is a send of its own, stored with its reply."""
    engine = make_engine(tmp_path, window=64_000)
    first = stamped(turn("question 1 " + "word " * 30, "reply 1"))
    ask = "question 2 " + "word " * 30
    engine.note_user_turn(first[0])
    engine.ingest(first)
    engine.turn_done()
    for reply in ("reply 2", "reply 2 again"):       # sent, undone, sent again
        history = first + turn(ask, reply)
        engine.note_user_turn(history[-2])
        engine.ingest(history)
        engine.turn_done()
    rows = len(stored(engine))
    written = (first + stamped(turn(ask, "reply 2 again"), 1_796_000_100.0)
               + first + stamped(turn(ask, second), 1_796_000_200.0))
    restored = copy.deepcopy(written) + copy.deepcopy(written) + [
        {"role": "user", "content": "continue"}]
    engine.note_user_turn(restored[-1])
    engine.ingest(restored)
    assert len(stored(engine)) == rows + new
    assert [c for _, c in stored(engine)].count(ask) == 2 + (new > 1)


def test_a_branchs_first_list_of_a_doubled_compacted_restore_stores_its_tail_once(tmp_path):
    """The host wrote its compacted list to state.db twice, the second time with new
    timestamps on the block, its acknowledgement and the last exchange (the turn the
    compaction ran in); a /resume restores both copies and a /branch copies them. No
    view explains the branch's first list: rule 7 shares the rows of the elements with
    equal timestamps, and rule 5 (a repeated block replays what followed it) must hold
    for the rest: the last exchange was stored twice (host walk 1110002)."""
    from test_identity import compact
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4, session="parent")
    out = stamped(compact(engine, long_history(30)))
    later = stamped(copy.deepcopy(out), start=1_796_000_100.0)
    again = copy.deepcopy(out)
    for k in (0, 1, -2, -1):   # the block, its acknowledgement, the last exchange
        again[k]["timestamp"] = later[k]["timestamp"]
    host = _HostSessions({"parent": {"id": "parent"},
                          "branch": {"id": "branch", "parent_session_id": "parent"}})
    engine.on_session_reset()
    engine.bind_session_state(host, "branch")    # /branch of the restored session
    assert engine.last_switch["kind"] == "branch"
    shown = out + again + [{"role": "user", "content": "next question"}]
    engine.note_user_turn(shown[-1])
    engine.ingest(shown)
    tail = [m["content"] for m in out[2:]]
    assert [c for _, c in stored(engine, "branch")] == tail + ["next question"]


def test_a_send_after_a_doubled_compacted_restore_is_no_replay_of_the_restored_copy(tmp_path):
    """The host wrote its compacted list to state.db twice (the second write stamping
    every message anew); a /resume restored both copies, a /retry re-sent the last
    question (the re-send and its new reply carry no timestamp: sent since the
    restore), a /branch copied the list and the text was sent a third time. In the
    branch's first list (no view explains it) the retry's send stands after the later
    block where the restored question stands after the earlier one: rule 5 paired it
    with that restored copy, both shared one row and the retry's send was lost (host
    walk 1310001). A message without a timestamp in a restored list is no replay."""
    from test_identity import compact
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4, session="parent")
    out = stamped(compact(engine, long_history(30)))
    again = stamped(copy.deepcopy(out), start=1_796_000_100.0)
    question = out[-2]["content"]
    assert out[-2]["role"] == "user"
    retried = out + again[:-2] + [{"role": "user", "content": question}]
    engine.on_session_reset()
    engine.bind_session_state(_HostSessions({"parent": {"id": "parent"}}), "parent")
    engine.note_user_turn(retried[-1])   # /resume, then /retry of the last question
    engine.ingest(retried)
    engine.turn_done()
    retried.append({"role": "assistant", "content": "another reply"})
    host = _HostSessions({"parent": {"id": "parent"},
                          "branch": {"id": "branch", "parent_session_id": "parent"}})
    engine.on_session_reset()
    engine.bind_session_state(host, "branch")    # /branch of the retried session
    assert engine.last_switch["kind"] == "branch"
    shown = retried + [{"role": "user", "content": question}]   # the text sent again
    engine.note_user_turn(shown[-1])
    engine.ingest(shown)
    tail = [m["content"] for m in out[2:]]
    assert [c for _, c in stored(engine, "branch")] == tail + [question, "another reply",
                                                                 question]


def _tool_exchange(ask: str, call_id: str, reply: str) -> list[dict]:
    """A turn answered through one tool call: the question, the call, its result, the reply."""
    return [{"role": "user", "content": ask},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "trove_status", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "trove_status",
             "content": '{"bound": true}'},
            {"role": "assistant", "content": reply}]


def test_a_branchs_restored_copied_attempt_before_its_retry_keeps_the_first_reply(tmp_path):
    """The parent sent T7 twice, each answered "ok" through a tool call; a /branch, then a
    /retry on the branch before any other turn (its first list drops the copied second
    send, which the branch's state.db keeps active). A restart restores [..., T7, call,
    result, "ok", T7, call', result', "ok", T7, call'', result'', reply]: the view's "ok"
    was read as the copied attempt's, the first "ok" and the attempt lay between two
    consecutive rows, and rule 1 made the later "ok" new too: the first "ok" was stored
    again (host walk 1500005). The copied attempt is new, every other element keeps its row."""
    engine = make_engine(tmp_path, session="parent", window=64_000)
    ask = "[T7] The cache " + "word " * 30
    history = long_history(2)
    for call_id in ("c1", "c2"):                 # the text sent, then sent again
        history += _tool_exchange(ask, call_id, "ok")
        engine.note_user_turn(history[-4])
        engine.ingest(history)
        engine.turn_done()
    _to_branch(engine)                           # /branch
    retried = history[:-4] + _tool_exchange(ask, "c3", "Noted [T7]")    # /retry on the branch
    engine.note_user_turn(retried[-4])
    engine.ingest(retried[:-3])
    engine.ingest(retried)
    engine.turn_done()
    rows = stored(engine, "branch")
    # a restart: state.db keeps the copied second send active before the retry's
    restored = stamped(history + retried[-4:]) + turn("[T8] Checkpoint", "Noted [T8]")
    again = make_engine(tmp_path, session="branch", window=64_000)
    again.note_user_turn(restored[-2])
    again.ingest(copy.deepcopy(restored[:-1]))
    again.ingest(copy.deepcopy(restored))
    assert [m for _, m in stored(again, "branch")].count("ok") == 3
    assert len(stored(again, "branch")) == len(rows) + 4 + 2


def _tool_turn(user: str, call_id: str) -> list[dict]:
    """A send answered through a tool call: the call, its result and "ok"."""
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": call_id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}
    return [{"role": "user", "content": user}, call,
            {"role": "tool", "tool_call_id": call_id, "content": "file body"},
            {"role": "assistant", "content": "ok"}]


def test_a_branchs_undone_copied_send_restored_between_two_matches_is_a_send_of_its_own(
        tmp_path):
    """A parent sends "continue" twice (each answered through a tool call, then "ok"),
    /branch, and the branch's first turn is an /undo of the copied second send and the
    text sent again (its own call). A second CLI restored the branch before that: [...,
    u2, call2, result2, ok, u3, call3, result3, ok, u4]. Read against the re-send's view,
    u3 lines up with the re-send's row and the last "ok" with its reply's, the call and
    result between them with nothing: u3 is a send of its own, stored with its reply
    (host walk 1590006: the reply stored, u3 lost)."""
    engine = make_engine(tmp_path, session="parent")
    history = turn("first message", "reply 1")
    engine.note_user_turn(history[-2])
    engine.ingest(history)
    engine.turn_done()
    for call_id in ("c2", "c3"):
        history += _tool_turn("continue", call_id)
        engine.note_user_turn(history[-4])
        engine.ingest(history)
        engine.turn_done()
    restored = copy.deepcopy(history)            # what the branch's state.db keeps active
    _to_branch(engine)                           # /branch
    resent = history[:-4] + _tool_turn("continue", "c4")           # /undo, the text again
    engine.note_user_turn(resent[-4])
    engine.ingest(resent)
    engine.turn_done()
    other = make_engine(tmp_path, session="branch")               # a second CLI's restore
    restored += [{"role": "user", "content": "third message"}]
    other.note_user_turn(restored[-1])
    other.ingest(restored)
    rows = stored(other, "branch")
    assert [r for r in rows if r[0] == "user"] == [
        ("user", "first message"), ("user", "continue"), ("user", "continue"),
        ("user", "continue"), ("user", "third message")]
    assert rows.count(("assistant", "ok")) == 3
    other.ingest(restored)                       # the same list again: nothing new
    assert len(stored(other, "branch")) == len(rows)


def test_a_re_send_stored_before_the_copied_send_it_follows_keeps_its_rows(tmp_path):
    """A /retry on a branch before its first turn stores the re-send (R) first; a
    restore shows the copied send state.db keeps (C) before it, stored then after R.
    A second CLI's view goes from C straight to its own longer turns (X), and a later
    restore [C, R, T, X] read against it has R and T between C and X: by store order
    that gap holds T alone. The first CLI's view, which never held X, lists R there:
    R keeps its rows (host walk 1640002: the re-send and its reply stored again)."""
    first = make_engine(tmp_path, window=64_000)
    head = turn("first message", "reply 1")
    resent = turn("go on", "reply 14")
    copied = turn("copied send", "copied reply")
    first.note_user_turn(resent[-2])
    first.ingest(head + resent)
    first.turn_done()
    listed = head + copied + resent + turn("question 20", "reply 20")
    first.note_user_turn(listed[-2])
    first.ingest(listed)
    first.turn_done()
    other = make_engine(tmp_path, window=64_000)                 # a second CLI, without R, T
    other_list = head + copied
    for t in range(3):
        other_list += turn(f"other turn {t}", f"other reply {t}")
        other.note_user_turn(other_list[-2])
        other.ingest(other_list)
        other.turn_done()
    rows = stored(other)
    assert rows.count(("user", "go on")) == 1
    restored = listed + other_list[len(head) + len(copied):] \
        + [{"role": "user", "content": "next"}]
    again = make_engine(tmp_path, window=64_000)                 # a restart restores it all
    again.note_user_turn(restored[-1])
    again.ingest(copy.deepcopy(restored))
    assert stored(again) == rows + [("user", "next")]


def test_a_branchs_copied_send_restored_before_its_retries_leaves_their_rows_to_them(
        tmp_path):
    """/branch, then /retry on the branch before any other turn (its first list lacks
    the copied exchange u2, a2), another /retry, an /undo with the text sent again and
    one more /retry. A restart restores what state.db keeps: [u1, r1, u2, a2, u2, a3,
    u2, a5, u2, a6, u3]. Between r1 and the last send's row the gap's rows are [u2, a3,
    u2, a4, u2, a5]: its LCS gave each restored send the row of the one before it, so
    no reply lined up; each send read as one of its own, and the first retry's exchange
    (u2, a3) was stored again (host walk 1670001). Only u2, a2 is new."""
    engine, history = _parent_then_branch(tmp_path)
    for reply in ("reply 3", "reply 4", "reply 5", "reply 6"):   # /retry, /retry, /undo
        sent = history[:-2] + turn("second message", reply)       # and again, /retry
        engine.note_user_turn(sent[-2])
        engine.ingest(sent[:-1])
        engine.ingest(sent)
        engine.turn_done()
    before = stored(engine, "branch")
    assert [m for _, m in before] == ["first message", "reply 1"] + [
        m for r in ("reply 3", "reply 4", "reply 5", "reply 6") for m in ("second message", r)]
    restored = stamped(history + [m for r in ("reply 3", "reply 5", "reply 6")
                                  for m in turn("second message", r)])
    restored += [{"role": "user", "content": "third message"}]
    again = make_engine(tmp_path, session="branch")               # a restart
    again.note_user_turn(restored[-1])
    again.ingest(restored)
    assert stored(again, "branch") == before + [
        ("user", "second message"), ("assistant", "reply 2"), ("user", "third message")]
    again.ingest(restored)                       # the same list again: nothing new
    assert len(stored(again, "branch")) == len(before) + 3


def test_a_retried_exchange_a_second_cli_restored_keeps_its_rows_after_later_retries(
        tmp_path):
    """A turn (u, ok), a /retry (u, a19: the retry's list drops the first exchange),
    an /undo with u sent again (u, ok) and a /retry of that (u, a22). A second CLI that
    restored the session after the first /retry shows what state.db kept then: [u, ok,
    u, a19] and its own turn. Read against the newest view ([u, ok, u, a22]) the second
    u matched the last retry's send, answered otherwise, so it read as a send of its
    own, and the first retry's exchange (u, a19) was stored again (host walk 1710006).
    A view lists u answered by a19: that exchange is those rows."""
    engine = make_engine(tmp_path, session="sess")
    history = turn("u", "ok")
    engine.note_user_turn(history[-2])
    engine.ingest(history)
    engine.turn_done()
    for sent in (turn("u", "a19"), turn("u", "ok"), turn("u", "ok") + turn("u", "a22")):
        engine.note_user_turn(sent[-2])          # /retry, /undo and again, /retry
        engine.ingest(sent[:-1])
        engine.ingest(sent)
        engine.turn_done()
    before = stored(engine)
    assert [m for _, m in before] == ["u", "ok", "u", "a19", "u", "ok", "u", "a22"]
    restored = stamped(turn("u", "ok") + turn("u", "a19"))
    restored += [{"role": "user", "content": "second CLI turn"}]
    other = make_engine(tmp_path, session="sess")   # restored after the first /retry
    other.note_user_turn(restored[-1])
    other.ingest(restored)
    assert stored(other) == before + [("user", "second CLI turn")]
    other.ingest(restored)                       # the same list again: nothing new
    assert len(stored(other)) == len(before) + 1


def test_a_branchs_copied_exchange_undone_before_its_first_turn_is_stored_from_a_restore(
        tmp_path):
    """/branch of three turns, /undo on the branch (the third exchange), a second CLI
    restores the branch from state.db (the copy of the first two), then the first CLI's
    /undo and re-send of "second message" is the branch's first list: the copy holds
    only the first exchange. The second CLI's turn shows the copied second exchange
    the first CLI undid: it is stored then, once, beside the re-send's, and nothing of
    the third, which no list of the branch showed (host walk 2400000, a second CLI's
    turn on a branch; the engine stores the restored list's copy, the walk's oracle
    now counts that list as a copy the branch may hold)."""
    engine = make_engine(tmp_path, session="parent")
    history = []
    for n in (1, 2, 3):
        history += stamped(turn(("first", "second", "third")[n - 1] + " message",
                                f"reply {n}"), start=1_796_000_000.0 + n)
        engine.note_user_turn(history[-2])
        engine.ingest(history)
        engine.turn_done()
    _to_branch(engine)                                             # /branch, then /undo
    restored = stamped(copy.deepcopy(history[:4]), start=1_796_100_000.0)  # state.db's
    resent = history[:2] + turn("second message", "ok")            # /undo, the text again
    engine.note_user_turn(resent[-2])
    engine.ingest(resent[:-1])
    engine.ingest(resent)
    engine.turn_done()
    assert [m for _, m in stored(engine, "branch")] == [
        "first message", "reply 1", "second message", "ok"]
    other = make_engine(tmp_path, session="branch")                # the second CLI's turn
    other_list = restored + turn("other CLI turn", "reply 4")
    other.note_user_turn(other_list[-2])
    other.ingest(other_list[:-1])
    other.ingest(other_list)
    other.turn_done()
    assert stored(other, "branch") == [
        ("user", "first message"), ("assistant", "reply 1"),
        ("user", "second message"), ("assistant", "ok"),
        ("user", "second message"), ("assistant", "reply 2"),
        ("user", "other CLI turn"), ("assistant", "reply 4")]
    other.ingest(copy.deepcopy(other_list))                        # the same list again
    assert len(stored(other, "branch")) == 8


def test_a_doubled_restore_of_a_branch_after_undone_turns_keeps_each_reply_at_its_place(
        tmp_path):
    """Host flow (soak seed 2380001): a compacted parent, a turn answered "ok" (T5) and a
    tool turn; a /branch whose first turn is another tool turn answered "ok", then one
    more turn, both undone. The branch's state.db held its list twice (the second write
    stamping the block and the turns from T5 on anew) and a /resume restored both
    copies. The branch's views list the undone tool turn's "ok" after the kept rows, so
    their reading gave that row to the later copy's "ok" (T5's reply), and rule 5's
    replay only filled elements without a row. The /compress of that list returned each
    row where the list first shows it: the undone "ok" last and T5's question right
    before the next user message; the host merged those two ("A\\n\\nB") and stored the
    merge, a message nobody sent, with the rows after it again. The later copy's
    elements are the earlier copy's rows."""
    from test_identity import compact
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=20, session="parent")
    history = list(compact(engine, long_history(30)))
    engine.turn_done()
    for sent in (turn("[T5] def handler_1(request)", "ok"),
                 _tool_exchange("yes [use-a-tool]", "c1", "Noted (reply 17)")):
        history += sent
        engine.note_user_turn(sent[0])
        engine.ingest(history)
        engine.turn_done()
    kept = list(history)
    _to_branch(engine)                           # /branch, then two turns on the branch
    for sent in (_tool_exchange("continue [use-a-tool]", "c2", "ok"),
                 turn("continue", "Noted (reply 19)")):
        history += sent
        engine.note_user_turn(sent[0])
        engine.ingest(history[:len(history) - len(sent) + 2])
        engine.ingest(history)
        engine.turn_done()
    rows = stored(engine, "branch")
    first = stamped(copy.deepcopy(kept))         # two /undo; state.db wrote the list twice
    again = stamped(copy.deepcopy(kept), start=1_796_000_100.0)
    tail = len(kept) - 6                         # T5's question on, stamped anew
    again[1:tail] = copy.deepcopy(first[1:tail])
    restored = first + again                     # /resume, then /compress
    result = engine.compress(copy.deepcopy(restored), force=True)
    assert stored(engine, "branch") == rows
    roles = [m["role"] for m in result]
    assert not any(a == b == "user" for a, b in zip(roles, roles[1:]))
    assert [m.get("content") for m in result[-6:]] == [m.get("content") for m in kept[-6:]]
    sent = {"role": "user", "content": "yes [use-a-tool]"}     # the next turn stores itself
    engine.note_user_turn(sent)
    engine.ingest(result + [sent, {"role": "assistant", "content": "Noted (reply 21)"}])
    assert stored(engine, "branch") == rows + [("user", "yes [use-a-tool]"),
                                               ("assistant", "Noted (reply 21)")]


def test_a_re_send_on_a_branch_restored_with_another_clis_turn_keeps_its_rows(tmp_path):
    """/branch; the first CLI's /undo of the copied T2 and the text sent again (reply
    10) is the branch's first list; a second CLI, which restored the branch before,
    sends "go on" after its copy of T2 (reply 6) and stores that copy with it. A
    /resume then restores state.db's [..., T2, reply 10, go on, reply 11]: read against
    the second CLI's view, T2 lines up with its copy (answered by reply 6) and reply 10
    with no row between it and "go on"; the first CLI's view lists T2 answered by reply
    10, so those are its rows (host walk 3330003, on the CLI: the re-send's exchange
    stored again)."""
    first = make_engine(tmp_path, session="parent")
    history: list[dict] = []
    for user, reply in (("first message", "reply 1"), ("T1 text", "reply 5"),
                        ("T2 text", "reply 6")):
        history += turn(user, reply)
        first.note_user_turn(history[-2])
        first.ingest(history)
        first.turn_done()
    copied = copy.deepcopy(history)              # what the second CLI restores
    _to_branch(first)                            # /branch
    resent = history[:-2] + turn("T2 text", "reply 10")            # /undo, the text again
    first.note_user_turn(resent[-2])
    first.ingest(resent)
    first.turn_done()
    other = make_engine(tmp_path, session="branch")               # the second CLI's turn
    other_list = copied + turn("go on", "reply 11")
    other.note_user_turn(other_list[-2])
    other.ingest(other_list)
    other.turn_done()
    rows = stored(other, "branch")
    assert rows.count(("user", "T2 text")) == 2
    restored = stamped(resent + other_list[-2:]) + [{"role": "user", "content": "next"}]
    again = make_engine(tmp_path, session="branch")               # /resume
    again.note_user_turn(restored[-1])
    again.ingest(restored)
    assert stored(again, "branch") == rows + [("user", "next")]


def _compacted_in_a_turn(tmp_path):
    """A parent session of nine turns, compacted inside the turn of "question 9" (the
    reply before it kept raw after the block): the engine, the history and the list
    the compaction returned."""
    engine = make_engine(tmp_path, session="parent", window=64_000, fresh_tail_count=2)
    history = long_history(8) + turn("question 8 " + "word " * 40, "reply 8 " + "word " * 30)
    for k in range(0, len(history), 2):
        engine.note_user_turn(history[k])
        engine.ingest(history[:k + 2])
        engine.turn_done()
    ask = {"role": "user", "content": "question 9"}
    engine.note_user_turn(ask)
    return engine, history, compact(engine, history + [ask])


def test_a_branch_undone_down_to_its_parents_block_and_reply_stores_nothing_at_new(tmp_path):
    """/branch of a compacted session whose compaction (inside a turn) kept a reply raw
    right after the block ([block, reply, question]); on the branch /undo twice down to
    [block, reply], no turn of its own, then /new: the host hands the branch's list over
    at the session end (on_session_end). The parent's view holds both (its block and
    that reply's row): the list is the parent's (rule 4), the branch stores nothing
    (host walk 3320002: the reply was stored again in the branch, a duplicate)."""
    engine, history, shown = _compacted_in_a_turn(tmp_path)   # the reply stays raw
    assert [m["role"] for m in shown] == ["user", "assistant", "user"]
    assert shown[1]["content"] == history[-1]["content"]
    shown = shown + [{"role": "assistant", "content": "ok"}]
    engine.ingest(shown)
    engine.turn_done()
    shown = shown + turn("question 10", "reply 10")
    engine.note_user_turn(shown[-2])
    engine.ingest(shown)
    engine.turn_done()
    parent_rows = stored(engine, "parent")
    _to_branch(engine)                               # /undo, /branch, /undo
    engine.on_session_end("branch", copy.deepcopy(shown[:2]))     # /new
    assert stored(engine, "branch") == []
    assert stored(engine, "parent") == parent_rows
    # The branch's copy with one exchange more is the parent's too (as before).
    engine.on_session_end("branch", copy.deepcopy(shown[:4]))
    assert stored(engine, "branch") == [] and stored(engine, "parent") == parent_rows


def _send(engine, shown: list, user: str, reply: str, *, retry: bool = False) -> list:
    """One turn (a /retry drops the last exchange first): the lists the host ingests."""
    return _turns(engine, shown[:-2] if retry else shown, [turn(user, reply)])


def test_a_branchs_copied_exchange_restored_before_two_retries_is_stored_once(tmp_path):
    """A compacted parent sends T19 twice (each answered "ok") and T20; /branch, /undo of
    T20, then /retry of T19 as the branch's first list (it drops the copied second
    (T19, ok), which the branch's state.db keeps active); a turn, its /undo and another
    /retry of T19. The next turn's list (after a restart: state.db's) shows the copied
    exchange before both retries. Read against the undone turn's view, the copied "ok"
    took that turn's "ok" (the view's rows between, the first retry's reply and the
    undone send, not shown there), and the first retry's exchange was stored again
    while the copied "ok" was lost (host walk 3320002, step 108). The copied exchange
    is a send of its own: stored once, with the turn's message."""
    engine, _, shown = _compacted_in_a_turn(tmp_path)
    shown = shown + [{"role": "assistant", "content": "ok"}]
    engine.ingest(shown)
    engine.turn_done()
    for user, reply in (("T19", "ok"), ("T19", "ok"), ("T20", "reply 46")):
        shown = _send(engine, shown, user, reply)
    _to_branch(engine)                                          # /branch
    copied = shown[:-2]                                         # /undo: state.db's copy
    shown = _send(engine, copied, "T19", "reply 47", retry=True)    # the first list
    _send(engine, shown, "yes", "ok")                           # a turn, then /undo
    shown = _send(engine, shown, "T19", "reply 49", retry=True)
    before = stored(engine, "branch")
    # state.db: the copied exchange, both retries' exchanges, the next turn's message
    restored = copied + turn("T19", "reply 47") + shown[-2:] \
        + [{"role": "user", "content": "T21"}]
    engine.note_user_turn(restored[-1])
    engine.ingest(restored)
    assert stored(engine, "branch")[len(before):] == [
        ("user", "T19"), ("assistant", "ok"), ("user", "T21")]
