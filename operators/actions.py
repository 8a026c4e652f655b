"""Operator actions behind ``/trove`` and ``scripts/trove.py``: one implementation, plain dicts.

Both front ends call these functions: ``command.py`` turns the dicts into chat
text, ``scripts/trove.py`` into terminal tables or JSON. Reads reuse what the
model's tools use: ``health`` for status and doctor, ``tools.dispatch`` for
grep, expand and load-session (the same JSON the model sees, with an explicit
operator scope). Every write is preceded by an online backup
(``backup.backup_database``, the SQLite backup API, never a file copy) whose path
is returned and recorded in ``trove_meta`` so status can show it. All SQL lives
in ``store`` and ``dag``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..storage import codec, faults, host_sessions, integrity
from ..diagnostics import caller, health, host, startup
from ..compaction import tokens
from .. import tools
from ..schemas import COUNT_LIMITS
from ..storage.backup import backup_database, backup_dir, timestamped_name, unused_path
from ..storage.postgres.connection import is_url
from ..config import TroveConfig, load_config
from ..dag import Dag
from ..storage.database import (Database, DatabaseError, get_database, open_read_only,
                                trove_file_problem)
from ..storage.migrations import SchemaTooNewError
from ..ingest.policy import policy_for
from ..store import UNKNOWN_SOURCE, Store, decode_row
from .outfile import OutputRefused, atomic_output

LAST_BACKUP_KEY = "last_backup_path"
LAST_BACKUP_AT_KEY = "last_backup_at"
LAST_BACKUP_LABEL_KEY = "last_backup_label"
# The scope an operator read runs in when it names no session: every session.
OPERATOR_SESSION = "trove-operator"
DAY = 86_400.0
GREP_DEFAULT_HITS, GREP_MAX_HITS = COUNT_LIMITS[("trove_grep", "limit")]
# A replay window must hold a system prompt, a summary and a fresh tail.
MIN_REPLAY_WINDOW = 4_096
REPAIR_STEPS = ("rebuild messages_fts from messages", "rebuild nodes_fts from nodes",
                "REINDEX every index")


class OperatorError(Exception):
    """An expected failure with a clear message (missing database, unknown id):
    front ends print it (the CLI exits 2), never a traceback."""


@dataclass
class Target:
    """What an action works on: the settings, the live engine when there is one, and
    whether the action may write (reads use a read-only connection). Who asks: the
    ``operator`` reads every owner; else (``binding.owners.local_operator``) reads run
    as ``caller``, the session the command was typed in, under ``Access``."""

    config: TroveConfig
    engine: Any = None
    writable: bool = True
    operator: bool = True
    caller: str | None = None

    @property
    def db_path(self) -> Path:
        """The database file every action reads and backs up."""
        return Path(self.config.resolved_database_path)

    @property
    def location(self) -> str:
        """What the database is opened by: the server's URL when one is set, else the file."""
        return self.config.database_url or str(self.db_path)

    @property
    def database(self) -> Database:
        """The shared connection: read-only unless the action writes or an engine is live
        (a PostgreSQL server, ``TROVE_DATABASE_URL``, in place of the file when set)."""
        where = self.location
        if self.writable or self.engine is not None:
            return get_database(where)
        return open_read_only(where)

    @property
    def store(self) -> Store:
        """Messages and sessions on the process-wide shared connection."""
        return Store(self.database)

    @property
    def dag(self) -> Dag:
        """Summary nodes on the same connection."""
        return Dag(self.database)

    @property
    def session_id(self) -> str | None:
        """The live engine's canonical session (None from the CLI)."""
        return getattr(self.engine, "canonical_id", None) if self.engine is not None else None


def config_for(db_path: str | os.PathLike | None = None) -> TroveConfig:
    """The configured settings, pointed at ``db_path`` when given (the CLI's ``--db``)."""
    environ = dict(os.environ)
    if db_path and is_url(str(db_path)):
        environ["TROVE_DATABASE_URL"] = str(db_path)
    elif db_path:
        environ.pop("TROVE_DATABASE_URL", None)  # --db PATH names a file: SQLite
        environ["TROVE_DATABASE_PATH"] = str(Path(db_path).expanduser().resolve())
    return load_config(environ)


