#!/usr/bin/env python3
"""Offline demo: replay a bundled coding session through the real engine.

    python3 scripts/demo.py                 # the bundled sample, a fresh database
    python3 scripts/demo.py --transcript my_chat.jsonl --window 128000

No model and no network: summaries come from the deterministic (extractive)
summarizer. Prints progress, then what was stored and the summary DAG.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import ROOT, load_package  # noqa: E402

load_package()
from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.dagview import write_dag_html  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.replay import HOST_OVERHEAD_TOKENS, load_transcript, replay  # noqa: E402

SAMPLE = ROOT / "samples" / "coding-session.jsonl"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", default=str(SAMPLE), help="OpenAI-format JSON or JSONL")
    parser.add_argument("--db", help="database to create (default: a fresh temporary folder)")
    parser.add_argument("--window", type=int, default=65_536, help="context window in tokens")
    parser.add_argument("--overhead", type=int, default=HOST_OVERHEAD_TOKENS,
                        help="host tokens around the messages (system prompt, tool schemas)")
    parser.add_argument("--session", default="demo-session")
    return parser.parse_args(argv)


def progress(turn: int, total: int, report) -> None:
    if turn != total and turn % max(1, total // 20):
        return
    width = 30
    filled = int(width * turn / total)
    end = "\n" if turn == total or not sys.stderr.isatty() else ""
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] turn {turn}/{total}"
                     f" · {report.compactions} compactions{end}")
    sys.stderr.flush()


def print_dag(engine) -> None:
    nodes = engine.dag.session_nodes(engine.canonical_id)
    frontier = {n["node_id"] for n in engine.dag.frontier(engine.canonical_id)}
    print(f"\nSummary DAG ({len(nodes)} nodes; * = in the live prompt):")
    print(f"  {'depth':>5} {'node':>5} {'tokens':>7} {'source':>7}  covers")
    for node in sorted(nodes, key=lambda n: (-n["depth"], n["node_id"])):
        mark = "*" if node["node_id"] in frontier else " "
        print(f"{mark} {node['depth']:>5} {node['node_id']:>5} {node['token_count']:>7}"
              f" {node['source_token_count']:>7}  m{node['first_store_id']}–m{node['last_store_id']}"
              f" ({node['message_count']} messages)")


def main(argv=None) -> int:
    args = parse_args(argv)
    messages = load_transcript(args.transcript)
    db_path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="trove-demo-")) / "trove.db"
    if db_path.exists():
        print(f"refusing to reuse {db_path}: the demo writes a fresh database", file=sys.stderr)
        return 2
    cfg = trove_config.load_config({"HERMES_HOME": str(db_path.parent),
                                    "TROVE_DATABASE_PATH": str(db_path)})
    engine = TroveEngine(cfg)
    engine.use_llm(None)  # offline: the deterministic summarizer
    engine.update_model("offline-demo", args.window)
    engine.on_session_start(args.session, platform="demo")
    print(f"hermes-trove demo: {len(messages)} messages from {args.transcript}")
    print(f"window {args.window:,} tokens, trigger {engine.threshold_tokens:,}, "
          f"host overhead {args.overhead:,}, counter {engine.counter.name}")
    report = replay(engine, messages, overhead=args.overhead, on_turn=progress)
    stored = engine.store.count_messages(engine.canonical_id)
    print(f"\nStored {stored} of {len(messages)} messages in {db_path}"
          f" ({report.compactions} compactions in {report.seconds:.2f}s;"
          f" largest prompt {report.max_prompt_tokens:,} tokens"
          f" of a {args.window:,} window)")
    print_dag(engine)
    page = write_dag_html(engine.store, engine.dag, engine.canonical_id,
                          db_path.parent / "dag.html")
    print(f"\nDAG view (open in a browser): {page}")
    return 0 if stored == len(messages) else 1


if __name__ == "__main__":
    sys.exit(main())
