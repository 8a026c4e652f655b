"""storage/identity through the engine: the engine's summary block and what only
looks like one (issue #24). A user's copy of a block is a message, stored once in its
place; the engine's block is never stored, also when no view remembers it.

Split from tests/test_identity.py (same helpers)."""

import copy
import json

import pytest

from hermes_trove.compaction import assemble

from enginekit import make_engine
from test_identity import compact, long_history, stamped, stored, turn


def test_a_user_message_that_copies_a_block_is_stored_once_in_its_place(tmp_path):
    # Audit: a user message whose text is exactly one of the engine's blocks (pasted
    # from a log, an earlier prompt) was taken for the engine's own block and never
    # stored. The turn's message is the user's (rule 2); a view holds it as its row
    # by the block's fingerprint, so later lists tell it from the block by its place.
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    older = compact(engine, long_history(20))
    engine.turn_done()
    shown = compact(engine, older + long_history(10)[4:])
    engine.turn_done()
    old_block, block = older[0]["content"], shown[0]["content"]
    assert old_block != block and assemble.is_trove_message(shown[0])
    rows = len(stored(engine))
    for text, reply in ((block, "that is the current block"), (old_block, "an older one")):
        pasted = {"role": "user", "content": text}
        engine.note_user_turn(pasted)                        # pre_llm_call
        shown = shown + [pasted, {"role": "assistant", "content": reply}]
        engine.ingest(shown)                                 # post_llm_call
        engine.turn_done()
    assert stored(engine)[rows:] == [("user", block), ("assistant", "that is the current block"),
                                     ("user", old_block), ("assistant", "an older one")]
    ids = engine.ingest(shown)
    engine.on_session_end("sess", copy.deepcopy(shown))     # the same list again: nothing new
    assert len(stored(engine)) == rows + 4
    assert ids[:2] == [None, None] and len(set(ids[2:])) == len(ids) - 2
    # A further turn and a compaction keep each copy on its one row; the new block is
    # the engine's and the lists after it store only the new turn.
    ask = {"role": "user", "content": "and now?"}
    engine.note_user_turn(ask)
    shown = compact(engine, shown + [ask, {"role": "assistant", "content": "fine"}])
    engine.turn_done()
    ask = {"role": "user", "content": "and then?"}
    engine.note_user_turn(ask)
    engine.ingest(shown + [ask, {"role": "assistant", "content": "done"}])
    contents = [c for _, c in stored(engine)]
    assert len(contents) == rows + 8
    assert contents.count(block) == 1 and contents.count(old_block) == 1
    assert not any(c == shown[0]["content"] for c in contents)
    # The copies are messages: the agent finds and reads them.
    found = json.loads(engine.handle_tool_call(
        "trove_grep", {"query": '"Earlier parts of this conversation"', "role": "user"},
        messages=shown))
    hits = [h["store_id"] for h in found["results"] if h["kind"] == "message"]
    copies = [r["store_id"] for r in engine.store.session_messages("sess", limit=5000)
              if r["content"] in (block, old_block)]
    assert sorted(hits) == sorted(copies) and len(copies) == 2
    for sid, text in zip(copies, (block, old_block)):
        read = json.loads(engine.handle_tool_call("trove_expand", {"store_id": sid},
                                                  messages=shown))
        assert read["message"]["content"] == text


def test_a_block_copy_sent_into_a_compaction_before_pre_llm_call_is_stored_once(tmp_path):
    # The host compacts before ``pre_llm_call`` when the turn's message pushes the list
    # over the trigger (a pasted block is long): the list ends with the copy. It stays
    # in the prompt and is stored once, by that compaction, not again by the turn.
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    shown = compact(engine, long_history(20))
    engine.turn_done()
    rows = len(stored(engine))
    pasted = {"role": "user", "content": shown[0]["content"]}
    out = compact(engine, shown + [pasted])
    assert out[-1] is pasted
    engine.note_user_turn(out[-1])                  # pre_llm_call
    engine.ingest(out + [{"role": "assistant", "content": "a copy of the block"}])
    engine.turn_done()
    assert stored(engine)[rows:] == [("user", pasted["content"]),
                                     ("assistant", "a copy of the block")]