def writes(words: tuple[str, ...]) -> bool:
    """Whether an operator command (``/trove`` words) writes the database: apply paths
    (``rotate apply`` among them) and backup (it records itself). Everything else opens
    read-only, the rotate preview too: it asks the live engine, which has its own
    connection, and without one it is refused with nothing written (a preview never
    migrates an older-schema file)."""
    return "apply" in words or words[:1] == ("backup",)


def open_target(config: TroveConfig, engine: Any = None, writable: bool = False,
                operator: bool = True, caller: str | None = None) -> Target:
    """A target on an existing trove database; a missing file, or one that is not a
    trove database, is an ``OperatorError`` with nothing written (operators never
    create or convert a database by typo). Reads open read-only."""
    target = Target(engine.config if engine is not None else config, engine, writable,
                    operator, caller)
    if engine is None and not config.database_url:
        problem = trove_file_problem(target.db_path, allow_older=writable)
        if problem is not None:
            raise OperatorError(problem + _file_problem_hint(target.db_path, problem))
    try:
        target.database  # read-only unless the command writes
    except (DatabaseError, SchemaTooNewError, sqlite3.Error) as exc:
        where = target.config.database_display   # the server (password hidden) or the file
        fault = faults.describe(where, exc)
        raise OperatorError(f"cannot open {where}: {fault['problem']}. "
                            f"Repair: {fault['repair']}") from None
    return target


def _file_problem_hint(path: Path, problem: str) -> str:
    """What to do about a file that is not a trove database: name the path settings when
    there is none; when the file cannot be read as SQLite it may be the user's damaged
    trove database, so say how to restore it too."""
    if not path.exists():
        return " (pass --db PATH or set TROVE_DATABASE_PATH)"
    if "not SQLite" in problem or "cannot read it" in problem:
        damage = faults.describe(path, sqlite3.DatabaseError("database disk image is malformed"))
        return (". If it is your trove database it is damaged. Repair: " + damage["repair"])
    return ""


def json_safe(value: Any) -> Any:
    """Plain JSON data (engine status holds tuples and paths)."""
    return json.loads(codec.dump_json(value))


# ---------------------------------------------------------------- backups
def record_backup(target: Target, path: str | Path, label: str) -> dict:
    """Remember the newest backup in ``trove_meta`` so status can name it."""
    at = time.time()
    store = target.store
    store.set_meta(LAST_BACKUP_KEY, str(path))
    store.set_meta(LAST_BACKUP_AT_KEY, repr(at))
    store.set_meta(LAST_BACKUP_LABEL_KEY, label)
    size = Path(path).stat().st_size if Path(path).exists() else None
    return {"path": str(path), "bytes": size, "at": at, "label": label}


def backup(target: Target, label: str = "backup") -> dict:
    """A timestamped online backup under ``backups/`` next to the database: the first
    step of every apply path, and ``/trove backup`` on its own."""
    if target.config.database_url:  # pg_dump of the schema, into the same backups/ folder
        dest = backup_dir(target.db_path) / timestamped_name("trove-server", label)
        written = backup_database(target.config.database_url,
                                  unused_path(dest.with_suffix(".pgdump")))
    else:
        written = backup_database(target.db_path, label=label)
    return {"status": "written", **record_backup(target, written, label)}


def last_backup(target: Target) -> dict:
    """The newest backup recorded by an operator action (path, time, label), or nulls."""
    store = target.store
    at = store.get_meta(LAST_BACKUP_AT_KEY)
    path = store.get_meta(LAST_BACKUP_KEY)
    return {"path": path, "at": float(at) if at else None,
            "label": store.get_meta(LAST_BACKUP_LABEL_KEY),
            "exists": bool(path) and Path(path).exists()}


