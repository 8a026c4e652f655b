"""Transcript rewrites (/undo, /retry, edits) in repetitive sessions: nothing lost,
nothing misplaced, and the newest user message always in the prompt."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_trove.compaction import assemble
from hermes_trove.store import decode_row

from enginekit import make_engine

VOCAB = ("continue", "ok", "HEARTBEAT")
SYSTEM = {"role": "system", "content": "You are a test agent."}


def turn(user: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


def repetitive(turns: int) -> list[dict]:
    return [m for t in range(turns) for m in turn("continue", "ok")]


def compact(engine, messages: list[dict]) -> list[dict]:
    """One forced compaction as the host runs it (system prompt first), returning
    what the host keeps as its list (without the system prompt)."""
    out = engine.compress([SYSTEM] + messages, force=True)
    assert out[0] is SYSTEM or out[0] == SYSTEM
    return out[1:]


def mapping(engine, messages: list[dict]) -> list[tuple[dict, int | None, bool]]:
    """Each shown message with its store_id and whether the engine inserted it."""
    ids = engine.ingest(messages)
    return [(m, sid, assemble.is_trove_message(m)) for m, sid in zip(messages, ids)]


def check_invariants(engine, messages: list[dict]) -> None:
    """Every conversational message shown is stored, each on a row of its own with the
    same content that no summary covers, and showing it again stores nothing."""
    before = engine.store.count_messages("sess")
    shown = mapping(engine, messages)
    after = engine.store.count_messages("sess")
    again = mapping(engine, messages)
    assert engine.store.count_messages("sess") == after, "showing the same list stored more"
    assert [sid for _, sid, _ in again] == [sid for _, sid, _ in shown]
    conversation = [(m, sid) for m, sid, ins in shown if not ins]
    ids = [sid for _, sid in conversation]
    assert None not in ids, "a conversational message was not stored"
    # Each shown message is its own row. Rows follow the order messages were first
    # shown: an edited message is a new row after every older one, and the messages
    # around it keep theirs (storage/identity, rule 1).
    assert len(set(ids)) == len(ids), f"two shown messages on one row: {ids}"
    rows = engine.store.get_messages(ids)
    for message, sid in conversation:
        assert decode_row(rows[sid]) == message
    assert not engine.dag.covered_store_ids(ids), "a shown message maps onto a summarized row"
    assert after - before <= len(conversation)


def check_prompt(before: list[dict], after: list[dict]) -> None:
    """The newest user message and everything after it survive a compaction."""
    newest = max(i for i, m in enumerate(before) if assemble.is_real_user(m))
    assert after[-(len(before) - newest):] == before[newest:]


def test_undo_after_compaction_keeps_the_newest_message(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=8)
    messages = compact(engine, repetitive(50))
    check_invariants(engine, messages)
    # /undo drops the last turn; a different request follows, then "continue".
    messages = messages[:-2] + turn("something else: deploy to staging instead", "ok")
    messages.append({"role": "user", "content": "continue"})
    check_invariants(engine, messages)
    out = compact(engine, messages)
    check_prompt(messages, out)
    rows = engine.store.session_messages("sess", limit=1000)
    assert [r["content"] for r in rows[-3:]] == [
        "something else: deploy to staging instead", "ok", "continue"]
    # Shown twice after the /undo: nothing appended anywhere.
    count = engine.store.count_messages("sess")
    engine.ingest(messages)
    engine.ingest(out)
    assert engine.store.count_messages("sess") == count


def test_retry_and_edit_after_compaction_keep_the_newest_message(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=8)
    messages = compact(engine, repetitive(50))
    # /retry: the last reply is regenerated.
    messages = messages[:-1] + [{"role": "assistant", "content": "HEARTBEAT_OK"}]
    messages.append({"role": "user", "content": "continue"})
    check_invariants(engine, messages)
    out = compact(engine, messages)
    check_prompt(messages, out)
    # An edit of one tail message: it is new (and so is its reply); the rest keep rows.
    body = [i for i, m in enumerate(out) if m.get("role") == "user"
            and not assemble.is_trove_message(m)]
    edited = list(out)
    edited[body[-2]] = {"role": "user", "content": "ok"}
    edited.append({"role": "assistant", "content": "ok"})
    edited.append({"role": "user", "content": "continue"})
    check_invariants(engine, edited)
    check_prompt(edited, compact(engine, edited))


def test_a_list_from_before_an_undo_and_a_compaction_stores_nothing_more(tmp_path):
    """Found by the walk below: a turn, its /undo, the same text sent again and a
    compaction; then the list from before the /undo is shown again (a stale copy).
    Its last turn is rows the store holds (the undone turn), not new rows. The fast
    path took it for the next turn because it counted the summarized rows the list
    claims as if they stood for the unclaimed fresh ones."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=6)
    messages = [m for t in range(4) for m in turn(VOCAB[t % 3], VOCAB[(t * 2) % 3])]
    check_invariants(engine, messages)
    first = list(messages)
    messages = messages + turn("continue", "continue")
    check_invariants(engine, messages)
    before_undo = list(messages)
    messages = messages[:-2]                                  # /undo
    check_invariants(engine, messages)
    messages = compact(engine, messages + [{"role": "user", "content": "continue"}])
    check_invariants(engine, messages)
    count = engine.store.count_messages("sess")
    for stale in (first, before_undo):
        engine.ingest(stale)
        assert engine.store.count_messages("sess") == count, "a stale view stored more"