def test_a_block_copy_the_user_sent_is_the_turns_message_the_compacted_prompt_keeps(tmp_path):
    # Storage reads the user's copy of a block as the turn's message; the tail chooser
    # judged user messages by their text, so the copy was not "the newest user
    # message": the compaction kept an older question in its place (two user turns in
    # a row, the tail chosen around a stale question) and, with a tool call after the
    # copy, summarized the copy out of the prompt. The tail is chosen around it.
    calls = [{"role": "assistant", "content": "", "tool_calls": [
                 {"id": "c1", "type": "function",
                  "function": {"name": "trove_grep", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "result " * 50}]
    for after in ([], calls):
        engine = make_engine(tmp_path / str(len(after)), window=64_000, fresh_tail_count=1)
        shown = compact(engine, long_history(20))
        engine.turn_done()
        shown = shown + long_history(12)[4:]
        engine.ingest(shown)
        engine.turn_done()
        rows = len(stored(engine))
        pasted = {"role": "user", "content": shown[0]["content"]}   # the current block
        engine.note_user_turn(pasted)                               # pre_llm_call
        out = compact(engine, shown + [pasted] + after)
        assert out[len(out) - len(after):] == after
        assert [i for i, m in enumerate(out) if m is pasted] == [len(out) - len(after) - 1]
        assert out[len(out) - len(after) - 2]["content"] == assemble.ACK_TEXT
        engine_blocks = [m for m in out if m is not pasted and assemble.is_trove_message(m)
                         and m["role"] == "user"]
        assert len(engine_blocks) == 1 and out[0] is engine_blocks[0]
        assert not assemble.sequence_problems(out)
        engine.ingest(out + [{"role": "assistant", "content": "that is the block"}])
        engine.turn_done()
        assert stored(engine)[rows:] == [("user", pasted["content"])] + [
            (m["role"], m["content"]) for m in after] + [("assistant", "that is the block")]


def test_the_compress_preflight_counts_a_block_copy_the_user_sent_as_conversation(tmp_path):
    # The gateway's /compress asks first whether there is anything to compact. A block
    # the session's views hold was the engine's wherever it stood, so a list whose
    # only uncompacted turn is the user's copy of the block and its answer read as
    # one message: "nothing to compress". The copy is read as the ingest reads it.
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=1)
    shown = compact(engine, long_history(20))
    engine.turn_done()
    block, ack = shown[0], shown[1]
    assert shown[2:] == long_history(20)[-2:] and assemble.is_trove_message(block)
    shown = [block, ack]                          # an /undo of the newest turn
    pasted = {"role": "user", "content": block["content"]}
    engine.note_user_turn(pasted)                 # pre_llm_call
    shown = shown + [pasted, {"role": "assistant", "content": "that is the block"}]
    engine.ingest(shown)                          # post_llm_call
    engine.turn_done()
    assert stored(engine)[-2:] == [("user", block["content"]),
                                   ("assistant", "that is the block")]
    gateway = make_engine(tmp_path, window=64_000, fresh_tail_count=1)   # its own agent
    for each in (engine, gateway):
        assert each.has_content_to_compress(copy.deepcopy(shown))
        # the engine's own block and acknowledgement alone are still nothing to compact
        assert not each.has_content_to_compress([block, ack, shown[-1]])


def test_a_second_copys_old_list_after_a_returned_block_keeps_rows_summarized_since(tmp_path):
    """A compaction returned its block and the turn it ran in; the user /undid that
    turn and went on. A second CLI restored the session then (the block and the turns
    after it). The first CLI summarized those turns in a later compaction and went on
    for many turns, so of the views only the returned one still holds the old block,
    and it holds none of those turns. The second CLI's next list shows them: they are
    the rows stored then, not new ones (host walk 280002: 16 rows stored again)."""
    a = make_engine(tmp_path, window=64_000, fresh_tail_count=1)
    history = long_history(30) + [{"role": "user", "content": "pending " + "p " * 30}]
    a.note_user_turn(history[-1])
    out = compact(a, history)                    # [block, ack, pending]
    assert out[-1] == history[-1] and len(out) == 3
    a.ingest(out + [{"role": "assistant", "content": "pending reply"}])
    a.turn_done()
    listed = out[:-1]                            # /undo of the pending turn
    for t in range(6):
        listed = listed + turn(f"topic {t} " + f"w{t} " * 30, "ok")
        a.note_user_turn(listed[-2])
        a.ingest(listed)
        a.turn_done()
    restored = copy.deepcopy(listed)             # the second CLI's transcript
    later = compact(a, listed + turn("one more " + "m " * 30, "ok"))
    for t in range(40):
        later = later + turn(f"later {t} " + "text " * 10, f"noted {t}")
        a.note_user_turn(later[-2])
        a.ingest(later)
        a.turn_done()
    rows = len(stored(a))
    topic = [r["store_id"] for r in a.store.session_messages("sess", limit=5000)
             if r["content"].startswith("topic ")]
    assert len(topic) == 6 and a.dag.covered_store_ids(topic)
    b = make_engine(tmp_path, window=64_000, fresh_tail_count=1)   # its own process
    restored += [{"role": "user", "content": "from the second CLI"}]
    b.note_user_turn(restored[-1])
    b.ingest(restored)
    texts = [content for _, content in stored(a)]
    assert len(stored(a)) == rows + 1 and texts[-1] == "from the second CLI"
    assert sum(1 for text in texts if text.startswith("topic ")) == 6


def test_a_row_a_second_copys_compaction_kept_beside_the_block_is_that_row_later(tmp_path):
    """Two CLIs on one session. The first compacts its list; the second, whose list was
    built before, compacts too and keeps raw beside the same block the exchange before
    its newest turn, rows the first had summarized into it (``tail_rows``, the
    second-process rule). The host's state.db then holds the second's compacted list
    followed by the first's later turns; the first CLI restarted reads it against its
    own view, which holds the block but not that reply. Only rows no summary covered
    were candidates after the block: the reply was stored again."""
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=1)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=2)
    history = [m for t in range(6) for m in turn(f"question {t} " + "word " * 200,
                                                 "ok" if t % 2 else f"answer {t}")]
    first.ingest(history)
    second.ingest(history)
    asked = {"role": "user", "content": "the first CLI asks on"}
    first.note_user_turn(asked)
    listed = compact(first, history + [asked]) + [{"role": "assistant", "content": "first reply"}]
    first.ingest(listed)
    first.turn_done()
    other = {"role": "user", "content": "the second CLI asks on"}
    second.note_user_turn(other)
    out = compact(second, history + [other])
    assert out[0] == listed[0] and out[-2:] == [history[-1], other]   # the reply kept raw
    assert first.dag.covered_store_ids(second.ingest(history[-1:]))
    out = out + [{"role": "assistant", "content": "second reply"}]
    second.ingest(out)
    second.turn_done()
    for t in range(3):
        listed = listed + turn(f"first CLI turn {t}", "ok")
        first.note_user_turn(listed[-2])
        first.ingest(listed)
        first.turn_done()
    rows = len(stored(first))
    restored = copy.deepcopy(out + listed[len(listed) - 6:])      # the host's state.db
    again = make_engine(tmp_path, window=64_000, fresh_tail_count=1)   # the first restarted
    restored.append({"role": "user", "content": "after the restart"})
    again.note_user_turn(restored[-1])
    again.ingest(restored)
    assert len(stored(first)) == rows + 1 and stored(first)[-1][1] == "after the restart"
    assert sum(1 for role, _ in stored(first) if role == "assistant") == 6 + 5


