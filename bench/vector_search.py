#!/usr/bin/env python3
"""Semantic search latency and memory at up to 1M stored messages.

Builds (once, cached in ``$TROVE_BENCH_CACHE``, default /tmp/trove-bench) a
store of N short messages in 100 sessions (the first holds 90%, like a
long-lived agent) and N 384-dimensional unit vectors in one embedding space.
The vectors are synthetic, not a model's: 2,000 cluster centres plus noise,
with a shared offset like real embedding models have (every text's vector has
a large common component), so the sign-bit prescreen is tested on data where
centring matters. Then it times ``Semantic.search`` (the vector arm of
``trove_grep``/``trove_recall``: prescreen + exact rescoring above
``vectorscan.PRESCREEN_MIN`` vectors) for queries near random stored vectors:

- ``all``: every session (trove_recall, ``session_scope="all"``);
- ``live``: the 90% session; ``small``: a 0.1% session.

Also: the prescreen's recall@10 against exact search (the exact top 10 by a
full matrix product over all vectors), the time to load the bits, the memory
the loaded bits hold, how much the RSS grew while loading (batches of float
vectors pass through) and the process's peak RSS.

    .venv/bin/python bench/vector_search.py 100000 1000000
Writes bench/results/vector_search.json.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth  # noqa: E402  (loads the package)

import numpy as np  # noqa: E402

from hermes_trove.config import load_config  # noqa: E402
from hermes_trove.recall import embeddings, semantic, vectorscan  # noqa: E402
from hermes_trove.storage.database import Database  # noqa: E402
from hermes_trove.storage.vectors import SpaceIdentity, VectorRow, VectorStore  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

CACHE = Path(os.environ.get("TROVE_BENCH_CACHE", "/tmp/trove-bench"))
DIM = 384
SESSIONS = 100
QUERIES = 40
IDENTITY = SpaceIdentity("bench", "synthetic-clusters", "1", DIM)


def session_of(i: int, n: int) -> str:
    """90% of rows in session s0, the rest spread over s1..s99."""
    return "s0" if i < n * 0.9 else f"s{1 + i % (SESSIONS - 1)}"


def vectors_for(rng: np.random.Generator, count: int, centres: np.ndarray,
                offset: np.ndarray) -> np.ndarray:
    """Unit vectors: a shared offset + a random centre + noise."""
    picks = centres[rng.integers(0, len(centres), count)]
    raw = offset + picks + rng.normal(0, 0.35, (count, DIM)).astype(np.float32)
    return (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)


def build(n: int) -> Path:
    """The cached store with n messages and n vectors."""
    path = CACHE / f"vectors-{n}.db"
    done = path.with_suffix(".done")
    if done.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_suffix(".db-wal"), path.with_suffix(".db-shm")):
        stale.unlink(missing_ok=True)
    started = time.perf_counter()
    db = Database(str(path))
    store, vectors = Store(db), VectorStore(db)
    rng = np.random.default_rng(7)
    centres = rng.normal(0, 1, (2000, DIM)).astype(np.float32)
    offset = rng.normal(0, 1, DIM).astype(np.float32) * 2.0
    space = vectors.space_id(IDENTITY)
    step = 20_000
    for start in range(0, n, step):
        by_session: dict[str, list] = {}
        for i in range(start, min(n, start + step)):
            by_session.setdefault(session_of(i, n), []).append(
                {"role": "user", "content": f"message {i}", "timestamp": 1.7e9 + i})
        ids = []
        for session, messages in by_session.items():
            store.ensure_session(session)
            Owners(store.db).record(session, LOCAL_OWNER)  # one owner: cross-session scope
            ids += store.ingest(session, messages, known=None).store_ids
        matrix = vectors_for(rng, len(ids), centres, offset)
        vectors.write(space, [VectorRow("m", sid, 0, f"h{sid}", matrix[k].tobytes())
                              for k, sid in enumerate(ids)])
        print(f"  built {min(n, start + step):,} / {n:,}", file=sys.stderr, flush=True)
    db.close()
    done.write_text(f"{time.perf_counter() - started:.1f}")
    return path


class _Fixed:
    """A provider stand-in with the bench's identity (search needs only numpy)."""

    np = np
    identity = IDENTITY


def measure(n: int) -> dict:
    path = build(n)
    db = Database(str(path))
    config = load_config(environ={}, hermes_home=path.parent)
    found = semantic.Semantic(db, config, embeddings.ProviderState(_Fixed(), ""))
    space = found.space()
    store = VectorStore(db)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    if n > vectorscan.PRESCREEN_MIN:
        found.bits.warm(store, space, "m", found.provider.identity.dim)
    load_s = time.perf_counter() - started
    held = found.bits.tables.get((space, "m"))
    bits_mb = (sum(a.nbytes for a in (held.ids, held.codes, held.words)) / 1e6
               if held is not None and held.ids is not None else 0.0)
    rss_bits = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
    rng = np.random.default_rng(11)
    sample = rng.integers(1, n, QUERIES)
    queries = []
    for sid in sample:
        raw = np.frombuffer(store.vectors_of(space, "m", [int(sid)])[0][1], np.float32)
        noisy = raw + rng.normal(0, 0.02, DIM).astype(np.float32)
        queries.append(noisy / np.linalg.norm(noisy))
    small = f"s{SESSIONS - 1}"
    timings: dict[str, list[float]] = {"all": [], "live": [], "small": []}
    results = []
    for q in queries:
        for scope, sessions in (("all", None), ("live", ("s0",)), ("small", (small,))):
            t = time.perf_counter()
            hits = found.search(q, "m", sessions, 10)
            timings[scope].append((time.perf_counter() - t) * 1000)
            if scope == "all":
                results.append([ref for ref, _ in hits])
    recall = exact_recall(store, space, queries[:10], results[:10], n)
    db.close()
    return {"messages": n, "queries": QUERIES,
            "p50_ms": {k: round(statistics.median(v), 2) for k, v in timings.items()},
            "p95_ms": {k: round(sorted(v)[int(len(v) * 0.95) - 1], 2) for k, v in timings.items()},
            "prescreen": n > vectorscan.PRESCREEN_MIN, "bits_load_s": round(load_s, 2),
            "bits_mb": round(bits_mb, 1), "rss_growth_loading_mb": round(rss_bits, 1),
            "recall_at_10_vs_exact": recall,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def exact_recall(store: VectorStore, space: int, queries, found, n: int) -> float:
    """Share of the exact top 10 (full product over every vector) that search returned."""
    best = [dict() for _ in queries]
    q = np.stack(queries)
    after = 0
    while True:
        rows = store.scan(space, "m", after, 100_000)
        if not rows:
            break
        ids = np.array([r[0] for r in rows])
        matrix = np.frombuffer(b"".join(r[3] for r in rows), np.float32).reshape(len(rows), -1)
        scores = matrix @ q.T
        for j in range(len(queries)):
            top = np.argpartition(-scores[:, j], 10)[:10]
            best[j].update({int(ids[i]): float(scores[i, j]) for i in top})
        after = rows[-1][0]
    hits = 0
    for j, got in enumerate(found):
        truth = sorted(best[j], key=lambda k: -best[j][k])[:10]
        hits += len(set(truth) & set(got))
    return round(hits / (10 * len(found)), 3)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(json.dumps(measure(int(argv[1]))))
        return 0
    sizes = [int(a) for a in argv] or [100_000]
    rows = []
    for n in sizes:
        build(n)
        out = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True,
                             text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    for r in rows:
        print(json.dumps(r))
    synth.save_results("vector_search", sizes=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