def test_a_list_from_before_an_undo_after_an_edit_stores_nothing_more(tmp_path):
    """Found by the walk below (seed 23): an edit gives the first message a new row
    (higher than the rows after it), an /undo drops those older rows from the list,
    and the list from before the /undo is shown again: they are those rows."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=6)
    messages = turn("continue", "continue") + turn("continue", "continue")
    check_invariants(engine, messages)
    edited = [{"role": "user", "content": "ok"}] + messages[1:]
    check_invariants(engine, edited)
    check_invariants(engine, edited[:2])                       # /undo
    count = engine.store.count_messages("sess")
    engine.ingest(edited)
    assert engine.store.count_messages("sess") == count, "a stale view stored more"


@st.composite
def operations(draw):
    return draw(st.lists(st.one_of(
        st.tuples(st.just("append"), st.sampled_from(VOCAB), st.sampled_from(VOCAB)),
        st.tuples(st.just("undo")),
        st.tuples(st.just("retry"), st.sampled_from(VOCAB)),
        st.tuples(st.just("edit"), st.integers(0, 40), st.sampled_from(VOCAB)),
        st.tuples(st.just("compact")),
        st.tuples(st.just("stale"), st.integers(0, 40))), min_size=5, max_size=30))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=operations(), turns=st.integers(3, 30))
def test_random_rewrites_never_lose_or_misplace_a_message(tmp_path_factory, ops, turns):
    run_rewrites(tmp_path_factory.mktemp("rw"), ops, turns)


def test_a_stale_list_after_an_edit_and_an_undo_stores_nothing_more(tmp_path):
    """Found by the walk above: a compaction, an edit of a tail message, an /undo,
    then a list from before the compaction shown again."""
    run_rewrites(tmp_path, [("append", "continue", "continue"), ("append", "continue", "continue"),
                            ("append", "continue", "continue"), ("undo",), ("undo",),
                            ("append", "continue", "ok"), ("compact",), ("edit", 15, "ok"),
                            ("undo",), ("stale", 18)], 3)


def test_a_stale_list_going_on_like_a_retried_reply_is_the_older_view(tmp_path):
    """Found by the walk above: after /undo, /retry and a new turn undone again, the
    retried reply's text ("ok") equals the reply the first list had at its place, so
    the first list, shown again, seemed to go on from the newest view with two new
    messages. It is the first view: nothing is stored."""
    run_rewrites(tmp_path, [("append", "continue", "continue"), ("undo",), ("undo",),
                            ("retry", "continue"), ("append", "continue", "ok"), ("undo",),
                            ("retry", "ok"), ("stale", 0)], 10)


def test_edits_of_the_tail_after_a_compaction_map_onto_live_rows(tmp_path):
    """Found by the walk above: a compaction, then the first two editable elements of
    the tail (the first messages after the block) edited in place. Each edit is one
    new row (rule 1), never a row the block's summary covers."""
    run_rewrites(tmp_path, [("append", "continue", "continue"), ("edit", 16, "continue"),
                            ("append", "continue", "continue"), ("undo",), ("compact",),
                            ("edit", 0, "ok"), ("edit", 1, "continue")], 5)


