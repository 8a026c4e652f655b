#!/usr/bin/env python3
"""Per-turn engine overhead at growing history sizes (no compaction needed).

One host turn through the engine, as the hooks run it: ``note_user_turn``
(pre_llm_call), persist the list with the user's message, ``should_compress``
and ``compress`` when nothing needs compacting, then persist it with the reply
(post_llm_call) and ``turn_done``. The live session holds 90% of the rows, compacted
into a DAG except its newest 60 messages, like a long-running agent.

    .venv/bin/python bench/turn_overhead.py 1000 100000      # sizes
Each size runs in its own process (``--one N``), so the peak RSS reported is
that size's alone. ``cpu p50`` is the process's CPU time per turn: on a shared,
busy machine it stays near the idle wall time while the wall time does not. Prints a table and writes bench/results/turn_overhead.json.
TROVE_TOKEN_COUNT_ACCELERATOR=false in the environment measures without the optional
rs-bpe counter (with it, tiktoken is not loaded: 63.7 against 71.0 MB RSS at 1K here).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth  # noqa: E402

from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.storage import database  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.store import decode_row  # noqa: E402

TURNS = 300


def measure(n_messages: int) -> dict:
    # Work on a scratch copy: the turns below append rows and session state, and the
    # cached database must stay as built so every run starts from the same history.
    source = synth.build(n_messages, verbose=False)
    path = source.with_name(f"scratch-turn-{n_messages}.db")
    shutil.copyfile(source, path)
    try:
        return _measure(path, n_messages)
    finally:
        for leftover in (path, path.with_suffix(".db-wal"), path.with_suffix(".db-shm")):
            leftover.unlink(missing_ok=True)


def _measure(path: Path, n_messages: int) -> dict:
    cfg = trove_config.load_config({"HERMES_HOME": str(path.parent),
                                    "TROVE_DATABASE_PATH": str(path),
                                    "TROVE_FRESH_TAIL_COUNT": "100000",
                                    "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0",
                                    **synth.embedding_settings(),
                                    **{k: v for k, v in os.environ.items()
                                       if k == "TROVE_TOKEN_COUNT_ACCELERATOR"}})
    engine = TroveEngine(cfg)
    engine.use_llm(None)
    engine.update_model("bench", 1_000_000)
    engine.on_session_start(synth.LIVE_SESSION, platform="cli")
    last = engine.store.last_store_id(synth.LIVE_SESSION)
    tail = [decode_row(r) for r in engine.store.session_messages(
        synth.LIVE_SESSION, after_store_id=last - 60, limit=60)]
    messages = engine.compress(tail, current_tokens=1, force=True)  # the block + tail
    timings, cpu = [], []
    for turn in range(TURNS):
        # The host's turn: pre_llm_call names the user's message, the turn's check
        # and compress() see the list with it, post_llm_call persists the turn with
        # the reply (then the turn is over).
        user = {"role": "user", "content": f"bench turn {n_messages} {turn}"}
        messages = messages + [user]
        started, started_cpu = time.perf_counter(), time.process_time()
        engine.note_user_turn(user)
        engine.ingest(messages)
        engine.should_compress(1000)
        messages = engine.compress(messages, current_tokens=1000)
        messages = messages + [{"role": "assistant", "content": f"reply {turn}"}]
        engine.ingest(messages)
        engine.turn_done()
        timings.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    database.forget_database(path)
    timings.sort()
    return {"messages": n_messages, "turns": TURNS,
            "p50_ms": round(statistics.median(timings), 3),
            "p95_ms": round(timings[int(len(timings) * 0.95) - 1], 3),
            # CPU time of the process: what the turn costs when the machine is shared
            "cpu_p50_ms": round(statistics.median(cpu), 3),
            "outcome": engine.last_compaction.get("outcome"),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def measure_in_subprocess(n_messages: int) -> dict:
    """One size in a fresh interpreter: its own page cache warm-up and peak RSS."""
    synth.build(n_messages)  # build (or reuse) outside the timed child
    out = subprocess.run([sys.executable, __file__, "--one", str(n_messages)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(json.dumps(measure(int(argv[1]))))
        return 0
    sizes = [int(a) for a in argv] or [1000, 10_000, 100_000]
    rows = [measure_in_subprocess(n) for n in sizes]
    print(f"{'messages':>10} {'p50 ms':>8} {'p95 ms':>8} {'cpu p50':>8} {'outcome':>8}"
          f" {'rss MB':>7}")
    for r in rows:
        print(f"{r['messages']:>10,} {r['p50_ms']:>8} {r['p95_ms']:>8} {r['cpu_p50_ms']:>8}"
              f" {r['outcome']:>8} {r['peak_rss_mb']:>7}")
    ratio = None
    if len(rows) > 1:
        ratio = round(rows[-1]["p50_ms"] / rows[0]["p50_ms"], 2)
        print(f"ratio largest/smallest p50: {ratio:.2f}")
    synth.save_results("turn_overhead", sizes=rows, p50_ratio_largest_smallest=ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
