#!/usr/bin/env python3
"""The store on both engines: SQLite (a file) and PostgreSQL (a server), same figures.

For every size and engine a fresh store is filled with ``search.Corpus`` messages
(Zipf vocabulary, identifiers, lognormal sizes around 1 KB) in 21 sessions through
``Store.ingest`` 2,000 at a time (the "fill" rate). Then, on that store:

  host      TroveEngine.on_session_end(window) with windows of 40 seen + 500 new
            messages (the way the host feeds the engine), 10 windows: msg/s
  raw       the same 5,000 messages, already encoded, by executemany of one row per
            statement into a bare table on the same engine with its own full-text
            index (SQLite: FTS5 kept by a trigger; PostgreSQL: a generated tsvector
            column with GIN): msg/s, the reference of the ratio host / raw
  turn      engine.ingest of the growing list, one 4-message turn at a time (the
            newest 44 messages shown), 100 turns: ms per turn, p50 / p95
  grep      trove_grep through tools.dispatch in the live session, 1-3 word queries
            and identifiers, 60 of each after 10 warm-up: ms p50 / p95
  open      a new connection's open (connect, migration check, structural check),
            median of 5: ms
  overlap   ranking on the same data: the fill is deterministic, so both engines hold
            the same rows under the same store_ids; for every query, the share of
            SQLite's top 10 trove_grep hits that PostgreSQL also returns in its top 10
            (both rank candidates with recall/search's BM25; they differ where the
            full-text engines' candidate sets differ), mean over the queries, and the
            share of queries whose top 10 is identical in order

The PostgreSQL server is the one in ``--pg-url`` (default $PG_TROVE_TEST_URL), each
size in its own schema (dropped afterwards); the SQLite file is in a temp folder.

    .venv/bin/python bench/backends.py 100000 1000000 [--pg-url URL] [--engines sqlite postgresql]
        [--bulk-fill]   (rows written directly instead of Store.ingest: see bulk_fill)
Prints a table and writes bench/results/backends.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)
from search import Corpus  # noqa: E402

from hermes_trove import config as trove_config, tools  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.storage import codec, database, migrations  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import INSERT_COLUMNS, Store  # noqa: E402

LIVE = "bench-live"
RAW_SQLITE = """
CREATE TABLE raw (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT,
                  tool_calls TEXT, content_hash TEXT, created_at REAL);
CREATE VIRTUAL TABLE raw_fts USING fts5(body, content='raw', content_rowid='id',
                                        tokenize='unicode61 remove_diacritics 2');
CREATE TRIGGER raw_ai AFTER INSERT ON raw BEGIN
  INSERT INTO raw_fts(rowid, body) VALUES (new.id, new.content);
