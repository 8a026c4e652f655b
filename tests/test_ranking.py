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


def _ctx(store, dag, tmp_path, session="s", config=None, found=None):
    config = config or load_config(environ={}, hermes_home=tmp_path)
    return tools.ToolContext(store=store, dag=dag, config=config,
                             count_tokens=COUNTER.count_text, session_id=session,
                             conversation_id=None, current_turn_store_id=store.last_store_id() + 1,
                             status=dict, llm_call=None, data_dir=tmp_path, semantic=found)


def _embedded(db, tmp_path, fake):
    """A config and ``Semantic`` over the fake server's embeddings, every row embedded."""
    from hermes_trove.recall import embeddings, semantic
    config = load_config(environ={
        "TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
        "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url},
        hermes_home=tmp_path)
    state = embeddings.open_provider(config)
    semantic.backfill(db, state.provider, config, apply=True)
    return config, semantic.Semantic(db, config, state)


def _hybrid_ids(ctx, query, limit):
    """The store ids ``trove_grep`` lists for ``query``, checking it ran hybrid."""
    out = json.loads(tools.dispatch("trove_grep", {"query": query, "limit": limit}, ctx))
    assert out["mode"] == "hybrid"
    return [r["store_id"] for r in out["results"]]


def _grep_best(store, dag, tmp_path, query: str) -> tuple[dict, dict]:
    """``trove_grep`` with ``explain`` and the full-text arm's first hit."""
    out = json.loads(tools.dispatch("trove_grep", {"query": query, "explain": True},
                                    _ctx(store, dag, tmp_path)))
    best = next(r for r in out["results"] if r["score_parts"]["ranks"].get("messages") == 1)
    return out, best


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


def test_plain_turns_name_the_person_the_other_role_addresses(tmp_path):
    """Plain user/assistant turns: the assistant calls the user Caroline, so the user's
    turn about the support group outscores the assistant's question that names her (in
    the full-text arm; the context arm then lifts each beside the other)."""
    messages = [{"role": "assistant", "content": "Hey Caroline, good to see you!"},
                {"role": "user", "content": "You too. Busy week."},
                {"role": "assistant", "content": "Thanks Caroline, talk soon."},
                {"role": "user", "content": "Bye for now."},
                {"role": "assistant", "content": "Caroline, how was the support group?"},
                {"role": "user", "content": "The support group was so powerful, everyone shared."},
                {"role": "assistant", "content": "Morning Caroline!"}]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        query = "What did Caroline say about the support group?"
        out, best = _grep_best(store, dag, tmp_path, query)
        assert best["store_id"] == ids[5] and best["score_parts"]["speaker_bonus"] > 0
        assert {r["store_id"] for r in out["results"][:2]} == {ids[4], ids[5]}
        # a lower-case query names nobody: the address turn matches more words and wins
        assert _grep_best(store, dag, tmp_path, query.lower())[1]["store_id"] == ids[4]
    finally:
        db.close()


def test_addressed_roles_needs_a_name_one_role_uses_and_the_other_does_not():
    assert ranking.proper_names("When did Caroline go? Did Mel see LGBTQ events") == {
        "caroline", "mel"}
    hey = [("assistant", "Hey Caroline!"), ("assistant", "thanks, Caroline"),
           ("assistant", "Caroline, how was it?"), ("user", "I told Caroline about it")]
    told = [("user", "I love Japan"), ("user", "Japan, the food!"), ("user", "back to Japan"),
            ("user", "in Japan, it rains")]
    both = [("user", "hi Mel"), ("assistant", "hi Mel"), ("user", "bye Mel"),
            ("assistant", "bye Mel"), ("user", "thanks Mel")]
    assert ranking.addressed_roles({"caroline": ("caroline", hey), "japan": ("japan", told),
                                    "mel": ("mel", both)}) == {"user": {"caroline"}}


def test_a_short_form_written_as_an_address_names_the_other_role():
    assert ranking.short_forms("melanie") == ["mel", "mela", "melan", "melani"]
    assert ranking.short_forms("andrew") == ["andr", "andre"]      # "and" is a stop word
    assert ranking.short_forms("sam") == []
    assert ranking.addresses("mel", "Hey Mel! How are you?", cased=True)
    assert ranking.addresses("mel", "Thanks, Mel.", cased=True)
    assert not ranking.addresses("mel", "hey mel", cased=True)          # not written as a name
    assert not ranking.addresses("mel", "the snow will melt, Melvin", cased=True)
    hey = [("user", "Hey Mel! Good to see you"), ("user", "Thanks, Mel!"),
           ("user", "Mel, how was the trip?"), ("assistant", "I made a melody")]
    assert ranking.addressed_roles({"melanie": (["mel", "mela"], hey)}, cased=True) == {
        "assistant": {"melanie"}}
    # lower-case "mel" is not read as a short form
    low = [(role, text.lower()) for role, text in hey]
    assert ranking.addressed_roles({"melanie": (["mel"], low)}, cased=True) == {}


def test_plain_turns_name_the_person_addressed_by_a_short_form(tmp_path):
    """The user calls the assistant "Mel" and never "Melanie": a question about
    Melanie still prefers the assistant's turn about pottery over the user's."""
    said = ["Hey Mel! Good to see you!", "You too! Busy with the kids.",
            "Thanks, Mel, for the tip.", "Any time.", "Mel, how was the weekend?",
            "I finished a pottery bowl, so proud.", "I should try pottery class one day."]
    messages = [{"role": ("user", "assistant")[i % 2], "content": text}
                for i, text in enumerate(said)]
    db, store, dag, ids = _db(tmp_path, messages)
    query = "What pottery did Melanie make?"
    try:
        out, best = _grep_best(store, dag, tmp_path, query)
        assert best["store_id"] == ids[5] and best["score_parts"]["speaker_bonus"] > 0
        assert "melanie" in out["stages"]["speakers"]["assistant"]
        # addressed only in lower case: no short form is read, the speaker is unknown
        for m in messages:
            m["content"] = m["content"].replace("Mel", "mel")
    finally:
        db.close()
    db, store, dag, ids = _db(tmp_path / "lower", messages)
    try:
        out, _ = _grep_best(store, dag, tmp_path, query)
        assert all(r["score_parts"].get("speaker_bonus", 0) == 0 for r in out["results"])
        assert "speakers" not in out["stages"]
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
        # the summary adds nothing: after the raw hit (and after the turns around it,
        # which the context arm lists below the hit)
        assert kinds.count("summary") == 1 and kinds[-1] == "summary"
        assert {r["store_id"] for r in out["results"][1:-1]} <= {ids[1], ids[3]}
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


def _filler(n, start=0):
    return [{"role": "user" if i % 2 else "assistant",
             "content": f"small talk number {i} about the weather and classes"}
            for i in range(start, start + n)]


def test_full_text_lists_matches_only_and_context_lifts_a_match_beside_a_better_one(
        tmp_path, monkeypatch):
    """Two turns match the same two words; the one right after the question's best
    match is the likelier answer, so it ranks first (without context the newer wins)."""
    from hermes_trove.recall import arms
    messages = _filler(10) + [
        {"role": "user", "content": "Any hiking trail near Moab you would recommend?"},
        {"role": "assistant", "content": "Moab trail Delicate Arch, at sunrise"},
        {"role": "user", "content": "Delicate Arch it is."},
    ] + _filler(10, 10) + [{"role": "assistant", "content": "Moab trail running race, at noon"}]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        beside, far, reply_to_reply = ids[11], ids[-1], ids[12]
        query = {"query": "Which hiking trail near Moab was recommended?"}
        out = json.loads(tools.dispatch("trove_grep", query, _ctx(store, dag, tmp_path)))
        order = [r["store_id"] for r in out["results"]]
        assert order[0] == ids[10] and order.index(beside) < order.index(far)
        assert reply_to_reply not in order          # no query word: full text never lists it
        monkeypatch.setattr(arms, "CONTEXT_WEIGHT", 0.0)
        out = json.loads(tools.dispatch("trove_grep", query, _ctx(store, dag, tmp_path)))
        order = [r["store_id"] for r in out["results"]]
        assert order.index(far) < order.index(beside)
    finally:
        db.close()


def test_full_text_fuses_past_the_page_so_context_lifts_a_reply_ranked_below_it(
        tmp_path, monkeypatch):
    """The reply shares one word with the question; on its own words five other turns
    rank above it, so a list cut at the page never holds it. Fused from a deeper list
    (``arms.FULL_TEXT_DEPTH``), the question turn beside it lifts it onto the page."""
    from hermes_trove.recall import arms
    others = [{"role": "assistant", "content": f"Moab trail report {i}: hiking closed"}
              for i in range(5)]
    messages = _filler(10) + [
        {"role": "user", "content": "Any hiking trail near Moab you would recommend?"},
        {"role": "assistant", "content": "Moab in May is hot, start at dawn"},
    ] + _filler(10, 10) + others + _filler(4, 20)
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        reply = ids[11]
        query = {"query": "Which hiking trail near Moab was recommended?", "limit": 4}

        def order():
            out = json.loads(tools.dispatch("trove_grep", query, _ctx(store, dag, tmp_path)))
            return [r["store_id"] for r in out["results"]]
        deep = order()
        monkeypatch.setattr(arms, "FULL_TEXT_DEPTH", 0)      # the page's own list only
        shallow = order()
        assert deep[0] == ids[10] and reply in deep
        assert reply not in shallow
    finally:
        db.close()


def test_hybrid_lists_the_reply_beside_a_hit_even_without_shared_words(tmp_path,
                                                                      monkeypatch):
    from fake_openai import FakeOpenAIServer
    from hermes_trove.recall import arms
    # the filler shares a word with the query (so its vectors are not orthogonal to it);
    # the reply shares none
    filler = [{"role": "user" if i % 2 else "assistant", "content": f"talk {i}: which was it"}
              for i in range(60)]
    messages = filler[:30] + [
        {"role": "user", "content": "Any hiking trail near Moab you would recommend?"},
        {"role": "assistant", "content": "Delicate Arch at sunrise, no contest."},
    ] + filler[30:]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        with FakeOpenAIServer() as fake:
            config, found = _embedded(db, tmp_path, fake)

            ctx = _ctx(store, dag, tmp_path, config=config, found=found)
            question = "Which hiking trail near Moab was recommended?"
            with_context = _hybrid_ids(ctx, question, 20)
            monkeypatch.setattr(arms, "CONTEXT_WEIGHT", 0.0)
            without = _hybrid_ids(ctx, question, 20)
        reply = ids[31]
        assert with_context[0] == ids[30] and reply in with_context[:5]
        assert reply not in without[:10]
    finally:
        db.close()


def test_neighbours_stay_in_their_session_and_skip_tool_rows(tmp_path):
    db = Database(str(tmp_path / "t.db"))
    try:
        store = Store(db)
        for session in ("a", "b"):
            store.ensure_session(session)
        first = store.ingest("a", [{"role": "user", "content": "one"},
                                   {"role": "assistant", "content": "two"}]).store_ids
        other = store.ingest("b", [{"role": "user", "content": "elsewhere"}]).store_ids
        rest = store.ingest("a", [{"role": "user", "content": "one"},
                                  {"role": "assistant", "content": "two"},
                                  {"role": "user", "content": "three"},
                                  {"role": "assistant", "content": "four"},
                                  {"role": "tool", "content": "log", "tool_call_id": "c1"},
                                  {"role": "user", "content": "five"}]).store_ids[2:]
        assert len(set(first + other + rest)) == 7
        found = store.neighbour_ids([first[1], other[0], rest[1]])
        assert found[first[1]] == (first[0], rest[0])
        assert found[other[0]] == (None, None)
        assert found[rest[1]] == (rest[0], rest[3])
    finally:
        db.close()


def test_a_date_in_the_question_prefers_that_days_turns(tmp_path):
    day = 86400.0
    old, new = 1_525_478_400.0 + 3600, 1_525_478_400.0 + 40 * day   # 2018-05-05, June
    messages = [{"role": "user", "content": "we went camping by the lake", "timestamp": old},
                {"role": "user", "content": "we went camping by the lake", "timestamp": new}]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        ctx = _ctx(store, dag, tmp_path)
        plain = json.loads(tools.dispatch("trove_grep", {"query": "camping by the lake"}, ctx))
        assert plain["results"][0]["store_id"] == ids[1]          # newest first on a tie
        dated = json.loads(tools.dispatch(
            "trove_grep", {"query": "On May 5, 2018: camping by the lake?"}, ctx))
        assert dated["results"][0]["store_id"] == ids[0]
        assert any("2018-05-05" in note for note in dated.get("notes", []))
        assert len(dated["results"]) == 2                           # a preference, not a filter
    finally:
        db.close()


def test_a_question_of_two_sentences_searches_each_by_its_own_vector(tmp_path):
    from fake_openai import FakeOpenAIServer
    from hermes_trove.recall import arms
    assert arms._clauses("Where is the trail near Moab?") == []
    assert arms._clauses("Where is the trail near Moab? Also, which cake did Jo bake?") == [
        "Where is the trail near Moab?", "Also, which cake did Jo bake?"]
    filler = [{"role": "user", "content": f"small talk number {i}"} for i in range(30)]
    messages = filler[:10] + [
        {"role": "user", "content": "the trail near Moab starts at the arch"},
    ] + filler[10:20] + [{"role": "assistant", "content": "Jo baked a carrot cake"}] + filler[20:]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        with FakeOpenAIServer() as fake:
            config, found = _embedded(db, tmp_path, fake)
            ctx = _ctx(store, dag, tmp_path, config=config, found=found)
            out = json.loads(tools.dispatch("trove_grep", {
                "query": "Where does the trail near Moab start? Also, which cake did Jo bake?",
                "mode": "semantic", "explain": True}, ctx))
        ranks = {r["store_id"]: r["score_parts"]["ranks"] for r in out["results"]}
        assert ranks[ids[10]].get("vector_clause0") == 1
        assert ranks[ids[21]].get("vector_clause1") == 1
        assert {ids[10], ids[21]} <= set(list(ranks)[:3])
    finally:
        db.close()


def test_each_sentence_of_a_question_gets_a_slot_near_the_top(tmp_path, monkeypatch):
    """Six turns match the first sentence's four words and outscore the one turn that
    answers the second sentence (three words) in the fused list; dealt in turn, each
    sentence's best hit is in the first three. Off (``INTERLEAVE = False``) it is not."""
    from hermes_trove.recall import arms
    trail = [{"role": "user", "content": f"the hiking trail near Moab starts at gate {i}"}
             for i in range(6)]
    filler = [{"role": "assistant", "content": f"small talk number {i}"} for i in range(10)]
    messages = [{"role": "assistant", "content": "Jo baked a carrot cake"}] + filler + trail
    db, store, dag, ids = _db(tmp_path, messages)
    query = {"query": "Where does the hiking trail near Moab start? Also, which cake did Jo bake?",
             "limit": 3}
    try:
        ctx = _ctx(store, dag, tmp_path)
        monkeypatch.setattr(arms, "INTERLEAVE", False)
        fused = json.loads(tools.dispatch("trove_grep", query, ctx))
        assert ids[0] not in [r["store_id"] for r in fused["results"]]
        monkeypatch.setattr(arms, "INTERLEAVE", True)
        for tool in ("trove_grep", "trove_recall"):
            dealt = json.loads(tools.dispatch(tool, query, ctx))
            top = [r["store_id"] for r in dealt["results"]]
            assert ids[0] in top[:3], tool
            assert set(top[:3]) & set(ids[11:]), tool                 # the first sentence too
    finally:
        db.close()


def test_an_arm_over_a_narrower_scope_can_be_scaled_on_its_own_rows():
    """Every session's arm holds a row (a) better than this session's best (b); in one
    family on one scale b keeps its lower score, on its own scale (``scales``) it is
    its arm's best and scores 1, as in a search of this session alone."""
    arms = {"all": [("a", 0.9), ("b", 0.5), ("c", 0.1)], "own": [("b", 0.5), ("d", 0.3)]}
    families = {"all": "vector:messages", "own": "vector:messages"}
    one = {key: score for key, score, _ in ranking.fuse_arms(arms, families=families)}
    assert one["a"] == 1.0 and one["b"] == 0.5
    apart = {key: score for key, score, _ in ranking.fuse_arms(
        arms, families=families, scales={"own": "vector:own"})}
    assert apart["b"] == 1.0 and apart["a"] == 1.0 and apart["d"] == 0.0
    assert apart["c"] == 0.0


def test_hybrid_leans_on_vectors_when_no_turn_holds_most_of_the_question(tmp_path,
                                                                        monkeypatch):
    """The question's best full-text hit holds one of its two words ("fun"); the turn
    the (bag-of-words) vectors rank first holds none of them. Full text weighed as much
    as the vectors (``LEXICAL_POWER = 0``) lists the one-word hit first; weighed by its
    coverage of the question (the default) it yields the first slot to the vectors."""
    from fake_openai import FakeOpenAIServer
    from hermes_trove.recall import arms
    filler = [{"role": "assistant", "content": f"zq{i} xv{i} kw{i}"} for i in range(20)]
    messages = filler[:5] + [{"role": "user", "content": "fun"}] + filler[5:15] + [
        {"role": "user", "content": "what do you do for on"}] + filler[15:]
    db, store, dag, ids = _db(tmp_path, messages)
    one_word, no_word = ids[5], ids[16]
    try:
        with FakeOpenAIServer() as fake:
            config, found = _embedded(db, tmp_path, fake)
            ctx = _ctx(store, dag, tmp_path, config=config, found=found)
            question = "what do you do for fun on weekends?"
            monkeypatch.setattr(arms, "LEXICAL_POWER", 0.0)
            assert _hybrid_ids(ctx, question, 5)[0] == one_word
            monkeypatch.setattr(arms, "LEXICAL_POWER", 1.0)
            assert _hybrid_ids(ctx, question, 5)[0] == no_word
    finally:
        db.close()


def test_lexical_confidence_is_the_best_coverage_of_the_first_five_hits(monkeypatch):
    from hermes_trove.recall import arms
    from hermes_trove.recall.search import Hit

    def hit(coverage):
        return Hit(1, {}, "", 1.0, {"coverage": coverage})
    monkeypatch.setattr(arms, "LEXICAL_POWER", 1.0)
    assert arms._lexical_confidence([]) == 0.0
    assert arms._lexical_confidence([hit(0.5), hit(0.25)]) == 0.5
    assert arms._lexical_confidence([hit(0.2)] * 5 + [hit(1.0)]) == 0.2   # sixth not read
    monkeypatch.setattr(arms, "LEXICAL_POWER", 2.0)
    assert arms._lexical_confidence([hit(0.5)]) == 0.25


@settings(max_examples=200, deadline=None)
@given(own_scores=st.lists(st.floats(0.01, 10), min_size=1, max_size=10, unique=True),
       other_scores=st.lists(st.floats(0.01, 10), max_size=8),
       order=st.randoms(use_true_random=False), extra=st.integers(0, 3),
       share=st.sampled_from([1e-9, 0.5, 1.0]))
def test_recall_deals_this_sessions_scores_in_grep_order(own_scores, other_scores, order, extra,
                                                         share):
    """This session's rows take grep's order (share 1), recall's own (share ~0) or a
    mix, always from the same pool of scores; other sessions' rows keep theirs."""
    from unittest import mock

    from hermes_trove.toolkit import search_tools
    own = [("m", i) for i in range(len(own_scores))]
    others = [("m", 100 + i) for i in range(len(other_scores))]
    biased = dict(zip(own + others, own_scores + other_scores))
    fused = [ranking.Fused(key, score, {}) for key, score in biased.items()]
    grep_keys = own[:]
    order.shuffle(grep_keys)
    grep_keys = grep_keys[:order.randint(0, len(own))] + [("m", 200 + i) for i in range(extra)]
    mine = [ranking.Fused(key, 1.0, {}) for key in grep_keys]
    with mock.patch.object(search_tools, "RECALL_GREP_ORDER", share):
        fused2, dealt = search_tools._dealt_in_grep_order(fused, biased, mine, set(own))
    keys = [f.key for f in fused2]
    assert len(keys) == len(set(keys)) == len(set(own) | set(others) | set(grep_keys))
    assert all(dealt[k] == biased[k] for k in others)
    mine_only = [k for k in grep_keys if k not in biased]
    pool = sorted(own_scores, reverse=True)
    assert sorted((dealt[k] for k in own + mine_only), reverse=True) == \
        pool + [pool[-1]] * len(mine_only)
    if share == 1.0:      # grep's list first, in its order
        assert [dealt[k] for k in grep_keys] == pool[:len(grep_keys)] + \
            [pool[-1]] * max(0, len(grep_keys) - len(pool))
    if share < 1e-6:      # recall's own order: every row keeps its score
        assert all(dealt[k] == biased[k] for k in own)


def test_without_names_takes_out_whole_names_and_their_possessive():
    text = "What is Melanie's favorite food? Also, did MELANIE see Mel or the Melanies?"
    assert ranking.without_names(text, {"melanie"}) == (
        "What is favorite food? Also, did see Mel or the Melanies?")
    assert ranking.without_names(text, set()) == text


def test_the_vector_arms_leave_out_people_but_not_what_the_question_is_about():
    from hermes_trove.recall import arms
    plan = query_plan.parse_query("Did Priya like Halloween in Paris with Caroline?")
    # "caroline" names a sender: out wherever it stands
    assert arms._people_named(plan, frozenset({"caroline"})) == {"caroline"}
    # words no row holds: out only as the question's actor ("Did Priya ..."), so a place
    # or a title nobody wrote stays in
    assert arms._people_named(plan, frozenset(), frozenset({"priya", "paris"})) == {"priya"}
    assert arms._people_named(plan, frozenset(), frozenset({"halloween"})) == set()
    assert arms._people_named(query_plan.parse_query("did caroline go?"),
                              frozenset({"caroline"})) == set()   # only what is written capitalized
    assert arms._vector_text(plan.text, {"caroline", "priya"}) == (
        "Did like Halloween in Paris with ?")
    assert arms._vector_text("Caroline?", {"caroline"}) == "Caroline?"   # nothing else left
    assert ranking.subject_names("What is Caroline's job? DID Mel go? Back to Korea?") == {
        "caroline", "mel"}


def test_a_question_naming_a_sender_finds_the_answer_not_every_turn_they_signed(
        tmp_path, monkeypatch):
    """Turns are embedded as "Caroline: text", so a query vector holding "Caroline"
    lands nearest her shortest turns; without the name it lands near the answer."""
    from fake_openai import FakeOpenAIServer
    from hermes_trove.recall import arms
    chatter = [{"role": "user", "content": f"[{name}] {word}"}
               for name, word in [("Caroline", "ok"), ("Mel", "Caroline!"), ("Caroline", "yes"),
                                  ("Caroline", "sure"), ("Mel", "lol"), ("Caroline", "hmm")] * 3]
    answer = {"role": "user",
              "content": "[Caroline] honestly spicy ramen is the food I crave most"}
    db, store, dag, ids = _db(tmp_path, chatter[:9] + [answer] + chatter[9:])
    question = "What food does Caroline like best?"
    try:
        with FakeOpenAIServer() as fake:
            config, found = _embedded(db, tmp_path, fake)
            ctx = _ctx(store, dag, tmp_path, config=config, found=found)

            def semantic_ids():
                out = json.loads(tools.dispatch("trove_grep", {
                    "query": question, "mode": "semantic", "limit": 5}, ctx))
                assert out["mode"] == "semantic"
                return [r["store_id"] for r in out["results"]]
            assert semantic_ids()[0] == ids[9]
            explained = json.loads(tools.dispatch("trove_grep", {
                "query": question, "mode": "semantic", "explain": True}, ctx))
            assert explained["stages"]["vector_query"] == {
                "text": "What food does like best?", "left_out": ["caroline"]}
            monkeypatch.setattr(arms, "_people_named", lambda *args: set())
            assert ids[9] not in semantic_ids()[:3]          # with the name: her chatter wins
    finally:
        db.close()


def test_a_search_says_which_query_words_name_senders_and_which_no_row_holds(tmp_path):
    """What the vector arms read to leave people out (``arms._people_named``)."""
    messages = [{"role": "user", "content": "[Priya] I baked the carrot cake"},
                {"role": "user", "content": "[Jo] the cake was lovely, Priya"}]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        corpus = search.MessageCorpus(store, search.MessageScope(("s",)))
        found = search.ranked_search(corpus, query_plan.parse_query(
            "Did Priya bake the cake for Oskar?"), 5)
        assert found.people == {"priya"} and found.absent == {"oskar"}
        assert [h.key for h in found.hits][0] == ids[0]
    finally:
        db.close()


def test_a_role_named_by_addresses_is_a_person_even_when_none_of_its_turns_match(tmp_path):
    """The answer shares no word with the question ("engaged" for "proposal"), so
    every candidate is a turn *addressing* Gina; she is still a person the question
    names: those turns weigh her name half, and the vectors leave her out."""
    said = [("user", "Hey Gina! How was the weekend?"),
            ("assistant", "We got engaged on the beach at sunset."),
            ("user", "No way, Gina! Was the proposal a surprise?"),
            ("assistant", "Totally, he hid the ring in a shell."),
            ("user", "Thanks, Gina, for sharing."), ("user", "I read about a proposal for a new park.")]
    messages = [{"role": role, "content": text} for role, text in said]
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        corpus = search.MessageCorpus(store, search.MessageScope(("s",)))
        found = search.ranked_search(corpus, query_plan.parse_query(
            "When did Gina get a marriage proposal?"), 5)
        assert all(h.row["role"] == "user" for h in found.hits)
        assert "gina" in found.roles["assistant"]
        assert found.people == {"gina"}
        # the addressing turn and the unrelated one both hold "proposal": Gina's name
        # weighs half in the first, so it no longer doubles its coverage
        by_key = {h.key: h for h in found.hits}
        assert by_key[ids[2]].parts["coverage"] < 2 * by_key[ids[5]].parts["coverage"]
    finally:
        db.close()


def test_vector_hits_sent_by_a_person_the_question_names_come_first():
    from hermes_trove.recall import arms
    hits = {("m", 1): search.Hit(1, {"role": "user"}, "[Jo] spicy ramen tonight", 0.5, {}),
            ("m", 2): search.Hit(2, {"role": "user"}, "[Caroline] ramen, always", 0.45, {}),
            ("m", 3): search.Hit(3, {"role": "assistant"}, "ramen for me", 0.42, {}),
            ("m", 4): search.Hit(4, {"role": "user"}, "ramen?", 0.41, {})}
    listed = [(key, hit.score) for key, hit in hits.items()]
    ranked = arms._by_speaker(listed, hits, {"caroline"}, {"assistant": frozenset({"caroline"})})
    boost = 1 + arms.VECTOR_SPEAKER
    assert ranked == sorted([(("m", 1), 0.5), (("m", 2), 0.45 * boost),
                             (("m", 3), 0.42 * boost), (("m", 4), 0.41)], key=lambda kc: -kc[1])
    assert ranked[0][0] == ("m", 2)                        # her [Name] turn over Jo's
    assert [k for k, _ in arms._by_speaker(listed, hits, {"oskar"}, {})] == list(hits)


def test_a_question_ranks_the_turn_that_answers_it_above_the_turn_that_asks_it_again(
        tmp_path, monkeypatch):
    """The partner asking the same thing matches every word of the question; the
    answer beside it matches fewer. Asked as a question, the answer comes first; a
    keyword search (no question) keeps the best match first; so does the factor at 1."""
    from hermes_trove.recall import arms
    messages = _filler(12) + [
        {"role": "user", "content": "Which pottery class did you sign up for?"},
        {"role": "assistant", "content": "The pottery class at the community center."},
    ] + _filler(12, 12)
    db, store, dag, ids = _db(tmp_path, messages)
    try:
        asks, answers = ids[12], ids[13]

        def first(query):
            out = json.loads(tools.dispatch("trove_grep", {"query": query},
                                            _ctx(store, dag, tmp_path)))
            return out["results"][0]["store_id"]

        assert first("Which pottery class did you sign up for?") == answers
        assert first("which pottery class sign up") == asks
        monkeypatch.setattr(arms, "ASKING_TURN", 1.0)
        assert first("Which pottery class did you sign up for?") == asks
    finally:
        db.close()


def test_only_asks_reads_every_sentence():
    from hermes_trove.recall import arms
    assert arms._only_asks("Which class? The pottery one?")
    assert not arms._only_asks("We went to Moab. Any trail you'd recommend?")
    assert not arms._only_asks("") and not arms._only_asks("Sure.")


def test_a_question_that_asks_when_ranks_the_turn_telling_the_time_first(tmp_path, monkeypatch):
    """Two turns hold the event's words equally; asked *when*, the one that tells a
    time ("yesterday") comes first whichever order they were stored in; asked *what*,
    the order is full text's own; so is it with the factor off."""
    from hermes_trove.recall import arms
    for told_first in (True, False):
        told = {"role": "user", "content": "I went to the support group meeting yesterday, it was great."}
        echo = {"role": "user", "content": "Glad I went to the support group meeting, it sounds great."}
        pair = [told, echo] if told_first else [echo, told]
        messages = _filler(10) + [pair[0]] + _filler(5, 10) + [pair[1]] + _filler(5, 15)
        db, store, dag, ids = _db(tmp_path / str(told_first), messages)
        try:
            told_id = ids[10] if told_first else ids[16]

            def first(query):
                out = json.loads(tools.dispatch("trove_grep", {"query": query},
                                                _ctx(store, dag, tmp_path / str(told_first))))
                return out["results"][0]["store_id"]

            assert first("When did you go to the support group meeting?") == told_id
            with monkeypatch.context() as off:
                off.setattr(arms, "ANSWER_TYPE", 0.0)
                baseline = first("When did you go to the support group meeting?")
            assert first("What was the support group meeting like?") == baseline
        finally:
            db.close()


def test_answer_types_read_the_question_and_the_turn():
    from hermes_trove.recall.answer_type import expected, holds
    assert expected("When did Caroline move?") == {"time"}
    assert expected("Nice! So when are you leaving?") == {"time"}
    assert expected("What year did you graduate?") == {"time"}
    assert expected("On May 9, 2018: How long ago did you get back?") == {"time"}
    assert expected("How long did you live in Korea?") == {"number"}
    assert expected("how many hours do you work? Also, where do you work?") == {"number", "place"}
    assert expected("Where do you go for laser tag?") == {"place"}
    assert not expected("What did you do when you were young?")
    assert not expected("What year of school are you in?") and not expected("Do you like it?")
    assert holds("time", "We moved there last May.") and holds("time", "two years ago")
    assert holds("time", "on Friday") and holds("time", "back in 2019")
    assert holds("time", "see you 5/7") and holds("time", "in a few weeks")
    assert not holds("time", "I may go there") and not holds("time", "2000 songs")
    assert holds("number", "about 3 hours") and holds("number", "twenty minutes")
    assert not holds("number", "I like it")
    assert holds("place", "we went to Provo") and holds("place", "at the park")
    assert not holds("place", "I went to bed") and not holds("kind", "anything")
