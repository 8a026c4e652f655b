"""Background preparation inside the real hermes-agent 0.19.0 host (fake model on 127.0.0.1)."""
import sqlite3
import time
from collections import Counter

import pytest

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)
from test_host_engine import WINDOW, long_answer

pytestmark = pytest.mark.host


def test_real_agent_prepares_in_the_background_and_stays_lossless(tmp_path, fake_llm):
    settings = {"background_prepare_share": 0.5, "leaf_chunk_tokens": 1500,
                "fresh_tail_count": 8, "condense_fanout": 2}
    home = hk.make_hermes_home(tmp_path, fake_llm.port, extra_config={"trove": settings})
    with hk.host_env(home) as env:
        fake_llm.responder = long_answer
        agent = hk.make_agent()
        engine = hk.live_engine(agent)
        assert engine.config.background_prepare_share == 0.5
        texts = [f"Question {i}: tell me about module_{i} and its retry setting."
                 for i in range(30)]
        history = None
        used = 0
        for text in texts:
            result = hk.run_turns(agent, [text], history=history)[-1]
            history = result["messages"]
            used += engine.last_compaction.get("prepared_used", 0) or 0
            time.sleep(0.05)  # the user reads the answer; the worker works
        status = engine.get_status()["background_prepare"]
        assert status["runs"] >= 1 and status["prepared"] >= 1 and not status["errors"]
        assert used >= 1, "no compaction used a prepared summary"
        for body in fake_llm.main_bodies:
            assert hk.estimate_prompt_tokens(body) < WINDOW
        db = sqlite3.connect(home / "trove.db")
        users = Counter(r[0] for r in db.execute("SELECT content FROM messages WHERE role = 'user'"))
        assert all(users[text] == 1 for text in texts)
        covered = [r[0] for r in db.execute("SELECT child_store_id FROM node_edges"
                                            " WHERE child_store_id IS NOT NULL")]
        assert len(covered) == len(set(covered))
        # merges (some prepared ahead) keep the lineage exact: one parent per node, children
        # one level down, in coverage order
        parents = Counter(r[0] for r in db.execute("SELECT child_node_id FROM node_edges"
                                                   " WHERE child_node_id IS NOT NULL"))
        assert parents and max(parents.values()) == 1
        for parent, depth in db.execute("SELECT node_id, depth FROM nodes WHERE depth > 0"):
            kids = db.execute("SELECT n.depth, n.first_store_id FROM node_edges e JOIN nodes n"
                              " ON n.node_id = e.child_node_id WHERE e.parent_id = ?"
                              " ORDER BY e.ordinal", (parent,)).fetchall()
            assert max(k[0] for k in kids) == depth - 1
            assert [k[1] for k in kids] == sorted(k[1] for k in kids)
        db.close()
    assert not env.blocked
