#!/usr/bin/env python3
"""Engine start-up time on a large database, and bytes per stored message.

Each run is a fresh process: import the package (not timed), then time the
engine's first use: open the shared connection (pragmas, migration check,
structural check), bind the session and schedule the background FTS check.

    .venv/bin/python bench/open_time.py 1000000     # builds /tmp/trove-bench/trove-1000000.db once
Prints a table and writes bench/results/open_time.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402

RUNS = 7
PROBE = r"""
import json, sys, time
sys.path.insert(0, {scripts!r})
from _bootstrap import load_package
load_package()
from hermes_trove import config
from hermes_trove.engine import TroveEngine
cfg = config.load_config({{"HERMES_HOME": {home!r}, "TROVE_DATABASE_PATH": {path!r}}})
started = time.perf_counter()
engine = TroveEngine(cfg)
engine.update_model("bench", 200000)
engine.on_session_start({session!r}, platform="cli")
opened = time.perf_counter() - started
print(json.dumps({{"open_ms": opened * 1000}}))
"""


def raw_json_bytes(path: Path) -> int:
    """Size of every stored message as plain JSON (what a transcript file would hold)."""
    import sqlite3
    sys.path.insert(0, str(HERE.parent / "scripts"))
    from _bootstrap import load_package
    load_package()
    from hermes_trove.store import decode_row
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    total = 0
    for row in conn.execute("SELECT * FROM messages"):
        total += len(json.dumps(decode_row(dict(row)), ensure_ascii=False).encode("utf-8"))
    conn.close()
    return total


def measure(n_messages: int) -> dict:
    path = synth.build(n_messages)
    probe = PROBE.format(scripts=str(HERE.parent / "scripts"), home=str(path.parent),
                         path=str(path), session=synth.LIVE_SESSION)
    times = []
    for _ in range(RUNS):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True).stdout
        times.append(json.loads(out.strip().splitlines()[-1])["open_ms"])
    size = path.stat().st_size
    raw = raw_json_bytes(path)
    return {"messages": n_messages, "db_bytes": size, "runs": RUNS,
            "open_ms_median": round(statistics.median(times), 2),
            "open_ms_max": round(max(times), 2),
            "bytes_per_message": round(size / n_messages, 1),
            "raw_json_bytes_per_message": round(raw / n_messages, 1),
            "db_to_raw_ratio": round(size / raw, 2)}


def main(argv: list[str]) -> int:
    rows = [measure(int(a)) for a in (argv or ["100000"])]
    print(f"{'messages':>10} {'db MB':>8} {'open ms (median)':>17} {'max':>7}"
          f" {'B/msg':>7} {'raw B/msg':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['messages']:>10,} {r['db_bytes'] / 1e6:>8.1f} {r['open_ms_median']:>17}"
              f" {r['open_ms_max']:>7} {r['bytes_per_message']:>7} "
              f"{r['raw_json_bytes_per_message']:>9} {r['db_to_raw_ratio']:>6}")
    synth.save_results("open_time", rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