def run_rewrites(tmp_path, ops: list, turns: int) -> None:
    """``turns`` turns, then ``ops`` one by one, the invariants checked after each."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=6)
    messages = [m for t in range(turns)
                for m in turn(VOCAB[t % 3], VOCAB[(t * 2) % 3])]
    check_invariants(engine, messages)
    seen = [list(messages)]
    for op in ops:
        if op[0] == "stale":  # an earlier view shown again (a deep copy, a hook)
            count = engine.store.count_messages("sess")
            engine.ingest(seen[op[1] % len(seen)])
            assert engine.store.count_messages("sess") == count, "a stale view stored more"
            continue
        inserted = [assemble.is_trove_message(m) for m in messages]
        editable = [i for i, ins in enumerate(inserted) if not ins]
        if op[0] == "append":
            messages = messages + turn(op[1], op[2])
        elif op[0] == "undo" and any(assemble.is_real_user(messages[i]) for i in editable):
            last_user = max(i for i in editable if assemble.is_real_user(messages[i]))
            messages = messages[:last_user]
        elif op[0] == "retry" and messages and messages[-1].get("role") == "assistant" \
                and not inserted[-1]:
            messages = messages[:-1] + [{"role": "assistant", "content": op[1]}]
        elif op[0] == "edit" and editable:
            i = editable[op[1] % len(editable)]
            messages = list(messages)
            messages[i] = {"role": messages[i]["role"], "content": op[2]}
        elif op[0] == "compact" and any(assemble.is_real_user(m) for m in messages):
            messages.append({"role": "user", "content": "continue"})
            out = compact(engine, messages)
            check_prompt(messages, out)
            messages = out
        check_invariants(engine, messages)
        seen.append(list(messages))


# ---------------------------------------------------------------- messages never silently skipped
def test_a_second_system_message_is_stored_and_kept(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    note = {"role": "system", "content": "Operator note: the repo moved to /srv/app."}
    body = [note] + repetitive(5) + [{"role": "user", "content": "continue"}]
    out = engine.compress([SYSTEM] + body, force=True)
    assert note in out
    assert "Operator note: the repo moved to /srv/app." in [
        r["content"] for r in engine.store.session_messages("sess")]


def test_a_pasted_block_header_is_conversation_not_the_engines_block(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=4)
    messages = compact(engine, repetitive(20))
    pasted = {"role": "user", "content": assemble.BLOCK_HEADER + "\n(pasted from a log) why?"}
    messages = messages + [pasted]
    out = compact(engine, messages)
    assert out[-1] == pasted
    stored = [r["content"] for r in engine.store.session_messages("sess", limit=500)]
    assert stored[-1] == pasted["content"]
    # The engine's own block and acknowledgement are still recognized and not stored.
    assert not any(c.startswith(assemble.BLOCK_MARKER) for c in stored[:-1])
    assert assemble.ACK_TEXT not in stored


def test_ignored_messages_stay_in_the_prompt_but_are_not_stored(tmp_path):
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=6,
                         ignore_message_patterns="^HEARTBEAT")
    messages = [m for t in range(30) for m in turn(f"task {t}", f"done {t}")]
    messages += turn("HEARTBEAT", "HEARTBEAT_OK") + [{"role": "user", "content": "HEARTBEAT"}]
    out = compact(engine, messages)
    assert out[-3:] == messages[-3:]
    assert not [r for r in engine.store.session_messages("sess", limit=500)
                if r["content"].startswith("HEARTBEAT")]
    # Shown again after the compaction: still not stored, still in place.
    out = compact(engine, out + turn("task 99", "done 99"))
    assert [m["content"] for m in out[-5:]] == [
        "HEARTBEAT", "HEARTBEAT_OK", "HEARTBEAT", "task 99", "done 99"]


# ---------------------------------------------------------------- store level
def test_after_a_block_with_no_known_tail_summarized_rows_are_not_candidates(tmp_path):
    from hermes_trove.dag import Dag, NewNode
    from hermes_trove.storage import database
    from hermes_trove.store import Store
    db = database.get_database(tmp_path / "s.db")
    store, dag = Store(db), Dag(db)
    history = repetitive(10)
    ids = store.ingest("s", history).store_ids
    dag.add_node(NewNode(session_id="s", depth=0, text="old turns", token_count=2,
                         source_token_count=40, level=1, model="test",
                         child_store_ids=ids[:16]))
    block = {"role": "user", "content": "[block]"}
    shown = [block] + history[16:] + turn("continue", "ok")
    result = store.ingest("s", shown, skip=[True] + [False] * (len(shown) - 1),
                          after_block=True)
    assert result.store_ids[1:5] == ids[16:] and result.inserted == 2
    # A whole-transcript view (no block) may line up with summarized rows, in order.
    assert store.ingest("s", history).inserted == 0
    database.forget_database(tmp_path / "s.db")


def test_the_anchored_rule_reads_a_whitespace_edit_as_the_stored_row(tmp_path):
    """Rule 6 without views (an import, a replay) compares fingerprints, blind to the
    whitespace the host rewrites, on every path: after a block with no known tail,
    with a known tail, and in a whole transcript; only the new exchange is stored."""
    from hermes_trove.dag import Dag, NewNode
    from hermes_trove.storage import database
    from hermes_trove.store import KnownTail, Store
    db = database.get_database(tmp_path / "s.db")
    store, dag = Store(db), Dag(db)
    history = [m for t in range(10) for m in turn(f"step {t}\n", f"done {t}\n")]
    ids = store.ingest("s", history).store_ids
    dag.add_node(NewNode(session_id="s", depth=0, text="old turns", token_count=2,
                         source_token_count=40, level=1, model="test",
                         child_store_ids=ids[:16]))
    stripped = [dict(m, content=m["content"].strip()) for m in history]
    block = {"role": "user", "content": "[block]"}
    shown = [block] + stripped[16:] + turn("continue", "ok")
    skip = [True] + [False] * (len(shown) - 1)
    result = store.ingest("s", shown, skip=skip, after_block=True)
    assert result.store_ids[1:5] == ids[16:] and result.inserted == 2
    known = KnownTail(store_ids=tuple(ids[16:]), low=ids[16], nodes=None)
    result = store.ingest("s", shown, skip=skip, known=known)
    assert result.store_ids[1:5] == ids[16:] and result.inserted == 0
    assert store.ingest("s", stripped).store_ids == ids
    database.forget_database(tmp_path / "s.db")


# ---------------------------------------------------------------- blocks restored by the host
def _rendered_block() -> dict:
    return {"role": "user", "content": "[trove context: summaries of earlier turns]\n"
            "Earlier parts of this conversation were summarized.\n[n1 · m1–m4]\n"}


def test_a_block_whose_trailing_whitespace_the_host_stripped_is_still_the_engines():
    """Hermes's state.db strips message text: /resume shows the block without its final
    newline, and it must still line up as the engine's own block (not be stored)."""
    from hermes_trove.compaction import assemble, known_tails
    block = _rendered_block()
    tails = {assemble.block_fingerprint(block["content"]): known_tails.entry([5, 6], 5, 1)}
    restored = [{"role": "user", "content": block["content"].rstrip()},
                {"role": "assistant", "content": assemble.ACK_TEXT.strip()},
                {"role": "user", "content": "continue"}]
    _, inserted, known = known_tails.read(restored, tails, lambda: {})
    assert inserted == [True, True, False]
    assert known is not None and known.store_ids == (5, 6)
    pasted = [{"role": "user", "content": block["content"] + "and a question of mine"}]
    assert known_tails.read(pasted, tails, lambda: {})[1] == [False]  # text differs: the user's


