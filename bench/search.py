#!/usr/bin/env python3
"""Search latency at scale: trove_grep through the tool dispatcher vs a bare FTS5 query.

The store (built once, cached as /tmp/trove-bench/trove-search-<n>.db) holds
coding-agent messages written with ``Store.ingest``: 20 other sessions and one
live session with 90% of the rows, compacted into leaf summaries (100 messages
each, with real extracted text) condensed up to depth 3, except its newest 60
messages. Text is drawn from a Zipf vocabulary of 60,000 words (s = 1.07), so a
query has common, mid-frequency and rare words as real text does; 8% of
messages carry a snake_case or camelCase identifier from a pool of 20,000;
sizes are lognormal around 1 KB, 200 B to 20 KB, 1% large payloads.

Query kinds (the same queries for every mode, 200 of each by default, after a
warm-up that is not counted):
  identifier  one identifier that occurs in the store (``stale_cursor_limit``)
  short       1-3 words of mixed frequency
  long        a natural question with 5 content words (2 common, 2 mid, 1 rare):
              "what did we decide about the {c} {m} and {c} for {m} {r}?"
The file is read once before timing (warm OS page cache; SQLite's own cache is
its default 2 MB) and the modes run in a fresh random order for every query.
Modes:
  grep        tools.dispatch("trove_grep", {"query": q}, ctx), ctx = the live
              engine's ToolContext (this session: raw messages + summaries)
  grep_all    the same with session_scope="all" (raw messages of every session)
  fts_or      bare FTS5 on the same file, its own connection:
              SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'body : (t1 OR t2 ...)'
              ORDER BY bm25(messages_fts) LIMIT 10   (an identifier is one phrase)
  fts_and     the same with AND (what a keyword box does); for reference
Each size runs in its own process, so its peak RSS is its own.

    .venv/bin/python bench/search.py 100000 1000000 [--queries 200]
Prints a table and writes bench/results/search.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import time
from itertools import accumulate
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)

from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.storage import database
from hermes_trove.recall import query_plan
from hermes_trove import tools  # noqa: E402
from hermes_trove.dag import Dag, NewNode  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

LIVE = synth.LIVE_SESSION
VOCAB_SIZE = 60_000
ZIPF_S = 1.07
IDENTIFIERS = 20_000
TARGETS_MS = {"identifier": 20.0, "short": 20.0, "long": 50.0}  # p50 at 1M, tool path
KINDS = ("identifier", "short", "long")
MODES = ("grep", "grep_all", "fts_or", "fts_and")
WARMUP = 20


# ---------------------------------------------------------------- corpus
def _vocabulary(rng: random.Random) -> list[str]:
    """60,000 distinct pronounceable words, none a stop word or question filler."""
    onsets = "b c d f g h j k l m n p r s t v w z br cl dr fl gr pl pr sk st tr ch sh th".split()
    vowels = "a e i o u ai ea io ou".split()
    codas = ["", "", "n", "r", "s", "t", "l", "m", "x", "nd", "rk", "st"]
    banned = query_plan.STOP_WORDS | query_plan.FILLER_WORDS
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < VOCAB_SIZE:
        word = "".join(rng.choice(onsets) + rng.choice(vowels)
                       for _ in range(rng.choice((1, 2, 2, 3)))) + rng.choice(codas)
        if len(word) >= 3 and word not in seen and word not in banned:
            seen.add(word)
            words.append(word)
    return words


class Corpus:
    """Deterministic Zipf text, identifiers and messages for the search store."""

    def __init__(self, seed: int = 7):
        rng = random.Random(seed)
        self.words = _vocabulary(rng)
        self.cum = list(accumulate(1.0 / (rank ** ZIPF_S) for rank in range(1, VOCAB_SIZE + 1)))
        mid = self.words[500:20_000]
        self.identifiers = []
        for i in range(IDENTIFIERS):
            parts = rng.sample(mid, rng.choice((2, 2, 3)))
            self.identifiers.append("_".join(parts) if i % 10 < 7
                                    else parts[0] + "".join(p.capitalize() for p in parts[1:]))
        self.ident_cum = list(accumulate(1.0 / (rank ** 0.9) for rank in range(1, IDENTIFIERS + 1)))

    def draw(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=k)

    def prose(self, rng: random.Random, chars: int) -> str:
        out, size = [], 0
        while size < chars:
            sentence = self.draw(rng, rng.randint(6, 16))
            sentence[0] = sentence[0].capitalize()
            text = " ".join(sentence) + "."
            out.append(text)
            size += len(text) + 1
        return " ".join(out)[:chars]

    def code(self, rng: random.Random, chars: int) -> str:
        lines, size = ["def handler(request):"], 0
        while size < chars:
            a, b, c = self.draw(rng, 3)
            line = f"    {a}_{b} = {c}({rng.randint(0, 999)})  # {' '.join(self.draw(rng, 5))}"
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)[:chars]

    def identifier(self, rng: random.Random) -> str:
        return rng.choices(self.identifiers, cum_weights=self.ident_cum, k=1)[0]

    def message(self, rng: random.Random, i: int) -> dict:
        size = int(min(20_000, max(200, rng.lognormvariate(6.6, 0.8))))
        if rng.random() < 0.01:
            size = rng.randint(8_000, 20_000)
        kind = rng.random()
        ident = f" {self.identifier(rng)}" if rng.random() < 0.08 else ""
        if kind < 0.3:
            return {"role": "user", "content": self.prose(rng, size) + ident}
        if kind < 0.5:
            a, b, c = self.draw(rng, 3)
            return {"role": "assistant", "content": "", "tool_calls": [{
                "id": f"call_{i}", "type": "function", "function": {
                    "name": rng.choice(["read_file", "terminal", "search_files"]),
                    "arguments": json.dumps({"path": f"src/{a}/{b}.py",
                                             "pattern": c + ident})}}]}
        if kind < 0.8:
            return {"role": "tool", "tool_call_id": f"call_{i - 1}", "name": "read_file",
                    "content": self.code(rng, size) + ident}
        return {"role": "assistant", "content": self.prose(rng, size) + ident}


_IDENT_PATTERN = re.compile(r"\b[a-z]+(?:_[a-z]+){1,2}\b|\b[a-z]+(?:[A-Z][a-z]+){1,2}\b")


def _leaf_text(messages: list[dict], ident_set: set[str]) -> str:
    """An extractive leaf summary: the first sentence of a few children, plus identifiers."""
    picks = [m for m in messages if m.get("content")][:: max(1, len(messages) // 8)][:8]
    lines = ["- " + re.split(r"(?<=\.)\s", m["content"], maxsplit=1)[0][:160] for m in picks]
    idents = sorted({w for m in messages
                     for w in _IDENT_PATTERN.findall(m.get("content") or "") if w in ident_set})
    if idents:
        lines.append("Identifiers: " + ", ".join(idents[:10]))
    return "\n".join(lines)


def build_search_db(n_messages: int, *, live_share: float = 0.9, tail: int = 60,
                    batch: int = 2000, leaf_size: int = 100, verbose: bool = True) -> Path:
    """Create (or reuse) the cached search store with ``n_messages`` rows."""
    synth.CACHE.mkdir(parents=True, exist_ok=True)
    path = synth.CACHE / f"trove-search-{n_messages}.db"
    done = path.with_suffix(".done")
    if path.exists() and done.exists():
        return path
    for stale in (path, path.with_suffix(".db-wal"), path.with_suffix(".db-shm")):
        stale.unlink(missing_ok=True)
    corpus = Corpus()
    ident_set = set(corpus.identifiers)
    rng = random.Random(11)
    db = database.get_database(path)
    store, dag = Store(db), Dag(db)
    live_n = int(n_messages * live_share)
    sessions = [(f"bench-other-{k}", (n_messages - live_n) // 20) for k in range(20)]
    sessions.append((LIVE, n_messages - sum(c for _, c in sessions)))  # live is newest
    started, written, next_report = time.perf_counter(), 0, 50_000
    leaves: list[tuple[int, str]] = []
    for session, count in sessions:
        store.ensure_session(session, source=rng.choice(["cli", "telegram", "discord"]))
        Owners(store.db).record(session, LOCAL_OWNER)  # one owner: cross-session scope
        for start in range(0, count, batch):
            chunk = [corpus.message(rng, written + j) for j in range(min(batch, count - start))]
            result = store.ingest(session, chunk, count_tokens=lambda m: len(json.dumps(m)) // 4,
                                  now=1_790_000_000 + written)
            if session == LIVE:
                for k in range(0, len(chunk), leaf_size):
                    first = start + k
                    if first + leaf_size > count - tail:
                        break
                    ids = result.store_ids[k:k + leaf_size]
                    text = _leaf_text(chunk[k:k + leaf_size], ident_set)
                    leaves.append((dag.add_node(NewNode(LIVE, 0, text, len(text) // 4,
                                                        20_000, 3, "deterministic",
                                                        child_store_ids=ids)), text))
            written += len(chunk)
            if verbose and written >= next_report:
                next_report += 50_000
                rate = written / (time.perf_counter() - started)
                print(f"  {written:,}/{n_messages:,} rows ({rate:,.0f} rows/s)", file=sys.stderr)
    level = leaves
    for depth in range(1, 4):
        groups = [level[i:i + 4] for i in range(0, len(level) - len(level) % 4, 4)]
        level = []
        for group in groups:
            text = "\n".join(t.split("\n", 1)[0] for _, t in group)
            level.append((dag.add_node(NewNode(LIVE, depth, text, len(text) // 4, 800, 3,
                                               "deterministic",
                                               child_node_ids=[n for n, _ in group])), text))
    database.forget_database(path)
    seconds = time.perf_counter() - started
    done.write_text(json.dumps({"built_at": time.time(), "seconds": round(seconds, 1),
                                "rows_per_s": round(n_messages / seconds)}))
    if verbose:
        print(f"  built {path} in {seconds:.0f} s", file=sys.stderr)
    return path


# ---------------------------------------------------------------- queries
def make_queries(path: Path, count: int, seed: int = 5) -> dict[str, list[str]]:
    """``count`` queries of each kind; identifiers are taken from stored rows."""
    corpus = Corpus()
    rng = random.Random(seed)
    common = [w for w in corpus.words[:300]]
    mid = corpus.words[1_000:5_000]
    rare = corpus.words[10_000:40_000]
    classes = (common, mid, rare)
    pattern = _IDENT_PATTERN
    ident_set = set(corpus.identifiers)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    top = conn.execute("SELECT max(store_id) FROM messages").fetchone()[0]
    found: list[str] = []
    while len(found) < count + WARMUP:
        sid = rng.randint(1, top)
        row = conn.execute("SELECT content, tool_calls FROM messages WHERE store_id = ?",
                           (sid,)).fetchone()
        if row is None:
            continue
        idents = [w for w in pattern.findall(" ".join(x or "" for x in row)) if w in ident_set]
        if idents:
            found.append(rng.choice(idents))
    conn.close()
    shorts = [" ".join(rng.choice(rng.choice(classes)) for _ in range(rng.randint(1, 3)))
              for _ in range(count + WARMUP)]
    longs = []
    for _ in range(count + WARMUP):
        c1, c2 = rng.sample(common, 2)
        m1, m2 = rng.sample(mid, 2)
        longs.append(f"what did we decide about the {c1} {m1} and {c2} for {m2} "
                     f"{rng.choice(rare)}?")
    return {"identifier": found, "short": shorts, "long": longs}


def bare_terms(kind: str, query: str) -> list[str]:
    """The FTS strings a keyword box would send: content words, or the identifier's phrase."""
    if kind == "identifier":
        parts = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", query).replace("_", " ").lower().split()
        return [" ".join(parts)]
    words = re.findall(r"[a-z]+", query.lower())
    return [w for w in words if w not in query_plan.STOP_WORDS and w not in ("decide",)]


