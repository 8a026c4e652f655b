"""Tests for search.py: query parsing, FTS safety, staged retrieval, scoring, fusion, snippets."""
import json
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_trove.recall import query_plan, ranking, search
from hermes_trove.dag import Dag, NewNode
from hermes_trove.storage.database import Database
from hermes_trove.store import Store


@pytest.fixture
def store():
    db = Database(":memory:")
    yield Store(db)
    db.close()


def add(store, session, *texts, role="assistant", source=None, now=1_700_000_000.0):
    store.ensure_session(session)
    return store.ingest(session, [{"role": role, "content": t} for t in texts],
                        source=source, now=now).store_ids


def find(store, query, sessions=("A",), limit=10, **scope):
    corpus = search.MessageCorpus(store, search.MessageScope(
        sessions, current_session=sessions[0] if sessions else None, **scope))
    return search.ranked_search(corpus, query_plan.parse_query(query), limit)


def keys(outcome):
    return [h.key for h in outcome.hits]


# ---------------------------------------------------------------- parsing
def concept_keys(query):
    return [c.key for c in query_plan.parse_query(query).concepts]


def test_stop_words_go_and_question_words_are_weighted_down():
    plan = query_plan.parse_query("What did we decide about the retry backoff?")
    weights = {c.key: c.weight for c in plan.concepts}
    assert weights == {"retry": 1.0, "backoff": 1.0, "decide": query_plan.FILLER_WEIGHT}


def test_a_query_of_only_stop_words_still_searches_them():
    assert concept_keys("what is this") == ["what", "is", "this"]


def test_plurals_and_verb_forms_are_one_concept():
    plan = query_plan.parse_query("ports retries deployed formatting")
    variants = {c.key: set(c.variants) for c in plan.concepts}
    assert {"port", "ports"} <= variants["port"] and {"retry", "retries"} <= variants["retry"]
    assert {"deploy", "deploys", "deploying"} <= variants["deployed"]
    assert {"format", "formatted"} <= variants["formatting"]
    assert concept_keys("format formatting formats") == ["format"]


@pytest.mark.parametrize("query, parts, joined", [
    ("retry_backoff_ms", ("retry", "backoff", "ms"), "retrybackoffms"),
    ("retryBackoffMs", ("retry", "backoff", "ms"), "retrybackoffms"),
    ("my-proxy", ("my", "proxy"), "myproxy"),
    ("HTTPServer", ("http", "server"), "httpserver"),
    ("settings/base.py", ("settings", "base", "py"), "settingsbasepy"),
])
def test_identifiers_are_kept_whole_as_phrases(query, parts, joined):
    [ident] = query_plan.parse_query(query).identifiers
    assert ident.parts == parts and ident.joined == joined
    assert query_plan.identifier_expr(ident) == f'("{" ".join(parts)}" OR "{joined}")'


def test_quoted_phrases_exclusions_contractions_and_needles():
    plan = query_plan.parse_query('"cache TTL" -docker don\'t user\'s 数据库 🦀')
    assert plan.phrases == (("cache", "ttl"),)
    assert plan.excluded == (("docker",),)
    assert "user" in concept_keys("user's") and "docker" not in [c.key for c in plan.concepts]
    assert plan.needles == ("数据库", "🦀")


@pytest.mark.parametrize("query", ["", "   ", '""', "-", "***", "\x00", "()"])
def test_queries_without_words_are_empty(query):
    assert query_plan.parse_query(query).empty


def test_hostile_text_is_cleaned_and_bounded():
    lone = json.loads('"a\\ud800b"')
    plan = query_plan.parse_query(lone + "\x00 staging " * 500)
    assert plan.truncated and len(plan.text) == query_plan.MAX_QUERY_CHARS
    assert "\x00" not in plan.text and "\ud800" not in plan.text
    assert len(query_plan.parse_query(" ".join(f"word{i}" for i in range(50))).concepts) == \
        query_plan.MAX_CONCEPTS


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=200))
def test_fast_tokenizer_equals_the_fts_regex(text):
    folded = query_plan.fold(text)
    assert query_plan.fold_tokens(folded) == query_plan._WORD.findall(folded)


