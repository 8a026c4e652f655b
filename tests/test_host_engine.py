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
    skill = manager._plugin_skills["hermes-trove:hermes-trove"]
    assert skill["path"].name == "SKILL.md" and skill["path"].exists()


def test_real_agent_uses_trove_and_compacts_losslessly(trove_host):
    server = trove_host.server
    server.responder = long_answer
    agent = hk.make_agent()
    assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
    engine = hk.live_engine(agent)
    # 50 turns: four leaves and a condensation (the requests carry fewer trove tokens since
    # issue 27, so 40 turns made only three leaves)
    texts = [f"Question {i}: tell me about module_{i} and its retry setting." for i in range(50)]
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
    policy = (hk.plugin_module("hermes-trove").recall_policy())
    assert policy and policy in json.dumps(user["content"])


def _descendants(db, node_id):
    out = []
    for child_node, child_store in db.execute(
            "SELECT child_node_id, child_store_id FROM node_edges WHERE parent_id = ?"
            " ORDER BY ordinal", (node_id,)).fetchall():
        out.extend([child_store] if child_store is not None else _descendants(db, child_node))
    return out


def test_model_recovers_a_compacted_fact_with_grep_then_expand(trove_host):
    fact = "The staging database listens on port 6543 behind pgbouncer-east."
    server = trove_host.server

    def responder(body):
        messages = body.get("messages", [])
        if not hk.is_main_request(body):
            return hk.Reply(text="- summary: earlier setup discussion.")
        last = messages[-1]
        if last.get("role") == "tool":
            result = json.loads(last["content"])
            if "results" in result:  # trove_grep answered: expand the best hit
                return hk.ToolCall("trove_expand", result["results"][0]["expand"]["args"])
            return hk.Reply(text="Found it in the archive.")
        text = last.get("content") if isinstance(last.get("content"), str) else json.dumps(last)
        if "which port" in text:
            return hk.ToolCall("trove_grep", {"query": "staging database port"})
        return hk.Reply(text="Noted. " + "Filler sentence about unrelated work. " * 160)

    server.responder = responder
    agent = hk.make_agent()
    texts = [f"Setup note: {fact}"] + [f"Unrelated task {i}: refactor module_{i}." for i in range(30)]
    results = hk.run_turns(agent, texts)
    engine = hk.live_engine(agent)
    assert engine.compression_count >= 1
    final = hk.run_turns(agent, ["Remind me: which port does the staging database use?"],
                         history=results[-1]["messages"])[0]
    main = server.main_bodies
    asked = next(i for i, b in enumerate(main) if "which port" in json.dumps(b["messages"][-1]))
    assert fact not in json.dumps(main[asked]["messages"])  # compacted out of the prompt
    tool_results = [m for m in final["messages"] if m.get("role") == "tool"]
    names = [m.get("name") or m.get("tool_name") for m in tool_results[-2:]]
    assert names == ["trove_grep", "trove_expand"]
    assert "6543" in tool_results[-1]["content"] and "pgbouncer-east" in tool_results[-1]["content"]
    assert final["final_response"] == "Found it in the archive."


def test_real_agent_folds_old_summaries_and_keeps_them_in_the_prompt(tmp_path, fake_llm):
    """A long session in the real host: condensation stops at depth 1 here, so the
    frontier outgrows the summary block and the oldest summaries must be folded into
    an overview (depth 2 or more) that stays in the prompt, lineage exact."""
    settings = {"incremental_max_depth": 1, "condense_fanout": 2, "leaf_chunk_tokens": 1500}
    home = hk.make_hermes_home(tmp_path, fake_llm.port, extra_config={"trove": settings})
    calls = Counter()

    def responder(body):
        if hk.is_main_request(body):
            return long_answer(body)
        calls["summary"] += 1  # long enough that the summaries fill the block
        return hk.Reply(text=f"- summary {calls['summary']}: " + "the user asked about "
                        "modules and retry settings; answers gave each key. " * 14)

    with hk.host_env(home) as env:
        fake_llm.responder = responder
        agent = hk.make_agent()
        engine = hk.live_engine(agent)
        assert engine.config.incremental_max_depth == 1
        texts = [f"Question {i}: tell me about module_{i} and its retry setting."
                 for i in range(TURNS_TO_FOLD)]
        hk.run_turns(agent, texts)
        for body in fake_llm.main_bodies:
            assert hk.estimate_prompt_tokens(body) < WINDOW
        db = sqlite3.connect(home / "trove.db")
        users = Counter(r[0] for r in db.execute("SELECT content FROM messages WHERE role = 'user'"))
        assert all(users[text] == 1 for text in texts)
        assert db.execute("SELECT count(*) FROM nodes WHERE depth >= 2").fetchone()[0], \
            "expected a fold above TROVE_INCREMENTAL_MAX_DEPTH"
        frontier = engine.dag.frontier(engine.canonical_id)
        sent = json.dumps(fake_llm.main_bodies[-1]["messages"])
        assert all(f"## node {n['node_id']} " in sent for n in frontier)
        first = db.execute("SELECT min(store_id) FROM messages").fetchone()[0]
        assert frontier[0]["first_store_id"] == first and frontier[0]["depth"] >= 2
        covered = [s for n in frontier for s in engine.dag.descendant_store_ids(n["node_id"])]
        assert covered == list(range(first, first + len(covered)))
        db.close()
    assert not env.blocked


