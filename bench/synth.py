"""Synthetic trove databases for the benchmarks (cached under /tmp/trove-bench).

Messages are coding-agent-like: prose, code, JSON tool results and tool calls,
200 B to 20 KB with most around 300-700 B, 1% large payloads. The "live"
session holds most rows, compacted into leaf and condensed nodes except its
newest ``tail`` messages, so per-turn work runs against a realistic history.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from _bootstrap import load_package  # noqa: E402

load_package()
from hermes_trove.storage import database  # noqa: E402
from hermes_trove.dag import Dag, NewNode  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

CACHE = Path(os.environ.get("TROVE_BENCH_CACHE", "/tmp/trove-bench"))
LIVE_SESSION = "bench-live"
WORDS = ("retry backoff proxy config deploy staging database port token refresh queue worker "
         "migration index handler request response timeout error exception commit branch test "
         "fixture payload schema cache latency throughput memory cursor session summary lineage "
         "decided because should must fixed broken flaky release version merge review").split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_message(rng: random.Random, i: int) -> dict:
    """One realistic message; sizes follow a long-tailed distribution."""
    kind = rng.random()
    size = int(min(20_000, max(200, rng.lognormvariate(6.0, 0.8))))
    if rng.random() < 0.01:
        size = rng.randint(8_000, 20_000)
    if kind < 0.3:
        return {"role": "user", "content": " ".join(_sentence(rng, 12) for _ in range(size // 90 + 1))[:size]
                + f" ident_{i % 5000}"}
    if kind < 0.5:
        call_id = f"call_{i}"
        return {"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function", "function": {
                "name": rng.choice(["read_file", "terminal", "search_files"]),
                "arguments": json.dumps({"path": f"src/mod_{i % 997}.py", "q": rng.choice(WORDS)})}}]}
    if kind < 0.8:
        lines = [f"    {rng.choice(WORDS)}_{j} = {rng.choice(WORDS)}({j})" for j in range(size // 30 + 1)]
        return {"role": "tool", "tool_call_id": f"call_{i - 1}", "name": "read_file",
                "content": ("def handler():\n" + "\n".join(lines))[:size]}
    return {"role": "assistant", "content": " ".join(_sentence(rng, 14) for _ in range(size // 100 + 1))[:size]}


def build(n_messages: int, *, live_share: float = 0.9, tail: int = 60, seed: int = 1,
          batch: int = 2000, verbose: bool = True) -> Path:
    """Create (or reuse) a database with ``n_messages`` rows; return its path."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"trove-{n_messages}.db"
    done = path.with_suffix(".done")
    if path.exists() and done.exists():
        return path
    for stale in (path, path.with_suffix(".db-wal"), path.with_suffix(".db-shm")):
        stale.unlink(missing_ok=True)
    rng = random.Random(seed)
    db = database.get_database(path)
    store, dag = Store(db), Dag(db)
    live_n = int(n_messages * live_share)
    started = time.perf_counter()
    written = 0
    sessions = [(LIVE_SESSION, live_n)] + [
        (f"bench-other-{k}", (n_messages - live_n) // 20) for k in range(20)]
    for session, count in sessions:
        store.ensure_session(session, source=rng.choice(["cli", "telegram", "discord"]))
        Owners(store.db).record(session, LOCAL_OWNER)  # one owner: cross-session scope
        for start in range(0, count, batch):
            chunk = [make_message(rng, written + j) for j in range(min(batch, count - start))]
            store.ingest(session, chunk, count_tokens=lambda m: len(json.dumps(m)) // 4,
                         now=1_790_000_000 + written)
            written += len(chunk)
            if verbose and written % 50_000 < batch:
                rate = written / (time.perf_counter() - started)
                print(f"  {written:,}/{n_messages:,} rows ({rate:,.0f} rows/s)", file=sys.stderr)
    _compact_live(store, dag, live_n - tail)
    database.forget_database(path)
    done.write_text(str(time.time()))
    return path


def _compact_live(store: Store, dag: Dag, covered: int, leaf_size: int = 100,
                  fanout: int = 4, max_depth: int = 3) -> None:
    """Leaves over the live session's oldest ``covered`` rows, condensed up to max_depth."""
    rows = store.session_messages(LIVE_SESSION, limit=covered)
    level = []
    for start in range(0, len(rows), leaf_size):
        ids = [r["store_id"] for r in rows[start:start + leaf_size]]
        level.append(dag.add_node(NewNode(LIVE_SESSION, 0, f"leaf summary {start}", 200, 20_000, 3,
                                          "deterministic", child_store_ids=ids)))
    for depth in range(1, max_depth + 1):
        groups = [level[i:i + fanout] for i in range(0, len(level) - len(level) % fanout, fanout)]
        level = [dag.add_node(NewNode(LIVE_SESSION, depth, f"depth {depth} summary", 300, 800, 3,
                                      "deterministic", child_node_ids=g)) for g in groups]


def embedding_settings() -> dict:
    """``TROVE_BENCH_EMBEDDINGS=1``: run the engine with the local embedding model on, so
    its background worker embeds while the bench measures (the worst case for a turn)."""
    if os.environ.get("TROVE_BENCH_EMBEDDINGS") not in ("1", "true"):
        return {}
    return {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "local"}


def save_results(bench: str, **payload) -> Path:
    """Write ``bench/results/<bench>.json`` with the machine facts beside the figures."""
    folder = Path(__file__).resolve().parent / "results"
    folder.mkdir(exist_ok=True)
    path = folder / f"{bench}.json"
    if embedding_settings():
        bench += "_embeddings"
    path = folder / f"{bench}.json"
    path.write_text(json.dumps({"bench": bench, "machine": machine(), **payload}, indent=2))
    return path


def machine() -> dict:
    """What the figures were measured on (stored with every result)."""
    import platform
    import sqlite3
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import subprocess
        revision = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).parent,
                                  capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        revision = ""
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "git": revision,
            "sqlite": sqlite3.sqlite_version, "load_avg_1m": round(os.getloadavg()[0], 2),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    import resource
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def percentile(sorted_values: list[float], share: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, int(round(share * len(sorted_values) + 0.4999)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1000]:
        print(build(n))
