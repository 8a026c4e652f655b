"""What the model sees: a compact trove_status (the inventory moves to trove_inspect), and
the CLI's grep/expand/describe showing why and what matched."""
import json
from pathlib import Path

from enginekit import drive, make_engine
from hermes_trove.dag import NewNode
from test_cli import home, run, run_json  # noqa: F401 (fixture)


def test_trove_status_is_compact_and_says_what_matters(tmp_path):
    engine = make_engine(tmp_path, window=16_000, fts_integrity_check_interval_hours=0)
    messages, _, outputs = drive(engine, 30)
    engine.ingest(messages)
    assert outputs
    text = engine.handle_tool_call("trove_status", {}, messages=messages)
    status = json.loads(text)
    assert engine.counter.count_text(text) < 400
    assert set(status) == {"bound", "session_id", "pressure", "last_compaction", "stored",
                           "problems", "more", "plugin", "background_prepare", "embeddings"}
    assert status["background_prepare"] is None  # the preparer is off by default
    assert status["embeddings"]["enabled"] is False  # and so are embeddings
    root = str(Path(__file__).resolve().parent.parent)
    assert status["plugin"].startswith(root)  # which code answered: folder, version, commit
    assert status["pressure"]["trigger_tokens"] == engine.threshold_tokens
    assert status["pressure"]["trigger_rule"] == engine.trigger_rule
    assert status["last_compaction"]["outcome"] == "compacted"
    assert status["last_compaction"]["at"].endswith("Z")
    assert status["stored"]["messages"] == engine.store.count_messages("sess")
    assert any("cannot free room" in p for p in status["problems"])  # 16K is too small
    assert "TROVE_TOOL_RESPONSE_MAX_TOKENS" not in text and "wildcards" not in text
    inspect = json.loads(engine.handle_tool_call("trove_inspect", {}, messages=messages))
    assert "TROVE_TOOL_RESPONSE_MAX_TOKENS" in inspect["status"]["config"]["settings"]


def long_summary_db(tmp_path):
    """A database whose only summary names its fact far from its start."""
    engine = make_engine(tmp_path, window=1_000_000, fts_integrity_check_interval_hours=0)
    ids = engine.store.ingest("sess", [{"role": "user", "content": "hello there"},
                                       {"role": "assistant", "content": "hi"}]).store_ids
    text = ("Summary header. " + "filler words about nothing in particular. " * 20
            + "The quokka migration uses port 7788. " + "more filler text. " * 10)
    node = engine.dag.add_node(NewNode(session_id="sess", depth=0, text=text, token_count=50,
                                       source_token_count=60, level=1, model="det",
                                       child_store_ids=ids))
    return node, text


def test_cli_grep_expand_describe_show_the_summary_and_its_match(tmp_path):
    node, text = long_summary_db(tmp_path)
    done = run(tmp_path, "grep", "quokka migration", "--session", "sess")
    assert f"n{node}" in done.stdout and "quokka migration" in done.stdout
    expanded = run(tmp_path, "expand", f"n{node}").stdout
    assert f"summary:\n{text}\nsources:" in expanded and "hello there" in expanded
    assert run_json(tmp_path, "expand", f"n{node}")["summary"] == text
    described = run(tmp_path, "describe", f"n{node}")
    assert described.returncode == 0 and f"n{node} summary" in described.stdout
    assert "depth: 0" in described.stdout and "preview: Summary header." in described.stdout
    assert "m1 message" in run(tmp_path, "describe", "m1").stdout
