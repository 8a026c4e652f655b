#!/usr/bin/env python3
"""Evidence tools: exact-answer rate, fail-closed rate and the schemas' prompt cost.

Generates ``worlds`` multi-session conversations (tests/evidencekit.py: planted
dates written absolutely or relatively, amounts in one currency beside another
trip's in a second currency, repeated restaurants in varied case, a renovation
budget and its cost, dated logbook events, an address that changes). Each
world asks one question of each operation (date_diff, sum, count_distinct,
difference, order, latest); a scripted agent answers using only
trove_grep(include_exact_ref) -> trove_evidence_pack -> trove_compute through
``tools.dispatch``, and the answer is compared with the generator's truth.

Fail-closed probes, per world: a tampered quote (one digit changed), a sum
mixing the two currencies, and the date_diff refs used from the first session
without a scope while one of them lies in another session. Each must return
an error, never a number.

Schema cost: the tokens (cl100k via the engine's counter) of each new tool
schema as the host sends it, ``{"type": "function", "function": schema}``.

Usage: python bench/evidence.py [worlds=100]
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import synth  # noqa: E402  (loads the package)
import evidencekit as ek  # noqa: E402
from hermes_trove import schemas, tools  # noqa: E402
from hermes_trove.compaction import tokens  # noqa: E402
from hermes_trove.config import load_config  # noqa: E402
from hermes_trove.dag import Dag  # noqa: E402
from hermes_trove.storage.database import Database  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

EVIDENCE_TOOLS = ("trove_evidence_pack", "trove_compute", "trove_compile_evidence",
                  "trove_query_state", "trove_retrieve")
COUNTER = tokens.get_counter()


def schema_cost() -> dict:
    """Tokens each evidence schema adds to every request, and all trove schemas together."""
    def cost(schema_list: list) -> int:
        return COUNTER.count_text(schemas.wire_json(schema_list))
    every = schemas.get_tool_schemas()
    evidence = [s for s in every if s["name"] in EVIDENCE_TOOLS]
    return {"per_tool": {s["name"]: cost([s]) for s in evidence},
            "evidence_total": cost(evidence), "all_trove_tools": cost(every)}


def build(world: ek.World, folder: Path):
    """A fresh store holding the world's messages; returns (db, tool-calling function)."""
    db = Database(str(folder / "trove.db"))
    store, dag = Store(db), Dag(db)
    for message in world.messages:
        store.ensure_session(message.session, source="cli")
        Owners(store.db).record(message.session, LOCAL_OWNER)  # one owner: cross-session scope
        store.ingest(message.session, [{"role": "user", "content": message.text}],
                     now=message.at)
    ctx = tools.ToolContext(store=store, dag=dag, config=load_config(environ={},
                            hermes_home=folder), count_tokens=COUNTER.count_text,
                            session_id="s0", conversation_id=None, current_turn_store_id=None,
                            status=lambda: {}, llm_call=None, data_dir=folder)
    return db, lambda name, args: json.loads(tools.dispatch(name, args, ctx))


def probes(world: ek.World, tool) -> dict[str, bool]:
    """True for each fail-closed probe that answered with an error and no result."""
    def refs_for(question: ek.Question) -> list[dict]:
        out = []
        for query in question.queries:
            found = tool("trove_grep", {"query": query, "include_exact_ref": True, "limit": 20,
                                        "session_scope": "all"})
            out += [h["exact_ref"] for h in found["results"] if h.get("exact_ref")
                    and re.search(question.pick, h["exact_ref"]["quote"])]
        return out

    by_op = {q.operation: q for q in world.questions}
    costs = refs_for(by_op["sum"])
    tampered = dict(costs[0], quote=re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10),
                                           costs[0]["quote"], count=1))
    other_trip = tool("trove_grep", {"query": "trip cost", "include_exact_ref": True,
                                     "limit": 50, "session_scope": "all"})
    foreign = [h["exact_ref"] for h in other_trip["results"]
               if h.get("exact_ref") and "x trip" in h["exact_ref"]["quote"]]
    dated = refs_for(by_op["date_diff"])
    checks = {"tampered_quote": ("sum", [tampered] + costs[1:], {"session_scope": "all"})}
    if foreign:
        checks["mixed_currency"] = ("sum", costs + foreign[:1], {"session_scope": "all"})
    sessions = {tool("trove_describe", {"store_id": r["store_id"], "session_scope": "all"})
                ["session_id"] for r in dated}
    if sessions != {"s0"}:
        checks["other_session_without_scope"] = ("date_diff", dated, {})
    result = {}
    for name, (operation, inputs, scope) in checks.items():
        out = tool("trove_compute", {"operation": operation, "inputs": inputs, **scope})
        result[name] = "error" in out and "result" not in out
    return result


def main() -> None:
    worlds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    exact = {op: [0, 0] for op in ek.OPERATIONS}
    closed: dict[str, list[int]] = {}
    wrong: list[tuple] = []
    started = time.perf_counter()
    for seed in range(worlds):
        world = ek.make_world(seed)
        with tempfile.TemporaryDirectory(prefix="trove-evidence-") as folder:
            db, tool = build(world, Path(folder))
            for question in world.questions:
                got = ek.answer(question, tool, {"session_scope": "all"})
                ok = ek.correct(question, got)
                exact[question.operation][0] += ok
                exact[question.operation][1] += 1
                if not ok:
                    wrong.append((seed, question.operation, question.expected, got))
            for name, ok in probes(world, tool).items():
                tally = closed.setdefault(name, [0, 0])
                tally[0] += ok
                tally[1] += 1
            db.close()
    elapsed = time.perf_counter() - started
    cost = schema_cost()
    print(f"worlds: {worlds}, questions: {sum(t[1] for t in exact.values())}, "
          f"{elapsed:.1f} s")
    print("exact-answer rate (grep -> evidence pack -> compute):")
    for op, (hit, total) in exact.items():
        print(f"  {op:15s} {hit}/{total} = {hit / total:.1%}")
    print("fail-closed probes answered with an error:")
    for name, (hit, total) in closed.items():
        print(f"  {name:28s} {hit}/{total}")
    print("schema tokens added to every request:")
    for name, value in cost["per_tool"].items():
        print(f"  {name:24s} {value}")
    print(f"  evidence tools total     {cost['evidence_total']} "
          f"(all trove tools: {cost['all_trove_tools']})")
    for item in wrong[:10]:
        print("  wrong:", item)
    synth.save_results("evidence", worlds=worlds, seconds=round(elapsed, 1),
                       exact={op: {"correct": h, "total": t} for op, (h, t) in exact.items()},
                       fail_closed={k: {"errors": h, "total": t} for k, (h, t) in closed.items()},
                       schema_tokens=cost, wrong=[list(map(str, w)) for w in wrong[:20]])


if __name__ == "__main__":
    main()