# ---------------------------------------------------------------- status and doctor
def session_summary(target: Target, session_id: str) -> dict:
    """One session's counts and lifecycle: replay floor, last rotate and its backup."""
    store, dag = target.store, target.dag
    canonical = store.canonical_session(session_id)
    row = store.get_session(canonical)
    if row is None:
        return {"session_id": session_id, "stored": False}
    state = row["state"]
    return {"session_id": session_id, "canonical_id": canonical, "stored": True,
            "source": row["source"], "messages": store.count_messages(canonical),
            "nodes": dag.stats(canonical)["nodes"], "frontier_nodes": len(dag.frontier(canonical)),
            "carried_nodes": len(dag.carried_node_ids(canonical)),
            "replay_floor": row["replay_floor"], "created_at": row["created_at"],
            "updated_at": row["updated_at"], "last_rotate_at": state.get("last_rotate_at"),
            "last_rotate_backup": state.get("last_rotate_backup"),
            "last_compaction": state.get("last_compaction")}


def status(target: Target, session_id: str | None = None) -> dict:
    """Database figures, the session (the live engine's, or the one named), the engine's
    runtime snapshot when live, and the newest backup."""
    store, dag = target.store, target.dag
    session_id = target.session_id or session_id
    engine = target.engine
    return {"database": health.database_stats(store, dag), "session_rows": store.count_sessions(),
            "live_engine": engine is not None,
            "engine": json_safe(engine.get_status()) if engine is not None else None,
            "session": session_summary(target, session_id) if session_id else None,
            "last_backup": last_backup(target), "plugin": host.plugin_identity(),
            "config_warnings": list(target.config.warnings),
            "database_notes": database_notes(target.config)}


def caller_status(target: Target, session_id: str | None) -> dict:
    """Status as a messaging gateway's user may see it: their own session (counts,
    rotate, last compaction) and its live engine, never a figure of the database as a
    whole. Totals, the path, the embedding index's counts and the backup's path are
    every owner's (and a total that grows tells a group member when someone else
    chats), so they stay the operator's; with no session known there is nothing of
    the caller's to show, and nothing is. Its engine is ``diagnostics.caller.engine``:
    the same allow-list the status tools give a gateway user; its session record names
    no backup path and no summary route."""
    session = target.session_id or (target.store.canonical_session(session_id)
                                    if session_id else None)
    engine = target.engine
    summary = session_summary(target, session) if session else None
    if summary and summary.get("stored"):
        # its failed summary calls by kind (their text names the operator's routes), and
        # that its last rotate wrote a backup, not where (the operator's data folder)
        summary["last_compaction"] = caller.last_compaction(summary["last_compaction"])
        if summary["last_rotate_backup"]:
            summary["last_rotate_backup"] = "kept by the operator"
    return {"database": "in use", "session": summary,
            "engine": caller.engine(json_safe(engine.get_status())) if engine is not None
            else None}


def database_notes(config: TroveConfig) -> list[str]:
    """What status and doctor say about where the database is (an unused default one)."""
    note = startup.unused_default_database(config)
    return [note] if note else []


def _location_checks(config: TroveConfig) -> list[dict]:
    return [health.check("database_location", "warn", note) for note in database_notes(config)]


def doctor(target: Target, full: bool = False) -> dict:
    """Read-only health (``health.run_doctor``); without a live engine the session
    check is marked skipped, since an offline database has no session to bind."""
    status_snapshot = json_safe(target.engine.get_status()) if target.engine is not None else {}
    report = health.run_doctor(target.store, target.dag, target.config, status_snapshot,
                               session_id=target.session_id, full=full,
                               offline=target.engine is None)
    if database_notes(target.config):
        report = health.verdict(report["checks"] + _location_checks(target.config))
    return {"database_path": target.config.database_display, **report}


def status_without_database(config: TroveConfig, session_id: str | None) -> dict:
    """Status before the first message: no database yet, the host's session id (from
    the environment) and the plugin code, so an operator sees the setup is live."""
    return {"database": None, "database_path": str(config.resolved_database_path),
            "session_rows": 0, "live_engine": False, "engine": None,
            "session": {"session_id": session_id, "stored": False} if session_id else None,
            "last_backup": None, "plugin": host.plugin_identity(),
            "config_warnings": list(config.warnings), "database_notes": database_notes(config)}