def test_the_known_tail_an_earlier_version_saved_is_still_recognized():
    from hermes_trove.compaction import assemble, known_tails
    block = _rendered_block()
    state = {"known_tail": {"block_hash": assemble.legacy_block_fingerprint(block["content"]),
                            "store_ids": [7, 8], "low": 7}}
    _, inserted, known = known_tails.read([block, {"role": "user", "content": "go"}], {},
                                          lambda: state)
    assert inserted == [True, False] and known.store_ids == (7, 8)


def test_a_second_process_keeps_the_exchange_the_first_one_summarized(tmp_path):
    """Found by the host walk (seed 30004): a second CLI on the session holds a list
    built before the first one compacted; that list's previous exchange is rows the
    first process has summarized since. They are the list's end as it stands: they
    stay raw beside the newest turn (their summary stays in the block) instead of the
    tail starving to the newest message, and nothing is stored twice."""
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=1)
    second = make_engine(tmp_path, window=64_000)
    history = [m for t in range(6) for m in turn(f"question {t} about module_{t}",
                                                 f"answer {t}: handler_{t} returns {t}")]
    check_invariants(first, history)
    check_invariants(second, history)
    compact(first, history + [{"role": "user", "content": "first process asks on"}])
    previous = history[-2:]
    assert first.dag.covered_store_ids(second.ingest(previous)) == set(second.ingest(previous))
    count = first.store.count_messages("sess")
    newest = {"role": "user", "content": "second process asks on"}
    out = compact(second, history + [newest])
    assert out[-3:] == previous + [newest], "the previous exchange did not stay raw"
    assert second.store.count_messages("sess") == count + 1
    text = "\n".join(str(m.get("content")) for m in out)
    assert all(f"question {t}" in text or f"answer {t}" in text for t in range(6)), \
        "a summarized turn is neither in the block nor raw"


