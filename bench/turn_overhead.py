#!/usr/bin/env python3
"""Per-turn engine overhead at growing history sizes (no compaction needed).

Two ways of running a turn, each 300 turns over a host list that grows from 61
messages (the live session holds 90% of the rows, compacted into a DAG except its
newest 60 messages, like a long-running agent):

- ``calls`` (the worst case): ``note_user_turn``, persist the list with the user's
  message, ``should_compress`` and ``compress`` with nothing to compact (the host
  calls it only over the trigger), persist the list with the reply, ``turn_done``;
- ``hooks`` (what Hermes 0.19 runs on a plain turn): the plugin's own
  ``pre_llm_call`` hook, ``should_compress`` on the host's rough estimate, the
  ``post_llm_call`` hook (persist, learn the overhead, the owner).

    .venv/bin/python bench/turn_overhead.py 1000 100000      # sizes
Each size and mode runs in its own process (``--one N MODE``), so the peak RSS
reported is that run's alone. ``cpu p50`` is the process's CPU time per turn: on a
shared, busy machine it stays near the idle wall time while the wall time does not.
Prints a table and writes bench/results/turn_overhead.json.
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
MODES = ("calls", "hooks")


def measure(n_messages: int, mode: str = "calls") -> dict:
    # Work on a scratch copy: the turns below append rows and session state, and the
    # cached database must stay as built so every run starts from the same history.
    source = synth.build(n_messages, verbose=False)
    path = source.with_name(f"scratch-turn-{n_messages}.db")
    shutil.copyfile(source, path)
    try:
        return _measure(path, n_messages, mode)
    finally:
        for leftover in (path, path.with_suffix(".db-wal"), path.with_suffix(".db-shm")):
            leftover.unlink(missing_ok=True)


def _measure(path: Path, n_messages: int, mode: str) -> dict:
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
    turn_fn = _hooks_turn if mode == "hooks" else _calls_turn
    for turn in range(TURNS):
        user = {"role": "user", "content": f"bench turn {n_messages} {turn}"}
        reply = {"role": "assistant", "content": f"reply {turn}"}
        started, started_cpu = time.perf_counter(), time.process_time()
        messages = turn_fn(engine, messages, user, reply)
        timings.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    database.forget_database(path)
    timings.sort()
    return {"messages": n_messages, "mode": mode, "turns": TURNS,
            "p50_ms": round(statistics.median(timings), 3),
            "p95_ms": round(timings[int(len(timings) * 0.95) - 1], 3),
            # CPU time of the process: what the turn costs when the machine is shared
            "cpu_p50_ms": round(statistics.median(cpu), 3),
            "outcome": engine.last_compaction.get("outcome"),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _calls_turn(engine, messages: list, user: dict, reply: dict) -> list:
    """Every engine call a turn can make: the user's message named and persisted, the
    check and a compress with nothing to compact, the reply persisted."""
    messages = messages + [user]
    engine.note_user_turn(user)
    engine.ingest(messages)
    engine.should_compress(1000)
    messages = engine.compress(messages, current_tokens=1000)
    messages = messages + [reply]
    engine.ingest(messages)
    engine.turn_done()
    return messages


def _hooks_turn(engine, messages: list, user: dict, reply: dict) -> list:
    """A plain turn as Hermes 0.19 runs it: the plugin's hooks around the model call
    and the host's check on its rough estimate (under the trigger here)."""
    import hermes_trove
    messages = messages + [user]
    hermes_trove.on_pre_llm_call(session_id=synth.LIVE_SESSION, conversation_history=messages)
    engine.should_compress(1000)
    messages = messages + [reply]
    engine.update_from_response({"prompt_tokens": 20_000, "completion_tokens": 10})
    hermes_trove.on_post_llm_call(session_id=synth.LIVE_SESSION,
                                  conversation_history=messages)
    return messages


def measure_in_subprocess(n_messages: int, mode: str) -> dict:
    """One size and mode in a fresh interpreter: its own warm-up and peak RSS."""
    synth.build(n_messages)  # build (or reuse) outside the timed child
    out = subprocess.run([sys.executable, __file__, "--one", str(n_messages), mode],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(json.dumps(measure(int(argv[1]), argv[2] if len(argv) > 2 else "calls")))
        return 0
    sizes = [int(a) for a in argv] or [1000, 10_000, 100_000]
    rows = [measure_in_subprocess(n, mode) for mode in MODES for n in sizes]
    print(f"{'mode':>6} {'messages':>10} {'p50 ms':>8} {'p95 ms':>8} {'cpu p50':>8}"
          f" {'outcome':>8} {'rss MB':>7}")
    for r in rows:
        print(f"{r['mode']:>6} {r['messages']:>10,} {r['p50_ms']:>8} {r['p95_ms']:>8}"
              f" {r['cpu_p50_ms']:>8} {r['outcome']:>8} {r['peak_rss_mb']:>7}")
    ratios = {}
    if len(sizes) > 1:
        for mode in MODES:
            mine = [r for r in rows if r["mode"] == mode]
            ratios[mode] = round(mine[-1]["p50_ms"] / mine[0]["p50_ms"], 2)
            print(f"{mode}: ratio largest/smallest p50: {ratios[mode]:.2f}")
    synth.save_results("turn_overhead", sizes=rows, p50_ratio_largest_smallest=ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
