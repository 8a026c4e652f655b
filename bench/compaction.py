#!/usr/bin/env python3
"""Time and summarizer calls to compact ~100K tokens of conversation in one pass.

Two summarizers: a stub LLM that answers instantly with a short summary (the
engine's own overhead), and the deterministic extractive summarizer (what runs
offline or when every model fails).

    .venv/bin/python bench/compaction.py [tokens]
Prints a table and writes bench/results/compaction.json.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402

from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.storage import database  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402

RUNS = 3


def conversation(target_tokens: int, counter) -> list[dict]:
    """Synthetic turns (user, tool call, result, answer) up to ``target_tokens``."""
    rng = random.Random(3)
    messages, total, i = [], 0, 0
    while total < target_tokens:
        message = synth.make_message(rng, i)
        if message["role"] == "tool":
            message = {"role": "assistant", "content": message["content"]}
        if message.get("tool_calls"):
            messages.append(message)
            message = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                       "name": "read_file", "content": "ok " * 50}
        messages.append(message)
        total = counter.count_messages(messages)
        i += 1
    return messages


def stub_llm(prompt: str, model, timeout) -> str:
    return "- decisions kept; see lineage for exact turns"


def run(summarizer: str, target_tokens: int) -> dict:
    seconds, calls, leaves, nodes = [], [], [], []
    for _ in range(RUNS):
        home = Path(tempfile.mkdtemp(prefix="trove-bench-compact-"))
        cfg = trove_config.load_config({"HERMES_HOME": str(home), "TROVE_FRESH_TAIL_COUNT": "8",
                                        "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0"})
        engine = TroveEngine(cfg)
        engine.use_llm(stub_llm if summarizer == "stub-llm" else None)
        engine.update_model("bench", 200_000)
        engine.on_session_start("bench-compact", platform="cli")
        messages = conversation(target_tokens, engine.counter)
        engine.ingest(messages)  # persisting is measured by the ingest bench, not here
        started = time.perf_counter()
        engine.compress(messages, current_tokens=engine.threshold_tokens + 1, force=True)
        seconds.append(time.perf_counter() - started)
        outcome = engine.last_compaction
        calls.append(outcome["summarizer_calls"])
        leaves.append(len(outcome["leaf_nodes"]))
        nodes.append(len(outcome["leaf_nodes"]) + len(outcome["condensed_nodes"]))
        database.forget_database(cfg.resolved_database_path)
        shutil.rmtree(home, ignore_errors=True)  # ~1 MB per run; nothing is kept
    return {"summarizer": summarizer, "source_tokens": target_tokens, "runs": RUNS,
            "seconds_median": round(statistics.median(seconds), 3),
            "llm_calls": calls[-1], "leaf_nodes": leaves[-1], "nodes_written": nodes[-1]}


def main(argv: list[str]) -> int:
    target = int(argv[0]) if argv else 100_000
    rows = [run("stub-llm", target), run("deterministic", target)]
    print(f"{'summarizer':>14} {'tokens':>8} {'seconds':>8} {'llm calls':>9} {'leaves':>6} {'nodes':>6}")
    for r in rows:
        print(f"{r['summarizer']:>14} {r['source_tokens']:>8,} {r['seconds_median']:>8}"
              f" {r['llm_calls']:>9} {r['leaf_nodes']:>6} {r['nodes_written']:>6}")
    synth.save_results("compaction", rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
