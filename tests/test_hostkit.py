"""Tests for tests/hostkit.py: the fake OpenAI server and the real Hermes 0.19.0 host driven offline.

The engine under test here is hostkit's probe plugin (written to tmp_path), never the repo's plugin.
"""
import json
import logging
import urllib.error
import urllib.request

import pytest

import hostkit as hk
from hostkit import fake_llm  # noqa: F401  (pytest fixture)

pytestmark = pytest.mark.host


# ---------------------------------------------------------------------------
# fake server alone
# ---------------------------------------------------------------------------

def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type"), resp.read().decode()


def test_fake_server_speaks_openai(fake_llm):
    fake_llm.responder = hk.scripted("hello world", [hk.ToolCall("trove_grep", {"query": "x"})], then="after")
    base = fake_llm.base_url

    with urllib.request.urlopen(base + "/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "fake-model"

    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "a" * 400}]}
    status, ctype, text = _post(base + "/chat/completions", body)
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "hello world"
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == hk.estimate_prompt_tokens(body) == 100
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    _, _, text = _post(base + "/chat/completions", body)
    chunks = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: {")]
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "trove_grep"
    assert json.loads("".join(tc["function"].get("arguments") or "" for tc in calls)) == {"query": "x"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"

    # non-streaming JSON (the auxiliary call_llm path) does not consume the script
    _, ctype, text = _post(base + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "s"}]})
    data = json.loads(text)
    assert ctype == "application/json" and data["choices"][0]["message"]["content"] == "after"
    assert data["usage"]["prompt_tokens"] == 1

    fake_llm.responder = lambda b: hk.Reply(text="x", prompt_tokens=54321)
    _, _, text = _post(base + "/chat/completions", {"messages": []})
    assert json.loads(text)["usage"]["prompt_tokens"] == 54321

    with pytest.raises(urllib.error.HTTPError) as err:
        _post(base.replace("/v1", "") + "/api/show", {"name": "fake-model"})
    assert err.value.code == 404
    assert [r["path"] for r in fake_llm.requests][-1] == "/api/show"
    assert len(fake_llm.main_bodies) == 2 and len(fake_llm.aux_bodies) == 2


def test_fake_server_binds_loopback_only(fake_llm):
    assert fake_llm._httpd.server_address[0] == "127.0.0.1"


# ---------------------------------------------------------------------------
# the real host with the probe plugin
# ---------------------------------------------------------------------------

@pytest.fixture
def probe_host(tmp_path, fake_llm):
    """Fake model + HERMES_HOME with the probe plugin + an isolated, reset host."""
    probe_dir = hk.write_probe_plugin(tmp_path / "probe_src", name="trove-probe")
    home = hk.make_hermes_home(tmp_path, fake_llm.port, plugin_dir=probe_dir)
    with hk.host_env(home) as env:
        env.server = fake_llm
        env.probe = hk.plugin_module("trove-probe")  # the host's copy of the probe package
        yield env
    assert not env.blocked, f"host tried to reach the network: {env.blocked}"


def test_host_loads_probe_and_selects_it(probe_host, fake_llm):
    probe = probe_host.probe
    entry = hk.plugin_loaded("trove-probe")
    assert entry["enabled"] and entry["error"] is None

    agent = hk.make_agent()
    assert hk.uses_plugin_engine(agent, "trove", plugin_name="trove-probe")
    engine = hk.live_engine(agent)
    assert engine.is_template is False and hk.template_engine().is_template is True

    [result] = hk.run_turns(agent, ["hello probe"])
    assert result["final_response"] == "ok"
    assert fake_llm.main_bodies, "the host never called the fake model"

    methods = [c["method"] for c in probe.CALLS]
    assert methods[:6] == ["__init__", "register", "__deepcopy__", "update_model", "get_tool_schemas", "on_session_start"]
    assert "update_from_response" in methods and "compress" not in methods
    start = probe.calls("on_session_start")[0]
    assert start["session_id"] == agent.session_id
    assert set(start["kw"]) == {"hermes_home", "platform", "model", "context_length", "conversation_id"}
    assert start["kw"]["platform"] == "cli" and start["kw"]["context_length"] == 65536
    um = probe.calls("update_model")[0]
    assert um["context_length"] == 65536 and um["model"] == "fake-model"
    assert um["provider"] == "custom" and um["api_mode"] == "chat_completions"
    assert um["base_url"].startswith(fake_llm.base_url) and um["api_key_is_callable"] is False

    first = fake_llm.main_bodies[0]
    assert first["messages"][0]["role"] == "system"
    assert first["messages"][-1]["content"] == "hello probe\n\n" + probe.PROBE_CONTEXT  # pre_llm_call context
    assert "probe_echo" in [t["function"]["name"] for t in first["tools"]]
    usage = probe.calls("update_from_response")[0]["usage"]
    assert usage["prompt_tokens"] == hk.estimate_prompt_tokens(first)