def test_a_doubled_restore_keeps_no_summarized_row_after_a_newer_one(tmp_path):
    """Found by the host walk (seed 610002): the host restored a compacted list twice
    (block, rows, block, the same rows) after later compactions summarized all but its
    last reply. Its summarized rows, shown again after the second block, were kept raw
    as if another process's list showed them there, after that last reply from the
    first copy: [block, newest reply, oldest reply, ...], two replies in a row that the
    host merged into a message nobody sent (stored on the next turn). The tail is a
    stretch of the list in its order: no row after a newer one, no two of one role."""
    first = make_engine(tmp_path, window=64_000, fresh_tail_count=2)
    history = [m for t in range(6) for m in turn(f"question {t} about module_{t}",
                                                 f"answer {t}: handler_{t} returns {t}")]
    first.ingest(history)
    asked = {"role": "user", "content": "next question"}
    first.note_user_turn(asked)
    listed = compact(first, history + [asked]) + [{"role": "assistant", "content": "a reply"}]
    first.ingest(listed)
    first.turn_done()
    for t in range(3):
        listed = listed + turn(f"later {t}", f"later answer {t}")
        first.note_user_turn(listed[-2])
        first.ingest(listed)
        first.turn_done()
    again = {"role": "user", "content": "compact now"}
    first.note_user_turn(again)
    compact(first, listed + [again])       # summarizes all of ``listed`` but its last reply
    count = first.store.count_messages("sess")
    doubled = [dict(m) for m in listed] + [dict(m) for m in listed]   # the host's restore
    wide = make_engine(tmp_path, window=64_000, fresh_tail_count=16)
    out = compact(wide, doubled)
    ids = wide.ingest(out)
    raw = [sid for m, sid in zip(out, ids) if not assemble.is_trove_message(m)]
    assert raw == sorted(raw), f"rows kept out of order: {[m['content'][:12] for m in out]}"
    roles = [m["role"] for m in out]
    assert all(a != b for a, b in zip(roles, roles[1:])), f"two of one role in a row: {roles}"
    assert wide.store.count_messages("sess") == count


def test_a_doubled_restore_missing_its_last_exchange_keeps_no_question_without_its_reply(
        tmp_path):
    """Found by the host walk (seed 1580012): the host restored a compacted list twice,
    the second copy without the exchange after the first ([block, rows, question,
    reply, block, the same rows]: an /undo wrote the shorter list again), and a /compress
    ran between turns. The question and its reply, shown before the later block only,
    are stale and summarized; the tail still kept the question, as the list's newest
    user message by its first showing, and put it last without its reply. The next
    turn's message followed it, two user messages in a row that the host merged into
    a message nobody sent; a second CLI later restored that merge beside the question's
    other copy and stored the reply after it again. The newest user message is the
    list's own last one (here a row shown again), not the newest of the rows."""
    engine = make_engine(tmp_path, window=64_000, fresh_tail_count=3)
    history = [m for t in range(6) for m in turn(f"question {t} about module_{t}",
                                                 f"answer {t}: handler_{t} returns {t}")]
    engine.ingest(history)
    listed = compact(engine, history)
    assert listed[-1]["role"] == "assistant"
    question = {"role": "user", "content": "one more question about module_9"}
    engine.note_user_turn(question)
    longer = listed + [question, {"role": "assistant", "content": "answer 9: handler_9"}]
    engine.ingest(longer)
    engine.turn_done()
    doubled = [dict(m) for m in longer] + [dict(m) for m in listed]   # the host's restore
    out = compact(engine, doubled)
    roles = [m["role"] for m in out]
    assert all(a != b for a, b in zip(roles, roles[1:])), f"two of one role in a row: {roles}"
    assert roles[-1] == "assistant", f"the list ends with a question without its reply: {roles}"
    ids = engine.ingest(out)
    raw = [sid for m, sid in zip(out, ids) if not assemble.is_trove_message(m)]
    assert raw == sorted(raw), f"rows kept out of order: {[m['content'][:12] for m in out]}"