def has_database(config: TroveConfig) -> bool:
    """Whether there is a configured database to open: a server URL always (opening it
    says whether the server answers), else the file when it exists. Only a missing file
    is "no database yet"; a URL is never reported as one."""
    return bool(config.database_url) or Path(config.resolved_database_path).is_file()


def database_unusable(config: TroveConfig, engine: Any = None) -> dict | None:
    """Why the database cannot be used at all (``path``, ``problem``, ``repair``), or None:
    the live engine's fault, else a path that is a directory or lies under a file.
    A missing file is not a fault (the engine creates it on the first message)."""
    if engine is not None:
        return engine.database_fault
    path = Path(config.resolved_database_path)
    blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if path.is_dir() or blocked is not None:
        problem = (f"{blocked} is a file, so {path} cannot be created" if blocked is not None
                   else None)
        fault = faults.describe(path, NotADirectoryError(problem or "is a directory"))
        if blocked is not None:
            fault.update(problem=problem, repair="set TROVE_DATABASE_PATH to a path whose "
                         f"folders can exist (or move {blocked} away)")
        return fault
    return None


def status_unusable(config: TroveConfig, fault: dict, engine: Any = None,
                    session_id: str | None = None) -> dict:
    """Status when the database cannot be used: the fault and its repair first, then
    what the engine knows without its database."""
    snapshot = json_safe(engine.get_status()) if engine is not None else None
    return {**status_without_database(config, session_id), "database_fault": fault,
            "engine": snapshot, "live_engine": engine is not None}


def doctor_without_database(config: TroveConfig, problem: str) -> dict:
    """Doctor when there is no trove database to open: the host-side checks still run,
    since "nothing stored" is most often a host setting (plugin not enabled)."""
    fault = database_unusable(config)
    checks = ([health.check("database", "fail", f"{fault['problem']}. Repair: {fault['repair']}",
                            repair=fault["repair"])]
              if fault else
              [health.check("database", "warn", f"{problem}: the engine creates it on the first "
                            "message once Hermes loads the plugin (see the host checks below)")])
    checks += _location_checks(config)
    checks += health.check_config(config, {}) + host.check_host(config.hermes_home)
    return {"database_path": str(config.resolved_database_path), **health.verdict(checks)}


# ---------------------------------------------------------------- doctor repair / source
def _repair_diagnosis(target: Target) -> dict:
    """SQLite structure and integrity (full quick_check), FTS row counts, deep FTS check."""
    checks = (health.check_database(target.store, full=True)
              + health.check_fts(target.store, target.dag, target.config))
    deep = integrity.run_fts_check(target.location)
    problems = [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "fail"]
    problems += [f"fts integrity-check: {p}" for p in deep["problems"]]
    missing = [c for c in checks if c["name"] == "schema_objects" and c["status"] == "fail"]
    return {"checks": checks, "fts_deep": deep, "problems": problems,
            "repairable": not missing}


def repair(target: Target, apply: bool = False) -> dict:
    """Diagnose SQLite and both FTS indexes; with ``apply``, backup then rebuild the FTS
    indexes and every index, and diagnose again."""
    before = _repair_diagnosis(target)
    report = {"mode": "apply" if apply else "preview", "database_path": str(target.db_path),
              "before": before, "problems": before["problems"]}
    if not before["problems"]:
        return {**report, "status": "ok", "note": "nothing to repair"}
    if not before["repairable"]:
        return {**report, "status": "refused", "reason": "required schema objects are missing; "
                "an index rebuild cannot recreate them: restore a backup"}
    if not apply:
        return {**report, "status": "preview", "would": list(REPAIR_STEPS)}
    written = backup(target, "pre-repair")
    target.store.rebuild_message_fts()
    target.dag.rebuild_node_fts()
    target.store.reindex_all()
    after = _repair_diagnosis(target)
    integrity.record_result(target.location, after["fts_deep"])
    return {**report, "status": "repaired" if not after["problems"] else "still_failing",
            "backup": written, "changed": list(REPAIR_STEPS), "after": after,
            "problems_after": after["problems"]}


