#!/usr/bin/env python3
"""Tokens of what the model gets from trove_status and trove_inspect after a compacted
session (the model pays for every call; trove_status should say only what matters now).

    .venv/bin/python bench/status_size.py
Prints one line per tool: JSON characters and tokens (the engine's own counter).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from _bootstrap import load_package  # noqa: E402

load_package()
sys.path.insert(0, str(ROOT / "tests"))
import enginekit  # noqa: E402  (the test suite's engine driver)


def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        engine = enginekit.make_engine(Path(home), window=16_000,
                                       fts_integrity_check_interval_hours=0)
        messages, _, _ = enginekit.drive(engine, 30)
        engine.ingest(messages)
        for name in ("trove_status", "trove_inspect"):
            text = engine.handle_tool_call(name, {}, messages=messages)
            print(f"{name}: {len(text):,} chars, {engine.counter.count_text(text):,} tokens "
                  f"({engine.counter.name})")


if __name__ == "__main__":
    main()