@pytest.mark.parametrize("second_process", [False, True])
def test_a_block_no_view_remembers_is_still_the_engines_own_when_its_acknowledgement_follows(
        tmp_path, second_process):
    """The engine knows its summary blocks from the views (``known_blocks``). A list
    whose block no view holds (views lost, a database from before views, a session
    whose views were dropped) had the block stored as a user message and the tail
    after it stored again. A block followed by the engine's exact acknowledgement in
    the assistant's role is the engine's own: nobody else writes that pair."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=8)
    out = compact(engine, long_history(60))
    assert any(assemble.is_block_candidate(m) for m in out)
    rows = stored(engine)
    with engine.store.db.transaction() as conn:
        conn.execute("DELETE FROM session_views")
    reader = make_engine(tmp_path, window=64_000, fresh_tail_count=8) if second_process else engine
    shown = copy.deepcopy(out) + [{"role": "user", "content": "next question"}]
    reader.note_user_turn(shown[-1])
    reader.ingest(shown)
    assert stored(reader) == rows + [("user", "next question")]


def test_a_pasted_block_header_without_the_acknowledgement_stays_conversation(tmp_path):
    """The other side of the rule above: a user message that only opens like a block
    (no view holds it, no acknowledgement after it) is the user's and is stored."""
    engine = make_engine(tmp_path, window=64_000)
    pasted = assemble.BLOCK_MARKER + "\nsomething the user pasted"
    history = turn("hello", "hi") + [{"role": "user", "content": pasted}]
    engine.note_user_turn(history[-1])
    engine.ingest(history)
    assert stored(engine)[-1] == ("user", pasted)