def bare_expr(terms: list[str], op: str) -> str:
    return "body : (" + f" {op} ".join('"' + t + '"' for t in terms) + ")"


# ---------------------------------------------------------------- measurement
def warm_file(path: Path) -> None:
    """Read the whole file once so every mode runs against the OS page cache (warm):
    the kernel here evicts idle file pages, and a cold start would be charged to
    whichever mode happens to touch a page first."""
    with open(path, "rb") as handle:
        while handle.read(8 << 20):
            pass


def measure(n_messages: int, count: int) -> dict:
    path = build_search_db(n_messages, verbose=False)
    queries = make_queries(path, count)
    cfg = trove_config.load_config({"HERMES_HOME": str(path.parent),
                                    "TROVE_DATABASE_PATH": str(path),
                                    "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0"})
    engine = TroveEngine(cfg)
    engine.use_llm(None)
    engine.update_model("bench", 200_000)
    engine.on_session_start(LIVE, platform="cli")
    engine.current_turn_store_id = engine.store.last_store_id(LIVE)
    ctx = engine.tool_context()
    bare = sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def run(mode: str, kind: str, query: str) -> tuple[float, int]:
        started = time.perf_counter()
        if mode in ("grep", "grep_all"):
            args = {"query": query} if mode == "grep" else {"query": query, "session_scope": "all"}
            answer = json.loads(tools.dispatch("trove_grep", args, ctx))
            if "error" in answer:
                raise RuntimeError(f"{mode} {query!r}: {answer['error']}")
            hits = len(answer["results"])
        else:
            terms = bare_terms(kind, query)
            expr = bare_expr(terms, "OR" if mode == "fts_or" else "AND")
            hits = len(bare.execute(
                "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
                " ORDER BY bm25(messages_fts) LIMIT 10", (expr,)).fetchall())
        return (time.perf_counter() - started) * 1000, hits

    warm_file(path)
    timings = {(m, k): [] for m in MODES for k in KINDS}
    empty = {(m, k): 0 for m in MODES for k in KINDS}
    order_rng = random.Random(3)
    for kind in KINDS:
        for index, query in enumerate(queries[kind]):
            # A fresh random order per query: the modes read many of the same pages,
            # so no mode may be the one that always finds them already loaded.
            for mode in order_rng.sample(MODES, len(MODES)):
                ms, hits = run(mode, kind, query)
                if index >= WARMUP:
                    timings[(mode, kind)].append(ms)
                    empty[(mode, kind)] += hits == 0
    bare.close()
    database.forget_database(path)
    rows = []
    for (mode, kind), values in timings.items():
        values.sort()
        rows.append({"mode": mode, "kind": kind, "queries": len(values),
                     "p50_ms": round(statistics.median(values), 2),
                     "p95_ms": round(synth.percentile(values, 0.95), 2),
                     "max_ms": round(values[-1], 2), "no_hit_queries": empty[(mode, kind)]})
    examples = {k: queries[k][WARMUP:WARMUP + 3] for k in KINDS}
    return {"messages": n_messages, "db_bytes": path.stat().st_size, "rows": rows,
            "examples": examples, "peak_rss_mb": synth.peak_rss_mb()}


