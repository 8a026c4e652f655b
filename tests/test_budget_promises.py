"""The prompt's promises when the host's chars/4 under-counts (CJK text): the real
tokens the list holds are known to the trigger (the full generated-conversation
property test joins in the next commit)."""

from __future__ import annotations

import pytest

from hermes_trove import on_post_tool_call

from enginekit import make_engine

agent_metadata = pytest.importorskip("agent.model_metadata")

CJK = "数据库连接池在高负载下耗尽，我们决定把超时改为三十秒并增加重试。"


def test_a_tool_result_grows_the_real_count_the_trigger_reads(tmp_path):
    """The host checks the request before its next model call on chars/4, about a
    fifth of the real tokens of Chinese text: a big Chinese tool output stayed under its
    figure of the trigger and the request went out over the window (seed 12). The
    ``post_tool_call`` hook counts the result into the real tokens the list holds."""
    engine = make_engine(tmp_path, window=64_000)
    ask = {"role": "user", "content": "read the design notes"}
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    engine.note_user_turn(ask)
    engine.update_from_response({"prompt_tokens": 900, "completion_tokens": 20})
    result = CJK * 1500                                     # 48K characters
    on_post_tool_call(session_id=engine.session_id, result=result, tool_call_id="c1",
                      tool_name="read_file")
    messages = [ask, call, {"role": "tool", "tool_call_id": "c1", "name": "read_file",
                            "content": result}]
    rough = 800 + agent_metadata.estimate_messages_tokens_rough(messages)
    assert rough < engine.threshold_tokens < engine.counter.count_messages(messages)
    assert engine.should_compress(rough)
    engine.compress(messages, current_tokens=rough)
    assert "under the trigger" not in engine.last_compaction.get("note", "")


def test_a_result_the_host_persists_counts_as_what_the_host_keeps(tmp_path):
    """The host writes a result over its threshold (15% of the window in characters,
    ``tools.budget_config``) to a file and keeps a preview in its list; the hook sees
    the raw result first. Counted whole, a 400K-character log read as ~100K tokens of
    pressure in a 64K window that no request carried. It counts as the host's
    replacement, never lower."""
    from tools.budget_config import budget_for_context_window
    from tools.tool_result_storage import maybe_persist_tool_result

    engine = make_engine(tmp_path, window=64_000)
    ask = {"role": "user", "content": "run the build"}
    engine.note_user_turn(ask)
    engine.update_from_response({"prompt_tokens": 900, "completion_tokens": 20})
    result = "".join(f"line {i}: compiling module_{i}.c ok\n" for i in range(12_000))
    assert len(result) > 400_000
    on_post_tool_call(session_id=engine.session_id, result=result, tool_call_id="c1",
                      tool_name="terminal")
    assert not engine.should_compress(950)
    kept = maybe_persist_tool_result(result, "terminal", "c1", env=None,
                                     config=budget_for_context_window(64_000))
    assert len(kept) < 10_000       # the host did replace it
    grew = engine._real_projection.pressure(0)
    assert grew >= engine.counter.count_message(
        {"role": "tool", "content": kept, "tool_call_id": "c1", "name": "terminal"})


def test_compress_counts_the_list_before_the_first_reply(tmp_path):
    """Before the first reply the real size of the list was unknown, so a first turn of
    Chinese text bigger than the window (under the trigger by the host's chars/4) was
    taken as under the trigger even on the host's retry after the provider refused it,
    and the host gave up: "cannot compress further" (seed 153)."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [{"role": "user", "content": CJK * 1900}]
    rough = 800 + agent_metadata.estimate_messages_tokens_rough(messages)
    assert rough < engine.threshold_tokens and engine.counter.count_messages(messages) > 64_000
    engine.compress(messages, current_tokens=rough)        # the host's overflow retry
    assert "under the trigger" not in engine.last_compaction.get("note", "")