def test_a_block_of_the_other_copy_inside_a_restored_list_keeps_the_rows_after_it(tmp_path):
    """Two CLIs on one session, each with a turn of its own after the shared history.
    The first /compresses its list (its block and the raw tail with its own turn); the
    second compacts in its next turn (a block of its own) and goes on. The host's
    state.db appends the first CLI's returned list inside the second CLI's transcript,
    and a third CLI restores it: [block B, B's turns, block A, A's tail, B's later
    turns]. Read against the second CLI's view, block A and its rows lay between two
    consecutive rows of B's: no row stood between them, and A's tail was stored again
    (host walk 1240009: a re-sent turn and its two replies)."""
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=2)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=2)
    history = long_history(8)
    first.ingest(history)
    second.ingest(history)
    mine = history + turn("the first CLI asks on " + "a " * 30, "first reply")
    first.note_user_turn(mine[-2])
    first.ingest(mine)
    first.turn_done()
    theirs = history + turn("the second CLI asks on " + "b " * 30, "ok")
    second.note_user_turn(theirs[-2])
    second.ingest(theirs)
    second.turn_done()
    out_a = compact(first, mine)                               # /compress between turns
    assert out_a[-1] == mine[-1] and out_a[0] != history[0]
    asked = {"role": "user", "content": "yes"}
    second.note_user_turn(asked)
    out_b = compact(second, theirs + [asked]) + [{"role": "assistant", "content": "ok"}]
    assert out_b[0] != out_a[0]
    second.ingest(out_b)
    second.turn_done()
    listed = out_b
    for t in range(3):
        listed = listed + turn(f"later {t} " + "c " * 20, f"noted {t}")
        second.note_user_turn(listed[-2])
        second.ingest(listed)
        second.turn_done()
    rows = stored(first)
    restored = copy.deepcopy(out_b + out_a + listed[len(out_b):])
    third = make_engine(tmp_path, window=64_000, fresh_tail_count=2)   # a new second CLI
    restored += [{"role": "user", "content": "from the third CLI"}]
    third.note_user_turn(restored[-1])
    third.ingest(restored)
    assert stored(first) == rows + [("user", "from the third CLI")]


