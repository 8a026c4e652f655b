#!/usr/bin/env python3
"""Cost of day / week / month rollups and of trove_recent over them.

A store of ``days`` days (default 62, ending on a frozen "now"), ``sessions`` sessions a
day and ``messages`` messages a session (timestamps from the messages); half the sessions
are summarized into leaves. Timed: the status scan, a first pass building every finished
period (stub LLM answering instantly: the engine's own overhead), the status of an
all-ready store, ``trove_recent`` for "last month" (scope all) before and after the
rollups, and the rebuild after one late message.

    .venv/bin/python bench/rollups.py [days] [sessions] [messages]
Prints a table and writes bench/results/rollups.json.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from _bootstrap import load_package  # noqa: E402

load_package()
from hermes_trove import tools  # noqa: E402
from hermes_trove.compaction import rollups, tokens  # noqa: E402
from hermes_trove.compaction.summarize import CircuitBreaker, Summarizer  # noqa: E402
from hermes_trove.config import load_config  # noqa: E402
from hermes_trove.dag import Dag, NewNode  # noqa: E402
from hermes_trove.ingest.policy import policy_for  # noqa: E402
from hermes_trove.storage.database import Database  # noqa: E402
from hermes_trove.storage.timeline import Timeline  # noqa: E402
from hermes_trove.storage.owners import LOCAL_OWNER, Owners  # noqa: E402
from hermes_trove.store import Store  # noqa: E402

NOW = 1_774_000_000.0     # 2026-03-20 09:46 UTC
DAY = 86400.0


def stub_llm(prompt: str, model, timeout) -> str:
    """An instant model: the figures are the engine's own work."""
    return "- decisions kept; see lineage for exact turns"


def build_store(home: Path, days: int, sessions: int, messages: int):
    """The synthetic store: every other session of a day summarized into one leaf."""
    config = load_config({"TROVE_ROLLUPS_ENABLED": "1",
                          "TROVE_ROLLUPS_MAX_BUILDS_PER_PASS": "1000",
                          "TROVE_ROLLUPS_LOOKBACK_DAYS": str(days + 1)}, hermes_home=home)
    db = Database(str(home / "trove.db"))
    store, dag = Store(db), Dag(db)
    counter = tokens.get_counter()
    for day in range(days):
        start = NOW - (days - day) * DAY
        for s in range(sessions):
            sid = f"d{day}-s{s}"
            store.ensure_session(sid, source="telegram")
            Owners(store.db).record(sid, LOCAL_OWNER)  # one owner: cross-session scope
            rows = [{"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"day {day} session {s} turn {i}: we discussed module_{i % 17} "
                                f"and decided retry_{i}_ms = {i * 7}. " * 3,
                     "timestamp": start + s * 3600 + i * 30} for i in range(messages)]
            ids = store.ingest(sid, rows, now=NOW).store_ids
            if s % 2 == 0:
                text = f"Summary of day {day} session {s}: modules discussed, retries set."
                dag.add_node(NewNode(session_id=sid, depth=0, text=text,
                                     token_count=counter.count_text(text),
                                     source_token_count=1000, level=3, model="stub",
                                     child_store_ids=ids))
    return config, db, store, dag, counter


def timed(fn):
    """``fn()`` and its wall time in seconds."""
    started = time.perf_counter()
    result = fn()
    return result, round(time.perf_counter() - started, 3)


def main() -> None:
    """Build, time, print, and write bench/results/rollups.json."""
    given = sys.argv[1:4]
    days, sessions, messages = (int(a) for a in given + ["62", "3", "40"][len(given):])
    home = Path(tempfile.mkdtemp(prefix="trove-bench-rollups-"))
    try:
        (config, db, store, dag, counter), build_seconds = timed(
            lambda: build_store(home, days, sessions, messages))
        timeline, eligible = Timeline(db), policy_for(config).feeds_rollups
        settings = rollups.settings_of(config)
        summarizer = Summarizer(llm_call=stub_llm, count_tokens=counter.count_text,
                                models=[None], breaker=CircuitBreaker(2, 60), timeout_s=1.0)
        ctx = tools.ToolContext(store=store, dag=dag, config=config,
                                count_tokens=counter.count_text, session_id="d0-s0",
                                conversation_id=None, current_turn_store_id=None,
                                status=dict, llm_call=None, data_dir=home, now=lambda: NOW)

        def recent() -> dict:
            return json.loads(tools.dispatch("trove_recent", {"period": "last month",
                                                              "session_scope": "all"}, ctx))

        figures = {"days": days, "sessions_per_day": sessions, "messages_per_session": messages,
                   "messages": store.count_messages(), "store_build_s": build_seconds}
        rows, figures["status_scan_s"] = timed(
            lambda: rollups.status(timeline, settings, eligible, NOW))
        figures["periods"] = len(rows)
        before, figures["recent_last_month_no_rollups_s"] = timed(recent)
        figures["recent_used_before"] = before["used"]
        report, figures["first_pass_s"] = timed(
            lambda: rollups.build_pass(store, dag, timeline, summarizer, counter.count_text,
                                       settings, eligible, NOW))
        figures["rollups_built"] = len(report.built)
        figures["errors"] = report.errors
        _, figures["status_all_ready_s"] = timed(
            lambda: rollups.status(timeline, settings, eligible, NOW))
        after, figures["recent_last_month_with_rollups_s"] = timed(recent)
        figures["recent_used_after"] = after["used"]
        figures["recent_items_before_after"] = [before["total"], after["total"]]
        figures["recent_tokens_before_after"] = [counter.count_text(json.dumps(before)),
                                                 counter.count_text(json.dumps(after))]
        store.ingest(f"d{days - 20}-s0", [{"role": "user", "content": "a late addendum",
                                           "timestamp": NOW - 20 * DAY + 7200}], now=NOW)
        report, figures["rebuild_after_late_message_s"] = timed(
            lambda: rollups.build_pass(store, dag, timeline, summarizer, counter.count_text,
                                       settings, eligible, NOW))
        figures["rebuilt"] = [f"{b['kind']} {b['key']}" for b in report.built]
        db.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=HERE).stdout.strip()
    (out / "rollups.json").write_text(json.dumps(
        {"machine": platform.platform(), "python": platform.python_version(),
         "revision": revision, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