TURNS_TO_FOLD = 48


def test_stored_token_counts_are_tiktoken_counts_whichever_counter_runs(trove_host):
    """Inside the real host the optional rs-bpe counter (installed with the test
    requirements) counts, and every stored row holds exactly tiktoken's count."""
    pytest.importorskip("rs_bpe")
    from hermes_trove.compaction.tokens import TokenCounter

    trove_host.server.responder = long_answer
    agent = hk.make_agent()
    engine = hk.live_engine(agent)
    texts = ["Question 1: naïve façade — 日本語 and 👍🏽 in one line?",
             "Question 2: what about   runs of spaces\n\n\tand tabs?"]
    results = hk.run_turns(agent, texts)
    hk.end_session(agent, results[-1]["messages"])
    inspect = json.loads(engine.handle_tool_call("trove_inspect", {}, messages=[]))
    assert inspect["status"]["token_counter"]["accelerator"] == {"package": "rs-bpe",
                                                                "used": True}
    plain = TokenCounter(engine.config.token_encoding, cache_size=0, accelerate=False)
    stored = {m["content"]: m["token_count"]
              for m in engine.store.session_messages(engine.canonical_id)}
    shown = [m for m in results[-1]["messages"] if m.get("role") in ("user", "assistant")]
    assert shown and all(stored[m["content"]] == plain.count_message(m) for m in shown)


def test_iso_timestamps_of_a_handed_history_are_message_times(tmp_path, fake_llm,
                                                               process_zone):
    """Issue 25: the gateway mirror and slash-command notes stamp messages with
    ``datetime.now().isoformat()``; a history carrying them, handed to the real host,
    is stored with those times, not the ingest time. A naive one is the host process's
    local time (its writer's zone), whatever ``TROVE_TIMEZONE`` says."""
    from datetime import datetime, timezone
    process_zone("Asia/Tokyo")   # the host machine's zone
    home = hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"trove": {"timezone": "Europe/Paris"}})
    with hk.host_env(home) as env:
        fake_llm.responder = lambda body: hk.Reply(text="Noted.")
        history = [
            {"role": "user", "content": "mirror note naive", "timestamp": "2026-12-01T18:00:00"},
            {"role": "assistant", "content": "ack one", "timestamp": "2026-12-01T10:00:00+01:00"},
            {"role": "user", "content": "slash note zulu", "timestamp": "2026-12-01T09:00:00Z"},
            {"role": "assistant", "content": "ack two", "timestamp": 1796115600000},
        ]
        agent = hk.make_agent()
        hk.run_turns(agent, ["and now?"], history=history)
        engine = hk.live_engine(agent)
        session = engine.canonical_id
    db = sqlite3.connect(home / "trove.db")
    try:
        times = dict(db.execute("SELECT content, message_at FROM messages WHERE session_id = ?",
                                (session,)).fetchall())
    finally:
        db.close()
    nine = datetime(2026, 12, 1, 9, tzinfo=timezone.utc).timestamp()
    assert times["mirror note naive"] == nine        # 18:00 in Tokyo
    assert times["ack one"] == times["slash note zulu"] == times["ack two"] == nine
    assert not env.blocked