END;
"""
RAW_PG = ("CREATE TABLE raw (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
          " session_id TEXT, role TEXT, content TEXT, tool_calls TEXT, content_hash TEXT,"
          " created_at DOUBLE PRECISION, fts tsvector GENERATED ALWAYS AS"
          " (to_tsvector('simple', trove_words(left(COALESCE(content, ''), 262144))))"
          " STORED);"
          " CREATE INDEX raw_fts ON raw USING gin (fts)")
RAW_INSERT = ("INSERT INTO raw(session_id, role, content, tool_calls, content_hash, created_at)"
              " VALUES (?, ?, ?, ?, ?, ?)")


class Target:
    """A fresh store on one engine: a temp SQLite file, or a schema on the server."""

    def __init__(self, engine: str, size: int, pg_url: str | None):
        self.engine = engine
        if engine == "sqlite":
            self.folder = Path(tempfile.mkdtemp(prefix="trove-bench-backends-"))
            self.where = str(self.folder / "trove.db")
        else:
            import psycopg
            from urllib.parse import quote
            self.schema = f"bench_{size}"
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA public")
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
                conn.execute(f"CREATE SCHEMA {self.schema}")
            self.pg_url = pg_url
            self.where = pg_url + ("&" if "?" in pg_url else "?") + "options=" + quote(
                f"-csearch_path={self.schema}")
            self.folder = Path(tempfile.mkdtemp(prefix="trove-bench-backends-"))

    def drop(self) -> None:
        database.forget_database(self.where)
        if self.engine == "postgresql":
            import psycopg
            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        shutil.rmtree(self.folder, ignore_errors=True)


def fill(target: Target, size: int, corpus: Corpus) -> dict:
    rng = random.Random(11)
    store = Store(database.get_database(target.where))
    sessions = [(f"bench-other-{k}", size // 10 // 20) for k in range(20)]
    sessions.append((LIVE, size - sum(c for _, c in sessions)))
    started, written = time.perf_counter(), 0
    for session, count in sessions:
        store.ensure_session(session, source="cli")
        Owners(store.db).record(session, LOCAL_OWNER)
        for start in range(0, count, 2000):
            chunk = [corpus.message(rng, written + j) for j in range(min(2000, count - start))]
            store.ingest(session, chunk, count_tokens=lambda m: len(json.dumps(m)) // 4,
                         now=1_790_000_000 + written)
            written += len(chunk)
            if written % 100_000 < 2000:
                print(f"  {target.engine}: {written:,}/{size:,}", file=sys.stderr)
    seconds = time.perf_counter() - started
    if target.engine == "postgresql":  # what autovacuum does after a bulk load, now
        with store.db.reading() as conn:
            conn.execute("ANALYZE")
    return {"fill_msg_s": round(size / seconds), "fill_s": round(seconds, 1)}


def bulk_fill(target: Target, size: int, corpus: Corpus) -> dict:
    """The same messages, sessions and owners as ``fill``, written as rows without the
    host path (no identity reading, no views): ``Store.ingest`` at ~335 msg/s on the
    server would take ~50 minutes for 1M. Rows are encoded exactly as the store encodes
    them (``codec``; the ordinal counts repeats of a content hash in a session) and
    written 5,000 per transaction: SQLite by executemany, PostgreSQL by COPY into the
    table with its indexes in place (GIN, pg_trgm), which is what the server maintains
    for every later write too. The host path is measured on its own (``host_and_raw``)."""
    rng = random.Random(11)
    db = database.get_database(target.where)
    store = Store(db)
    sessions = [(f"bench-other-{k}", size // 10 // 20) for k in range(20)]
    sessions.append((LIVE, size - sum(c for _, c in sessions)))
    started, written = time.perf_counter(), 0
    for session, count in sessions:
        store.ensure_session(session, source="cli")
        Owners(db).record(session, LOCAL_OWNER)
        seen: dict[str, int] = {}
        for start in range(0, count, 5000):
            rows = []
            for j in range(min(5000, count - start)):
                message = corpus.message(rng, written + j)
                e = codec.encode_message(codec.clean_message(message))
                ordinal = seen.get(e.content_hash, 0)
                seen[e.content_hash] = ordinal + 1
                rows.append((session, None, "cli", e.role, e.content, e.content_format,
                             e.tool_calls, e.tool_call_id, e.tool_name, e.extra, e.search_text,
                             e.content_hash, ordinal, e.message_at, 1_790_000_000 + written + j,
                             len(json.dumps(message)) // 4))
            _write_rows(db, target.engine, rows)
            written += len(rows)
            if written % 100_000 < 5000:
                print(f"  {target.engine}: {written:,}/{size:,} (bulk)", file=sys.stderr)
    seconds = time.perf_counter() - started
    with db.reading() as conn:  # what autovacuum does after a bulk load, now
        conn.execute("VACUUM ANALYZE" if target.engine == "postgresql" else "ANALYZE")
    return {"fill": "bulk", "fill_msg_s": round(size / seconds), "fill_s": round(seconds, 1)}


def _write_rows(db, engine: str, rows: list[tuple]) -> None:
    """One transaction of message rows (see ``bulk_fill``)."""
    columns = ", ".join(INSERT_COLUMNS)
    with db.transaction() as conn:
        if engine == "sqlite":
            conn.executemany(f"INSERT INTO messages({columns}) VALUES"
                             f" ({', '.join('?' * len(INSERT_COLUMNS))})", rows)
            return
        from hermes_trove.storage.postgres.connection import escape_text
        with conn.raw.cursor().copy(f"COPY messages({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([escape_text(v) for v in row])


def make_engine(target: Target) -> TroveEngine:
    env = {"HERMES_HOME": str(target.folder), "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0",
           "TROVE_MIN_TRIGGER_TOKENS": "0"}
    env["TROVE_DATABASE_URL" if target.engine == "postgresql" else "TROVE_DATABASE_PATH"] = \
        target.where
    engine = TroveEngine(trove_config.load_config(env))
    engine.use_llm(None)
    engine.update_model("bench", 10_000_000)  # never compacts: ingest alone is measured
    return engine


def host_and_raw(target: Target, corpus: Corpus) -> dict:
    rng = random.Random(5)
    messages = [corpus.message(rng, 10_000_000 + i) for i in range(5_000)]
    engine = make_engine(target)
    engine.on_session_start("bench-host", platform="cli")
    started = time.perf_counter()
    for start in range(0, len(messages), 500):
        engine.on_session_end("bench-host", messages[max(0, start - 40):start + 500])
    host = len(messages) / (time.perf_counter() - started)
    db = database.get_database(target.where)
    with db.transaction() as conn:
        if target.engine == "sqlite":
            migrations.run_script(conn, RAW_SQLITE)
        else:
            for statement in RAW_PG.split(";"):
                conn.execute(statement)
    encoded = [codec.encode_message(codec.clean_message(m)) for m in messages]
    rows = [("raw", e.role, e.content, e.tool_calls, e.content_hash, time.time())
            for e in encoded]
    started = time.perf_counter()
    for start in range(0, len(rows), 500):
        with db.transaction() as conn:
            conn.executemany(RAW_INSERT, rows[start:start + 500])
    raw = len(rows) / (time.perf_counter() - started)
    assert len(INSERT_COLUMNS) > 6  # the store writes more columns than raw: its schema
    return {"host_msg_s": round(host), "raw_msg_s": round(raw), "ratio": round(host / raw, 2)}


def per_turn(target: Target, corpus: Corpus) -> dict:
    rng = random.Random(7)
    engine = make_engine(target)
    engine.on_session_start("bench-turns", platform="cli")
    shown: list[dict] = []
    times = []
    for t in range(100):
        shown += [corpus.message(rng, 20_000_000 + 4 * t + k) for k in range(4)]
        started = time.perf_counter()
        engine.ingest(shown[-44:])
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"turn_ms_p50": round(statistics.median(times), 2),
            "turn_ms_p95": round(synth.percentile(times, 0.95), 2)}


def grep(target: Target, corpus: Corpus) -> dict:
    rng = random.Random(9)
    engine = make_engine(target)
    engine.on_session_start(LIVE, platform="cli")
    ctx = engine.tool_context()
    queries = ([" ".join(corpus.draw(rng, rng.randint(1, 3))) for _ in range(70)]
               + [corpus.identifier(rng) for _ in range(70)])
    rng.shuffle(queries)
    times, hits = [], {}
    for index, query in enumerate(queries):
        started = time.perf_counter()
        answer = json.loads(tools.dispatch("trove_grep", {"query": query}, ctx))
        if "error" in answer:
            raise RuntimeError(f"trove_grep {query!r}: {answer['error']}")
        if index >= 20:
            times.append((time.perf_counter() - started) * 1000)
        hits[query] = [r.get("store_id") or f"n{r.get('node_id')}" for r in answer["results"]]
    times.sort()
    return {"grep_ms_p50": round(statistics.median(times), 1),
            "grep_ms_p95": round(synth.percentile(times, 0.95), 1), "hits": hits}


def overlap(first: dict, second: dict) -> dict:
    """How much of ``first``'s top 10 per query ``second`` also has, and same-order share."""
    shares, same = [], 0
    for query, ours in first.items():
        theirs = second.get(query, [])
        if ours:
            shares.append(len(set(ours[:10]) & set(theirs[:10])) / len(ours[:10]))
        same += ours[:10] == theirs[:10]
    return {"top10_overlap": round(statistics.mean(shares), 3) if shares else None,
            "same_top10_share": round(same / max(1, len(first)), 3)}