@pytest.mark.parametrize("word", [
    "Ångström", "NAÏVE", "e\u0301cole", "ệ", "İstanbul", "ISI", "ısı", "Łódź",
    "ΛΌΓΟΣ", "σοφίας", "Ωμέγα", "ω\u0301", "ЁЛКА", "йогурт", "한국어", "東京タワー", "ﬁle", "ＡＢＣ",
    "Straße",
])
def test_fold_makes_the_words_the_fts5_index_holds(word):
    """A query's folded word must be the token unicode61 (remove_diacritics 2) indexes
    the same text as, or the word is never found: Greek and Cyrillic keep their accents
    there, a final sigma is a sigma, Hangul stays syllables, "ﬁ" stays itself."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, row)")
    conn.execute("INSERT INTO f VALUES (?)", (word,))
    indexed = [r[0] for r in conn.execute("SELECT term FROM v")]
    assert query_plan.fts_tokens(word) == indexed
    assert conn.execute("SELECT count(*) FROM f WHERE f MATCH ?",
                        (query_plan.quote(query_plan.fts_tokens(word)),)).fetchone()[0] == 1


def test_quote_doubles_embedded_quotes():
    assert query_plan.quote('say "hi"') == '"say ""hi"""'
    assert query_plan.any_of(["a", ("b", "c")]) == '("a" OR "b c")'


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_every_generated_expression_is_valid_fts5(text):
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(body, tags, "
                  "tokenize='unicode61 remove_diacritics 2')")
    conn.execute("INSERT INTO f VALUES ('some body text', 's41')")
    plan = query_plan.parse_query(text)
    bodies = [query_plan.concept_expr(c) for c in plan.concepts]
    bodies += [query_plan.identifier_expr(i) for i in plan.identifiers]
    bodies += [query_plan.quote(p) for p in plan.phrases]
    scope = query_plan.tag_scope(["A", text[:20] or "x"], role="user", source=text[:10])
    for body in bodies:
        conn.execute("SELECT rowid FROM f WHERE f MATCH ?",
                     (query_plan.scoped(body, scope, plan.excluded),)).fetchall()


def test_an_irregular_past_counts_as_the_verb_after_did_only():
    variants = {c.key: set(c.variants) for c in
                query_plan.parse_query("When did Melanie run a charity race?").concepts}
    assert "ran" in variants["run"] and "race" in variants
    # in the same clause only, and only after "did": "going" is not "went"
    assert "ran" not in {v for c in query_plan.parse_query(
        "What did Caroline buy? Also, where does she run?").concepts for v in c.variants}
    assert "went" not in {v for c in query_plan.parse_query(
        "where are you going to go").concepts for v in c.variants}
    assert {"bought"} <= {v for c in query_plan.parse_query(
        "What didn't you buy for the party?").concepts for v in c.variants}


def test_a_question_with_did_finds_the_answer_told_in_the_past_tense(store):
    ids = add(store, "A", "We ran a 5K for the animal shelter on Saturday.",
              "The shelter needs volunteers on weekends.", role="user")
    assert keys(find(store, "When did Melanie run for the shelter?"))[0] == ids[0]


# ---------------------------------------------------------------- retrieval and ranking
def test_natural_question_finds_partial_matches(store):
    ids = add(store, "A", "We settled on retry_backoff_ms = 250 with jitter.",
              "Unrelated note about the weather.")
    out = find(store, "what did we decide about the retry backoff?")
    assert keys(out)[:1] == [ids[0]]
    assert any(s.startswith("all_terms") for s in out.stages)


def test_coverage_beats_repetition(store):
    ids = add(store, "A", "database database database database database",
              "the staging database port is 6543")
    assert keys(find(store, "staging database port"))[0] == ids[1]


