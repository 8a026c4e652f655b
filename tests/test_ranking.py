"""Ranking rules: the sender's name as a field, raw evidence first, score fusion."""
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_trove import tools
from hermes_trove.compaction import tokens
from hermes_trove.config import load_config
from hermes_trove.dag import Dag, NewNode
from hermes_trove.recall import query_plan, ranking, search
from hermes_trove.storage.database import Database
from hermes_trove.store import Store

COUNTER = tokens.get_counter()


def test_speaker_of_reads_the_prefix_then_the_name_field():
    assert ranking.speaker_of({"role": "user"}, "[Caroline] I joined a choir") == (
        "Caroline", "I joined a choir")
    assert ranking.speaker_of({"role": "user", "tool_name": "Mel"}, "hi") == ("Mel", "hi")
    # a tool row's name is a tool, never a person
    assert ranking.speaker_of({"role": "tool", "tool_name": "terminal"}, "ok") == (None, "ok")
    assert ranking.speaker_of({"role": "user"}, "[x]no space") == (None, "[x]no space")


def _db(tmp_path, messages, session="s"):
    db = Database(str(tmp_path / "t.db"))
    store, dag = Store(db), Dag(db)
    store.ensure_session(session)
    ids = store.ingest(session, messages).store_ids
    return db, store, dag, ids


def _ctx(store, dag, tmp_path, session="s"):
    return tools.ToolContext(store=store, dag=dag, config=load_config(environ={}, hermes_home=tmp_path),
                             count_tokens=COUNTER.count_text, session_id=session,
                             conversation_id=None, current_turn_store_id=store.last_store_id() + 1,
                             status=dict, llm_call=None, data_dir=tmp_path)


def test_a_question_naming_a_person_prefers_that_persons_turns(tmp_path):
    messages = [{"role": "user", "content": "[Mel] Wow Caroline, your pottery looks great!"},
                {"role": "user", "content": "[Caroline] I love my new pottery class."},
                {"role": "user", "content": "Caroline, pottery again?", "name": "Mel"},
                {"role": "user", "content": "pottery is my weekend thing", "name": "Caroline"}]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        out = json.loads(tools.dispatch("trove_grep", {"query": "What does Caroline say about "
                                                       "pottery?", "explain": True},
                                        _ctx(store, dag, tmp_path)))
        top = [r["store_id"] for r in out["results"][:2]]
        assert set(top) == {ids[1], ids[3]}
        assert out["results"][0]["score_parts"]["speaker_bonus"] > 0
    finally:
        db.close()


def test_summaries_do_not_crowd_out_the_turns_under_them(tmp_path):
    messages = [{"role": "user", "content": f"filler line number {i} about nothing"}
                for i in range(6)]
    messages[2] = {"role": "user", "content": "the harbour photo won second prize"}
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        dag.add_node(NewNode("s", 0, "they talked: the harbour photo won second prize", 10,
                             100, 1, "m", child_store_ids=ids))
        out = json.loads(tools.dispatch("trove_grep", {"query": "harbour photo prize"},
                                        _ctx(store, dag, tmp_path)))
        kinds = [r["kind"] for r in out["results"]]
        assert kinds[0] == "message" and out["results"][0]["store_id"] == ids[2]
        assert kinds == ["message", "summary"]     # the summary adds nothing: after the raw hit
    finally:
        db.close()


def test_place_summaries_keeps_a_summary_that_adds_a_concept(tmp_path):
    db = Database(str(tmp_path / "t.db"))
    try:
        order = [("n", 1), ("m", 10), ("n", 2), ("m", 11)]
        matched = {("n", 1): ["lisbon", "trip"], ("m", 10): ["trip"], ("n", 2): ["trip"],
                   ("m", 11): ["trip"]}
        texts = {("m", 10): "a trip", ("m", 11): "another trip"}
        placed = ranking.place_summaries(order, matched, 5, Dag(db), texts)
        assert placed == [("n", 1), ("m", 10), ("m", 11), ("n", 2)]
    finally:
        db.close()


def test_place_summaries_moves_word_for_word_repeats_last(tmp_path):
    db = Database(str(tmp_path / "t.db"))
    try:
        order = [("m", 1), ("m", 2), ("m", 3)]
        texts = {("m", 1): "same  words", ("m", 2): "same words", ("m", 3): "other"}
        placed = ranking.place_summaries(order, {}, 5, Dag(db), texts)
        assert placed == [("m", 1), ("m", 3), ("m", 2)]
    finally:
        db.close()


scored = st.lists(st.tuples(st.integers(0, 30), st.floats(0, 100)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(a=scored, b=scored)
def test_score_fusion_keeps_every_key_once_and_orders_a_single_arm(a, b):
    a = list({k: s for k, s in a}.items())
    b = list({k: s for k, s in b}.items())
    fused = ranking.fuse_arms({"a": sorted(a, key=lambda p: -p[1]),
                               "b": sorted(b, key=lambda p: -p[1])},
                              families={"a": "t", "b": "t"})
    keys = [k for k, _, _ in fused]
    assert sorted(keys) == sorted({k for k, _ in a + b})
    assert all(0.0 <= s <= 1.0 for _, s, _ in fused)
    single = ranking.fuse_arms({"a": sorted(a, key=lambda p: -p[1])})
    best = {k: s for k, s in a}
    values = [best[k] for k, _, _ in single]
    assert values == sorted(values, reverse=True)


def test_score_fusion_adds_families_with_weights():
    fused = ranking.fuse_arms({"text": [("x", 9.0), ("y", 1.0)], "vec": [("y", 0.9), ("x", 0.1)]},
                              weights={"text": 0.4, "vec": 0.6})
    assert [k for k, _, _ in fused] == ["y", "x"]


def test_recall_finds_what_grep_finds_in_this_session(tmp_path):
    """Other sessions full of the same words must not push this session's turn out."""
    db = Database(str(tmp_path / "t.db"))
    try:
        store, dag = Store(db), Dag(db)
        store.ensure_session("s")
        own = store.ingest("s", [{"role": "user", "content": "the harbour photo came second"}])
        for other in range(3):
            store.ensure_session(f"o{other}")
            store.ingest(f"o{other}", [{"role": "user",
                                        "content": f"harbour photo contest entry {i}"}
                                       for i in range(250)])
        ctx = _ctx(store, dag, tmp_path)
        grep = json.loads(tools.dispatch("trove_grep", {"query": "harbour photo"}, ctx))
        recall = json.loads(tools.dispatch("trove_recall", {"query": "harbour photo"}, ctx))
        assert grep["results"][0]["store_id"] == own.store_ids[0]
        assert recall["results"][0]["store_id"] == own.store_ids[0]
    finally:
        db.close()
