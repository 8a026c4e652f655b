"""A seeded walk of the embedding index against an oracle.

Rows of every kind (empty, tool, long enough for several chunks, a secret) and
summary nodes arrive in three sessions; sessions are cleaned (vectors, nodes,
rows in one transaction); two indexers step in turn and restart; the endpoint
sometimes takes at most 4 inputs a request or refuses a text. After a final
backfill the index must be exactly what the rows say: one NULL row for a row
with nothing to embed, else chunks 0..k-1 of its (redacted) text, each the
endpoint's vector of that chunk; no vector of a removed row; with redaction on,
no secret in any request. Runs on both engines (tests/pgkit.py).
"""
import random
import numpy as np
import pytest
import fake_openai
from hermes_trove.ingest.redaction import redact_for
from hermes_trove.recall import embeddings, semantic
from hermes_trove.storage.vectors import VectorStore
from hermes_trove.store import Store
from hermes_trove.dag import Dag, NewNode
from test_embeddings import chat, fake, openai_config  # noqa

WORDS = "alpha beta gamma delta api_key=sk-proj-AbCdEf0123456789GhIjKlMnOpQrStUvWx epsilon zeta".split()


def text(rnd):
    k = rnd.choice([0, 1, 3, 20, 400, 1500])
    return " ".join(rnd.choice(WORDS) for _ in range(k))


@pytest.mark.parametrize("seed", range(8))
def test_the_index_is_what_the_rows_say(chat, tmp_path, fake, seed):
    rnd = random.Random(seed)
    db, store, dag, ids = chat
    config = openai_config(tmp_path, fake, TROVE_EMBEDDING_BATCH_SIZE=str(rnd.choice([1, 3, 16])),
                           TROVE_SENSITIVE_PATTERNS_ENABLED=rnd.choice(["true", "false"]))
    provider = embeddings.open_provider(config).provider
    redact = redact_for(config)
    indexers = [semantic.Indexer(db, provider, config, redact) for _ in range(2)]
    sessions = [f"g{i}" for i in range(3)]
    lists = {s: [] for s in sessions}
    for step in range(60):
        action = rnd.random()
        if action < 0.45:
            s = rnd.choice(sessions)
            role = rnd.choice(["user", "assistant", "tool", "assistant"])
            m = {"role": role, "content": text(rnd)}
            if role == "tool":
                m["tool_call_id"] = "c"
            lists[s].append(m)
            r = store.ingest(s, lists[s])
            if rnd.random() < 0.2 and r.store_ids:
                dag.add_node(NewNode(s, 0, text(rnd) or "x", 5, 100, 1, "m", child_store_ids=[r.store_ids[-1]]))
        elif action < 0.55:
            s = rnd.choice(sessions)
            with db.transaction() as conn:
                VectorStore.delete_sessions_in(conn, [s])
                dag.delete_session_nodes_in(conn, [s])
                store.delete_sessions_in(conn, [s])
            lists[s] = []
        elif action < 0.6:
            indexers[rnd.randrange(2)] = semantic.Indexer(db, provider, config, redact)  # restart
        else:
            fake.embedding_max_inputs = rnd.choice([None, None, 4])
            fake.embedding_rejects = rnd.choice([(), (), ("zeta zeta",)])
            try:
                indexers[rnd.randrange(2)].step()
            except embeddings.EmbeddingError:
                pass
    fake.embedding_max_inputs, fake.embedding_rejects = None, ()
    semantic.backfill(db, provider, config, apply=True, redact=redact)
    clean = semantic.outgoing(config, redact)
    space = indexers[0].space()
    got = {}
    for ref, chunk, h, vec, kind in db.conn.execute("SELECT ref_id, chunk, text_hash, vector, kind FROM embedding_vectors WHERE space_id = ?", (space,)).fetchall():
        got.setdefault((kind, ref), {})[chunk] = (h, vec)
    msgs = {r["store_id"]: dict(r) for r in db.conn.execute("SELECT * FROM messages").fetchall()}
    nodes = {r["node_id"]: dict(r) for r in db.conn.execute("SELECT * FROM nodes").fetchall()}
    want = {}
    for sid, row in msgs.items():
        want[("m", sid)] = semantic.chunks(clean(semantic.message_text(row)))
    for nid, row in nodes.items():
        want[("n", nid)] = semantic.chunks(clean(f"summary: {row['text']}"))
    assert set(got) == set(want), (set(got) ^ set(want))
    for key, pieces in want.items():
        have = got[key]
        if not pieces:
            assert list(have) == [0] and have[0][1] is None, (key, have)
            continue
        assert sorted(have) == list(range(len(pieces))), (key, sorted(have), len(pieces))
        for i, p in enumerate(pieces):
            h, vec = have[i]
            assert h == semantic.text_hash(p)
            v = np.frombuffer(vec, np.float32)
            e = np.asarray(fake_openai.fake_embedding(p[:embeddings.MAX_INPUT_CHARS]), np.float32)
            e = e / (np.linalg.norm(e) or 1)
            assert np.allclose(v, e, atol=1e-5), key
            assert "sk-proj" not in p or config.sensitive_patterns_enabled is False
    sent = " ".join(t for r in fake.requests if r["path"].endswith("embeddings") for t in r["body"]["input"])
    if config.sensitive_patterns_enabled:
        assert "sk-proj-AbCdEf0123456789GhIjKlMnOpQrStUvWx" not in sent
