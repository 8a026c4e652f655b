#!/usr/bin/env python3
"""Recall quality on chats whose questions paraphrase their answers (see ``chats.py``).

Ten generated two-person chats (20 dated sessions of ~30 turns each, 30 events
told in them, one question per event) are stored in one fresh database per
rendering style (``plain``, ``named`` as ``[Name] text``, ``field`` with the
speaker in ``name``), one trove session per chat. Summary nodes are built over
each chat with the deterministic summarizer (leaves of 16 turns, then depth-1
nodes over 4 leaves), as compaction would leave them. Each question is asked
as the chat's current turn through ``tools.dispatch`` (limit 10).

Methods:
  bm25        reference: plain BM25 over the chat's turns with the same stop
              words and plural folding (no trove ranking, no summaries)
  grep        ``trove_grep`` as the agent calls it (default mode)
  grep:<m>    ``trove_grep`` with ``mode=<m>`` (full_text / semantic / hybrid),
              when embeddings are on (``--embeddings``)
  recall      ``trove_recall`` (all sessions, fused arms)

Figures per method and per question kind / overlap:
  R@5   share of a question's evidence turns among the top 5 raw results
        (a summary is not the turn)
  hit@5 a top-5 result is an evidence turn or a summary whose lineage holds one
  MRR   1 / rank of the first such result in the top 10

    .venv/bin/python bench/recall_quality.py [--chats 10] [--styles plain named field]
                                             [--embeddings] [--misses]
Writes bench/results/recall_quality.json.
"""

from __future__ import annotations

import argparse
import atexit
import ast
import importlib
import json
import math
import os
import pickle
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)
import chats  # noqa: E402
import realchats  # noqa: E402
sys.path.insert(0, str(HERE.parent / "tests"))
from test_recall_quality import summarize_session  # noqa: E402  (the same summary nodes)

from hermes_trove import tools  # noqa: E402
from hermes_trove.config import load_config  # noqa: E402
from hermes_trove.compaction import tokens  # noqa: E402
from hermes_trove.dag import Dag  # noqa: E402
from hermes_trove.recall import query_plan, ranking, semantic  # noqa: E402
from hermes_trove.storage import codec  # noqa: E402
from hermes_trove.storage.database import Database  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

COUNTER = tokens.get_counter()