def test_identifier_matches_every_spelling_and_exact_ranks_first(store):
    ids = add(store, "A", "retry backoff ms was discussed in prose",
              "set retryBackoffMs in the client", "config: retry_backoff_ms=250")
    out = find(store, "retry_backoff_ms")
    assert set(keys(out)) == set(ids) and keys(out)[0] == ids[2]
    assert out.hits[0].parts["identifier_bonus"] > 0


def test_hyphenated_and_plural_queries(store):
    ids = add(store, "A", "the my-proxy service restarted", "opened two ports today")
    assert keys(find(store, "my-proxy"))[0] == ids[0]
    assert keys(find(store, "port")) == [ids[1]]


def test_excluded_terms_and_required_phrases(store):
    ids = add(store, "A", "cache TTL is 90 seconds", "cache size and TTL via docker",
              "TTL of the cache is 30")
    assert keys(find(store, "cache TTL -docker")) == [ids[2], ids[0]] or \
        set(keys(find(store, "cache TTL -docker"))) == {ids[0], ids[2]}
    assert keys(find(store, '"cache TTL"')) == [ids[0]]
    loose = find(store, '"cache ttl window"')
    assert loose.notes and set(keys(loose)) == set(ids)


def test_cjk_and_emoji_fall_back_to_substring_scan(store):
    ids = add(store, "A", "数据库端口是6543", "deploy done 🚀 finally", "plain text")
    assert keys(find(store, "端口")) == [ids[0]]
    assert keys(find(store, "🚀")) == [ids[1]]


def test_scope_role_source_and_time_filters(store):
    a = add(store, "A", "kiwi in A")
    b = add(store, "B", "kiwi in B")
    user = add(store, "A", "kiwi from the user", role="user")
    tg = add(store, "A", "kiwi on telegram", source="telegram", now=1_700_000_500.0)
    assert set(keys(find(store, "kiwi"))) == {a[0], user[0], tg[0]}
    assert set(keys(find(store, "kiwi", sessions=None))) == {a[0], b[0], user[0], tg[0]}
    assert keys(find(store, "kiwi", role="user")) == user
    assert keys(find(store, "kiwi", source="telegram")) == tg
    assert set(keys(find(store, "kiwi", source="unknown"))) == {a[0], user[0]}
    assert keys(find(store, "kiwi", time_from=1_700_000_100.0)) == tg
    assert tg[0] not in keys(find(store, "kiwi", time_to=1_700_000_100.0))


def test_a_dense_session_is_filtered_after_matching_and_stays_exact(store):
    """The live session usually holds most rows, so its tag is applied after
    matching; the rows returned must still be exactly the session's matches."""
    old = add(store, "A", "zebra crossing notes from long ago")
    add(store, "B", *[f"zebra report {i} in B" for i in range(300)])
    recent = add(store, "A", *[f"filler line {i}" for i in range(1500)], "zebra again in A")
    corpus = search.MessageCorpus(store, search.MessageScope(("A",), current_session="A"))
    assert corpus.dense and not search.MessageCorpus(
        store, search.MessageScope(("B",), current_session="B")).dense
    # the 300 newer matches of B fill every bounded scan; A's old row is still found
    assert set(keys(find(store, "zebra"))) == {old[0], recent[-1]}
    assert len(keys(find(store, "zebra", sessions=("B",), limit=50))) == 50
    assert all(h.row["session_id"] == "B"
               for h in find(store, "zebra report", sessions=("B",)).hits)


def test_current_turn_is_hidden_in_its_session_only(store):
    old = add(store, "A", "what about the mango rollout?")
    other = add(store, "B", "mango rollout in B")
    asking = add(store, "A", "and now: what about the mango rollout?")
    out = find(store, "mango rollout", current_turn_store_id=asking[0])
    assert keys(out) == old
    corpus = search.MessageCorpus(store, search.MessageScope(
        None, current_session="A", current_turn_store_id=asking[0]))
    everywhere = search.ranked_search(corpus, query_plan.parse_query("mango rollout"), 10)
    assert set(keys(everywhere)) == {old[0], other[0]}