def measure_in_subprocess(n_messages: int, count: int) -> dict:
    build_search_db(n_messages)
    out = subprocess.run([sys.executable, __file__, "--one", str(n_messages),
                          "--queries", str(count)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--build-only", action="store_true", help="build the stores and stop")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.queries)))
        return 0
    if args.build_only:
        for n in args.sizes:
            print(build_search_db(n))
        return 0
    results = [measure_in_subprocess(n, args.queries) for n in args.sizes]
    print(f"{'messages':>10} {'kind':>10} " + " ".join(f"{m + ' p50/p95':>19}" for m in MODES)
          + f" {'rss MB':>7}")
    verdicts = []
    for res in results:
        by = {(r["mode"], r["kind"]): r for r in res["rows"]}
        for kind in KINDS:
            cells = " ".join(f"{by[(m, kind)]['p50_ms']:>9.2f}/{by[(m, kind)]['p95_ms']:<9.2f}"
                             for m in MODES)
            print(f"{res['messages']:>10,} {kind:>10} {cells} {res['peak_rss_mb']:>7}")
        if res["messages"] >= 1_000_000:
            for kind in KINDS:
                for mode in ("grep", "grep_all"):
                    p50 = by[(mode, kind)]["p50_ms"]
                    verdicts.append({"mode": mode, "kind": kind, "p50_ms": p50,
                                     "target_ms": TARGETS_MS[kind],
                                     "met": p50 < TARGETS_MS[kind]})
    for v in verdicts:
        print(f"target at 1M: {v['mode']} {v['kind']} p50 {v['p50_ms']} ms < {v['target_ms']} ms:"
              f" {'met' if v['met'] else 'MISSED'}")
    synth.save_results("search", sizes=results, targets=verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
