"""The probe text tells an endpoint's models apart under one name (``recall.probe``).

An OpenAI-compatible endpoint that starts serving another model under the same name
and the same dimension kept its space: new query vectors were ranked against the old
model's vectors, silently. Each space now keeps its model's vector of a fixed probe
text; answers that differ start a new space, the old one is never searched again.
"""
import json
import time

import numpy
import pytest

from enginekit import stored_chat
from fake_openai import FakeOpenAIServer
from hermes_trove import tools
from hermes_trove.compaction import tokens
from hermes_trove.config import load_config
from hermes_trove.diagnostics import health
from hermes_trove.recall import embeddings, probe, semantic
from hermes_trove.storage.vectors import VectorStore

COUNTER = tokens.get_counter()
CHAT = [
    {"role": "user", "content": "[Caroline] I signed up for a ceramics workshop downtown"},
    {"role": "user", "content": "[Mel] we adopted a rescue puppy from the shelter"},
    {"role": "user", "content": "[Caroline] the weather has been awful"},
]
GREP = {"query": "ceramics workshop", "mode": "semantic"}


@pytest.fixture
def fake():
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def chat(tmp_path, backend):
    yield from stored_chat(backend[1], CHAT)


def config_for(tmp_path, fake):
    return load_config(environ={"TROVE_EMBEDDINGS_ENABLED": "true",
                                "TROVE_EMBEDDING_PROVIDER": "openai",
                                "TROVE_EMBEDDING_MODEL": "fake-embed",
                                "TROVE_EMBEDDING_BASE_URL": fake.base_url}, hermes_home=tmp_path)


def grep(found, store, dag, tmp_path, config):
    ctx = tools.ToolContext(store=store, dag=dag, config=config,
                            count_tokens=COUNTER.count_text, session_id="s",
                            conversation_id=None,
                            current_turn_store_id=store.last_store_id() + 1, status=dict,
                            llm_call=None, data_dir=tmp_path, semantic=found)
    return json.loads(tools.dispatch("trove_grep", GREP, ctx))


def vectors_in(db, space):
    with db.reading() as conn:
        return conn.execute("SELECT COUNT(*) FROM embedding_vectors WHERE space_id = ? AND "
                            "vector IS NOT NULL", (space,)).fetchone()[0]


def test_a_model_swapped_under_the_same_name_is_a_new_space(chat, tmp_path, fake):
    """The endpoint serves another model as "fake-embed" (same 64 dimensions): a new
    process's search no longer uses the old vectors (full text, and the status and the
    doctor say why), the backfill embeds every row anew under the new generation,
    searches use that, and prune lists the old generation and frees it."""
    db, store, dag, ids = chat
    config = config_for(tmp_path, fake)
    semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    old_space = semantic.Indexer(db, embeddings.open_provider(config).provider, config).space()
    before = semantic.Semantic.open(db, config)
    before.query_vector("warm up")          # the endpoint's dimension is known: its space too
    assert grep(before, store, dag, tmp_path, config)["mode"] == "semantic"
    fake.embedding_model_served = "another-model"
    found = semantic.Semantic.open(db, config)
    found.query_vector("warm up")
    out = grep(found, store, dag, tmp_path, config)
    assert out["mode"] == "full_text" and "no vectors" in out["notes"][0]
    assert found.space() is None                        # the old vectors are not searched
    status = found.status()
    assert status["model_check"]["state"] == "changed" and "new space" in \
        status["model_check"]["detail"]
    doctor = health.check_embeddings({"embeddings": status})
    assert doctor[0]["status"] == "warn" and "different model" in doctor[0]["detail"]
    done = semantic.backfill(db, found.provider, config, apply=True)
    assert done["rows"] == len(CHAT) and done["texts_embedded"] >= len(CHAT)
    assert done["identity"]["revision"] == found.provider.identity.revision
    new_space = found.space()
    assert new_space not in (None, old_space) and vectors_in(db, new_space) == len(CHAT)
    assert vectors_in(db, old_space) == len(CHAT)       # kept until pruned, never searched
    out = grep(found, store, dag, tmp_path, config)
    assert out["mode"] == "semantic" and out["results"][0]["store_id"] == ids[0]
    listed = semantic.prune(db, found.provider, config, apply=False)
    assert [(s["space_id"], s["vectors"]) for s in listed["spaces"]] == [(old_space, len(CHAT))]
    semantic.prune(db, found.provider, config, apply=True)
    assert vectors_in(db, old_space) == 0 and vectors_in(db, new_space) == len(CHAT)
    fake.embedding_model_served = ""                    # the first model back: its space
    back = semantic.Semantic.open(db, config)
    assert back.space() == old_space and back.status()["model_check"]["state"] == "same"


def test_the_same_model_changes_nothing(chat, tmp_path, fake):
    """Same model, new process: the same space, nothing embedded again, one probe call,
    and the status says the model answers as the one that made its vectors."""
    db, store, dag, ids = chat
    config = config_for(tmp_path, fake)
    semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    space = VectorStore(db).latest_space("openai", "fake-embed",
                                         fake.base_url.rstrip("/") + "/embeddings")
    calls = len(fake.requests)
    again = semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    assert again["rows"] == 0 and len(fake.requests) == calls + 1      # the probe alone
    found = semantic.Semantic.open(db, config)
    assert found.space() == space and grep(found, store, dag, tmp_path, config)["mode"] == \
        "semantic"
    assert found.status()["model_check"]["state"] == "same"
    assert health.check_embeddings({"embeddings": found.status()})[0]["status"] == "ok"
    with db.reading() as conn:
        assert conn.execute("SELECT COUNT(*) FROM embedding_spaces").fetchone()[0] == 1