def test_common_words_keep_candidate_work_bounded(store):
    add(store, "A", *[f"common words everywhere number {i}" for i in range(600)])
    out = find(store, "common everywhere number", limit=5)
    assert len(out.hits) == 5
    assert all(int(s.split(":")[-1]) <= search.CONCEPT_CAP for s in out.stages)


def test_summaries_are_searched_with_the_same_pipeline(store):
    dag = Dag(store.db)
    ids = add(store, "A", "raw one", "raw two")
    node = dag.add_node(NewNode("A", 0, "summary mentions the zeppelin budget", 5, 10, 3,
                                "deterministic", child_store_ids=ids))
    dag.add_node(NewNode("B", 0, "zeppelin in another session", 5, 10, 3, "deterministic",
                         child_store_ids=ids))
    corpus = search.SummaryCorpus(dag, ["A"])
    assert keys(search.ranked_search(corpus, query_plan.parse_query("zeppelin budget"), 5)) == [node]


def test_explain_parts_are_reported(store):
    add(store, "A", "the staging database port is 6543")
    parts = find(store, "staging port").hits[0].parts
    assert parts["matched"] == ["staging", "port"] and parts["coverage"] == 1.0
    assert parts["phrase_bonus"] == 0 and parts["bm25"] > 0


# ---------------------------------------------------------------- snippets and fusion
def test_snippet_is_centred_on_the_match():
    text = "x" * 1000 + " the retry_backoff_ms value " + "y" * 1000
    plan = query_plan.parse_query("retry_backoff_ms")
    piece = search.snippet(plan, text)
    assert "retry_backoff_ms" in piece and piece.startswith("…") and piece.endswith("…")
    assert len(piece) <= search.SNIPPET_CHARS + 2
    assert search.snippet(plan, "short text") == "short text"


def test_snippet_shows_the_window_holding_most_of_the_query():
    text = ("the nightly job ran. " + "filler words here. " * 40
            + "BACKUP_CRON=\"17 3 * * *\"  # nightly backup schedule, UTC. "
            + "more filler. " * 40 + "the cron table was edited.")
    piece = search.snippet(query_plan.parse_query("when does the nightly backup cron run?"), text)
    assert "17 3 * * *" in piece and "nightly backup schedule" in piece


def test_fuse_is_reciprocal_rank_fusion():
    fused = ranking.fuse({"a": ["x", "y"], "b": ["y", "z"]})
    scores = {f.key: f.score for f in fused}
    assert [f.key for f in fused] == ["y", "x", "z"]
    assert scores["y"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[0].ranks == {"a": 2, "b": 1}


def test_fuse_weights_and_quality():
    assert [f.key for f in ranking.fuse({"a": ["x"], "b": ["y"]}, {"a": 0.5})] == ["y", "x"]
    fused = ranking.fuse({"a": ["x"], "b": ["y"]}, quality={"x": 0.2})
    assert [f.key for f in fused] == ["y", "x"]
    assert [f.key for f in ranking.fuse({"a": ["x", "x", "w"]})] == ["x", "w"]


def test_a_deeper_list_reads_only_the_pages_share_of_candidates(store):
    """``scored`` bounds the rows read and scored (the cost of the page shown), whatever
    ``limit`` asks for: the rest of the list comes from what was scored."""
    add(store, "A", *[f"kestrel rollout note {i}" for i in range(300)])
    corpus = search.MessageCorpus(store, search.MessageScope(("A",), current_session="A"))
    read: list[int] = []
    load = corpus.load
    corpus.load = lambda keys: read.append(len(keys)) or load(keys)
    plan = query_plan.parse_query("kestrel rollout")
    deep = search.ranked_search(corpus, plan, 100)
    deep_read = read[-1]
    cheap = search.ranked_search(corpus, plan, 100, scored=5)
    assert read[-1] == max(5 * 4, search.RESCORE_MIN) < len(deep.hits) <= deep_read
    assert keys(cheap) == keys(deep)[:read[-1]]