def source_fix(target: Target, apply: bool = False) -> dict:
    """Legacy blank/whitespace sources: count them; with ``apply``, backup then set
    them to ``unknown`` (what every new row gets when the source is not known)."""
    found = target.store.blank_source_rows()
    report = {"mode": "apply" if apply else "preview", "found": found,
              "database_path": str(target.db_path)}
    if not found["messages"] and not found["sessions"]:
        return {**report, "status": "ok", "note": "no blank sources"}
    if not apply:
        return {**report, "status": "preview", "would": f"set source to {UNKNOWN_SOURCE!r}"}
    written = backup(target, "pre-source")
    return {**report, "status": "fixed", "backup": written,
            "changed": target.store.fix_blank_sources()}


# ---------------------------------------------------------------- rotate
def rotate(target: Target, apply: bool = False) -> dict:
    """The live session's rotate (``TroveEngine.rotate``): preview, or apply behind the
    rolling ``*-rotate-latest`` backup, which is then recorded as the newest backup."""
    if target.engine is None:
        return {"status": "refused", "reason": "no live trove session here: rotate acts on "
                "a running agent's session (use /trove rotate inside Hermes)"}
    result = target.engine.rotate(apply=apply)
    state = (target.store.get_session(target.session_id) or {}).get("state") or {}
    if result.get("status") == "noop" and not state.get("last_rotate_at"):
        result["reason"] = (f"nothing to rotate yet: all {result.get('tail_messages', 0)} live "
                            f"messages are the fresh tail (TROVE_FRESH_TAIL_COUNT="
                            f"{target.config.fresh_tail_count}); rotate summarizes only older "
                            "messages")
    if result.get("status") == "rotated":
        result["backup_recorded"] = record_backup(target, result["backup"], "rotate")
    return result


# ---------------------------------------------------------------- reads through the tools
def tool_context(target: Target, session_id: str, semantic: Any = None) -> tools.ToolContext:
    """A ToolContext whose calling session is ``session_id`` (an operator scope);
    ``semantic`` lets a search use the embedding index (``semantic_side``)."""
    counter = tokens.get_counter(target.config.token_encoding,
                                 target.config.token_count_accelerator)
    return tools.ToolContext(
        store=target.store, dag=target.dag, config=target.config,
        count_tokens=counter.count_text, session_id=session_id, conversation_id=None,
        current_turn_store_id=None, status=lambda: {}, llm_call=None,
        data_dir=target.db_path.parent, payloads=policy_for(target.config).payloads,
        operator=target.operator, semantic=semantic)


def call_tool(target: Target, name: str, args: dict, session_id: str,
              semantic: Any = None) -> dict:
    """``tools.dispatch`` as the operator; a tool error becomes an ``OperatorError``."""
    data = json.loads(tools.dispatch(name, args, tool_context(target, session_id, semantic)))
    if "error" in data:
        raise OperatorError(data["error"])
    return data


def require_session(target: Target, session_id: str) -> str:
    """The canonical id of a stored session, named by its id or by the title Hermes's
    ``/title`` gave it (``state.db``), or an ``OperatorError`` naming it."""
    store = target.store

    def stored(name: str) -> str | None:
        canonical = store.canonical_session(name)
        if store.get_session(canonical) is None and not store.session_messages(canonical, 0, 1):
            return None
        return canonical

    found = stored(session_id)
    if found is None:
        titled = host_sessions.session_for_title(target.config.hermes_home, session_id)
        found = stored(titled) if titled else None
    if found is None:
        raise OperatorError(f"session {session_id!r} not found, neither as an id nor as a "
                            "session title (see the 'sessions' command)")
    return found


def caller_session(target: Target) -> str | None:
    """The canonical session of a caller who is not the operator (``Target``), or None."""
    return target.store.canonical_session(target.caller) if target.caller else None


