"""The plugin inside the real hermes-agent 0.19.0 host (fake model on 127.0.0.1)."""

import json
import sqlite3
from collections import Counter

import pytest

import hostkit as hk
from hostkit import fake_llm, trove_host  # noqa: F401 (fixtures)

pytestmark = pytest.mark.host

WINDOW = 65_536


def long_answer(body: dict) -> hk.Reply:
    """Main requests get a long, fact-bearing answer; summary requests a short summary."""
    if not hk.is_main_request(body):
        return hk.Reply(text="- summary: the user asked about modules; facts kept in lineage.")
    asked = [m for m in body.get("messages", []) if m.get("role") == "user"][-1]
    text = asked["content"] if isinstance(asked["content"], str) else json.dumps(asked["content"])
    turn = int(text.split(":")[0].split()[-1]) if text.startswith("Question") else -1
    return hk.Reply(text=f"Answer {turn}: the config key retry_{turn}_ms is {turn * 7}. "
                    + "Explanation sentence with detail. " * 160)


def test_plugin_loads_through_the_real_plugin_manager(trove_host):
    from hermes_cli.plugins import get_plugin_context_engine, get_plugin_manager

    manager = get_plugin_manager()
    assert hk.plugin_loaded("hermes-trove")
    engine = get_plugin_context_engine()
    assert engine is not None and engine.name == "trove"
    assert type(engine).__module__.startswith("hermes_plugins.hermes_trove")
    hooks = getattr(manager, "_hooks", {})
    assert "pre_llm_call" in hooks and "post_llm_call" in hooks


def test_real_agent_uses_trove_and_compacts_losslessly(trove_host, monkeypatch):
    monkeypatch.setenv("TROVE_CONDENSE_FANOUT", "3")
    server = trove_host.server
    server.responder = long_answer
    agent = hk.make_agent()
    assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
    engine = hk.live_engine(agent)
    texts = [f"Question {i}: tell me about module_{i} and its retry setting." for i in range(40)]
    results = hk.run_turns(agent, texts)
    hk.end_session(agent, results[-1]["messages"])

    assert engine.compression_count >= 3
    for body in server.main_bodies:
        assert hk.estimate_prompt_tokens(body) < WINDOW

    db = sqlite3.connect(trove_host.hermes_home / "trove.db")
    rows = db.execute("SELECT store_id, role, content FROM messages ORDER BY store_id").fetchall()
    contents = Counter((r[1], r[2]) for r in rows)
    for text in texts:
        assert contents[("user", text)] == 1, text
    answers = [c for (role, c) in contents if role == "assistant" and c.startswith("Answer ")]
    assert len(answers) == len(texts)
    assert all(contents[("assistant", a)] == 1 for a in answers)

    # Lineage: leaves partition what was compacted; every node reaches exactly its messages.
    edges = db.execute("SELECT parent_id, child_store_id FROM node_edges"
                       " WHERE child_store_id IS NOT NULL").fetchall()
    covered = [child for _, child in edges]
    assert len(covered) == len(set(covered))
    depths = dict(db.execute("SELECT node_id, depth FROM nodes"))
    assert max(depths.values()) >= 1, "expected a condensation"
    for node_id, depth in depths.items():
        reached = _descendants(db, node_id)
        count = db.execute("SELECT message_count FROM nodes WHERE node_id = ?", (node_id,)).fetchone()[0]
        assert len(reached) == count == len(set(reached))
    # The compacted messages are not in the final prompt; the uncovered ones are.
    last_request = server.main_bodies[-1]["messages"]
    sent = json.dumps(last_request)
    first_answer = next(r[2] for r in rows if r[1] == "assistant" and r[2].startswith("Answer "))
    assert rows[0][0] in covered and first_answer[:40] not in sent
    db.close()


def test_recall_policy_is_appended_only_by_trove(trove_host):
    trove_host.server.responder = lambda body: "fine"
    agent = hk.make_agent()
    hk.run_turns(agent, ["hello there"])
    user = [m for m in trove_host.server.main_bodies[-1]["messages"] if m["role"] == "user"][-1]
    policy = (hk.plugin_module("hermes-trove").plugin_wiring.recall_policy())
    assert policy and policy in json.dumps(user["content"])


def _descendants(db, node_id):
    out = []
    for child_node, child_store in db.execute(
            "SELECT child_node_id, child_store_id FROM node_edges WHERE parent_id = ?"
            " ORDER BY ordinal", (node_id,)).fetchall():
        out.extend([child_store] if child_store is not None else _descendants(db, child_node))
    return out