def test_tool_call_round_trip_and_hooks(probe_host, fake_llm):
    fake_llm.responder = hk.tool_then_text("probe_echo", {"text": "ping"}, "pong received")
    probe = probe_host.probe
    agent = hk.make_agent()
    r1, r2 = hk.run_turns(agent, ["use the tool", "again"])
    assert r2["final_response"] == "pong received"

    [call1, call2] = probe.calls("handle_tool_call")
    assert call1["name"] == "probe_echo" and call1["args"] == {"text": "ping"} and call1["kw_keys"] == ["messages"]
    tool_msgs = [m for m in r2["messages"] if m["role"] == "tool"]
    assert json.loads(tool_msgs[0]["content"])["echo"] == "ping"
    assert tool_msgs[0]["name"] == "probe_echo" and tool_msgs[0]["tool_call_id"]
    # the tool result went back to the model
    assert fake_llm.main_bodies[1]["messages"][-1]["role"] == "tool"

    kinds = [h[0] for h in probe.HOOKS]
    assert kinds == ["pre_llm_call", "post_llm_call", "on_session_end"] * 2
    post = [h[1] for h in probe.HOOKS if h[0] == "post_llm_call"][-1]
    assert post["assistant_response"] == "pong received" and post["conversation_history"]["len"] == 8
    pre = [h[1] for h in probe.HOOKS if h[0] == "pre_llm_call"]
    assert pre[0]["is_first_turn"] is True and pre[1]["is_first_turn"] is False
    # engine on_session_end is NOT called per turn
    assert probe.calls("on_session_end") == []
    hk.end_session(agent, r2["messages"])
    assert probe.calls("on_session_end")[-1]["n_messages"] == 8


def test_forced_compaction_calls_probe_compress(probe_host, fake_llm):
    probe = probe_host.probe
    agent = hk.make_agent()
    [r1] = hk.run_turns(agent, ["first question"])
    engine = hk.live_engine(agent)
    engine.threshold_tokens = 1       # everything is over the trigger now...
    engine.compress_once = True       # ...until the first compress()
    [r2] = hk.run_turns(agent, ["second question"], history=r1["messages"])

    [comp] = probe.calls("compress")
    seen = comp["messages"]
    assert [m["role"] for m in seen] == ["user", "assistant", "user"]  # no system prompt
    assert seen[-1]["content"] == "second question" and "api_content" not in seen[-1]
    assert "api_content" in seen[0] and any(k.startswith("_") for k in seen[0])  # _db_persisted
    assert comp["force"] is False and comp["current_tokens"] > 10000

    after = [c["method"] for c in probe.CALLS[probe.CALLS.index(comp):]]
    assert after[:3] == ["compress", "on_session_end", "on_session_start"]
    boundary = probe.calls("on_session_start")[-1]
    assert boundary["kw"]["boundary_reason"] == "compression"
    assert boundary["session_id"] == boundary["kw"]["old_session_id"] == agent.session_id  # in_place
    assert engine.compression_count == 1
    assert r2["messages"][0]["content"] == "[probe summary of 3 messages]"
    assert fake_llm.main_bodies[-1]["messages"][1]["content"] == "[probe summary of 3 messages]"


def test_manual_compress_passes_focus_and_force(probe_host):
    probe = probe_host.probe
    agent = hk.make_agent(session_db=False)
    [r1] = hk.run_turns(agent, ["one"])
    compressed = hk.manual_compress(agent, r1["messages"], focus="databases")
    [comp] = probe.calls("compress")
    assert comp["force"] is True and comp["focus_topic"] == "databases"
    assert [m["role"] for m in comp["messages"]] == ["user", "assistant"]  # no system prompt here either
    assert compressed[0]["content"].startswith("[probe summary")
    assert probe.calls("on_session_end") == []  # no session DB: no end call before compaction


def test_each_agent_gets_its_own_deep_copy(probe_host):
    a, b = hk.make_agent(session_db=False), hk.make_agent(session_db=False)
    ea, eb = hk.live_engine(a), hk.live_engine(b)
    assert ea is not eb and hk.template_engine() not in (ea, eb)
    assert len(probe_host.probe.calls("__deepcopy__")) == 2


def test_slash_command_and_skill(probe_host):
    from hermes_cli.plugins import get_plugin_manager

    assert hk.run_slash_command("trove", "status now") == "probe:status now"
    assert probe_host.probe.HOOKS[-1] == ("command", "status now")
    assert probe_host.probe.REGISTER_INFO["register_skill"] == "ok"
    assert get_plugin_manager().find_plugin_skill("trove-probe:probe-skill").name == "SKILL.md"


def test_fresh_plugin_load_per_env(tmp_path, fake_llm):
    seen = []
    for i in range(2):
        probe_dir = hk.write_probe_plugin(tmp_path / f"src{i}", name="trove-probe")
        home = hk.make_hermes_home(tmp_path / f"t{i}", fake_llm.port, plugin_dir=probe_dir)
        with hk.host_env(home) as env:
            mod = hk.plugin_module("trove-probe")
            agent = hk.make_agent(session_db=False)
            assert hk.uses_plugin_engine(agent)
            start = mod.calls("on_session_start")[0]
            seen.append((id(mod), mod.__file__, start["kw"]["hermes_home"]))
            assert [c["method"] for c in mod.CALLS].count("register") == 1
        assert "hermes_plugins.trove_probe" not in __import__("sys").modules
    assert seen[0][0] != seen[1][0]
    assert seen[0][2] != seen[1][2] and seen[1][2] == str(tmp_path / "t1" / "hermes_home")


def test_fallback_to_builtin_when_plugin_not_enabled(tmp_path, fake_llm, caplog):
    probe_dir = hk.write_probe_plugin(tmp_path / "src", name="trove-probe")
    home = hk.make_hermes_home(tmp_path, fake_llm.port, plugin_dir=probe_dir,
                               extra_config={"plugins": {"enabled": []}})
    with hk.host_env(home):
        caplog.set_level(logging.WARNING, logger="run_agent")
        agent = hk.make_agent(session_db=False)
        from agent.context_compressor import ContextCompressor

        assert isinstance(hk.live_engine(agent), ContextCompressor)
        assert not hk.uses_plugin_engine(agent)
        assert hk.plugin_loaded("trove-probe")["enabled"] is False
    assert "Context engine 'trove' not found — falling back to built-in compressor" in caplog.text
