#!/usr/bin/env python3
"""A pathological trove_grep (hundreds of CJK terms over large tool outputs) while
another agent of the same process compacts: how long the grep takes and how long
the other agent's ``compress`` calls wait for the shared connection.

The store holds ``--rows`` tool outputs in session "a", each the query's first 299
two-character CJK terms repeated 20 times (~18 KB): every row holds almost every
needle, so the substring fallback (CJK is matched by substring, not FTS5) must test
each of them in each row and finds nothing (the 300th term is in no row).
Thread 1 runs the grep in session "a" ``--greps`` times; thread 2 runs a
coding-agent session "b" whose every turn ends with a forced ``compress``.

    .venv/bin/python bench/grep_contention.py [--rows 1500] [--greps 1]
Prints the figures and writes bench/results/grep_contention.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import synth  # noqa: E402  (loads the package)

from enginekit import coding_turn, make_engine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1500)
    parser.add_argument("--greps", type=int, default=1)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trove-grep-bench-"))
    reader = make_engine(home, window=128_000, session="a")
    terms = [chr(0x4E00 + i) + chr(0x4E00 + 2 * i + 7) for i in range(300)]
    text = (" ".join(terms[:299]) + "\n") * 20
    reader.ingest([{"role": "tool", "tool_call_id": f"c{n}", "name": "terminal",
                    "content": text + f"row {n}"} for n in range(args.rows)])
    query = " ".join(terms)
    writer = make_engine(home, window=64_000, session="b")
    grep_seconds: list[float] = []
    waits: list[float] = []
    done = threading.Event()

    def grep() -> None:
        for _ in range(args.greps):
            started = time.perf_counter()
            json.loads(reader.handle_tool_call("trove_grep", {"query": query}))
            grep_seconds.append(time.perf_counter() - started)
        done.set()

    def compact() -> None:
        messages: list = []
        turn = 0
        while not done.is_set():
            messages = messages + coding_turn(turn, filler=5)
            turn += 1
            started = time.perf_counter()
            messages = writer.compress(messages, force=True)
            waits.append(time.perf_counter() - started)

    threads = [threading.Thread(target=grep), threading.Thread(target=compact)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    figures = {"rows": args.rows, "grep_seconds_median": round(statistics.median(grep_seconds), 3),
               "grep_seconds_max": round(max(grep_seconds), 3), "compress_calls": len(waits),
               "compress_seconds_median": round(statistics.median(waits), 3),
               "compress_seconds_max": round(max(waits), 3)}
    for key, value in figures.items():
        print(f"{key:26} {value}")
    synth.save_results("grep_contention", **figures)


if __name__ == "__main__":
    main()
