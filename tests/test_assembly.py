"""Every list compress() returns is a valid chat sequence (property-based)."""

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_trove.compaction import assemble
from hermes_trove.storage import database

from enginekit import make_engine

WORDS = st.sampled_from(["ok", "retry", "backoff", "proxy", "日本語", "😀", "fix", "src/a.py",
                         "decided", "port 6543", "", "the quick brown fox " * 30])
TEXT = st.lists(WORDS, min_size=0, max_size=6).map(" ".join)


@st.composite
def segment(draw, n: int):
    """One piece of a transcript: a user turn, an answer, a tool group, or junk."""
    kind = draw(st.sampled_from(["user", "user_parts", "assistant", "tools", "orphan",
                                 "empty_assistant", "incomplete"]))
    if kind == "user":
        return [{"role": "user", "content": draw(TEXT) or "ok"}]
    if kind == "user_parts":
        return [{"role": "user", "content": [{"type": "text", "text": draw(TEXT)},
                                             {"type": "image_url",
                                              "image_url": {"url": "data:image/png;base64,AA"}}]}]
    if kind == "assistant":
        return [{"role": "assistant", "content": draw(TEXT) or "done"}]
    if kind == "empty_assistant":
        return [{"role": "assistant", "content": ""}]
    calls = draw(st.integers(1, 3))
    ids = [f"c{n}_{i}" for i in range(calls)]
    call_msg = {"role": "assistant", "content": draw(TEXT), "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": "t", "arguments": "{}"}}
        for cid in ids]}
    results = [{"role": "tool", "tool_call_id": cid, "name": "t", "content": draw(TEXT)}
               for cid in ids]
    if kind == "orphan":
        return results
    if kind == "incomplete":
        return [call_msg] + results[:-1]
    return [call_msg] + results


@st.composite
def transcript(draw):
    count = draw(st.integers(1, 40))
    return [m for n in range(count) for m in draw(segment(n))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=transcript(), more=st.lists(transcript(), min_size=0, max_size=3),
       pressures=st.lists(st.integers(1000, 8000), min_size=4, max_size=4),
       forces=st.lists(st.booleans(), min_size=4, max_size=4))
def test_compress_output_is_always_a_valid_sequence(first, more, pressures, forces):
    home = Path(tempfile.mkdtemp(prefix="trove-prop-"))
    engine = make_engine(home, window=4_000, fresh_tail_count=6, leaf_chunk_tokens=600)
    try:
        messages = list(first)
        shown = list(first)
        for step, extra in enumerate([[]] + more):
            messages = messages + extra
            shown += extra
            out = engine.compress(messages, current_tokens=pressures[step], force=forces[step])
            assert not engine._last_compress_aborted, engine.last_compaction
            if out is not messages:  # a no-op hands back the caller's own list
                assert assemble.sequence_problems(out) == [], out
            messages = out
        engine.ingest(messages)
        assert engine.store.count_messages(engine.canonical_id) == len(shown)
    finally:
        database.forget_database(engine.config.resolved_database_path)


def test_group_units_and_validity_rules():
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "a", "content": "r"}
    units = assemble.group_units([{"role": "user", "content": "q"}, call, result,
                                  {"role": "tool", "tool_call_id": "zz", "content": "orphan"},
                                  {"role": "assistant", "content": ""}])
    assert [u.kind for u in units] == ["message", "tool_group", "orphan_tool", "empty_assistant"]
    assert assemble.sequence_problems([call, result]) == [
        "first message after the system prompt is 'assistant'", "no user message"]
    assert assemble.sequence_problems([{"role": "user", "content": "q"}, call]) == []
    assert "tool call without its result at 1" in assemble.sequence_problems(
        [{"role": "user", "content": "q"}, call, {"role": "user", "content": "x"}])


def test_block_marks_engine_messages_and_alternation_ack():
    out = assemble.build_prompt(None, assemble.BLOCK_MARKER + "\nbody",
                                [{"role": "user", "content": "hi"}])
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert assemble.is_trove_message(out[0]) and assemble.is_trove_message(out[1])
    assert not assemble.is_trove_message(out[2])


def test_a_compaction_that_keeps_nothing_raw_ends_with_the_acknowledgement():
    """Everything summarized (here a lone tool result without its call, which no tail
    keeps; in the host a /compress whose last exchange had no room): the list ends
    with the block's acknowledgement, so the next user message alternates instead of
    being merged into the block, and an ingest of the returned list stores nothing
    (read ending with the block, its text was taken for a message the user sent)."""
    home = Path(tempfile.mkdtemp(prefix="trove-prop-"))
    engine = make_engine(home, window=4_000, fresh_tail_count=6, leaf_chunk_tokens=600)
    try:
        first = [{"role": "tool", "tool_call_id": "c0_0", "name": "t", "content": ""}]
        out = engine.compress(list(first), current_tokens=1000, force=True)
        assert [m["role"] for m in out] == ["user", "assistant"]
        assert all(assemble.is_trove_message(m) for m in out)
        engine.ingest(out)
        assert engine.store.count_messages(engine.canonical_id) == 1
        engine.ingest(out + [{"role": "user", "content": "and now?"}])
        assert engine.store.count_messages(engine.canonical_id) == 2
    finally:
        database.forget_database(engine.config.resolved_database_path)
    assert [m["role"] for m in assemble.build_prompt(None, "block", [])] == ["user", "assistant"]
