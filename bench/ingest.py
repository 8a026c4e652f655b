#!/usr/bin/env python3
"""Ingest throughput: messages per second into the store, against SQLite's own limit.

The messages are ``synth.make_message``: user prose, assistant tool calls, tool
results (code), assistant prose; 200 B to 20 KB, most 300-700 B, 1% large
payloads. Every variant writes the same messages into a fresh database (a
temporary folder, deleted afterwards) with the same durability (WAL,
``synchronous=FULL``), in the same run; rounds are interleaved and the median
of the rounds is reported.

  per turn (one call and one transaction per turn of 4 messages, as the
  engine persists a finished turn):
    store      Store.ingest(session, turn)        encode + identity + insert (+ FTS)
    engine     TroveEngine.ingest(turn)           + ingest policy, per-message memo,
                                                  tiktoken counts
    raw        executemany of the same rows into a minimal table (7 columns, no
               index but the primary key) with an external-content FTS5 index
               (unicode61) kept by an AFTER INSERT trigger: the reference of the
               ratios. One row per statement makes FTS5 flush a segment per row;
               the store writes 100 rows per statement, so it can beat this
    raw_schema executemany of the already encoded rows into trove's own schema
               (its unique identity index, three more indexes, FTS with tags), one
               row per statement like raw: what the schema costs at that strategy
  bulk (one call and one transaction per 2,000 messages, like an import):
    store, engine, raw, raw_schema as above
  host (batches of 500 new messages, the way the host feeds the engine):
    host       TroveEngine.on_session_end(window) with bounded live windows of
               40 already-seen messages (the same objects) + 500 new ones
    host_tk    the same with TROVE_TOKEN_COUNT_ACCELERATOR=false: tiktoken counts
               every message even where the optional rs-bpe is installed
    store, engine, raw at 500 messages per call, beside it
Engine variants count with the optional rs-bpe package when it is installed
(requirements-extras.txt; the line "token counts:" says which ran).

Ratio = our throughput / raw throughput at the same batching (target >= 0.5).
The per-message cost of the engine path over Store.ingest is reported, and its
parts measured alone on the same messages (no database): ingest policy
(``policy.prepare``, which encodes; also with every secret detector on), counting
(``count_message`` with the accelerator when installed, and with tiktoken alone),
bare ``codec.encode_message``.
The tiktoken encoding is loaded before timing (a once-per-process start-up cost
of ~0.25 s) and its count cache emptied before each engine run, so counts are cold.

    .venv/bin/python bench/ingest.py [--messages 20000] [--rounds 3]
Prints a table and writes bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)

from hermes_trove.compaction import tokens  # noqa: E402
from hermes_trove.storage import codec  # noqa: E402
from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.storage import database  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.store import Store, normalize_source  # noqa: E402

TURN = 4
BULK = 2000
HOST_NEW = 500     # new messages per host window
HOST_SEEN = 40     # already-seen messages at the start of each host window
SESSION = "bench-ingest"
TARGET_RATIO = 0.5

RAW_SCHEMA = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT,
    tool_calls TEXT,
    tool_call_id TEXT,
    tool_name TEXT,
    created_at REAL NOT NULL
);
CREATE VIRTUAL TABLE messages_fts USING fts5(
    body, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, body)
    VALUES (new.id, COALESCE(new.content, '') || ' ' || COALESCE(new.tool_calls, ''));
END;
"""
RAW_INSERT = ("INSERT INTO messages(session_id, role, content, tool_calls, tool_call_id,"
              " tool_name, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
SCHEMA_INSERT = (
    "INSERT INTO messages(session_id, conversation_id, source, role, content, content_format,"
    " tool_calls, tool_call_id, tool_name, extra, search_text, content_hash, ordinal,"
    " message_at, created_at, token_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def make_messages(n: int, seed: int = 21) -> list[dict]:
    rng = random.Random(seed)
    return [synth.make_message(rng, i) for i in range(n)]


def fresh(messages: list[dict]) -> list[dict]:
    """New message objects (the engine memoizes per object: each run starts cold)."""
    return [json.loads(json.dumps(m)) for m in messages]


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _timed_raw_inserts(conn, sql: str, rows: list[tuple], size: int) -> float:
    """Insert ``rows`` with one ``executemany`` transaction per batch; seconds taken.
    Checks every row landed, then closes the connection."""
    started = time.perf_counter()
    for batch in batches(rows, size):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, batch)
        conn.execute("COMMIT")
    seconds = time.perf_counter() - started
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(rows)
    conn.close()
    return seconds


def cheap_tokens(message: dict) -> int:
    return len(json.dumps(message)) // 4


# ---------------------------------------------------------------- variants
def run_store(folder: Path, messages: list[dict], size: int) -> float:
    db = database.get_database(folder / "trove.db")
    store = Store(db)
    store.ensure_session(SESSION, source="cli")
    started = time.perf_counter()
    for batch in batches(messages, size):
        store.ingest(SESSION, batch, count_tokens=cheap_tokens, source="cli")
    seconds = time.perf_counter() - started
    assert store.count_messages(SESSION) == len(messages)
    database.forget_database(folder / "trove.db")
    return seconds


def _timed_engine(folder: Path, messages: list[dict], feed, **settings: str) -> float:
    """Seconds ``feed(engine)`` takes to hand ``messages`` to a fresh engine (checked)."""
    cfg = trove_config.load_config({"HERMES_HOME": str(folder),
                                    "TROVE_DATABASE_PATH": str(folder / "trove.db"),
                                    "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0",
                                    **synth.embedding_settings(), **settings})
    engine = TroveEngine(cfg)
    engine.use_llm(None)
    engine.update_model("bench", 200_000)
    engine.on_session_start(SESSION, platform="cli")
    # The tiktoken encoding loads once per process (~0.25 s, a start-up cost) and the
    # counter caches counts by text: load it now and empty the cache, so every run
    # counts these messages cold, as a live agent counts new messages.
    engine.counter.count_text("warm-up")
    engine.counter._cache.clear()
    started = time.perf_counter()
    feed(engine)
    seconds = time.perf_counter() - started
    assert engine.store.count_messages(SESSION) == len(messages)
    database.forget_database(cfg.resolved_database_path)
    return seconds


def run_engine(folder: Path, messages: list[dict], size: int) -> float:
    def feed(engine):
        for batch in batches(messages, size):
            engine.ingest(batch)
    return _timed_engine(folder, messages, feed)


def run_host(folder: Path, messages: list[dict], size: int, **settings: str) -> float:
    """The way the host feeds the engine: bounded live windows of ``HOST_SEEN``
    already-seen messages (the same objects the host keeps) + ``size`` new ones,
    through ``on_session_end`` (which the host calls before every compaction)."""
    def feed(engine):
        for start in range(0, len(messages), size):
            engine.on_session_end(SESSION, messages[max(0, start - HOST_SEEN):start + size])
    return _timed_engine(folder, messages, feed, **settings)


def run_host_tiktoken(folder: Path, messages: list[dict], size: int) -> float:
    """``run_host`` with tiktoken counting everything (the optional accelerator off)."""
    return run_host(folder, messages, size, TROVE_TOKEN_COUNT_ACCELERATOR="false")


def _raw_connection(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def run_raw(folder: Path, messages: list[dict], size: int) -> float:
    conn = _raw_connection(folder / "raw.db")
    conn.executescript(RAW_SCHEMA)
    stamp = time.time()
    rows = [(SESSION, m["role"], m.get("content"),
             json.dumps(m["tool_calls"]) if "tool_calls" in m else None,
             m.get("tool_call_id"), m.get("name"), stamp) for m in messages]
    return _timed_raw_inserts(conn, RAW_INSERT, rows, size)


def run_raw_schema(folder: Path, messages: list[dict], size: int) -> float:
    path = folder / "schema.db"
    database.get_database(path)  # creates trove's schema through its migrations
    database.forget_database(path)
    conn = _raw_connection(path)
    conn.execute("INSERT INTO sessions(session_id, canonical_id, source, created_at, updated_at)"
                 " VALUES (?, ?, 'cli', 0, 0)", (SESSION, SESSION))
    stamp = time.time()
    ordinals: dict[str, int] = {}
    rows = []
    for m in messages:
        enc = codec.encode_message(codec.clean_message(m))
        ordinal = ordinals.get(enc.content_hash, 0)
        ordinals[enc.content_hash] = ordinal + 1
        rows.append((SESSION, None, normalize_source("cli"), enc.role, enc.content,
                     enc.content_format, enc.tool_calls, enc.tool_call_id, enc.tool_name,
                     enc.extra, enc.search_text, enc.content_hash, ordinal, enc.message_at,
                     stamp, cheap_tokens(m)))
    return _timed_raw_inserts(conn, SCHEMA_INSERT, rows, size)


VARIANTS = {"store": run_store, "engine": run_engine, "raw": run_raw, "raw_schema": run_raw_schema,
            "host": run_host, "host_tk": run_host_tiktoken}
# which variants run at which batching: the host path only at the host's window size
BATCHINGS = (("turn", TURN, ("store", "engine", "raw", "raw_schema")),
             ("bulk", BULK, ("store", "engine", "raw", "raw_schema")),
             ("host", HOST_NEW, ("store", "engine", "raw", "host", "host_tk")))


def component_costs(messages: list[dict]) -> dict:
    """Microseconds per message of the engine's per-message work, without a database."""
    folder = Path(tempfile.mkdtemp(prefix="trove-bench-ingest-"))
    try:
        cfg = trove_config.load_config({"HERMES_HOME": str(folder),
                                        "TROVE_DATABASE_PATH": str(folder / "trove.db")})
        engine = TroveEngine(cfg)
        policy, counter = engine.policy, engine.counter
        plain = tokens.TokenCounter(cfg.token_encoding, accelerate=False)
        redacting = TroveEngine(trove_config.load_config({
            "HERMES_HOME": str(folder), "TROVE_DATABASE_PATH": str(folder / "redacting.db"),
            "TROVE_SENSITIVE_PATTERNS_ENABLED": "true"})).policy  # every detector on
        counter.count_text("warm-up")
        counter._cache.clear()  # cold counts, as for new messages
        out = {}
        for name, fn in (("policy_prepare_us", policy.prepare),
                         ("policy_prepare_redacting_us", redacting.prepare),
                         ("count_message_us", counter.count_message),
                         ("tiktoken_count_us", plain.count_message),
                         ("codec_encode_us", lambda m: codec.encode_message(codec.clean_message(m))),
                         ("cheap_count_us", cheap_tokens)):
            sample = fresh(messages)
            started = time.perf_counter()
            for m in sample:
                fn(m)
            out[name] = round((time.perf_counter() - started) * 1e6 / len(sample), 1)
        for name in ("trove.db", "redacting.db"):
            database.forget_database(folder / name)
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    messages = make_messages(args.messages)
    mean_bytes = sum(len(json.dumps(m)) for m in messages) / len(messages)
    seconds: dict[tuple[str, str], list[float]] = {}
    for round_no in range(args.rounds):
        for batching, size, variants in BATCHINGS:
            names = list(variants)
            names = names[round_no % len(names):] + names[:round_no % len(names)]
            for name in names:
                folder = Path(tempfile.mkdtemp(prefix="trove-bench-ingest-"))
                try:
                    took = VARIANTS[name](folder, fresh(messages), size)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                seconds.setdefault((batching, name), []).append(took)
                print(f"  round {round_no + 1} {batching:>4} {name:>10}: "
                      f"{len(messages) / took:,.0f} msg/s", file=sys.stderr)
    rows = []
    for (batching, name), values in seconds.items():
        median = statistics.median(values)
        rows.append({"batching": batching, "variant": name, "seconds_median": round(median, 3),
                     "msgs_per_s": round(len(messages) / median),
                     "runs_msgs_per_s": [round(len(messages) / v) for v in values]})
    by = {(r["batching"], r["variant"]): r for r in rows}
    summary = {}
    for batching, _, variants in BATCHINGS:
        raw = by[(batching, "raw")]["msgs_per_s"]
        for name in variants:
            if name != "raw":
                by[(batching, name)]["ratio_to_raw"] = round(
                    by[(batching, name)]["msgs_per_s"] / raw, 3)
        engine_us = by[(batching, "engine")]["seconds_median"] * 1e6 / len(messages)
        store_us = by[(batching, "store")]["seconds_median"] * 1e6 / len(messages)
        summary[batching] = {"engine_over_store_us_per_msg": round(engine_us - store_us, 1),
                             "store_us_per_msg": round(store_us, 1),
                             "engine_us_per_msg": round(engine_us, 1)}
    components = component_costs(make_messages(5000, seed=99))
    accelerator = tokens.get_counter().accelerator
    print(f"{len(messages):,} messages, mean {mean_bytes:,.0f} B as JSON, {args.rounds} rounds"
          f" (median); WAL, synchronous=FULL")
    print(f"{'batching':>8} {'variant':>10} {'msg/s':>8} {'ratio to raw':>12}")
    for batching, _, variants in BATCHINGS:
        for name in variants:
            r = by[(batching, name)]
            ratio = r.get("ratio_to_raw")
            print(f"{batching:>8} {name:>10} {r['msgs_per_s']:>8,} "
                  f"{'' if ratio is None else f'{ratio:.2f}':>12}")
    for batching, s in summary.items():  # turn, bulk and host
        print(f"{batching}: engine path costs {s['engine_over_store_us_per_msg']} us/message more"
              f" than Store.ingest ({s['engine_us_per_msg']} vs {s['store_us_per_msg']})")
    # The rounds are interleaved, so a round's host and raw ran minutes apart at most:
    # the spread of these ratios is the noise of the machine during the run.
    host_rounds = [round(r / h, 3) for r, h in zip(seconds[("host", "raw")],
                                                   seconds[("host", "host")])]
    summary["host"]["host_ratio_per_round"] = host_rounds
    print(f"host path (on_session_end, {HOST_SEEN} seen + {HOST_NEW} new per call):"
          f" {by[('host', 'host')]['ratio_to_raw']:.2f} of raw, beside store"
          f" {by[('host', 'store')]['ratio_to_raw']:.2f} and engine"
          f" {by[('host', 'engine')]['ratio_to_raw']:.2f} at the same batching;"
          f" per round " + " ".join(f"{r:.2f}" for r in host_rounds))
    tk_rounds = [round(r / h, 3) for r, h in zip(seconds[("host", "raw")],
                                                 seconds[("host", "host_tk")])]
    summary["host"]["host_tiktoken_ratio_per_round"] = tk_rounds
    print(f"host path with tiktoken alone (accelerator off): "
          f"{by[('host', 'host_tk')]['ratio_to_raw']:.2f} of raw; per round "
          + " ".join(f"{r:.2f}" for r in tk_rounds))
    print(f"token counts: {accelerator}")
    print("per-message parts, no database (us): " + ", ".join(
        f"{k[:-3]} {v}" for k, v in components.items()))
    verdicts = {b: by[(b, "store")]["ratio_to_raw"] >= TARGET_RATIO for b in ("turn", "bulk")}
    verdicts["host"] = by[("host", "host")]["ratio_to_raw"] >= TARGET_RATIO
    for b, met in verdicts.items():
        what = "host path" if b == "host" else "store"
        print(f"target {what}/raw >= {TARGET_RATIO} ({b}): {'met' if met else 'MISSED'}")
    synth.save_results("ingest", messages=len(messages), mean_json_bytes=round(mean_bytes),
                       rounds=args.rounds, rows=rows, engine_overhead=summary,
                       components_us_per_message=components, target_ratio=TARGET_RATIO,
                       token_counter_accelerator=accelerator,
                       target_met=verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