class Bm25:
    """Reference ranking: BM25 (k1 1.2, b 0.75) with stop words and plural folding."""

    def __init__(self, texts: dict[int, str]):
        self.docs = {key: Counter(self.terms(text)) for key, text in texts.items()}
        self.lengths = {key: sum(c.values()) for key, c in self.docs.items()}
        self.avg = sum(self.lengths.values()) / max(1, len(self.docs))
        self.df = Counter(term for c in self.docs.values() for term in c)

    @staticmethod
    def terms(text: str) -> list[str]:
        """Folded tokens minus stop words, plurals folded to their singular."""
        return [query_plan.singular(t) for t in query_plan.fts_tokens(text)
                if t not in query_plan.STOP_WORDS]

    def rank(self, query: str, limit: int) -> list[int]:
        """Keys of the best ``limit`` documents."""
        scores = self.scores(query)
        return sorted(scores, key=lambda k: (-scores[k], -k))[:limit]

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every document holding a query term (``splade_probe.py`` fuses
        them)."""
        n = len(self.docs)
        scores = {}
        for term in set(self.terms(query)):
            idf = math.log(1 + (n - self.df[term] + 0.5) / (self.df[term] + 0.5))
            for key, counts in self.docs.items():
                tf = counts.get(term)
                if tf:
                    norm = 1.2 * (1 - 0.75 + 0.75 * self.lengths[key] / self.avg)
                    scores[key] = scores.get(key, 0.0) + idf * tf * 2.2 / (tf + norm)
        return scores


def conversations(data: str, n_chats: int, max_sessions: int, asked: str = "you",
                  questions: str = "kinds") -> list:
    """``(chat, render, now)`` per conversation of a data set (see ``--data``);
    ``asked="name"``: the real chats' questions name the people (``--asked``);
    ``questions``: which real-chat questions (``--questions``)."""
    if data == "generated":
        made = [chats.make_chat(1000 + index) for index in range(n_chats)]
        return [(chat, chats.render, chat.session_starts[-1] + 30 * 86400) for chat in made]
    found = realchats.histories(n_chats, max_sessions, questions)
    if asked == "name":
        for history in found:
            realchats.ask_by_name(history)
    return [(h, realchats.render, h.turns[-1]["timestamp"] + 86400) for h in found]


def build(style: str, convs: list, folder: Path, environ: dict):
    """One database with every chat as its own session; returns what the runs need."""
    db = Database(str(folder / f"{style}.db"))
    store, dag = Store(db), Dag(db)
    cases = []
    for index, (chat, render, now) in enumerate(convs):
        session = f"chat{index}"
        store.ensure_session(session, source="telegram")
        Owners(store.db).record(session, LOCAL_OWNER)  # one owner: cross-session scope
        ids = store.ingest(session, render(chat, style)).store_ids
        summarize_session(store, dag, session, ids)
        cases.append((session, chat, ids, now))
    config = load_config(environ=environ, hermes_home=folder / "home")
    found = semantic.Semantic.open(db, config)
    if found.provider is not None:
        cache_passages(found.provider)
        started = time.perf_counter()
        report = semantic.backfill(db, found.provider, config, apply=True, max_seconds=3600)
        seconds = time.perf_counter() - started
        print(f"  {style}: embedded {report['texts_embedded']} distinct texts "
              f"({report['texts_reused']} reused) for {report['rows']} rows in {seconds:.1f} s "
              f"= {report['texts_embedded'] / seconds:.1f} texts/s")
    return db, store, dag, config, cases, found


CACHE = Path(os.environ.get("TROVE_BENCH_CACHE", "/tmp/trove-bench"))
SAVE_EVERY = 15.0             # seconds between two writes of the vector cache


def cache_passages(provider) -> None:
    """Keep passage and query vectors on disk by (model, text) so reruns skip the model
    (delete ``recall-vectors-<model>.pkl`` to time the embedding again: ``build`` prints
    texts/s). One file per model, replaced atomically, so two runs never corrupt it."""
    model = provider.identity.model
    path = CACHE / f"recall-vectors-{model}.pkl"
    path.parent.mkdir(parents=True, exist_ok=True)
    known = pickle.loads(path.read_bytes()) if path.exists() else {}
    embed, embed_query = provider.passages, provider.query
    saved = [time.monotonic()]

    def save(force: bool = False) -> None:
        if force or time.monotonic() - saved[0] > SAVE_EVERY:
            fresh = path.with_suffix(f".{os.getpid()}.tmp")
            fresh.write_bytes(pickle.dumps(known))
            fresh.replace(path)
            saved[0] = time.monotonic()

    def passages(texts, timeout):
        todo = [t for t in texts if (model, t) not in known]
        if todo:
            for text, vector in zip(todo, embed(todo, timeout)):
                known[(model, text)] = vector
            save()
        return provider.np.stack([known[(model, t)] for t in texts])

    def query(text, timeout):
        if ("query", model, text) not in known:
            known[("query", model, text)] = embed_query(text, timeout)
            save()
        return known[("query", model, text)]

    atexit.register(save, True)
    provider.passages = passages
    provider.query = query


def ask(tool: str, args: dict, store: Store, dag: Dag, config, session: str, now: float,
        found=None):
    """One tool call as the chat's current turn (the question itself is not stored)."""
    ctx = tools.ToolContext(store=store, dag=dag, config=config,
                            count_tokens=COUNTER.count_text, session_id=session,
                            conversation_id=None,
                            current_turn_store_id=store.last_store_id() + 1,
                            status=dict, llm_call=None, data_dir=Path(store.db.path).parent,
                            now=lambda: now, semantic=found)
    return json.loads(tools.dispatch(tool, args, ctx))


def score(results: list[dict], evidence: set[int], dag: Dag) -> tuple[float, bool, float]:
    """R@5, hit@5 and reciprocal rank of one answer list (see the module docstring)."""
    top_raw = {r["store_id"] for r in results[:5] if r["kind"] == "message"}
    recall = len(top_raw & evidence) / len(evidence)
    first = None
    for rank, r in enumerate(results[:10], start=1):
        if r["kind"] == "message" and r["store_id"] in evidence:
            first = rank
        elif r["kind"] == "summary" and evidence & set(dag.descendant_store_ids(r["node_id"])):
            first = rank
        if first:
            break
    return recall, bool(first and first <= 5), (1.0 / first if first else 0.0)


def run_style(style: str, methods: list[str], convs: list, environ: dict,
              show_misses: bool) -> dict:
    """Every method on every question of one rendering; figures overall and per group."""
    figures: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        db, store, dag, config, cases, found = build(style, convs, Path(tmp), environ)
        try:
            for method in methods:
                groups: dict[str, list] = defaultdict(list)
                for session, chat, ids, now in cases:
                    bm25 = Bm25({sid: codec.message_text(codec.decode_message(row))
                                 for sid, row in store.get_messages(ids).items()}) \
                        if method == "bm25" else None
                    for q in chat.questions:
                        evidence = {ids[i] for i in q.evidence}
                        if bm25 is not None:
                            results = [{"kind": "message", "store_id": k}
                                       for k in bm25.rank(q.text, 10)]
                        else:
                            tool, _, mode = method.partition(":")
                            args = {"query": q.text, "limit": 10}
                            if mode:
                                args["mode"] = mode
                            answer = ask(f"trove_{tool}", args, store, dag, config, session, now,
                                         found)
                            results = answer.get("results", [])
                        figure = score(results, evidence, dag)
                        for group in ("all", f"kind:{q.kind}", f"overlap:{q.overlap}")[
                                :2 if q.overlap == "-" else 3]:
                            groups[group].append(figure)
                        if show_misses and figure[0] < 1.0:
                            print(f"  miss {style} {method} [{q.kind}/{q.overlap}] {q.text}")
                figures[method] = {group: summary(rows) for group, rows in sorted(groups.items())}
        finally:
            db.close()
    return figures


