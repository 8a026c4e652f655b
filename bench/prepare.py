#!/usr/bin/env python3
"""Time inside compress() at the trigger, with background preparation on vs off.

The recall bench's synthetic coding conversation (default 300 turns) is fed
turn by turn the way the host does it: the list grows, the engine persists
it, ``should_compress(prompt tokens)`` is asked, and ``compress()`` runs when
it says so. The summarizer is the recall bench's extractive stub behind a
sleep of ``--call-seconds`` (default 2 s) per call, standing in for a real
model. Between turns the bench sleeps ``--think-seconds`` (default 0.5 s):
the time a real turn spends in the model, which is when a background worker
can work.

  off  TROVE_BACKGROUND_PREPARE_SHARE=0 (the default): every summary is made
       inside compress().
  on   TROVE_BACKGROUND_PREPARE_SHARE=--share (default 0.8): past that share of
       the trigger a worker summarizes the oldest chunks and the merges the next
       compaction will make of them; compress() uses what is ready and waits for
       what is in flight.

Printed per mode: compress() seconds at the trigger (p50, max, total), the
summarizer calls made inside compress() by the compacting thread (and how
many of them were merges) vs in the worker, the prepared nodes compress()
wrote, and the per-turn engine time outside compress() (persist +
should_compress; p50, p95 over the first and the last third of the turns, to
show it stays flat). A think time equal to the call time is a model of one
speed serving both the turn and the summaries.

    .venv/bin/python bench/prepare.py [--turns 300] [--window 200000]
        [--call-seconds 2] [--think-seconds 0.5] [--share 0.8] [--modes off on]
Writes bench/results/prepare.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)
import recall_vs_builtin as rb  # noqa: E402

from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.compaction import prepare  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.operators.replay import HOST_OVERHEAD_TOKENS  # noqa: E402
from hermes_trove.storage import database  # noqa: E402


class SlowModel:
    """The extractive stub after ``seconds`` of sleep; records where it was called."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.where: list[str] = []
        self.kinds: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, prompt: str, model=None, timeout=None) -> str:
        time.sleep(self.seconds)
        with self.lock:
            self.where.append(threading.current_thread().name)
            self.kinds.append("merge" if "<summaries>" in prompt else "leaf")
        return rb.stub_summary(prompt)


def _turns(messages: list[dict]) -> list[list[dict]]:
    """The conversation cut at each user message."""
    turns: list[list[dict]] = []
    for message in messages:
        if message["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(mode: str, args) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="trove-bench-prepare-"))
    model = SlowModel(args.call_seconds)
    try:
        cfg = trove_config.load_config({
            "HERMES_HOME": str(folder), "TROVE_DATABASE_PATH": str(folder / "trove.db"),
            "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0",
            "TROVE_BACKGROUND_PREPARE_SHARE": str(args.share) if mode == "on" else "0"})
        engine = TroveEngine(cfg)
        engine.use_llm(model)
        engine.update_model("bench-model", args.window)
        engine.on_session_start("prepare-bench", platform="cli")
        conversation, _ = rb.build_conversation(args.turns)
        messages = [{"role": "system", "content": "You are a coding agent."}]
        compress_seconds, turn_seconds, used = [], [], 0
        calls_in_compress, merges_in_compress = 0, 0
        for turn in _turns(conversation):
            messages.extend(dict(m) for m in turn)
            current = HOST_OVERHEAD_TOKENS + engine.counter.count_messages(messages)
            started = time.perf_counter()
            engine.ingest(messages[1:])
            due = engine.should_compress(current)
            turn_seconds.append(time.perf_counter() - started)
            if due:
                before = len(model.where)
                started = time.perf_counter()
                messages = engine.compress(messages, current_tokens=current)
                compress_seconds.append(time.perf_counter() - started)
                mine = [k for w, k in zip(model.where[before:], model.kinds[before:])
                        if w == threading.current_thread().name]  # not the worker's
                calls_in_compress += len(mine)
                merges_in_compress += mine.count("merge")
                used += engine.last_compaction.get("prepared_used", 0)
            time.sleep(args.think_seconds)
        prepare.wait(engine.store.db.path, engine.canonical_id, timeout=120)
        third = max(1, len(turn_seconds) // 3)
        result = {
            "mode": mode, "compactions": len(compress_seconds),
            "compress_p50_s": round(statistics.median(compress_seconds), 3)
            if compress_seconds else 0.0,
            "compress_max_s": round(max(compress_seconds, default=0.0), 3),
            "compress_total_s": round(sum(compress_seconds), 1),
            "calls_in_compress": calls_in_compress,
            "merges_in_compress": merges_in_compress,
            "calls_in_worker": sum(1 for w in model.where if w.startswith("trove-prepare")),
            "prepared_used": used,
            "turn_ms_first_third_p50": round(1000 * _pct(turn_seconds[:third], 0.5), 2),
            "turn_ms_first_third_p95": round(1000 * _pct(turn_seconds[:third], 0.95), 2),
            "turn_ms_last_third_p50": round(1000 * _pct(turn_seconds[-third:], 0.5), 2),
            "turn_ms_last_third_p95": round(1000 * _pct(turn_seconds[-third:], 0.95), 2),
            "worker": engine.get_status()["background_prepare"],
        }
        database.forget_database(cfg.resolved_database_path)
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=200_000)
    parser.add_argument("--call-seconds", type=float, default=2.0)
    parser.add_argument("--think-seconds", type=float, default=0.5)
    parser.add_argument("--share", type=float, default=0.8,
                        help="TROVE_BACKGROUND_PREPARE_SHARE of the 'on' mode")
    parser.add_argument("--modes", nargs="+", choices=("off", "on"), default=["off", "on"])
    args = parser.parse_args(argv)
    results = [run(mode, args) for mode in args.modes]
    print(f"{args.turns} turns, window {args.window:,}, {args.call_seconds} s per summarizer "
          f"call, {args.think_seconds} s between turns, 'on' = share {args.share}")
    for r in results:
        print(f"preparation {r['mode']:>3}: {r['compactions']} compactions; compress() p50 "
              f"{r['compress_p50_s']} s, max {r['compress_max_s']} s, total "
              f"{r['compress_total_s']} s; calls in compress {r['calls_in_compress']} "
              f"({r['merges_in_compress']} merges), in the worker {r['calls_in_worker']}, "
              f"prepared nodes used {r['prepared_used']}; per turn outside compress p50/p95 first third "
              f"{r['turn_ms_first_third_p50']}/{r['turn_ms_first_third_p95']} ms, last third "
              f"{r['turn_ms_last_third_p50']}/{r['turn_ms_last_third_p95']} ms")
    synth.save_results("prepare", turns=args.turns, window=args.window,
                       call_seconds=args.call_seconds, think_seconds=args.think_seconds,
                       share=args.share, runs=results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
