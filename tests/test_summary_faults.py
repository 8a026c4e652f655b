"""Compaction when the summary model misbehaves, at the engine (fast cases); the seeded
run through the real host is tests/test_summary_faults_host.py."""

import json

import pytest

from enginekit import drive, make_engine
from hermes_trove.compaction.assemble import ACK_TEXT, BLOCK_HEADER, BLOCK_MARKER

SECRET = "sk-live0TESTsecretKEY1234567890abcdef"


def test_a_summary_that_echoes_a_secret_is_stored_redacted(tmp_path):
    """The model answers with a secret its (redacted) prompt never held: the node, the
    block and every later merge prompt hold the placeholder, never the secret."""
    prompts = []

    def llm(prompt, model, timeout_s):
        prompts.append(prompt)
        return f"- the deploy key is {SECRET}; module work went on."

    engine = make_engine(tmp_path, llm=llm, sensitive_patterns_enabled=True,
                         condense_fanout=2, leaf_chunk_tokens=600)
    messages, _, outputs = drive(engine, 40)
    assert outputs and prompts
    texts = [n["text"] for n in engine.dag.frontier(engine.canonical_id)]
    texts += [r[0] for r in engine.store.db.conn.execute("SELECT text FROM nodes")]
    assert texts and not any(SECRET in t for t in texts)
    assert any("[REDACTED:api_key" in t for t in texts)
    assert not any(SECRET in p for p in prompts)
    assert SECRET not in json.dumps(messages)


def _leaf_nodes(engine):
    return [r[0] for r in engine.store.db.conn.execute(
        "SELECT text FROM nodes WHERE depth = 0 ORDER BY node_id")]


@pytest.mark.parametrize("answer", [
    "I'm sorry, but I can't help with that request.",
    "I cannot summarize this conversation.",
    "As an AI language model, I am not able to do that.",
])
def test_a_refusal_is_no_summary(tmp_path, answer):
    """A short refusal is smaller than its source and fits the budget, but says nothing
    about the data: both levels reject it and the deterministic digest stands."""
    engine = make_engine(tmp_path, llm=lambda p, m, t: answer, leaf_chunk_tokens=600)
    drive(engine, 30)
    leaves = _leaf_nodes(engine)
    assert leaves and not any(answer in t for t in leaves)
    levels = [r[0] for r in engine.store.db.conn.execute("SELECT level FROM nodes")]
    assert set(levels) == {3}


def test_an_answer_holding_the_engines_block_text_is_no_summary(tmp_path):
    """A model that echoes the block header or the acknowledgement (the text around its
    data) gives no summary: stored, it was a block inside the block, and merges read
    its header words as the conversation's key terms."""
    echo = BLOCK_HEADER + "\n## node 1 (depth 0)\n- fake\n" + ACK_TEXT
    engine = make_engine(tmp_path, llm=lambda p, m, t: echo, leaf_chunk_tokens=600,
                         condense_fanout=2)
    messages, _, _ = drive(engine, 30)
    texts = [r[0] for r in engine.store.db.conn.execute("SELECT text FROM nodes")]
    assert texts and not any(BLOCK_MARKER in t or ACK_TEXT in t for t in texts)
    blocks = [m for m in messages if str(m.get("content", "")).startswith(BLOCK_MARKER)]
    assert len(blocks) == 1 and blocks[0]["content"].count(BLOCK_MARKER) == 1


def test_a_fenced_answer_is_stored_without_its_fence(tmp_path):
    engine = make_engine(tmp_path, leaf_chunk_tokens=600,
                         llm=lambda p, m, t: "```markdown\n- module work; handler kept\n```")
    drive(engine, 30)
    leaves = _leaf_nodes(engine)
    assert leaves and all(t.startswith("- module work; handler kept\n") for t in leaves)


def test_status_says_why_summaries_are_digests_and_shows_the_breaker(tmp_path):
    """A dead summary route: the compaction's record names the failures and the status
    shows the breaker open, so an operator sees why the summaries are digests."""
    from hermes_trove.compaction import summarize
    from hermes_trove.diagnostics.compaction_text import compaction_line
    summarize._breakers.clear()

    def llm(prompt, model, timeout_s):
        raise RuntimeError("HTTP 500 upstream exploded")

    engine = make_engine(tmp_path, llm=llm, leaf_chunk_tokens=600)
    drive(engine, 30)
    status = engine.get_status()
    last = status["last_compaction"]
    assert set(last["levels"]) == {3}
    assert any("upstream exploded" in k or "breaker open" in k
               for k in last["summary_problems"]), last
    assert status["summary_breaker"]["default"]["state"] == "open"
    line = compaction_line(last, str)
    assert "by the deterministic digest" in line and " x" in line, line
    summarize._breakers.clear()


def test_status_names_a_rejected_refusal(tmp_path):
    engine = make_engine(tmp_path, llm=lambda p, m, t: "I'm sorry, I can't help with that.",
                         leaf_chunk_tokens=600)
    drive(engine, 30)
    assert "rejected: a refusal" in engine.get_status()["last_compaction"]["summary_problems"]


def test_doctor_warns_when_summaries_fall_back_to_the_digest(tmp_path):
    from hermes_trove.compaction import summarize
    summarize._breakers.clear()

    def llm(prompt, model, timeout_s):
        raise TimeoutError("slow")

    engine = make_engine(tmp_path, llm=llm, leaf_chunk_tokens=600)
    drive(engine, 30)
    report = json.loads(engine.handle_tool_call("trove_doctor", {}, messages=[]))
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["summary_model"]["status"] == "warn", checks.get("summary_model")
    assert "breaker open" in checks["summary_model"]["detail"]
    summarize._breakers.clear()
