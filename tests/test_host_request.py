"""What trove adds to the requests the real Hermes 0.19.0 host sends (issue 27): the fake
OpenAI server records every request, and these tests read the trove tools and the recall
policy out of them."""
import json

import pytest

import hostkit as hk
from hostkit import fake_llm, trove_host  # noqa: F401 (fixtures)
from hermes_trove import config
from hermes_trove.compaction import tokens

pytestmark = pytest.mark.host

SCHEMA_TOKEN_BUDGET = 1500
POLICY_TOKEN_BUDGET = 120
COUNTER = tokens.get_counter("cl100k_base")


def trove_tools(body: dict) -> list[dict]:
    """The trove_* entries of a request's ``tools``, as the host sent them."""
    return [t for t in body.get("tools") or []
            if t.get("function", {}).get("name", "").startswith("trove_")]


def user_texts(body: dict) -> list[str]:
    return [hk._content_text(m.get("content")) for m in body["messages"] if m["role"] == "user"]


def policy() -> str:
    return hk.plugin_module("hermes-trove").recall_policy()


def test_defaults_send_thirteen_small_schemas_and_the_policy_once(trove_host):
    server = trove_host.server
    agent = hk.make_agent()
    hk.run_turns(agent, ["hello there", "and a second question", "and a third one"])
    first, last = server.main_bodies[0], server.main_bodies[-1]

    sent = trove_tools(first)
    names = [t["function"]["name"] for t in sent]
    assert names == [n for n in config.KNOWN_TOOLS
                     if n not in ("trove_query_state", "trove_retrieve")]
    assert names == sorted(agent._context_engine_tool_names, key=names.index)
    wire = json.dumps(sent, ensure_ascii=False, separators=(",", ":"))
    assert COUNTER.exact and COUNTER.count_text(wire) <= SCHEMA_TOKEN_BUDGET
    assert trove_tools(last) == sent                      # the same bytes on every request

    text = policy()
    assert 0 < COUNTER.count_text(text) <= POLICY_TOKEN_BUDGET
    assert user_texts(first)[-1].endswith(text)           # appended to the user turn
    # the host re-sends each turn's injected text with that turn: one copy is enough
    assert sum(t.count(text) for t in user_texts(last)) == 1
    assert [u for u in user_texts(last) if text in u][0].startswith("hello there")
    assert not trove_host.blocked


def test_a_minimal_surface_sends_three_tools_and_hides_the_rest(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port, extra_config={
        "trove": {"exposed_tools": ["trove_grep", "trove_expand", "trove_recall"]}})
    fake_llm.responder = hk.scripted(hk.ToolCall("trove_status", {}), "done")
    with hk.host_env(home) as env:
        agent = hk.make_agent()
        hk.run_turns(agent, ["what is the context pressure?"])
        bodies = fake_llm.main_bodies
        assert [t["function"]["name"] for t in trove_tools(bodies[0])] == [
            "trove_grep", "trove_expand", "trove_recall"]
        assert user_texts(bodies[0])[-1].endswith(policy())   # the three it names are there
        # The model asked for a hidden tool: the host never routes it to the engine...
        answer = [m for m in bodies[-1]["messages"] if m["role"] == "tool"][-1]
        assert "TROVE_EXPOSED_TOOLS" not in answer["content"]
        assert "trove_status" in answer["content"]
        # ...and a call that does reach the engine (an older tool list) gets a clear error.
        engine = hk.live_engine(agent)
        error = json.loads(engine.handle_tool_call("trove_status", {}, messages=[]))
        assert "TROVE_EXPOSED_TOOLS" in error["error"] and error["tool"] == "trove_status"
    assert not env.blocked


def test_no_policy_where_trove_does_not_store_the_session(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port, extra_config={
        "trove": {"ignore_session_patterns": ["*"]}})
    with hk.host_env(home) as env:
        agent = hk.make_agent()
        hk.run_turns(agent, ["hello there"])
        assert hk.live_engine(agent).session_mode == "ignored"
        assert all(policy() not in t for t in user_texts(fake_llm.main_bodies[-1]))
    assert not env.blocked


def test_the_skill_the_policy_points_to_opens_with_the_argument_details(trove_host):
    text = policy()
    skill = text.rsplit("skill ", 1)[1].rstrip(".")        # "hermes-trove:hermes-trove"
    trove_host.server.responder = hk.scripted(hk.ToolCall("skill_view", {"name": skill}), "ok")
    agent = hk.make_agent()
    hk.run_turns(agent, ["what port did we pick earlier?"])
    answer = [m for m in trove_host.server.main_bodies[-1]["messages"] if m["role"] == "tool"][-1]
    content = json.loads(answer["content"])
    assert content["success"] is True, content
    # what left the schemas' descriptions is in the skill the model can open
    for words in ("## Arguments", "session_scope", "time_from", "include_exact_ref",
                  "source_offset", "trove_compute"):
        assert words in content["content"], words