def _scope(target: Target, session_id: str | None) -> tuple[str, dict]:
    """(calling session, extra args): a named session, or every session. Any other
    caller (``Target``) calls from their session and names another by its id as typed
    (a title is looked up across owners), so ``Access`` decides: their owner's only."""
    if target.operator:
        if session_id:
            return require_session(target, session_id), {}
        return OPERATOR_SESSION, {"session_scope": "all"}
    caller = caller_session(target)
    if caller is None:
        raise OperatorError("the session this command was typed in is not known (a gateway "
                            "names none to plugin commands), so it may read nothing; ask "
                            "the agent, or run scripts/trove.py on the host")
    return caller, ({"session_id": session_id} if session_id else {"session_scope": "all"})


def parse_ref(text: str) -> tuple[str, Any]:
    """``n12``/``12`` -> node_id, ``m34`` -> store_id, ``trove-payload:...`` -> externalized_ref."""
    text = str(text).strip()
    if text.startswith("trove-payload:"):
        return "externalized_ref", text
    match = re.fullmatch(r"([nNmM]?)(\d{1,18})", text)
    if match is None:
        raise OperatorError(f"{text!r} is not an id: use n12 or 12 (summary node), m34 "
                            "(message store_id) or trove-payload:<sha256>")
    return ("store_id" if match.group(1).lower() == "m" else "node_id"), int(match.group(2))


def expand(target: Target, ref: str, session_id: str | None = None,
           source_offset: int = 0) -> dict:
    """``trove_expand`` of a node (one page of sources), or the exact text of a message
    or a payload (every page joined)."""
    key, value = parse_ref(ref)
    caller, scope = _scope(target, session_id)
    args = {key: value, **scope}
    if key == "node_id" and source_offset:
        args["source_offset"] = source_offset
    data = call_tool(target, "trove_expand", args, caller)
    if key == "node_id":
        node = target.dag.get_node(value)
        data["summary"] = node["text"] if node else None  # the node's own text, then sources
    if key == "store_id":
        data["message"] = _whole_text(target, data["message"], caller, scope,
                                      lambda page: page["message"])
    elif key == "externalized_ref":
        data = _whole_text(target, data, caller, scope, lambda page: page)
    return data


def describe(target: Target, ref: str, session_id: str | None = None) -> dict:
    """``trove_describe``: metadata and a preview of a node, message or payload."""
    key, value = parse_ref(ref)
    caller, scope = _scope(target, session_id)
    return call_tool(target, "trove_describe", {key: value, **scope}, caller)


def _whole_text(target: Target, item: dict, caller: str, scope: dict,
                pick: Callable[[dict], dict]) -> dict:
    """Follow an item's continuation handles and join its pages exactly (``pick``
    finds the item in each answer: the message, or the payload page itself)."""
    content, calls, pages = item.get("content"), item.get("tool_calls"), 1
    page = item
    while page.get("has_more"):
        page = pick(call_tool(target, "trove_expand", {**page["expand"]["args"], **scope},
                              caller))
        pages += 1
        if page.get("content") is not None:
            content = (content or "") + page["content"]
        if page.get("tool_calls") is not None:
            calls = (calls or "") + page["tool_calls"]
    whole = {k: v for k, v in item.items()
             if k not in ("expand", "next_content_offset", "next_tool_calls_offset")}
    if content is not None:
        whole["content"] = content
    if calls is not None:
        whole["tool_calls"] = calls
    return {**whole, "has_more": False, "pages": pages}


def load_session(target: Target, session_id: str, after: int = 0, limit: int = 50) -> dict:
    """``trove_load_session``: one ordered page of a session's raw messages."""
    canonical = require_session(target, session_id)
    return call_tool(target, "trove_load_session",
                     {"after_store_id": after, "limit": limit}, canonical)


# ---------------------------------------------------------------- sessions, export, dag
def sessions(target: Target, limit: int = 100) -> dict:
    """Session rows, newest activity first, with message counts and time ranges."""
    rows = target.store.list_sessions(limit=limit)
    named = host_sessions.titles(target.config.hermes_home, (r["session_id"] for r in rows))
    for row in rows:
        row["nodes"] = target.dag.stats(row["session_id"])["nodes"]
        row["title"] = named.get(row["session_id"])
    return {"total": target.store.count_sessions(), "sessions": rows}