def open_time(target: Target) -> dict:
    times = []
    for _ in range(5):
        database.forget_database(target.where)
        started = time.perf_counter()
        database.get_database(target.where)
        times.append((time.perf_counter() - started) * 1000)
    return {"open_ms": round(statistics.median(times), 1)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[100_000, 1_000_000])
    parser.add_argument("--pg-url", default=os.environ.get("PG_TROVE_TEST_URL"))
    parser.add_argument("--engines", nargs="+", default=["sqlite", "postgresql"],
                        choices=["sqlite", "postgresql"])
    parser.add_argument("--bulk-fill", action="store_true",
                        help="fill with rows written directly (bulk_fill) instead of "
                             "Store.ingest; the host path is measured the same either way")
    args = parser.parse_args(argv)
    if "postgresql" in args.engines and not args.pg_url:
        parser.error("PostgreSQL needs --pg-url (or PG_TROVE_TEST_URL)")
    corpus = Corpus()
    rows = []
    for size in args.sizes:
        ranked = {}
        for engine in args.engines:
            target = Target(engine, size, args.pg_url)
            try:
                row = {"engine": engine, "messages": size}
                row.update((bulk_fill if args.bulk_fill else fill)(target, size, corpus))
                row.update(host_and_raw(target, corpus))
                row.update(per_turn(target, corpus))
                row.update(grep(target, corpus))
                row.update(open_time(target))
            finally:
                target.drop()
            ranked[engine] = row.pop("hits")
            if len(ranked) == 2:
                row.update(overlap(ranked["sqlite"], ranked["postgresql"]))
            rows.append(row)
            print(json.dumps(row), flush=True)
    header = ("engine", "messages", "fill_msg_s", "host_msg_s", "raw_msg_s", "ratio",
              "turn_ms_p50", "turn_ms_p95", "grep_ms_p50", "grep_ms_p95", "open_ms",
              "top10_overlap", "same_top10_share")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row.get(h, "")) for h in header))
    synth.save_results("backends", rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