def test_a_space_made_before_probes_takes_the_first_probe(chat, tmp_path, fake):
    """A database indexed before probes were kept (probe NULL): the first probe is
    adopted, nothing is embedded again; a later swap is then told apart."""
    db, store, dag, ids = chat
    config = config_for(tmp_path, fake)
    semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    with db.transaction() as conn:
        conn.execute("UPDATE embedding_spaces SET probe = NULL")
    assert semantic.backfill(db, embeddings.open_provider(config).provider, config,
                             apply=True)["rows"] == 0
    with db.reading() as conn:
        assert conn.execute("SELECT COUNT(*) FROM embedding_spaces WHERE probe IS NOT "
                            "NULL").fetchone()[0] == 1
    fake.embedding_model_served = "another-model"
    assert semantic.backfill(db, embeddings.open_provider(config).provider, config,
                             apply=True)["rows"] == len(CHAT)


def test_the_worker_notices_a_swap_while_it_runs(chat, tmp_path, fake, monkeypatch):
    """The swap happens while the process runs: before its next batch the worker probes
    again (every RECHECK_SECONDS; now), moves to the new space and embeds everything
    there; the new row's vector never lands in the old model's space."""
    db, store, dag, ids = chat
    config = config_for(tmp_path, fake)
    found = semantic.shared(db, config)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (found.status().get("available") and
                                                   found.status()["pending"] == 0):
            time.sleep(0.05)
        old_space = found.space()
        assert old_space is not None and found.status()["model_check"]["state"] == "new"
        monkeypatch.setattr(semantic, "RECHECK_SECONDS", 0.0)
        fake.embedding_model_served = "another-model"
        store.ingest("s", CHAT + [{"role": "user", "content": "[Mel] a new line"}])
        found.worker.poke()
        while time.monotonic() < deadline and (found.space() in (None, old_space) or
                                               found.status()["pending"]):
            time.sleep(0.05)
        assert found.space() not in (None, old_space) and found.status()["pending"] == 0
        assert found.status()["model_check"]["state"] == "changed"
        assert vectors_in(db, old_space) == len(CHAT)             # no new-model vector there
        assert vectors_in(db, found.space()) == len(CHAT) + 1
    finally:
        semantic.forget_shared(db.path)


def test_a_failing_probe_fails_closed_and_says_why(chat, tmp_path, fake):
    """The endpoint is down at the probe: no vector arm (full text answers), a note and
    the status say why, the doctor warns, and the worker's indexer embeds nothing."""
    db, store, dag, ids = chat
    config = config_for(tmp_path, fake)
    semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    found = semantic.Semantic.open(db, config)
    fake.stop()
    out = grep(found, store, dag, tmp_path, config)
    assert out["mode"] == "full_text" and out["results"][0]["store_id"] == ids[0]
    assert "did not answer the probe" in out["notes"][0]
    status = found.status()
    assert status["model_check"]["state"] == "failed"
    assert health.check_embeddings({"embeddings": status})[0]["status"] == "warn"
    with pytest.raises(embeddings.EmbeddingError):
        semantic.Indexer(db, found.provider, config).step()


def test_float_noise_is_the_same_model_and_another_model_is_not():
    """The tolerance: a server's batch-dependent float noise (1e-3 per component, more
    than measured locally, where runs are bit-identical) keeps the space; an unrelated
    vector does not."""
    rng = numpy.random.default_rng(7)
    base = rng.normal(size=384).astype(numpy.float32)
    base /= numpy.linalg.norm(base)
    noisy = base + rng.normal(scale=1e-3, size=384).astype(numpy.float32)
    noisy /= numpy.linalg.norm(noisy)
    other = rng.normal(size=384).astype(numpy.float32)
    other /= numpy.linalg.norm(other)
    assert probe.same_answers(numpy, base.tobytes(), noisy.tobytes())
    assert not probe.same_answers(numpy, base.tobytes(), other.tobytes())
    assert not probe.same_answers(numpy, base.tobytes(), base[:128].tobytes())


def test_embed_status_and_the_doctor_say_the_model_changed(chat, tmp_path, fake):
    """``/trove embed status`` probes the configured model (an operator asked) and says
    the name answers as another model; ``/trove status`` never calls the model."""
    from hermes_trove import command
    from hermes_trove.operators import actions as ops
    db, store, dag, ids = chat
    where = "TROVE_DATABASE_URL" if db.dialect == "postgresql" else "TROVE_DATABASE_PATH"
    config = load_config(environ={"TROVE_EMBEDDINGS_ENABLED": "true",
                                  "TROVE_EMBEDDING_PROVIDER": "openai",
                                  "TROVE_EMBEDDING_MODEL": "fake-embed",
                                  "TROVE_EMBEDDING_BASE_URL": fake.base_url, where: db.path},
                         hermes_home=tmp_path)
    semantic.backfill(db, embeddings.open_provider(config).provider, config, apply=True)
    fake.embedding_model_served = "another-model"
    target = ops.open_target(config)
    action = command.ACTIONS[("embed", "status")]
    text = action.render(action.run(target))
    assert "model check (changed)" in text and "different model" in text
    report = health.run_doctor(store, dag, config,
                               {"embeddings": action.run(target)["embed_status"]})
    [found] = [c for c in report["checks"] if c["name"] == "embedding_model"]
    assert found["status"] == "warn" and report["overall"] in ("warn", "fail")
    calls = len(fake.requests)
    from hermes_trove.operators import families
    line = families.embeddings_line(families.embeddings_status(target))
    assert len(fake.requests) == calls and "indexed" in line      # status: no model call