def summary(rows: list[tuple[float, bool, float]]) -> dict:
    """Mean R@5, hit@5 and MRR of a group of questions."""
    n = len(rows)
    return {"n": n, "R@5": round(sum(r[0] for r in rows) / n, 3),
            "hit@5": round(sum(r[1] for r in rows) / n, 3),
            "MRR": round(sum(r[2] for r in rows) / n, 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=["generated", "chitchat"], default="generated",
                        help="generated: chats.py (smoke test); chitchat: real chats from the "
                             "chitchat-dataset package, questions derived by realchats.py")
    parser.add_argument("--chats", type=int, default=None,
                        help="conversations (default 10 generated, 12 chitchat histories)")
    parser.add_argument("--sessions", type=int, default=25,
                        help="chitchat: sessions per history at most")
    parser.add_argument("--asked", choices=["you", "name"], default="you",
                        help="chitchat: questions as typed (\"you\") or naming the person "
                             "asked and the asker (\"Is Melanie dressing up?\")")
    parser.add_argument("--questions", choices=["kinds", "typed"], default="kinds",
                        help="chitchat: the four question kinds, or only questions asking "
                             "for a time, number or place (realchats.py)")
    parser.add_argument("--styles", nargs="+", default=["plain", "named", "field"])
    parser.add_argument("--embeddings", action="store_true",
                        help="turn the local embedding model on and add the mode runs")
    parser.add_argument("--model", default="",
                        help="with --embeddings: the local model (TROVE_EMBEDDING_MODEL)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="run only these methods (e.g. grep recall; default: all)")
    parser.add_argument("--misses", action="store_true", help="print each question missed")
    parser.add_argument("--fusion", choices=["score", "rrf"], default="score",
                        help="how arms are fused (ranking.FUSION)")
    parser.add_argument("--weights", type=float, default=None,
                        help="hybrid: the full-text family's weight (vector = 1 - it)")
    parser.add_argument("--set", nargs="*", default=[], metavar="MODULE.NAME=VALUE",
                        help="override a constant for an experiment, e.g. "
                             "toolkit.search_tools.RECALL_RECENCY_BIAS=0")
    args = parser.parse_args(argv)
    for item in args.set:
        target, _, value = item.partition("=")
        module, _, name = target.rpartition(".")
        owner = importlib.import_module(f"hermes_trove.{module}")
        setattr(owner, name, type(getattr(owner, name))(ast.literal_eval(value)))
    ranking.FUSION = args.fusion
    if args.weights is not None:
        semantic.WEIGHTS.update(full_text=args.weights, vector=1 - args.weights)
    environ: dict = {}
    methods = ["bm25", "grep", "recall"]
    if args.embeddings:
        environ = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "local",
                   "TROVE_EMBEDDING_MODEL": args.model}
        methods += ["grep:full_text", "grep:semantic", "grep:hybrid"]
    if args.methods:
        methods = [m for m in methods if m in args.methods]
    n_chats = args.chats or (10 if args.data == "generated" else 12)
    convs = conversations(args.data, n_chats, args.sessions, args.asked, args.questions)
    print(f"data {args.data} (asked: {args.asked}): {len(convs)} conversations, "
          f"{sum(len(c.turns) for c, _, _ in convs)} turns, "
          f"{sum(len(c.questions) for c, _, _ in convs)} questions")
    results = {}
    for style in args.styles:
        results[style] = run_style(style, methods, convs, environ, args.misses)
        print(f"\n== {style}")
        groups = sorted({g for m in results[style].values() for g in m})
        print(f"{'group':<18}" + "".join(f"{m:>22}" for m in methods))
        for group in groups:
            cells = []
            for method in methods:
                f = results[style][method].get(group)
                cells.append(f"{f['R@5']:.3f}/{f['hit@5']:.3f}/{f['MRR']:.3f}" if f else "-")
            print(f"{group:<18}" + "".join(f"{c:>22}" for c in cells))
    print("\ncells: R@5 / hit@5 / MRR")
    if args.set:
        print("overrides: " + ", ".join(args.set) + " (results not saved)")
        return 0
    name = "recall_quality" + ("" if args.data == "generated" else "_" + args.data) + (
        "_" + args.model if args.model else "") + ("_named_questions" if args.asked == "name" else "") + (
        "_typed" if args.questions == "typed" else "")
    synth.save_results(name,
                       data=args.data, chats=n_chats, sessions=args.sessions, fusion=args.fusion,
                       weights=dict(semantic.WEIGHTS), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
