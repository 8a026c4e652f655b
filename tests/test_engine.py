"""The engine offline: binding, ingest, compaction passes, progress, lineage."""

import copy
from pathlib import Path
import json

import pytest

from hermes_trove.compaction import assemble
from hermes_trove.storage import database
from hermes_trove.store import decode_row

from enginekit import host_tokens, DEFAULT_OVERHEAD, coding_turn, drive, make_engine


def prompt_tokens(engine, messages):
    """The larger of the host's estimate and the real count of the next request."""
    return max(host_tokens(messages), DEFAULT_OVERHEAD + engine.counter.count_messages(messages))


def test_name_and_threshold(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    assert engine.name == "trove"
    assert engine.threshold_tokens == int(64_000 * 0.35)
    assert not engine.should_compress(1000)
    assert engine.should_compress(engine.threshold_tokens)
    assert not engine.should_compress(-1)


def test_small_windows_compact_at_the_floor_and_report_it(tmp_path):
    engine = make_engine(tmp_path, window=65_536, min_trigger_tokens=32_000)
    assert engine.threshold_tokens == 32_000
    assert abs(engine.threshold_percent - 32_000 / 65_536) < 1e-9
    assert not engine.should_compress(int(65_536 * 0.35)) and engine.should_compress(32_000)
    assert engine.get_status()["threshold_tokens"] == 32_000
    assert engine.get_status()["trigger_rule"].startswith("TROVE_MIN_TRIGGER_TOKENS floor")
    engine.update_model("bigger", 200_000)  # the share decides from ~92K up
    assert engine.threshold_tokens == 70_000 and engine.threshold_percent == 0.35
    assert engine.trigger_rule.startswith("TROVE_CONTEXT_THRESHOLD=0.35")


def test_compaction_keeps_prompt_under_trigger_and_valid(tmp_path):
    engine = make_engine(tmp_path)
    final, originals, outputs = drive(engine, 80)
    assert len(outputs) >= 3
    for out in outputs:
        assert prompt_tokens(engine, out) < engine.threshold_tokens
        assert assemble.sequence_problems(out) == []
    assert engine.compression_count == len(outputs)
    assert engine.dag.stats("sess")["by_depth"].get(1, {}).get("nodes", 0) >= 1  # condensed


def test_a_long_session_folds_old_summaries_instead_of_leaving_them_out(tmp_path):
    """Condensation stops at the max depth, so the frontier grows with the session;
    the oldest nodes are folded into an overview and the block keeps covering
    everything from the first compacted message on, with exact lineage."""
    engine = make_engine(tmp_path, incremental_max_depth=1, leaf_chunk_tokens=1500)
    final, originals, outputs = drive(engine, 160)
    dag = engine.dag
    depths = [n["depth"] for n in dag.session_nodes("sess")]
    assert max(depths) >= 3, "expected folds above the incremental max depth"
    assert engine.last_compaction["omitted_nodes"] == 0
    frontier = dag.frontier("sess")
    block = next(m["content"] for m in outputs[-1] if assemble.is_trove_message(m))
    assert all(f"## node {n['node_id']} " in block for n in frontier)
    first = engine.store.session_messages("sess", limit=1)[0]["store_id"]
    assert frontier[0]["first_store_id"] == first
    covered = [sid for n in frontier for sid in dag.descendant_store_ids(n["node_id"])]
    assert covered == list(range(first, first + len(covered)))  # contiguous, once each
    for out in outputs:
        assert prompt_tokens(engine, out) < engine.threshold_tokens
        assert assemble.sequence_problems(out) == []


def test_every_message_stored_once_and_lineage_is_exact(tmp_path):
    engine = make_engine(tmp_path)
    final, originals, _ = drive(engine, 60)
    engine.ingest(final)
    store, dag = engine.store, engine.dag
    rows = store.session_messages("sess", limit=10_000)
    assert [decode_row(r) for r in rows] == originals
    by_id = {r["store_id"]: decode_row(r) for r in rows}
    leaves = dag.session_nodes("sess", depth=0)
    covered = [sid for leaf in leaves for sid in dag.descendant_store_ids(leaf["node_id"])]
    assert len(covered) == len(set(covered))  # no message summarized twice
    for node in dag.frontier("sess"):
        under = dag.descendant_store_ids(node["node_id"])
        assert under == sorted(under)
        assert node["message_count"] == len(under)
    # What is not covered is exactly what is still raw in the prompt.
    raw_in_prompt = [m for m in final if not assemble.is_trove_message(m)]
    uncovered = [by_id[s] for s in sorted(set(by_id) - set(covered))]
    assert raw_in_prompt == uncovered


def test_500_turn_replay_stores_nothing_twice(tmp_path):
    engine = make_engine(tmp_path, window=16_000, leaf_chunk_tokens=4000)
    final, originals, outputs = drive(engine, 500, filler=5)
    engine.ingest(final)
    assert engine.store.count_messages("sess") == len(originals) == 2000
    # The whole history shown again, in pieces and whole, adds nothing.
    assert engine.store.ingest("sess", originals).inserted == 0
    for start in range(0, 2000, 250):
        assert engine.store.ingest("sess", originals[start:start + 300]).inserted == 0
    assert engine.store.count_messages("sess") == 2000
    assert len(outputs) >= 20


def test_assembled_prefix_is_byte_stable_between_compactions(tmp_path):
    engine = make_engine(tmp_path)
    _, _, outputs = drive(engine, 60)
    last = outputs[-1]
    engine.turn_done()   # the turn ended (declined, then no reply, is the host's overflow)
    again = engine.compress(copy.deepcopy(last), current_tokens=prompt_tokens(engine, last))
    assert json.dumps(again) == json.dumps(last)
    assert engine.last_compaction["outcome"] == "noop"
    # The block changes only when a compaction really happened.
    assert len(outputs) >= 3 and outputs[-1][0] != outputs[-2][0]


def test_tail_keeps_api_content_and_strips_host_keys(tmp_path):
    engine = make_engine(tmp_path)
    messages, _, _ = drive(engine, 30)
    messages.append({"role": "user", "content": "last question", "api_content": "last question+",
                     "_db_persisted": True})
    out = engine.compress(messages, current_tokens=engine.threshold_tokens + 1, force=True)
    assert out[-1] == {"role": "user", "content": "last question", "api_content": "last question+"}


def test_leading_system_message_is_kept_and_not_stored(tmp_path):
    engine = make_engine(tmp_path)
    system = {"role": "system", "content": "You are helpful."}
    turns = [m for t in range(20) for m in coding_turn(t)]
    out = engine.compress([system] + turns, current_tokens=engine.threshold_tokens + 10)
    assert out[0] == system
    assert assemble.sequence_problems(out) == []
    assert engine.store.count_messages("sess") == len(turns)


def test_tail_gives_way_when_long_turns_would_keep_it_over_the_trigger(tmp_path):
    engine = make_engine(tmp_path, window=16_000)
    cut = []
    original = engine._finish

    def spy(*args, **kwargs):   # every compaction's outcome, not only the last one
        out = original(*args, **kwargs)
        cut.append(engine.last_compaction.get("tail_cut_by_tokens"))
        return out
    engine._finish = spy
    final, _, outputs = drive(engine, 12, filler=600)
    assert outputs
    assert any(cut), "long turns never cut the tail short"
    for out in outputs:
        assert prompt_tokens(engine, out) < engine.threshold_tokens
        assert assemble.sequence_problems(out) == []
        assert out[-1]["role"] in ("assistant", "tool", "user")


def test_newest_turn_alone_over_the_trigger_is_reported_not_retried(tmp_path):
    engine = make_engine(tmp_path, window=8_000)
    huge = [{"role": "user", "content": "word " * 9000}]
    current = prompt_tokens(engine, huge)
    out = engine.compress(huge, current_tokens=current)
    assert out == huge
    outcome = engine.last_compaction
    assert outcome["outcome"] == "noop"
    assert "nothing left to compact" in outcome["reason"]
    assert not engine.should_compress(current)  # no pointless host retries at this size
    assert engine.should_compress(current + 500)  # growth re-arms it


def test_the_no_op_guard_lasts_one_turn(tmp_path):
    """The guard keeps the host from retrying within the turn; the next turn's list is
    another list whose figure the host may count otherwise (host walk seed 30004: a
    /compress between turns left a guard that skipped the next turn's compaction)."""
    engine = make_engine(tmp_path, window=8_000)
    huge = [{"role": "user", "content": "word " * 9000}]
    current = prompt_tokens(engine, huge)
    engine.compress(huge, current_tokens=current)
    assert not engine.should_compress(current)
    engine.turn_done()                                     # post_llm_call
    assert engine.should_compress(current)
    engine.compress(huge, current_tokens=current)
    assert not engine.should_compress(current)
    engine.note_user_turn({"role": "user", "content": "next"})  # pre_llm_call
    assert engine.should_compress(current)


def test_a_compress_between_turns_leaves_no_guard(tmp_path):
    """A /compress is no retry within a turn: the next turn's preflight, which the host
    runs before ``pre_llm_call`` and may count lower (its new message counted once),
    still compacts (host walk 120000: a /compress that could not cut a big turn left a
    guard at 41,291 host tokens, and the next turn went out at 41,170, over the
    threshold, with the big turn no longer the newest)."""
    engine = make_engine(tmp_path, window=8_000)
    huge = [{"role": "user", "content": "word " * 9000}]
    current = prompt_tokens(engine, huge)
    engine.compress(huge, current_tokens=current, force=True)  # a /compress between turns
    assert engine.should_compress(current - 100)


def test_the_turn_ends_for_every_copy_of_the_session(tmp_path):
    """The hooks reach the copy bound last (a gateway hygiene agent's, beside the
    session's own): the turn they end is the session's, so the own copy's guard ends
    with it too."""
    own = make_engine(tmp_path, window=8_000)
    other = make_engine(tmp_path, window=8_000)             # bound last: the hooks' copy
    huge = [{"role": "user", "content": "word " * 9000}]
    current = prompt_tokens(own, huge)
    own.compress(huge, current_tokens=current)
    assert not own.should_compress(current)
    other.turn_done()
    assert own.should_compress(current)


def test_unreachable_trigger_is_detected_at_start(tmp_path):
    engine = make_engine(tmp_path, window=64_000, context_threshold=0.1)
    assert engine.reachability
    assert any("trigger" in p for p in engine.reachability)
    assert engine.get_status()["reachability_problems"] == engine.reachability


def test_summarizer_failure_falls_back_to_deterministic(tmp_path):
    calls = []

    def failing(prompt, model, timeout):
        calls.append(model)
        raise RuntimeError("provider down")

    engine = make_engine(tmp_path, llm=failing)
    drive(engine, 30)
    levels = engine.last_compaction["levels"]
    assert levels and set(levels) == {3}
    assert calls  # the LLM was tried first


def test_level_two_used_when_level_one_is_over_budget(tmp_path):
    def model(prompt, model_name, timeout):
        if "bullet" in prompt.lower():
            return "- module handlers kept; decided to keep handler names"
        return "word " * 5000  # level 1 ignores its budget

    engine = make_engine(tmp_path, llm=model)
    drive(engine, 30)
    assert 2 in engine.last_compaction["levels"]


def test_breaker_opens_after_failures_and_stops_calling(tmp_path):
    calls = []

    def failing(prompt, model, timeout):
        calls.append(1)
        raise TimeoutError("slow")

    engine = make_engine(tmp_path, llm=failing, summary_circuit_breaker_failure_threshold=2,
                         summary_circuit_breaker_cooldown_seconds=3600)
    drive(engine, 30)
    made = len(calls)
    drive(engine, 30, start=30)
    assert made >= 2
    assert len(calls) == made  # open breaker: no further calls


def test_compaction_boundary_continues_the_same_storage(tmp_path):
    engine = make_engine(tmp_path)
    final, originals, _ = drive(engine, 30)
    engine.on_session_end("sess", final)
    engine.on_session_start("sess-2", boundary_reason="compression", old_session_id="sess",
                            platform="cli")
    assert engine.canonical_id == "sess"
    assert engine.store.ingest("sess-2", final,
                               skip=[assemble.is_trove_message(m) for m in final]).inserted == 0
    final2, more, _ = drive(engine, 10, start=30, messages=final)
    engine.ingest(final2)
    assert engine.store.count_messages("sess") == len(originals) + len(more)


def test_new_session_carries_high_level_summaries_with_lineage(tmp_path):
    engine = make_engine(tmp_path, new_session_retain_depth=1, condense_fanout=2)
    final, originals, _ = drive(engine, 60)
    old_frontier = engine.dag.frontier("sess")
    carried = [n["node_id"] for n in old_frontier if n["depth"] >= 1]
    assert carried
    engine.on_session_reset()
    engine.on_session_start("fresh", old_session_id="sess", platform="cli")
    new_frontier = [n["node_id"] for n in engine.dag.frontier("fresh")]
    assert new_frontier == carried
    reached = engine.dag.descendant_store_ids(carried[0])
    assert reached and all(engine.store.get_message(s)["session_id"] == "sess" for s in reached)
    # The carried summaries show up in the new session's first compaction.
    messages, _, outputs = drive(engine, 30, start=100)
    # (itself, or an overview that folded it: its header cites "n<id>-...")
    assert outputs and any(f"node {carried[0]}" in m.get("content", "")
                           or f"[n{carried[0]}-" in m.get("content", "") for m in outputs[0]
                           if assemble.is_trove_message(m))


def test_retain_depth_minus_one_carries_nothing(tmp_path):
    engine = make_engine(tmp_path, new_session_retain_depth=-1)
    drive(engine, 40)
    engine.on_session_start("fresh", old_session_id="sess")
    assert engine.dag.frontier("fresh") == []


def test_empty_session_id_unbinds_and_compress_uses_an_ephemeral_session(tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    engine = make_engine(tmp_path, session=None)
    engine.on_session_start("")
    assert engine.binding == "unbound" and engine.canonical_id is None
    final, originals, outputs = drive(engine, 30)
    assert engine.binding == "ephemeral" and engine.canonical_id.startswith("trove-ephemeral-")
    engine.ingest(final)
    assert engine.store.count_messages(engine.canonical_id) == len(originals)


def test_unbound_engine_binds_from_hermes_session_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_SESSION_ID", "from-env")
    engine = make_engine(tmp_path, session=None)
    engine.ingest([{"role": "user", "content": "hi"}])
    assert engine.binding == "env" and engine.canonical_id == "from-env"


def test_deep_copies_share_one_connection_and_storage(tmp_path):
    engine = make_engine(tmp_path)
    drive(engine, 10)
    twin = copy.deepcopy(engine)
    assert twin.store.db is engine.store.db
    twin.ingest([m for t in range(12) for m in coding_turn(t)])
    assert engine.store.count_messages("sess") == 48


def test_internal_error_returns_messages_unchanged_and_reports(tmp_path, monkeypatch):
    engine = make_engine(tmp_path)
    messages = [m for t in range(30) for m in coding_turn(t)]
    monkeypatch.setattr(type(engine.dag), "covered_store_ids",
                        lambda self, ids: (_ for _ in ()).throw(RuntimeError("disk on fire")))
    out = engine.compress(messages, current_tokens=engine.threshold_tokens + 1)
    assert out is messages
    assert engine._last_compress_aborted is True
    assert engine.get_status()["last_compaction"]["outcome"] == "error"
    # The messages were still persisted before the failure.
    assert engine.store.count_messages("sess") == len(messages)


def test_status_reports_counter_and_pressure(tmp_path):
    engine = make_engine(tmp_path)
    engine.update_from_response({"prompt_tokens": 4000, "completion_tokens": 10})
    status = engine.get_status()
    assert status["last_prompt_tokens"] == 4000
    assert status["threshold_tokens"] == engine.threshold_tokens
    assert status["token_counter"]["name"]
    assert status["binding"] == "host"


def test_fts_check_runs_in_background_and_is_recorded(tmp_path, _both_engines):
    if _both_engines != "sqlite":
        pytest.skip("FTS5 shadow tables only: a server computes its tsvector columns itself")
    engine = make_engine(tmp_path)
    import time
    from hermes_trove.storage import integrity
    deadline = time.time() + 10
    while engine.store.get_meta(integrity.CHECKED_AT_KEY) is None and time.time() < deadline:
        time.sleep(0.05)
    result = json.loads(engine.store.get_meta(integrity.RESULT_KEY))
    assert result["ok"] is True
    assert not integrity.start_if_due(engine.store.db.path,
                                      engine.store.get_meta(integrity.CHECKED_AT_KEY), 24)


@pytest.fixture(autouse=True)
def _both_engines(engines_on_backend):
    """Every engine test runs on SQLite and on PostgreSQL (tests/pgkit.py)."""
    yield engines_on_backend


@pytest.fixture(autouse=True)
def _close_databases():
    from hermes_trove.compaction import summarize as summarize_module
    summarize_module._breakers.clear()  # route health is process-wide; tests start fresh
    yield
    for key in list(database._registry):
        database.forget_database(key)


def test_rotate_preview_apply_and_noop(tmp_path):
    engine = make_engine(tmp_path, window=1_000_000, fresh_tail_count=8)
    messages, originals, outputs = drive(engine, 20)
    assert not outputs  # a huge window: nothing compacted yet
    engine.ingest(messages)
    preview = engine.rotate()
    assert preview["status"] == "preview" and preview["older_messages"] == 72
    assert not engine.should_compress(10)
    result = engine.rotate(apply=True)
    assert result["status"] == "rotated" and result["leaf_nodes"]
    assert Path(result["backup"]).exists() and Path(result["backup"]).name.endswith("rotate-latest.db")
    assert engine.should_compress(10)  # the host picks the rotation up at its next check
    out = engine.compress(messages, current_tokens=10)
    assert assemble.sequence_problems(out) == []
    raw = [m for m in out if not assemble.is_trove_message(m)]
    assert raw == originals[-8:]
    assert engine.rotate()["status"] == "noop"
    # Nothing was lost: every message is still stored and readable in order.
    rows = engine.store.session_messages("sess", limit=1000)
    assert [decode_row(r) for r in rows] == originals
    state = engine.store.get_session("sess")
    assert state["replay_floor"] == result["replay_floor"] and state["state"]["last_rotate_at"]


def test_rotate_refuses_an_unbound_engine(tmp_path):
    engine = make_engine(tmp_path, session=None)
    assert engine.rotate(apply=True)["status"] == "refused"


@pytest.mark.parametrize("mode,setting", [("ignored", "ignore_session_patterns"),
                                          ("stateless", "stateless_session_patterns")])
def test_filtered_sessions_store_nothing_and_stay_bounded(tmp_path, mode, setting):
    engine = make_engine(tmp_path, session=None, **{setting: "cron:**"})
    engine.on_session_start("job-7", platform="cron")
    assert engine.session_mode == mode and engine.session_filter_match == "cron:**"
    messages = [m for t in range(40) for m in coding_turn(t)]
    out = engine.compress(messages, current_tokens=prompt_tokens(engine, messages))
    assert engine.last_compaction["outcome"] == "delegated"
    assert engine.count_messages(out) < engine.count_messages(messages)
    assert engine.store.count_messages() == 0
    assert engine.store.get_session("job-7") is None
    assert engine.rotate(apply=True)["status"] == "refused"
    status = engine.get_status()
    assert status["session_mode"] == mode
    assert status["ingest_policy"]["session_filters"]


def test_trim_fallback_keeps_a_valid_bounded_sequence():
    from hermes_trove.compaction import fallback
    messages = [m for t in range(30) for m in coding_turn(t)]
    out = fallback.trim_to_budget(messages, 2_000, count=lambda m: len(str(m)) // 4)
    assert assemble.sequence_problems(out) == []
    assert out[0]["content"] == fallback.TRIM_NOTICE and out[-1] == messages[-1]


def test_ignored_messages_are_not_stored_and_counted(tmp_path):
    engine = make_engine(tmp_path, ignore_message_patterns="^HEARTBEAT_OK$")
    engine.ingest([{"role": "user", "content": "real question"},
                   {"role": "assistant", "content": "HEARTBEAT_OK"},
                   {"role": "assistant", "content": "real answer"}])
    rows = engine.store.session_messages("sess")
    assert [r["content"] for r in rows] == ["real question", "real answer"]
    assert engine.get_status()["ingest_policy"]["message_filter"]["ignored_messages"] >= 1


def test_manual_compress_of_the_head_with_a_verbatim_tail_stores_nothing_twice(tmp_path):
    """The CLI's /compress compacts the older part and re-appends the newest turns verbatim."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [m for t in range(40) for m in coding_turn(t)]
    engine.ingest(messages)  # persisted turn by turn by the post_llm_call hook
    head, tail = messages[:-8], messages[-8:]
    compressed = engine.compress(head, current_tokens=engine.threshold_tokens - 1, force=True)
    assert assemble.is_trove_message(compressed[0])
    resumed = compressed + tail + [{"role": "user", "content": "and now?"}]
    engine.ingest(resumed)
    assert engine.store.count_messages("sess") == len(messages) + 1
    out = engine.compress(resumed, current_tokens=engine.threshold_tokens + 1, force=True)
    engine.ingest(out)
    assert engine.store.count_messages("sess") == len(messages) + 1


def test_compress_preflight_counts_a_pasted_block_header_as_conversation(tmp_path):
    from enginekit import drive, make_engine
    from hermes_trove.compaction import assemble

    engine = make_engine(tmp_path, window=16_000)
    messages, _, outputs = drive(engine, 60)
    assert outputs, "the drive never compacted"
    block = next(m for m in outputs[-1] if assemble.is_trove_message(m) and m["role"] == "user")
    ack = outputs[-1][outputs[-1].index(block) + 1]
    newest = {"role": "user", "content": "and now?"}
    # the engine's own block and acknowledgement are not conversation
    assert not engine.has_content_to_compress([outputs[-1][0], block, ack, newest])
    # a user who pastes the header wrote a message: there is something to compact
    pasted = {"role": "user", "content": assemble.BLOCK_MARKER + "\nmy notes from yesterday"}
    assert engine.has_content_to_compress([outputs[-1][0], pasted, newest])
    assert not engine.has_content_to_compress([newest])
    assert not engine.has_content_to_compress([])


def test_a_real_prompt_count_handed_as_current_tokens_is_no_overhead_sample(tmp_path):
    """After a tool call the host compresses with ``approx_tokens=last_prompt_tokens``:
    the provider's real count of the request before the tool result, not its rough
    estimate of the list. Taken as a host-unit sample it inflated the overhead by
    the gap between the two counters and starved the tail (host walk seed 9505)."""
    engine = make_engine(tmp_path, window=16_000)
    messages = [m for t in range(6) for m in coding_turn(t)]
    engine.compress(list(messages), current_tokens=host_tokens(messages), force=True)
    learned = engine.last_compaction["host_overhead"]
    assert abs(learned - DEFAULT_OVERHEAD) <= 50  # per message vs the whole list
    real = host_tokens(messages) + 7_000  # the provider counts this request far higher
    engine.update_from_response({"prompt_tokens": real, "completion_tokens": 20})
    engine.compress(list(messages), current_tokens=real, force=True)
    assert engine.last_compaction["host_overhead"] == learned
    # the host's own rough estimate is still a sample, however large
    engine.compress(list(messages), current_tokens=host_tokens(messages, overhead=5_000),
                    force=True)
    assert abs(engine.last_compaction["host_overhead"] - 5_000) <= 50



def test_the_current_turn_is_counted_as_the_host_counted_it(tmp_path):
    """The current turn's user message carries ``api_content`` (the wire text) beside
    ``content``. Where the host estimates its request copies it counts the wire text
    once (``budget.api_form``); its figure shows it, and the tail is sized the same
    way. Counted twice, a big message left no room for the previous exchange (host
    walk seed 30009). A figure that counted the whole dict is taken as it stands. The
    overhead learned on an earlier list tells the two apart."""
    from hermes_trove.compaction.budget import api_form, host_estimator
    history = [m for t in range(8) for m in coding_turn(t)]
    text = "lorem ipsum dolor sit amet " * 1_300          # ~9K host units
    newest = {"role": "user", "content": text, "api_content": text + "\n\n[context]"}
    once = host_estimator()([api_form(newest)])
    assert host_estimator()([newest]) > 1.9 * once     # the dict holds the text twice
    engine = make_engine(tmp_path, window=64_000)
    engine.compress(history[:4], current_tokens=host_tokens(history[:4]), force=True)
    out = engine.compress(history + [newest],
                          current_tokens=host_tokens(history + [api_form(newest)]), force=True)
    outcome = engine.last_compaction
    assert abs(outcome["host_overhead"] - DEFAULT_OVERHEAD) <= 50
    assert outcome["host_tokens_after"] - outcome["host_overhead"] < 1.5 * once + 2_000
    assert out[-1] is newest                          # returned as the host holds it
    assert out[-3:-1] == history[-2:], "the previous exchange did not stay raw"
    engine = make_engine(tmp_path / "twice", window=64_000)
    engine.compress(history[:4], current_tokens=host_tokens(history[:4]), force=True)
    engine.compress(history + [newest], current_tokens=host_tokens(history + [newest]),
                    force=True)
    outcome = engine.last_compaction
    assert outcome["host_tokens_after"] - outcome["host_overhead"] > 1.9 * once


def test_a_pass_the_host_would_not_count_as_progress_keeps_the_list(tmp_path):
    """The host's preflight loop stops without taking a result that kept as many rows
    and cut its estimate by 5% or less, although its in-place compaction already wrote
    it to state.db; the turn's end then wrote it again and a /resume restored both
    copies (host walk 120017). Such a pass returns the host's list unchanged; a
    /compress takes its result, and every message is stored either way."""
    engine = make_engine(tmp_path, window=8_000)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok there"},
                {"role": "user", "content": "word " * 9000}]
    current = prompt_tokens(engine, messages)
    out = engine.compress(messages, current_tokens=current)
    assert out is messages
    outcome = engine.last_compaction
    assert outcome["outcome"] == "noop" and "progress" in outcome["reason"]
    stored = [decode_row(r)["content"] for r in engine.store.session_messages(engine.canonical_id)]
    assert stored == [m["content"] for m in messages]
    assert not engine.should_compress(current)       # no pointless retry at this size
    forced = engine.compress(messages, current_tokens=current, force=True)
    assert forced != messages and assemble.is_trove_message(forced[0])


def test_the_hosts_progress_rule_as_predicted():
    """Fewer rows always count; as many rows count only when the host's estimate of
    the request drops by more than 5% (with a point of margin, since the host rebuilds
    its system prompt); without the host's figure only fewer rows can be known."""
    from hermes_trove.compaction.budget import host_estimator, host_sees_progress
    before = [{"role": "user", "content": "a" * 40_000}, {"role": "assistant", "content": "b" * 400}]
    current = 10_000 + host_estimator()(before)
    fewer = [{"role": "user", "content": "a" * 40_000}]
    assert host_sees_progress(before, fewer, current)
    assert host_sees_progress(before, fewer, None)
    assert not host_sees_progress(before, before, current)
    for cut, counts in ((0.03, False), (0.055, False), (0.10, True)):
        chars = int(current * cut * 4)
        after = [{"role": "user", "content": "a" * (40_000 - chars)},
                 {"role": "assistant", "content": "b" * 400}]
        assert host_sees_progress(before, after, current) is counts, cut
        assert not host_sees_progress(before, after, None)


def test_the_trigger_counts_the_real_tokens_the_list_is_known_to_hold(tmp_path):
    """The host asks on chars/4, about a fifth of CJK text's real tokens: two 20K-token
    Chinese turns stayed under its figure of the threshold and the request went out
    over the window (host walk 120004). The provider's count of the last request, its
    reply and the user message noted since are real tokens the list holds; after a
    compaction they are unknown until the next reply."""
    engine = make_engine(tmp_path, window=64_000)
    trigger = engine.threshold_tokens
    chinese = "灰度发布和自动回滚，缓存层负责" * 400
    messages = [{"role": "user", "content": "earlier question " * 40},
                {"role": "assistant", "content": "earlier answer " * 40},
                {"role": "user", "content": chinese}, {"role": "assistant", "content": "好的"}]
    rough = host_tokens(messages)
    assert rough < trigger                                  # the host would never ask
    engine.update_from_response({"prompt_tokens": trigger - 500, "completion_tokens": 10})
    assert not engine.should_compress(rough)
    turn = {"role": "user", "content": chinese}
    engine.note_user_turn(turn)                             # pre_llm_call: real + this turn
    messages.append(turn)
    rough = host_tokens(messages)
    assert rough < trigger and engine.should_compress(rough)
    out = engine.compress(messages, current_tokens=rough)   # not "under the trigger"
    assert out != messages and assemble.is_trove_message(out[0])
    assert out[-1]["content"] == chinese
    assert not engine.should_compress(host_tokens(out))     # unknown again until a reply


def test_the_real_side_of_the_trigger_is_the_list_at_hand_once_compress_sees_it(tmp_path):
    """An /undo after the reply shrinks the list with no hook: the projection from the
    provider's count is then too high, and ``compress`` counts the list it is given
    instead of compacting on the stale figure."""
    engine = make_engine(tmp_path, window=64_000)
    trigger = engine.threshold_tokens
    messages = [{"role": "user", "content": "question " * 50},
                {"role": "assistant", "content": "answer " * 50}]
    engine.update_from_response({"prompt_tokens": 1_000, "completion_tokens": 60})
    engine.learn_overhead(messages)                    # post_llm_call: the real overhead
    engine.update_from_response({"prompt_tokens": trigger + 1_000, "completion_tokens": 60})
    engine.note_user_turn({"role": "user", "content": "next"})
    current = host_tokens(messages)                    # the list after an /undo: small
    assert engine.should_compress(current)             # the stale projection says over
    assert engine.compress(messages, current_tokens=current) is messages
    assert engine.last_compaction["outcome"] == "noop"
    assert not engine.should_compress(current)         # the list at hand, counted


def test_the_real_overhead_pairs_the_turns_own_count_with_its_list(tmp_path):
    """Two copies of the engine on one session (two CLIs in one process): the turn's
    provider usage reaches the copy that ran it, ``post_llm_call`` the copy bound
    last. The overhead is the turn's count minus its list, not the other copy's last
    count (host walk 170003: 27K of "overhead" left the summary block no room)."""
    first = make_engine(tmp_path, window=64_000)
    second = make_engine(tmp_path, window=64_000)     # bound last: the hooks reach it
    messages = [{"role": "user", "content": "question " * 400},
                {"role": "assistant", "content": "answer " * 400},
                {"role": "user", "content": "next"}]
    second.update_from_response({"prompt_tokens": 40_000, "completion_tokens": 10})
    sent = first.count_messages(messages)
    first.update_from_response({"prompt_tokens": 9_000 + sent, "completion_tokens": 10})
    second.learn_overhead(messages + [{"role": "assistant", "content": "done"}])
    assert second._real_overhead == 9_000


def test_the_real_overhead_leaves_out_what_a_message_carries_in_its_sidecar(tmp_path):
    """The host sends a user message's ``api_content`` sidecar (the text and the
    context plugins added, trove's recall note among them) and the provider counts
    it. Learned as host overhead, the note stayed reserved after a compaction had
    summarized its message, and the previous exchange that fit beside a large turn
    was left out of the tail (host walk 120004, a starved tail ~94 tokens short)."""
    engine = make_engine(tmp_path, window=64_000)
    note = " Check the source before answering about earlier work." * 8
    first = {"role": "user", "content": "question one", "api_content": "question one" + note}
    messages = [first, {"role": "assistant", "content": "answer one"},
                {"role": "user", "content": "question two"}]
    plain = engine.count_messages(messages)
    noted = engine.sent_tokens(messages)
    assert noted > plain + 40                          # the note is counted where it is sent
    engine.update_from_response({"prompt_tokens": 9_000 + noted, "completion_tokens": 10})
    engine.learn_overhead(messages + [{"role": "assistant", "content": "answer two"}])
    assert engine._real_overhead == 9_000             # not 9,000 + the note


def _injected_history(turns: int, memory_tokens: int) -> list:
    """``turns`` short exchanges whose user messages carry an ``api_content`` sidecar:
    the text plus a memory provider's block of Chinese notes (the host's chars/4
    counts them ~4x low), as Hermes 0.19 stamps and replays on every request."""
    import random
    from walktexts import cjk
    rng, messages = random.Random(turns), []
    for t in range(turns):
        text = f"[T{t}] what about the retry loop in module {t}?"
        memory = cjk(rng, memory_tokens)
        messages += [{"role": "user", "content": text,
                      "api_content": text + "\n\nRecalled memory:\n" + memory},
                     {"role": "assistant", "content": f"module {t} retries three times."}]
    return messages


def _learned(engine, messages: list, overhead: int) -> None:
    """The provider counted ``messages`` (sidecars sent) with ``overhead`` around them."""
    engine.update_from_response({"prompt_tokens": overhead + engine.sent_tokens(messages),
                                 "completion_tokens": 10})
    engine.learn_overhead(messages + [{"role": "assistant", "content": "ok"}])


def test_a_list_whose_sidecars_reach_the_trigger_is_compacted(tmp_path):
    """The host replays every historical user message's sidecar: a memory provider
    that injects ~600 tokens a turn sends them again for each user message kept. A
    list whose messages are small but whose sidecars take it over the trigger is over
    the trigger (the projection counts each message as sent, as the learned overhead
    does), and the result fits under it as sent: it went out 13% over the trigger at
    64K, and close to the window at 32K (tests/test_host_sidecars.py)."""
    engine = make_engine(tmp_path, window=32_000)
    trigger = engine.threshold_tokens
    messages = _injected_history(14, 600)
    _learned(engine, messages[:-2], 2_000)
    assert engine._real_overhead == 2_000
    assert 2_000 + engine.count_messages(messages) < trigger // 2     # the content alone
    host = host_tokens(messages, 2_000)
    assert host < trigger < 2_000 + engine.sent_tokens(messages)      # as sent: over
    result = engine.compress(messages, current_tokens=host)
    assert result != messages and engine.last_compaction["outcome"] == "compacted"
    assert 2_000 + engine.sent_tokens(result) < trigger
    assert engine.last_compaction["tokens_after"] == 2_000 + engine.sent_tokens(result)


def test_the_tail_is_sized_by_what_its_messages_send(tmp_path):
    """A /compress keeps a tail within the room as the provider gets it: each kept
    user message's sidecar counts, the same count the learned overhead used (one
    rule: ``sent_count``). Sized on the content alone the tail kept every sidecar
    and the request went out over the trigger."""
    engine = make_engine(tmp_path, window=32_000)
    trigger = engine.threshold_tokens
    messages = _injected_history(14, 600)
    _learned(engine, messages[:-2], 2_000)
    result = engine.compress(messages, current_tokens=host_tokens(messages, 2_000), force=True)
    kept = [m for m in result if m.get("api_content")]
    assert len(kept) >= 2, "the tail kept no injected turn: nothing proved"
    assert 2_000 + engine.sent_tokens(result) < trigger
    assert engine.last_compaction["tail_tokens"] == sum(engine.sent_count(m) for m in kept) \
        + sum(engine.sent_count(m) for m in result
              if m.get("role") == "assistant" and m in messages)


def test_the_newest_user_message_stays_when_rows_after_it_were_summarized(tmp_path):
    """A pass that kept the newest user message raw and summarized the tool group
    after it can end with the host's list unchanged (the host would not count it as
    progress); compacting that list again read the user message as a stale row (a live
    row shown before summarized ones) and summarized it: the prompt went out without
    the user's question (tests/test_budget_promises.py seed 239)."""
    engine = make_engine(tmp_path, window=16_000, fresh_tail_count=3)
    call = lambda cid: {"role": "assistant", "content": "", "tool_calls": [  # noqa: E731
        {"id": cid, "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}
    question = {"role": "user", "content": "why does the proxy drop connections?"}
    messages = [{"role": "user", "content": "hello " * 300}, {"role": "assistant", "content": "hi"},
                question, call("c1"),
                {"role": "tool", "tool_call_id": "c1", "name": "grep", "content": "log " * 2500},
                call("c2"), {"role": "tool", "tool_call_id": "c2", "name": "grep", "content": "ok"}]
    first = engine.compress(messages, current_tokens=prompt_tokens(engine, messages), force=True)
    assert question in first
    again = engine.compress(messages, current_tokens=prompt_tokens(engine, messages), force=True)
    assert question in again, [m.get("content", "")[:40] for m in again]
    assert assemble.sequence_problems(again) == []


def test_the_learned_real_overhead_outlives_the_process_of_its_session(tmp_path):
    """The real overhead a session learned is kept in its state (written only when it
    moved) and known to a copy bound to the session later, before its first reply; a
    copy that learned its own keeps it, and a garbled kept value is ignored."""
    first = make_engine(tmp_path, session="s")
    messages = [{"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "hi"}]
    first.update_from_response({"prompt_tokens": 9_000, "completion_tokens": 5})
    first.learn_overhead(messages)
    learned = first._real_overhead
    assert learned and learned > 8_000
    assert first.store.get_session(first.canonical_id)["state"]["real_overhead"] == learned
    writes = []
    first.store.update_session_state = lambda sid, patch: writes.append(patch)
    first.update_from_response({"prompt_tokens": 9_010, "completion_tokens": 5})
    first.learn_overhead(messages)                     # moved by 10 tokens: no write
    assert writes == []
    later = make_engine(tmp_path, session="s")         # a restart: a new copy, same session
    assert later._real_overhead == learned
    other = make_engine(tmp_path, session="t")         # another session learned nothing
    assert other._real_overhead is None
    other.store.update_session_state(other.canonical_id, {"real_overhead": "lots"})
    assert make_engine(tmp_path, session="t")._real_overhead is None


def test_the_kept_overhead_is_kept_in_each_session_the_copy_binds_to(tmp_path):
    """A copy that kept its overhead in one session keeps it in the next one it binds
    to (/new, /resume) at its first reply there, even when it did not move: a restart
    into that session reads it (host walk 1290001: learned in one session, written to
    none after a /resume, so the restarted copy knew nothing)."""
    engine = make_engine(tmp_path, session="a")
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    for session in ("a", "b"):
        engine.on_session_start(session, platform="cli")
        engine.update_from_response({"prompt_tokens": 9_000, "completion_tokens": 5})
        engine.learn_overhead(messages)
    assert make_engine(tmp_path, session="b")._real_overhead == engine._real_overhead


def test_a_compress_the_host_asks_for_on_its_overflow_path_compacts_below_the_trigger(tmp_path):
    """``should_compress`` declined the request; no reply came; the host then asks
    ``compress`` with a smaller figure (its overflow path: the provider refused, the
    estimate leaves out the tool schemas): the list is compacted to less than it held.
    A reply in between, the turn's end, or the same figure again keeps the no-op."""
    def declined_then(engine, messages, *, between=None, figure=None):
        current = host_tokens(messages)
        assert not engine.should_compress(current)
        if between:
            between()
        return engine.compress(list(messages), current_tokens=figure or current // 2)

    window = 64_000
    engine = make_engine(tmp_path, window=window)
    messages, _, _ = drive(engine, 12)
    assert engine.compression_count == 0 and host_tokens(messages) < engine.threshold_tokens
    for between, figure in ((lambda: engine.update_from_response({"prompt_tokens": 9_000}), None),
                            (engine.turn_done, None), (None, host_tokens(messages))):
        assert declined_then(engine, messages, between=between, figure=figure) == messages
        assert engine.last_compaction["outcome"] == "noop" and engine.compression_count == 0
    out = declined_then(engine, messages)
    assert engine.compression_count == 1 and len(out) < len(messages)
    assert host_tokens(out) < host_tokens(messages)
