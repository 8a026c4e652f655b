#!/usr/bin/env python3
"""Offline demo: replay a bundled coding session through the real engine.

    python3 scripts/demo.py                 # the bundled sample, a fresh database
    python3 scripts/demo.py --transcript my_chat.jsonl --window 128000 --ask "retry backoff"

No model and no network: summaries come from the deterministic (extractive)
summarizer. Prints progress, what was stored, the summary DAG, and the
recovery of a detail that compaction took out of the prompt (trove_grep, then
trove_expand on the hit); writes a self-contained HTML view of the DAG.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import ROOT, load_package  # noqa: E402

load_package()
from hermes_trove.operators import actions as ops  # noqa: E402
from hermes_trove.operators.dagview import write_dag_html  # noqa: E402
from hermes_trove.operators.replay import HOST_OVERHEAD_TOKENS  # noqa: E402

SAMPLE = ROOT / "samples" / "coding-session.jsonl"
SAMPLE_QUESTION = "which port does the staging database listen on"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", default=str(SAMPLE), help="OpenAI-format JSON or JSONL")
    parser.add_argument("--db", help="database to create (default: a fresh temporary folder)")
    parser.add_argument("--window", type=int, default=65_536, help="context window in tokens")
    parser.add_argument("--overhead", type=int, default=HOST_OVERHEAD_TOKENS,
                        help="host tokens around the messages (system prompt, tool schemas)")
    parser.add_argument("--session", default="demo-session")
    parser.add_argument("--ask", default=SAMPLE_QUESTION,
                        help="a question whose answer was compacted away, for the recovery step")
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


def print_dag(target, session: str) -> None:
    nodes = target.dag.session_nodes(session)
    frontier = {n["node_id"] for n in target.dag.frontier(session)}
    print(f"\nSummary DAG ({len(nodes)} nodes; * = in the live prompt):")
    print(f"  {'depth':>5} {'node':>5} {'tokens':>7} {'source':>7}  covers")
    for node in sorted(nodes, key=lambda n: (-n["depth"], n["node_id"])):
        mark = "*" if node["node_id"] in frontier else " "
        print(f"{mark} {node['depth']:>5} {node['node_id']:>5} {node['token_count']:>7}"
              f" {node['source_token_count']:>7}  m{node['first_store_id']}–m{node['last_store_id']}"
              f" ({node['message_count']} messages)")


def print_recovery(target, session: str, question: str) -> bool:
    """trove_grep for the question, then trove_expand the best raw hit, as a model would."""
    print(f'\nRecovering a compacted detail: trove_grep("{question}")')
    found = ops.call_tool(target, "trove_grep", {"query": question, "limit": 5}, session)
    raw = [hit for hit in found["results"] if "store_id" in hit.get("expand", {}).get("args", {})]
    if not raw:
        print("  no raw hit")
        return False
    hit = raw[0]
    store_id = hit["expand"]["args"]["store_id"]
    covering = target.dag.covering_nodes(store_id)
    where = f"summarized into node n{covering[0]}" if covering else "still raw in the prompt"
    print(f"  top hit m{store_id} ({where}): {hit.get('snippet', '')[:160]!r}")
    exact = ops.call_tool(target, "trove_expand", hit["expand"]["args"], session)["message"]
    print(f"  trove_expand(store_id={store_id}) -> exact text:\n    {exact.get('content', '')[:300]}")
    return bool(covering)


def main(argv=None) -> int:
    args = parse_args(argv)
    db_path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="trove-demo-")) / "trove.db"
    if db_path.exists():
        print(f"refusing to reuse {db_path}: the demo writes a fresh database", file=sys.stderr)
        return 2
    print(f"hermes-trove demo: replaying {args.transcript}")
    print(f"window {args.window:,} tokens, host overhead {args.overhead:,}; offline summaries")
    result = ops.replay_transcript(args.transcript, db_path, window=args.window,
                                   session_id=args.session, overhead=args.overhead,
                                   on_turn=progress)
    print(f"\nStored {result['stored']} of {result['messages']} messages in {db_path}"
          f" ({result['compactions']} compactions in {result['seconds']:.2f}s;"
          f" largest prompt {result['max_prompt_tokens']:,} tokens of a {args.window:,} window)")
    target = ops.open_target(ops.config_for(db_path))
    session = result["session_id"]
    print_dag(target, session)
    print_recovery(target, session, args.ask)
    page = write_dag_html(target.store, target.dag, session, db_path.parent / "dag.html")
    print(f"\nDAG view (open in a browser): {page}")
    return 0 if result["stored"] == result["messages"] else 1


if __name__ == "__main__":
    sys.exit(main())