def test_a_doubled_restore_read_against_a_re_send_of_its_question_keeps_the_replay(tmp_path):
    """Host walk 2410002 (two CLIs on one session): state.db held a compacted list
    twice, the second copy stamped anew, and both CLIs restored it. The first CLI undid
    the second copy's last exchanges and sent the question's text again (a new row and
    reply); the second CLI, restored before that, sent its own turn, read against the
    first CLI's view. The view's latest copy of the text is the re-send, but the reply
    after the restored question replays the first copy's: the question is the first
    copy's row too (rule 5). Read as the re-send's row, the turn's compaction kept it by
    its first showing right before the turn's message, a question without its reply:
    the host merged the two into a message nobody sent, and stored it as a new row."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = compact(engine, long_history(30))
    listed = out + turn("question A about the billing job", "answer A") \
        + turn("question B about the queue", "answer B")
    engine.ingest(listed)
    doubled = stamped(listed) + stamped(listed, start=1_796_000_100.0)   # state.db's copy
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=4)      # a /resume
    again = len(listed) + len(out)                  # the second copy's question A
    assert doubled[again]["content"] == "question A about the billing job"
    resent = doubled[:again] + [{"role": "user", "content": doubled[again]["content"]}]
    first.note_user_turn(resent[-1])                # two /undo, the text sent again
    first.ingest(resent)
    first.ingest(resent + [{"role": "assistant", "content": "answer A again"}])
    first.turn_done()
    rows = stored(engine)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=4)     # restored before
    shown = doubled + [{"role": "user", "content": "question C about the cache"}]
    second.note_user_turn(shown[-1])
    ids = second.ingest(shown)
    assert stored(engine) == rows + [("user", "question C about the cache")]
    assert ids[again] == ids[len(out)], "the restored question is the first copy's row"
    kept = compact(second, shown)
    roles = [m["role"] for m in kept]
    assert all(not (a == b == "user") for a, b in zip(roles, roles[1:])), \
        f"two user messages in a row, which the host merges: {roles}"
    second.ingest(kept)
    assert stored(engine) == rows + [("user", "question C about the cache")]


def _turns(engine, head: list[dict], sends: list[list[dict]]) -> list[dict]:
    """Each of ``sends`` as a turn of ``engine`` on ``head``; returns the last list."""
    listed = list(head)
    for sent in sends:
        listed = listed + sent
        engine.note_user_turn(listed[-2])
        engine.ingest(listed[:-1])
        engine.ingest(listed)
        engine.turn_done()
    return listed


def test_a_reply_read_last_after_an_unmatched_send_anchors_no_gap(tmp_path):
    """Two CLIs on a compacted session: the first sent X1-X3 and T12 ("ok"); the second,
    whose lists never showed X1-X3, sent T16, "continue" (both answered "ok") and T17.
    The first showed T16 (a restore), compacted again, and after a restart showed its
    old block with X2, X3, T12, "continue" and T17 but not T16. Its view [..., T12, ok,
    T16, ok] explains the most: "continue" matched nothing and its "ok" matched T16's,
    which bounded the gap before it (no "continue" there) and began the run after it:
    "continue" and its "ok" were stored again (host walk 1910005, the second CLI a real
    process). A reply read last after an element the view could not match anchors
    nothing: the run after T12's "ok" finds "continue", its "ok" and T17."""
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    out = compact(first, long_history(30))
    xs = [turn("X1", "r1"), turn("X2", "r2"), turn("X3", "r3"), turn("T12", "ok")]
    mine = _turns(first, out, xs)
    second = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    _turns(second, out + xs[-1], [turn("T16", "ok"), turn("continue", "ok"),
                                 turn("T17", "r32")])
    shown = mine + turn("T16", "ok")
    first.ingest(stamped(shown))                      # a restore shows T16
    assert assemble.is_trove_message(compact(first, shown)[0])    # compacted again
    before = stored(first)
    restored = stamped(out + xs[1] + xs[2] + xs[3] + turn("continue", "ok")
                       + turn("T17", "r32")) + [{"role": "user", "content": "T19"}]
    again = make_engine(tmp_path, window=64_000, fresh_tail_count=4)   # a restart
    again.note_user_turn(restored[-1])
    again.ingest(restored)
    assert stored(again) == before + [("user", "T19")]
