"""Compaction when the summary model misbehaves, at the engine (fast cases); the seeded
run through the real host is tests/test_summary_faults_host.py."""

import json

from enginekit import drive, make_engine

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