def export_messages(target: Target, session_id: str, page: int = 500) -> Iterator[dict]:
    """Every message of a session, exactly as stored (decoded), in order."""
    canonical = require_session(target, session_id)
    after = 0
    while True:
        rows = target.store.session_messages(canonical, after, page)
        yield from (decode_row(r) for r in rows)
        if len(rows) < page:
            return
        after = rows[-1]["store_id"]


def export_session(target: Target, session_id: str, write: Callable[[str], Any]) -> dict:
    """Write a session as JSONL (one exact message per line) through ``write``."""
    count = 0
    for message in export_messages(target, session_id):
        write(codec.dump_json(message) + "\n")
        count += 1
    return {"session_id": session_id, "messages": count}


def export_to_file(target: Target, session_id: str, out: str | Path,
                   force: bool = False) -> dict:
    """``export_session`` into a new file (``outfile``: never the database, never an
    existing file unless ``force``, renamed into place only when complete)."""
    require_session(target, session_id)
    with _output(out, target, force) as handle:
        report = export_session(target, session_id, handle.write)
    return {**report, "out": str(Path(out).expanduser().resolve())}


def dag_page(target: Target, session_id: str, out: str | Path, force: bool = False) -> dict:
    """The self-contained HTML view of a session's summary DAG (``dagview``), written
    like ``export_to_file``."""
    from .dagview import render_html, dag_data
    canonical = require_session(target, session_id)
    page = render_html(dag_data(target.store, target.dag, canonical))
    with _output(out, target, force) as handle:
        handle.write(page)
    return {"session_id": canonical, "nodes": target.dag.stats(canonical)["nodes"],
            "path": str(Path(out).expanduser().resolve())}


@contextmanager
def _output(out: str | Path, target: Target, force: bool) -> Iterator:
    """``outfile.atomic_output`` for the target's database, refusals as ``OperatorError``."""
    try:
        with atomic_output(out, target.db_path, force) as handle:
            yield handle
    except OutputRefused as exc:
        raise OperatorError(str(exc)) from None


# ---------------------------------------------------------------- replay
def replay_transcript(transcript: str | Path, db_path: str | Path, *, window: int,
                      session_id: str, overhead: int | None = None,
                      on_turn: Callable | None = None) -> dict:
    """Replay a transcript through a TroveEngine into ``db_path`` (new, or an existing
    database backed up first), offline with the deterministic summarizer."""
    from ..engine import TroveEngine
    from .replay import HOST_OVERHEAD_TOKENS, load_transcript, replay
    if window < MIN_REPLAY_WINDOW:
        raise OperatorError(f"--window must be at least {MIN_REPLAY_WINDOW:,} tokens, not "
                            f"{window:,}")
    messages = load_transcript(transcript)
    db_path = Path(db_path).expanduser().resolve()
    written = None
    if db_path.exists():
        written = backup(open_target(config_for(db_path), writable=True), "pre-replay")
    cfg = load_config({"HERMES_HOME": str(db_path.parent), "TROVE_DATABASE_PATH": str(db_path)})
    engine = TroveEngine(cfg)
    engine.use_llm(None)
    engine.update_model("offline-replay", window)
    engine.on_session_start(session_id, platform="replay")
    report = replay(engine, messages, on_turn=on_turn,
                    overhead=HOST_OVERHEAD_TOKENS if overhead is None else overhead)
    return {"database_path": str(db_path), "session_id": engine.canonical_id,
            "backup": written, "turns": report.turns, "messages": report.messages,
            "stored": engine.store.count_messages(engine.canonical_id),
            "compactions": report.compactions, "max_prompt_tokens": report.max_prompt_tokens,
            "window": window, "nodes": engine.dag.stats(engine.canonical_id)["nodes"],
            "seconds": round(report.seconds, 3)}
