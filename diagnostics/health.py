"""Read-only diagnostics of a trove database and its engine, shared by every front end.

``trove_doctor`` (the tool), a later ``/trove doctor`` command and the CLI all
call ``run_doctor``; ``trove_status`` and ``trove_inspect`` build their
reports with ``status_report`` and ``inspect_report``. Nothing here
writes: deep checks that cost seconds on a big file (``PRAGMA quick_check``)
are skipped above ``QUICK_CHECK_MAX_BYTES`` unless asked for with
``full=True``. Apart from PRAGMAs, every query goes through ``Store``/``Dag``.

A check is a dict ``{"name", "status", "detail", ...data}`` where status is
``ok``, ``warn``, ``fail`` or ``skipped``; the report's ``overall`` is the worst.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping

from ..storage import migrations
from ..storage.postgres import catalog
from ..config import TroveConfig, check_reachability
from ..dag import Dag
from ..storage.database import Database
from ..storage.timeline import Timeline
from ..store import Store
from . import caller, host

QUICK_CHECK_MAX_BYTES = 256 * 1024 * 1024
LARGE_ROW_WARN_CHARS = 200_000
FREELIST_WARN_SHARE = 0.25
SEVERITY = {"ok": 0, "skipped": 0, "warn": 1, "fail": 2}


def check(name: str, status: str, detail: str, **data: Any) -> dict:
    """One diagnostic result in the shape every front end prints."""
    return {"name": name, "status": status, "detail": detail, **data}


def pragma(db: Database, name: str) -> Any:
    """The first value a read-only PRAGMA returns (``journal_mode``, ``page_count``...)."""
    with db.reading() as conn:
        row = conn.execute(f"PRAGMA {name}").fetchone()
    return row[0] if row else None


def file_sizes(path: str) -> dict[str, int]:
    """Bytes of the database file and its -wal/-shm companions (0 when absent)."""
    sizes = {}
    for suffix in ("", "-wal", "-shm"):
        try:
            sizes["db" + suffix.replace("-", "_")] = os.path.getsize(path + suffix)
        except OSError:
            sizes["db" + suffix.replace("-", "_")] = 0
    return sizes


def database_stats(store: Store, dag: Dag) -> dict:
    """Sizes and counts for a status report: cheap (counts use indexes, no deep checks)."""
    db = store.db
    if db.dialect == "postgresql":
        facts = catalog.server_facts(db)
        nodes = dag.stats()
        return {"path": db.display, "size_bytes": facts["size_bytes"], "files": {},
                "server_version": facts["server_version"],
                "schema_version": facts["schema_version"],
                "schema_supported": facts["schema_supported"],
                "messages": store.count_messages(), "nodes": nodes["nodes"],
                "nodes_by_depth": {str(d): v["nodes"] for d, v in nodes["by_depth"].items()},
                "open_seconds": round(db.open_seconds, 4)}
    sizes = file_sizes(db.path) if db.path != ":memory:" else {}
    page_size, page_count = pragma(db, "page_size"), pragma(db, "page_count")
    nodes = dag.stats()
    return {
        "path": db.display,
        "size_bytes": sum(sizes.values()) if sizes else page_size * page_count,
        "files": sizes,
        "schema_version": pragma(db, "user_version"),
        "schema_supported": migrations.latest_version(),
        "messages": store.count_messages(),
        "nodes": nodes["nodes"],
        "nodes_by_depth": {str(d): v["nodes"] for d, v in nodes["by_depth"].items()},
        "open_seconds": round(db.open_seconds, 4),
    }


def status_report(store: Store, dag: Dag, config: TroveConfig, status: Mapping, *,
                  session_id: str | None, counter_name: str | None = None) -> dict:
    """What ``trove_status`` (and a status command) shows: the engine's own snapshot,
    database statistics, the token counter and every setting with its source."""
    return {"bound": bool(session_id), "session_id": session_id, "engine": dict(status),
            "database": database_stats(store, dag),
            "token_counter": status.get("token_counter") or counter_name or "unknown",
            "config": config.describe()}


LIFECYCLE_WORDS = ("compaction", "compression", "skip", "pattern", "ignore", "stateless",
                   "pressure", "filter", "mode", "binding", "reachability", "usage")


def inspect_report(store: Store, dag: Dag, status: Mapping, session_id: str, *,
                   cover: Callable[[dict], Mapping] = lambda node: node) -> dict:
    """A session's memory inventory, metadata only: frontier, carried nodes, counts, and
    the engine's last compaction / skip decisions and matched patterns. ``cover`` gives
    a node's message count and time range as the caller may count them
    (``toolkit.scope.Access.coverage``: a summary over another owner's rows counts only
    the caller's)."""
    stats = dag.stats(session_id)
    frontier = []
    for n in dag.frontier(session_id):
        seen = cover(n)
        frontier.append({"node_id": n["node_id"], "depth": n["depth"], "tokens": n["token_count"],
                         "message_count": seen["message_count"], "time_from": seen["time_from"],
                         "time_to": seen["time_to"], "carried": n["session_id"] != session_id})
    return {
        "session_id": session_id,
        "messages": store.count_messages(session_id),
        "nodes_by_depth": {str(d): v for d, v in stats["by_depth"].items()},
        "frontier": frontier,
        "carried_node_ids": dag.carried_node_ids(session_id),
        "lifecycle": {k: v for k, v in status.items()
                      if any(word in k for word in LIFECYCLE_WORDS)},
    }


# ---------------------------------------------------------------- database
def check_database(store: Store, *, full: bool = False) -> list[dict]:
    """Journal mode, structure, integrity (bounded), space use and the largest rows."""
    db = store.db
    if db.dialect == "postgresql":
        return _check_server(store)
    results = []
    mode = str(pragma(db, "journal_mode")).lower()
    results.append(check("journal_mode", "ok" if mode == "wal" else "warn",
                         f"journal_mode={mode}" + ("" if mode == "wal" else
                                                   " (WAL expected: readers block writers)")))
    missing = list(getattr(db, "missing_objects", []) or [])
    results.append(check("schema_objects", "fail" if missing else "ok",
                         f"missing: {', '.join(missing)}" if missing else "all required objects exist",
                         schema_version=pragma(db, "user_version")))
    page_size, page_count = pragma(db, "page_size"), pragma(db, "page_count")
    size = page_size * page_count
    results.append(_quick_check(db, size, full))
    results.append(_space(store, page_size, page_count))
    results.append(_largest_rows(store))
    return results


def _check_server(store: Store) -> list[dict]:
    """The database checks that fit a PostgreSQL server: structure and schema version,
    the search extensions, space per relation and the largest rows (the server keeps
    its own files whole: there is no quick_check or journal mode to read)."""
    facts = catalog.server_facts(store.db)
    missing = list(store.db.missing_objects or [])
    behind = facts["schema_version"] != facts["schema_supported"]
    trigram = ("pg_trgm index on messages" if facts["trigram_index"] else
               "no pg_trgm index: substring search scans (CREATE EXTENSION pg_trgm, then "
               "reopen)")
    return [
        check("server", "ok", f"PostgreSQL {facts['server_version']}, schema {facts['schema']}"),
        check("schema_objects", "fail" if missing or behind else "ok",
              f"missing: {', '.join(missing)}" if missing else
              f"schema version {facts['schema_version']} of {facts['schema_supported']}",
              schema_version=facts["schema_version"]),
        check("search_extensions", "ok" if facts["trigram_index"] else "warn", trigram,
              pg_trgm=facts["pg_trgm"], pgvector=facts["pgvector"]),
        check("space", "ok", f"{facts['size_bytes']} bytes in the schema's tables",
              largest_objects=facts["largest_objects"], sizes_from="pg_total_relation_size"),
        _largest_rows(store),
    ]


def _quick_check(db: Database, size: int, full: bool) -> dict:
    if size > QUICK_CHECK_MAX_BYTES and not full:
        return check("quick_check", "skipped",
                     f"database is {size // (1024 * 1024)} MB (> {QUICK_CHECK_MAX_BYTES >> 20} MB); "
                     "run trove_doctor with full=true to check it (takes seconds)")
    started = time.perf_counter()
    with db.reading() as conn:
        rows = [r[0] for r in conn.execute("PRAGMA quick_check(20)")]
    seconds = round(time.perf_counter() - started, 3)
    ok = rows == ["ok"]
    return check("quick_check", "ok" if ok else "fail",
                 "ok" if ok else "; ".join(str(r) for r in rows[:5]), seconds=seconds)


def _space(store: Store, page_size: int, page_count: int) -> dict:
    freelist = pragma(store.db, "freelist_count") or 0
    share = freelist / page_count if page_count else 0.0
    tables = store.table_sizes()
    if tables is not None:
        tables = dict(list(tables.items())[:8])
    status = "warn" if share > FREELIST_WARN_SHARE else "ok"
    detail = f"{page_count * page_size} bytes in {page_count} pages; {freelist} free pages"
    if status == "warn":
        detail += " (a VACUUM during a quiet moment would return the space)"
    return check("space", status, detail, largest_objects=tables,
                 sizes_from="dbstat" if tables is not None else "page_count*page_size")


def _largest_rows(store: Store) -> dict:
    rows = store.largest_messages(limit=3)
    big = [r for r in rows if r["chars"] > LARGE_ROW_WARN_CHARS]
    detail = (f"{len(big)} of the newest messages hold over {LARGE_ROW_WARN_CHARS} chars; "
              "consider TROVE_LARGE_OUTPUT_EXTERNALIZATION_ENABLED" if big
              else "no oversized rows among the newest messages")
    return check("largest_rows", "warn" if big else "ok", detail,
                 rows=[{"store_id": r["store_id"], "role": r["role"], "chars": r["chars"]}
                       for r in rows])


# ---------------------------------------------------------------- full-text index
def check_fts(store: Store, dag: Dag, config: TroveConfig, now: float | None = None) -> list[dict]:
    """Row counts of both FTS indexes against their tables, and when they were deep-checked."""
    results = []
    for name, counts in (("messages_fts", store.fts_row_counts()),
                         ("nodes_fts", dag.fts_row_counts())):
        same = counts["rows"] == counts["fts_docs"]
        results.append(check(f"{name}_rows", "ok" if same else "fail",
                             f"{counts['rows']} rows, {counts['fts_docs']} indexed" +
                             ("" if same else ": the index is out of step; rebuild it"), **counts))
    if store.db.dialect == "postgresql":
        results.append(check("fts_integrity", "ok", "tsvector columns are computed by the "
                             "server on every write (nothing to drift)"))
        return results
    checked = store.get_meta("fts_checked_at")
    interval = config.fts_integrity_check_interval_hours
    now = time.time() if now is None else now
    if checked is None:
        status = "ok" if interval == 0 else "warn"
        results.append(check("fts_integrity", status, "no deep FTS integrity check recorded yet"))
    else:
        try:
            age_hours = (now - float(checked)) / 3600
        except ValueError:
            results.append(check("fts_integrity", "warn", f"unreadable fts_checked_at {checked!r}"))
            return results
        late = interval > 0 and age_hours > 2 * interval
        results.append(check("fts_integrity", "warn" if late else "ok",
                             f"last deep check {age_hours:.1f} h ago"
                             + (f" (interval {interval} h)" if late else ""),
                             checked_at=float(checked)))
    return results


# ---------------------------------------------------------------- engine
def check_config(config: TroveConfig, status: Mapping) -> list[dict]:
    """Configuration warnings, and whether compaction can work for the current window."""
    return [check("config_warnings", "warn" if config.warnings else "ok",
                  f"{len(config.warnings)} warning(s)" if config.warnings else "no warnings",
                  warnings=list(config.warnings))] + check_reachable(config, status)


def check_reachable(config: TroveConfig, status: Mapping) -> list[dict]:
    """Whether compaction can free room in the calling engine's window (its own state,
    so a caller who is not the operator gets it too)."""
    window = status.get("context_length")
    if not (isinstance(window, int) and window > 0):
        return []
    problems = check_reachability(config, window)
    return [check("compaction_reachable", "fail" if problems else "ok",
                  "; ".join(problems) if problems else
                  f"compaction can free room in a {window}-token window")]


def check_lifecycle(status: Mapping, session_nodes: int | None,
                    offline: bool = False) -> list[dict]:
    """Session binding and compaction progress, from the engine's status snapshot.

    ``offline``: no engine is running (the operator CLI reads the file only), so
    there is no session to bind and the check is skipped rather than warned."""
    bound = status.get("session_id") or status.get("bound_session")
    if offline:
        results = [check("session_bound", "skipped", "no live engine: reading the database only")]
    else:
        results = [check("session_bound", "ok" if bound else "warn",
                         f"bound to {bound}" if bound else "the engine has no session bound: "
                         "recall tools return nothing until a session starts")]
    compactions = status.get("compaction_count") or status.get("compression_count") or 0
    if compactions and session_nodes == 0:
        results.append(check("compaction_output", "warn",
                             f"{compactions} compactions but no summary node in this session"))
    stalled = status.get("no_progress_passes") or 0
    if stalled:
        results.append(check("compaction_progress", "warn",
                             f"{stalled} compaction passes made no progress",
                             last_skip_reason=status.get("last_skip_reason")))
    return results


def check_summaries(status: Mapping) -> list[dict]:
    """Whether the summary model is being used: an open breaker, a spent hourly cap or a
    last compaction whose model answers all failed leave the summaries to the
    deterministic digest, which still compacts but keeps less; the operator should know."""
    problems = []
    breaker = status.get("summary_breaker")
    if isinstance(breaker, Mapping):
        shut = sorted(str(r) for r, s in breaker.items()
                      if isinstance(s, Mapping) and s.get("state") == "open")
        if shut:
            problems.append(f"circuit breaker open for {', '.join(shut)} "
                            "(TROVE_SUMMARY_CIRCUIT_BREAKER_COOLDOWN_SECONDS)")
    spend = status.get("summary_spend")
    if isinstance(spend, Mapping) and spend.get("exhausted"):
        problems.append(f"spend guard reached: {spend.get('reason')}")
    last = status.get("last_compaction")
    if isinstance(last, Mapping) and isinstance(last.get("levels"), list) \
            and isinstance(last.get("summary_problems"), Mapping) and last["summary_problems"]:
        digests = sum(1 for v in last["levels"] if v == 3)
        if digests:
            why = ", ".join(f"{str(k)[:80]} x{v}"
                            for k, v in list(last["summary_problems"].items())[:3])
            problems.append(f"last compaction: {digests} of {len(last['levels'])} summaries "
                            f"by the deterministic digest ({why})")
    if not problems:
        return [check("summary_model", "ok", "model summaries in use (or none needed yet)")]
    return [check("summary_model", "warn", "; ".join(problems))]


def check_embeddings(status: Mapping) -> list[dict]:
    """Whether the embedding model still answers as the one that made the stored
    vectors (``recall.probe``): an endpoint serving another model under the same name
    starts a new index (the old vectors are never searched), and a probe that failed
    leaves the vector arm off. Read from the engine's status: the doctor calls no model."""
    block = status.get("embeddings")
    check_block = block.get("model_check") if isinstance(block, Mapping) else None
    if not isinstance(check_block, Mapping):
        return []
    state, detail = check_block.get("state"), str(check_block.get("detail") or "")
    if state in ("changed", "failed"):
        return [check("embedding_model", "warn", detail)]
    return [check("embedding_model", "ok" if state != "unchecked" else "skipped", detail)]


def check_pressure(status: Mapping, config: TroveConfig) -> list[dict]:
    """How full the context window is, against the compaction trigger."""
    ratio = status.get("context_pressure")
    prompt, window = status.get("last_prompt_tokens"), status.get("context_length")
    if not isinstance(ratio, (int, float)) and isinstance(prompt, int) and prompt >= 0 \
            and isinstance(window, int) and window > 0:
        ratio = prompt / window
    if not isinstance(ratio, (int, float)):
        return [check("context_pressure", "skipped", "no prompt size reported yet")]
    trigger, share = status.get("threshold_tokens"), config.context_threshold
    if isinstance(trigger, int) and isinstance(window, int) and trigger > 0 and window > 0:
        share = trigger / window  # the effective trigger (TROVE_MIN_TRIGGER_TOKENS may raise it)
    status_word = "fail" if ratio >= 1.0 else "warn" if ratio > share * 1.5 else "ok"
    return [check("context_pressure", status_word,
                  f"prompt at {ratio:.0%} of the window (trigger {share:.0%})",
                  ratio=round(float(ratio), 4))]


def check_rollup_lineage(db: Database, config: TroveConfig) -> list[dict]:
    """Every rollup source still exists: a removed node or message leaves a rollup
    whose drill-down breaks (the next rollup build replaces it, since its sources'
    watermark changed)."""
    timeline = Timeline(db)
    problems = timeline.lineage_problems(limit=20)
    count = timeline.count_rollups()
    if problems:
        shown = ", ".join(f"r{p['rollup_id']}#{p['ordinal']} -> {p['missing']}"
                          for p in problems[:5])
        many = "+" if len(problems) >= 20 else ""
        return [check("rollup_lineage", "warn", f"{len(problems)}{many} rollup sources point "
                      f"at removed rows ({shown}); run /trove rollups build apply to rebuild "
                      "them", problems=problems)]
    state = "on" if config.rollups_enabled else "off (TROVE_ROLLUPS_ENABLED)"
    return [check("rollup_lineage", "ok", f"{count} rollups, every source present; "
                  f"rollups {state}")]


def run_doctor(store: Store, dag: Dag, config: TroveConfig, status: Mapping | None = None, *,
               session_id: str | None = None, full: bool = False,
               now: float | None = None, offline: bool = False,
               operator: bool = True) -> dict:
    """Every check, in the order an operator reads them; ``overall`` is the worst status.

    ``offline`` when no engine runs (see ``check_lifecycle``). ``operator`` False: a
    caller who is not the profile's operator (a messaging gateway's user asking the
    agent, ``toolkit.scope.operator_view``) gets the checks of its own engine and
    session only; the database, index, rollup, settings and host checks show every
    owner's figures, the file's path and the host's config (``diagnostics.caller``)."""
    status = dict(status or {})
    session_nodes = dag.stats(session_id)["nodes"] if session_id else None
    checks: list[dict] = []
    every = (lambda: check_database(store, full=full),
             lambda: check_fts(store, dag, config, now),
             lambda: check_config(config, status))
    own = (lambda: check_lifecycle(status, session_nodes, offline),
           lambda: check_pressure(status, config),
           lambda: check_embeddings(status),
           lambda: check_summaries(status if operator else caller.summaries(status)))
    if not operator:
        every = (lambda: check_reachable(config, status),)
        own += (lambda: [check("operator_checks", "skipped", caller.OPERATOR_VIEW)],)
    else:
        own += (lambda: check_rollup_lineage(store.db, config),
                lambda: host.check_host(config.hermes_home))
    for part in every + own:
        try:
            checks += part()
        except Exception as exc:  # one broken check must not hide the others
            checks.append(check("doctor_error", "fail", f"{type(exc).__name__}: {exc}"[:300]))
    return verdict(checks)


def verdict(checks: list[dict]) -> dict:
    """The doctor report for ``checks``: ``overall`` is the worst status."""
    worst = max((SEVERITY.get(c["status"], 0) for c in checks), default=0)
    return {"overall": {0: "ok", 1: "warn", 2: "fail"}[worst], "checks": checks}
