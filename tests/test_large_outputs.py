"""Large payloads through the engine: media guard, externalization, replay stubs, GC."""

import base64
import os
import subprocess
import sys
from pathlib import Path

from hermes_trove.compaction import assemble
from hermes_trove.storage import database, payloads
from hermes_trove.store import decode_row

from enginekit import coding_turn, make_engine

ROOT = Path(__file__).resolve().parent.parent


def big_log(n=60_000):
    return "".join(f"line {i}: worker processed batch {i * 7} in {i % 97} ms\n" for i in range(n // 50))[:n]


def tool_pair(call_id, content, name="terminal"):
    return [{"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}]


def test_five_megabyte_image_leaves_the_database_small_and_expands_exactly(tmp_path):
    engine = make_engine(tmp_path)
    engine.ingest([{"role": "user", "content": "seed"}])
    db_path = engine.config.resolved_database_path
    engine.store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = db_path.stat().st_size + Path(str(db_path) + "-wal").stat().st_size
    image = base64.b64encode(os.urandom(3_750_000)).decode()  # ~5 MB of base64
    uri = f"data:image/png;base64,{image}"
    message = {"role": "tool", "tool_call_id": "c1", "name": "screenshot",
               "content": [{"type": "text", "text": "screen"},
                           {"type": "image_url", "image_url": {"url": uri}}]}
    ids = engine.ingest([{"role": "user", "content": "seed"}, *tool_pair("c1", "x")[:1], message])
    engine.store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    after = db_path.stat().st_size + Path(str(db_path) + "-wal").stat().st_size
    assert after - before < 50_000
    row = decode_row(engine.store.get_message(ids[-1]))
    url = row["content"][1]["image_url"]["url"]
    refs = payloads.refs_in(url)
    assert len(refs) == 1 and image not in url
    assert engine.policy.payloads.get_text(refs[0]) == uri  # byte-exact back
    assert payloads.restore_text(url, engine.policy.payloads) == uri
    # Shown again, the same message is recognised: nothing new stored.
    assert engine.store.ingest("sess", [message], encoded=[engine.policy.prepare(message)]).inserted == 0


def test_active_replay_stubs_big_tool_results_and_keeps_identity(tmp_path):
    engine = make_engine(tmp_path, window=200_000, large_output_externalization_enabled="true",
                         large_output_active_replay_stubbing_enabled="true",
                         large_output_active_replay_stub_threshold_tokens=500)
    log = big_log()
    messages = [m for t in range(3) for m in coding_turn(t)]
    messages += [{"role": "user", "content": "run the job"}] + tool_pair("big", log)
    messages += tool_pair("exp", log, name="trove_expand")
    messages += [{"role": "assistant", "content": "done"}]
    out = engine.compress(messages, current_tokens=engine.count_messages(messages) + 1000,
                          force=True)
    assert assemble.sequence_problems(out) == []
    tools_out = {m["tool_call_id"]: m for m in out if m.get("role") == "tool"}
    stub = tools_out["big"]["content"]
    assert log not in stub and payloads.refs_in(stub)
    assert payloads.restore_text(stub, engine.policy.payloads) == log
    assert tools_out["exp"]["content"] == log  # trove_expand results are never stubbed
    stored = engine.store.count_messages("sess")
    engine.ingest(out + [{"role": "user", "content": "next"}])
    assert engine.store.count_messages("sess") == stored + 1  # the stub is the same message


def test_stubbing_needs_externalization(tmp_path):
    engine = make_engine(tmp_path, window=200_000, large_output_active_replay_stubbing_enabled="true",
                         large_output_active_replay_stub_threshold_tokens=500)
    log = big_log()
    messages = [{"role": "user", "content": "go"}] + tool_pair("big", log)
    out = engine.compress(messages, current_tokens=engine.count_messages(messages) + 1000,
                          force=True)
    assert [m for m in out if m.get("role") == "tool"][0]["content"] == log


def backfilled_session(tmp_path):
    """A session with one big tool output, stored, then backfilled into a payload file
    by the operator script: (the output, the turns)."""
    log = big_log()
    plain = make_engine(tmp_path, window=32_000)
    turns = [{"role": "user", "content": "run"}] + tool_pair("big", log)
    turns += [m for t in range(30) for m in coding_turn(t)]
    plain.ingest(turns)
    db_path = plain.config.resolved_database_path
    database.forget_database(db_path)
    backfill = subprocess.run([sys.executable, str(ROOT / "scripts" / "backfill_externalized_tool_outputs.py"),
                               "--db", str(db_path), "--apply", "--json"],
                              capture_output=True, text=True, timeout=120)
    assert backfill.returncode == 0, backfill.stderr
    return log, turns


def test_transcript_gc_rewrites_backfilled_summarized_rows_exactly(tmp_path):
    log, turns = backfilled_session(tmp_path)
    gc = make_engine(tmp_path, window=32_000, large_output_transcript_gc_enabled="true")
    row_before = gc.store.session_messages("sess", limit=3)[2]
    assert row_before["content"] == log
    gc.compress(turns, current_tokens=gc.threshold_tokens + 1, force=True)
    row_after = gc.store.get_message(row_before["store_id"])
    assert row_after["content"] != log and payloads.refs_in(row_after["content"])
    assert payloads.restore_text(row_after["content"], gc.policy.payloads) == log
    assert row_after["content_hash"] == row_before["content_hash"]
    assert gc.store.count_messages("sess") == len(turns)


def test_secrets_never_reach_rows_fts_summaries_or_replay(tmp_path):
    secret = "sk-ant-api03-" + "Zq8" * 14
    engine = make_engine(tmp_path, sensitive_patterns_enabled="true", fresh_tail_count=4)
    leak = {"role": "user", "content": f"deploy with OPENAI_API_KEY={secret} please"}
    messages = [leak] + [m for t in range(30) for m in coding_turn(t)]
    messages += [{"role": "user", "content": f"again: Authorization: Bearer {secret}"}]
    out = engine.compress(messages, current_tokens=engine.threshold_tokens + 1, force=True)
    conn = engine.store.db.conn
    assert not conn.execute("SELECT count(*) FROM messages WHERE content LIKE ?",
                            (f"%{secret}%",)).fetchone()[0]
    assert not conn.execute("SELECT count(*) FROM nodes WHERE text LIKE ?",
                            (f"%{secret}%",)).fetchone()[0]
    assert not engine.store.fts_candidates('"Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8Zq8"', limit=5)
    assert secret not in str(out)
    assert "[REDACTED:" in out[-1]["content"]
    stored = engine.store.count_messages("sess")
    engine.ingest(out)
    assert engine.store.count_messages("sess") == stored  # redacted replay = same messages
    assert secret not in str(engine.get_status())


def test_tools_search_describe_and_page_externalized_payloads_within_scope(tmp_path):
    import json as _json
    from hermes_trove import tools
    engine = make_engine(tmp_path, window=200_000, large_output_externalization_enabled="true")
    log = big_log() + "\nFATAL: checksum mismatch in shard kestrel-42\n" + big_log(20_000)
    engine.ingest([{"role": "user", "content": "run the nightly job"}] + tool_pair("job", log))
    row = engine.store.session_messages("sess")[2]
    ref = payloads.refs_in(row["content"])[0]
    assert "kestrel" not in row["content"]  # only in the payload, not in the preview

    def call(name, **args):
        return _json.loads(tools.dispatch(name, args, engine.tool_context()))

    found = call("trove_grep", query="checksum mismatch kestrel", content_scope="externalized")
    assert found["results"][0]["externalized_ref"] == ref and "kestrel" in found["results"][0]["snippet"]
    both = call("trove_grep", query="checksum mismatch kestrel", content_scope="both")
    assert both["externalized_results"][0]["externalized_ref"] == ref
    described = call("trove_describe", externalized_ref=ref)
    assert described["kind"] == "tool_output" and described["size"] == len(log.encode())
    pages, offset = [], 0
    while True:
        page = call("trove_expand", externalized_ref=ref, content_offset=offset)
        pages.append(page["content"])
        if not page["has_more"]:
            break
        offset = page["next_content_offset"]
    assert "".join(pages) == log and len(pages) > 1
    expanded_row = call("trove_expand", store_id=row["store_id"])
    assert expanded_row["message"]["externalized_refs"] == [ref]
    # Another session cannot read it without an explicit scope; paths never work.
    engine.on_session_start("other", platform="cli")
    assert "not found in this scope" in call("trove_expand", externalized_ref=ref)["error"]
    assert call("trove_expand", externalized_ref=ref, session_scope="all")["content"]
    for bad in ("../../etc/passwd", "/etc/passwd", "trove-payload:../../etc/passwd"):
        assert "error" in call("trove_expand", externalized_ref=bad)


def test_transcript_gc_keeps_a_row_whose_payload_file_is_damaged(tmp_path):
    """Fails closed: a payload file that exists but no longer holds the row's exact
    bytes (truncated by a full disk, altered) never replaces the stored text."""
    log, turns = backfilled_session(tmp_path)
    gc = make_engine(tmp_path, window=32_000, large_output_transcript_gc_enabled="true")
    store = gc.policy.payloads
    path = store.path_of(payloads.ref_for(payloads.encode_text(log)))
    path.write_bytes(path.read_bytes()[:100])  # present, but not the original any more
    row_before = gc.store.session_messages("sess", limit=3)[2]
    assert row_before["content"] == log
    gc.compress(turns, current_tokens=gc.threshold_tokens + 1, force=True)
    assert gc.store.get_message(row_before["store_id"])["content"] == log
