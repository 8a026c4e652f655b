#!/usr/bin/env python3
"""What ``trove_recall`` costs per call on real chats, with and without grep's order.

Builds the chitchat plain store of ``recall_quality.py --data chitchat`` (12
histories, 16,779 turns; with ``--embeddings`` the default local model's vectors,
caught up) and asks its 253 questions through ``tools.dispatch``, timing each
``trove_recall`` call with ``toolkit.search_tools.RECALL_GREP_ORDER`` at 0 (recall's
own order) and at its default (the calling session re-ordered with grep's rank,
which runs one more search of that session), and ``trove_grep`` for scale.

    .venv/bin/python bench/recall_cost.py [--embeddings] [--runs 1]
Prints mean / p50 / p95 in ms per variant.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_quality as rq  # noqa: E402  (loads the package)

from hermes_trove.toolkit import search_tools  # noqa: E402


def timed(tool: str, questions: list, store, dag, config, found) -> list[float]:
    """Milliseconds per call of ``tool`` over every question, sorted."""
    times = []
    for session, text, now in questions:
        start = time.perf_counter()
        rq.ask(tool, {"query": text, "limit": 10}, store, dag, config, session, now, found)
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times)


def line(label: str, times: list[float]) -> str:
    """One printed row: mean, p50 and p95."""
    return (f"{label:<34} mean {statistics.mean(times):7.1f}  p50 {times[len(times) // 2]:7.1f}"
            f"  p95 {times[int(len(times) * 0.95)]:7.1f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embeddings", action="store_true")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    environ = ({"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "local",
                "TROVE_EMBEDDING_MODEL": ""} if args.embeddings else {})
    default = search_tools.RECALL_GREP_ORDER
    convs = rq.conversations("chitchat", 12, 25)
    with tempfile.TemporaryDirectory() as tmp:
        db, store, dag, config, cases, found = rq.build("plain", convs, Path(tmp), environ)
        questions = [(session, q.text, now) for session, chat, _, now in cases
                     for q in chat.questions]
        print(f"{len(questions)} questions, {'hybrid' if args.embeddings else 'full text'}, ms")
        for run in range(args.runs):
            for share in (0.0, default):
                search_tools.RECALL_GREP_ORDER = share
                print(line(f"run {run} trove_recall order {share}",
                           timed("trove_recall", questions, store, dag, config, found)))
            search_tools.RECALL_GREP_ORDER = default
            print(line(f"run {run} trove_grep",
                       timed("trove_grep", questions, store, dag, config, found)))
        db.close()


if __name__ == "__main__":
    main()
