"""The ``/trove`` slash command: chat text over ``operator_actions``.

Registered only when ``TROVE_ENABLE_SLASH_COMMAND`` is true (``register`` in ``__init__``).
The handler resolves the live engine of the calling session
(``HERMES_SESSION_ID``, read the way the gateway scopes it per conversation;
``forks.host_session_hint`` never takes another chat's id from the environment of
a gateway process); without one it still answers from the configured database. Each subcommand is
one entry of ``ACTIONS``: the operator function that builds a plain dict and
the formatter that turns it into text. ``scripts/trove.py`` runs the same
entries for status, doctor and backup, so both front ends say the same thing.
In a messaging gateway chat (``owners.local_operator`` false) only the entries marked
``gateway_ok`` run, on the caller's own data; every other one is refused in one line.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from typing import Callable

from .operators import actions as ops
from .operators import rollup_actions
from .operators import embed, families, housekeeping
from .operators import search, textview
from .operators.progress import LogProgress
from .config import load_config
from .binding import forks, owners
from .engine import find_engine
from .diagnostics import compaction_text
from .diagnostics.host import describe_identity
from .storage.payloads import human_size
from .tools import iso

log = logging.getLogger(__name__)

COMMAND_NAME = "trove"
DESCRIPTION = "hermes-trove: status, doctor, backup and rotate of the lossless context store"
ARGS_HINT = ("[status|grep QUERY|doctor [clean|repair|source|retention] [apply]|backup|rotate [apply]|"
             "rollups [status|build [apply]]|"
             "embed warmup|embed backfill [apply]|embed prune [apply]|help]")
MARK = {"ok": "ok", "skipped": "--", "warn": "WARN", "fail": "FAIL"}


@dataclass(frozen=True)
class Action:
    """One subcommand: its words, help line, operator function and formatter."""

    words: tuple[str, ...]
    summary: str
    run: Callable[[ops.Target], dict]
    render: Callable[[dict], str]
    # Reads only the caller's own data, so a messaging gateway's user may run it
    # (``owners.local_operator`` false). Everything else (writes, repairs, backups, the
    # model download, any view over every owner) is the profile operator's: fail
    # closed, a new action is the operator's unless it says otherwise here.
    gateway_ok: bool = False


def register_command(ctx) -> None:
    """Register ``/trove`` with the host (called by ``register`` when enabled)."""
    ctx.register_command(COMMAND_NAME, handle, description=DESCRIPTION, args_hint=ARGS_HINT)


def calling_session() -> str | None:
    """The session the command was typed in: the gateway's per-conversation value
    when it set one, else ``HERMES_SESSION_ID`` from the environment (CLI), else the
    interactive CLI's own session (before the first message of a resumed session no
    agent has started, so nothing has set the variable yet)."""
    return forks.host_session_hint() or cli_session() or None


def cli_session() -> str | None:
    """The session id of the running ``hermes`` CLI, which the host's plugin manager
    holds (``_cli_ref``; None outside an interactive CLI)."""
    plugins = sys.modules.get("hermes_cli.plugins")   # loaded only inside the host
    try:
        cli = plugins.get_plugin_manager()._cli_ref if plugins is not None else None
        value = getattr(cli, "session_id", None)
    except Exception:  # an older or different host: no CLI session to name
        return None
    return value.strip() if isinstance(value, str) and value.strip() else None


def resolve_target(writable: bool = False) -> ops.Target:
    """The calling session's live engine, else the configured database (opened
    read-only unless the subcommand writes); who asks decides what it may read
    (``owners.local_operator``: in a messaging gateway, the caller's owner only)."""
    session = calling_session()
    engine = find_engine(session) if session else None
    who = {"operator": owners.local_operator(), "caller": session}
    if engine is not None:
        return ops.open_target(engine.config, engine, **who)
    return ops.open_target(load_config(), writable=writable, **who)


def database_exists() -> bool:
    """Whether there is a database to read: a live engine holds one, else the configured
    server or existing file (``ops.has_database``)."""
    session = calling_session()
    if session and find_engine(session) is not None:
        return True
    return ops.has_database(load_config())


def handle(raw_args: str = "") -> str:
    """The host's entry point: parse the words, run the action, answer text (never raise).
    Subcommand words match in any case; the user's text is echoed as typed."""
    typed = " ".join(str(raw_args or "").split())
    words = tuple(typed.lower().split()) or ("status",)
    if words[0] == "grep":
        return grep_command(typed.split(None, 1)[1] if len(words) > 1 else "")
    action = ACTIONS.get(words)
    if action is None:
        return f"/trove: unknown subcommand {typed!r}\n\n{help_text()}"
    if words == ("help",):
        return help_text()
    operator = owners.local_operator()
    if not operator and not action.gateway_ok:
        return gateway_refusal(words)
    try:
        if words == ("status",) and not operator:
            return caller_status_text()
        if words == ("status",):
            engine = find_engine(calling_session()) if calling_session() else None
            config = engine.config if engine is not None else load_config()
            fault = ops.database_unusable(config, engine)
            if fault:
                return format_status(ops.status_unusable(config, fault, engine,
                                                         calling_session()))
        if words in (("doctor",), ("doctor", "full"), ("status",)) and not database_exists():
            config = load_config()
            if words == ("status",):
                return format_status({**ops.status_without_database(config, calling_session()),
                                      **families.without_database(config)})
            return action.render(ops.doctor_without_database(
                config, f"no trove database at {config.resolved_database_path}"))
        return action.render(action.run(resolve_target(ops.writes(words))))
    except ops.OperatorError as exc:
        return f"/trove {' '.join(words)}: {exc}"
    except Exception as exc:  # a command must answer, never break the chat
        log.exception("hermes-trove: /trove %s failed", " ".join(words))
        return f"/trove {' '.join(words)} failed: {type(exc).__name__}: {exc}"


def gateway_refusal(words: tuple[str, ...]) -> str:
    """The one line a messaging gateway's user gets for an operator-only action: it
    writes, repairs, backs up or spans every owner, and whoever types in a shared chat
    is not the profile's operator (``owners.local_operator``)."""
    return (f"/trove {' '.join(words)}: refused in a messaging gateway chat: it writes, "
            "backs up or reads every user's data, so only the profile's operator runs it, "
            "from the Hermes CLI or scripts/trove.py on the host")


def caller_status_text() -> str:
    """``/trove status`` for a messaging gateway's user: their own session (when the
    task names it) and never a figure of the whole database (``ops.caller_status``);
    whether the database is in use, without its path or fault details."""
    session = calling_session()
    engine = find_engine(session) if session else None
    config = engine.config if engine is not None else load_config()
    if ops.database_unusable(config, engine):
        return format_caller_status({"database": "unusable", "session": None})
    if not database_exists():
        return format_caller_status({"database": "none", "session": None})
    target = resolve_target()
    report = ops.caller_status(target, session)
    if report["session"] is not None:   # their owner's periods only (``caller_access``)
        report["rollups"] = families.rollups_status(target)
    return format_caller_status(report)


GREP_OPTION = re.compile(r"(?:^|\s)--(session|mode|limit|offset)(?:=|\s+)(\S+)")
GREP_USAGE = ("usage: /trove grep [--session ID] [--mode full_text|semantic|hybrid] "
              "[--limit N] [--offset N] QUERY")


def grep_command(text: str) -> str:
    """``/trove grep QUERY``: the operator's read-only search, every session unless
    ``--session`` names one; the same report and table as ``trove.py grep``. Typed in a
    messaging gateway it searches the caller's owner's sessions only (``resolve_target``)."""
    options = {name: value for name, value in GREP_OPTION.findall(text)}
    query = GREP_OPTION.sub(" ", text).strip()
    if not query:
        return f"/trove grep: no query\n{GREP_USAGE}"
    try:
        numbers = {k: int(options[k]) for k in ("limit", "offset") if k in options}
    except ValueError:
        return f"/trove grep: --limit and --offset take whole numbers\n{GREP_USAGE}"
    try:
        report = search.grep(resolve_target(), query, session_id=options.get("session"),
                          limit=numbers.get("limit"), offset=numbers.get("offset", 0),
                          mode=options.get("mode"))
    except ops.OperatorError as exc:
        return f"/trove grep: {exc}"
    except Exception as exc:  # a command must answer, never break the chat
        log.exception("hermes-trove: /trove grep failed")
        return f"/trove grep failed: {type(exc).__name__}: {exc}"
    return textview.format_grep(report, options.get("session"))


def help_text() -> str:
    """Every subcommand with one line each, and which ones write (after a backup)."""
    lines = ["/trove commands (apply paths write a backup first, then say what changed):"]
    lines += [f"  /trove {' '.join(a.words):<24} {a.summary}" for a in ACTIONS.values()]
    lines.append(f"  /trove {'grep QUERY':<24} search every session (read-only; --session ID, "
                 "--mode full_text|semantic|hybrid, --limit N, --offset N; in a messaging "
                 "gateway: your own sessions)")
    allowed = [" ".join(a.words) for a in ACTIONS.values() if a.gateway_ok]
    lines.append(f"In a messaging gateway chat only {', '.join(allowed)} and grep run, on "
                 "your own sessions; the rest are the operator's (the Hermes CLI or "
                 "scripts/trove.py).")
    lines.append("doctor clean apply also needs TROVE_DOCTOR_CLEAN_APPLY_ENABLED=true. "
                 "Operator CLI without Hermes: scripts/trove.py --help")
    return "\n".join(lines)


# ---------------------------------------------------------------- shared pieces
def when(ts) -> str:
    """A Unix time as ISO-8601 UTC, or 'never'."""
    return iso(float(ts)) if ts else "never"


def refused_or_noop(report: dict, title: str) -> str | None:
    """The one-line answer for a refused or no-op action, else None."""
    if report.get("status") == "refused":
        return f"{title}: refused: {report['reason']}"
    if report.get("status") == "noop":
        return f"{title}: nothing to do: {report['reason']}"
    return None


def backup_line(written: dict | None) -> str:
    """Where the backup of an apply path went."""
    if not written:
        return "backup: none"
    size = f" ({human_size(written['bytes'])})" if written.get("bytes") is not None else ""
    return f"backup written first: {written['path']}{size}"


def _count(number) -> str:
    return f"{int(number or 0):,}"


# ---------------------------------------------------------------- status
def format_status(report: dict) -> str:
    """Database, session, engine, last rotate and last backup, a line each."""
    db = report["database"]
    fault = report.get("database_fault")
    if fault:
        lines = ["trove status",
                 f"DATABASE UNUSABLE, nothing is stored: {fault.get('problem')}",
                 f"repair: {fault.get('repair')}"]
        lines += _session_lines(report.get("session"))
        lines.append(_engine_line(report.get("engine")))
    elif db is None:
        lines = ["trove status", f"database: none yet at {report['database_path']} (the engine "
                 "creates it on the first message)"]
        lines += [f"database note: {n}" for n in report.get("database_notes", [])]
        session = report.get("session")
        lines.append(f"session: {session['session_id']} (nothing stored yet)" if session else
                     "session: none (HERMES_SESSION_ID is not set)")
    else:
        depths = ", ".join(f"d{d}: {n}" for d, n in db["nodes_by_depth"].items()) or "none"
        lines = ["trove status",
                 f"database: {db['path']} ({human_size(db['size_bytes'])}, schema "
                 f"{db['schema_version']}/{db['schema_supported']}): {_count(db['messages'])} "
                 f"messages, {_count(db['nodes'])} summary nodes ({depths}), "
                 f"{_count(report['session_rows'])} session rows"]
        lines += [f"database note: {n}" for n in report.get("database_notes", [])]
        lines += _session_lines(report.get("session"))
        lines.append(_engine_line(report.get("engine")))
        lines += _summary_work_lines(report.get("engine"))
    if report.get("embeddings"):
        lines.append(families.embeddings_line(report["embeddings"]))
    if report.get("rollups"):
        lines.append(families.rollups_line(report["rollups"], when))
    last = report["last_backup"] or {"path": None}
    lines.append(f"last backup: {last['path']} at {when(last['at'])} ({last['label']})"
                 + ("" if last["exists"] else " [file missing]") if last["path"]
                 else "last backup: none recorded yet (/trove backup writes one)")
    if report.get("plugin"):
        lines.append(f"plugin: {describe_identity(report['plugin'])}")
    lines += [f"config warning: {w}" for w in report.get("config_warnings", [])]
    return "\n".join(lines)


CALLER_DATABASE = {"in use": "database: in use",
                   "none": "database: none yet (the engine creates it on the first message)",
                   "unusable": "database: UNUSABLE, nothing is stored (the operator sees why "
                               "and how to repair it with /trove doctor in the Hermes CLI)"}


def format_caller_status(report: dict) -> str:
    """A messaging gateway user's status: their session, engine and rollups, or a line
    saying the session is not known here; no path, total or other owner's figure."""
    lines = ["trove status (messaging gateway chat: your own session only)",
             CALLER_DATABASE[report["database"]]]
    if report["session"] is not None:
        lines += _session_lines(report["session"])
        if report.get("engine"):
            lines.append(_engine_line(report["engine"]))
        if report.get("rollups", {}).get("enabled"):
            counts = report["rollups"].get("counts") or {}
            lines.append("rollups of your sessions: " + ", ".join(
                f"{state} {counts.get(state, 0)}" for state in ("ready", "pending", "stale",
                                                                 "open")))
    elif report["database"] == "in use":
        lines.append("session: not known here (Hermes 0.19 names none to a plugin command "
                     "in a gateway chat), so no figures are shown")
    lines.append("every user's totals, paths and backups are the operator's view: /trove "
                 "status in the Hermes CLI, or scripts/trove.py status on the host")
    return "\n".join(lines)


def _session_lines(session: dict | None) -> list[str]:
    if not session:
        return ["session: none (no live session and HERMES_SESSION_ID is not set)"]
    if not session.get("stored"):
        return [f"session: {session['session_id']} (nothing stored for it)"]
    alias = ("" if session["canonical_id"] == session["session_id"]
             else f", stored under {session['canonical_id']}")
    rotate = (f"last rotate: {when(session['last_rotate_at'])}, backup "
              f"{session['last_rotate_backup']}" if session.get("last_rotate_at")
              else "last rotate: never")
    compacted = compaction_text.compaction_line(session.get("last_compaction"), when)
    return [f"session: {session['session_id']}{alias} (source {session['source']}): "
            f"{_count(session['messages'])} messages, {session['nodes']} summary nodes, "
            f"{session['frontier_nodes']} in the frontier, {session['carried_nodes']} carried; "
            f"replay floor m{session['replay_floor']}", rotate, compacted]


def _summary_work_lines(engine: dict | None) -> list[str]:
    """The background worker's state and the summary spend guard, when there is an engine."""
    if not engine:
        return []
    lines = []
    prep = engine.get("background_prepare") or {}
    if prep.get("share"):
        chunks = prep.get("chunks") or {}
        lines.append(f"background preparation: from {prep['share']} of the trigger; "
                     f"{'running' if prep.get('running') else 'idle'}, {prep.get('runs', 0)} "
                     f"runs, {prep.get('prepared', 0)} chunks prepared, "
                     f"{chunks.get('ready', 0)} ready, {chunks.get('claimed', 0)} claimed"
                     + (f"; {prep['prepared_merges']} merges prepared, "
                        f"{chunks.get('groups_ready', 0)} ready"
                        if prep.get("prepared_merges") else "")
                     + (f"; last error: {prep['errors'][-1]}" if prep.get("errors") else ""))
    else:
        lines.append("background preparation: off (TROVE_BACKGROUND_PREPARE_SHARE=0)")
    spend = engine.get("summary_spend") or {}
    if spend.get("max_calls_per_hour") or spend.get("max_tokens_per_hour"):
        lines.append(f"summary spend: {spend.get('calls_last_hour', 0)} calls, "
                     f"{_count(spend.get('tokens_last_hour', 0))} tokens in the last hour"
                     + (f"; EXHAUSTED, deterministic summaries ({spend['reason']})"
                        if spend.get("exhausted") else ""))
    return lines


def _engine_line(engine: dict | None) -> str:
    if not engine:
        return "engine: no live trove engine for this session (read from the configured database)"
    window = engine.get("context_length") or 0
    return (f"engine: {engine.get('binding')} binding, mode {engine.get('session_mode')}; "
            f"prompt {_count(engine.get('last_prompt_tokens'))} / {_count(window)} tokens "
            f"({engine.get('usage_percent', 0)}%), "
            f"trigger {_count(engine.get('threshold_tokens'))}"
            + (f" ({engine['trigger_rule']})" if engine.get("trigger_rule") else "") + "; "
            f"{engine.get('compression_count', 0)} compactions this session"
            + (f"; owner {engine['owner']}" if engine.get("owner") else "")
            + _switch_text(engine.get("last_switch"))
            + "\n" + compaction_text.counters_text(engine))


def _switch_text(switch: dict | None) -> str:
    """The last session switch the engine followed (/new, /resume, /branch), if any."""
    if not switch or not switch.get("from"):
        return ""
    return (f"; last switch: {switch['kind']} from {switch['from']}"
            + (f" ({switch['carried_nodes']} nodes carried)" if switch.get("carried_nodes")
               else ""))


# ---------------------------------------------------------------- doctor
def format_doctor(report: dict) -> str:
    """Overall verdict, then one line per check."""
    lines = [f"trove doctor: overall {MARK[report['overall']]} ({report['database_path']})"]
    for c in report["checks"]:
        lines.append(f"  [{MARK.get(c['status'], c['status'])}] {c['name']}: {c['detail']}")
        lines += [f"      - {warning}" for warning in c.get("warnings") or ()]
    return "\n".join(lines)


def format_clean(report: dict) -> str:
    """Scan: each candidate with its rule and whether it is safe; apply: what went."""
    title = "trove doctor clean"
    short = refused_or_noop(report, title)
    if report.get("status") == "cleaned":
        removed = report["removed"]
        lines = [f"{title} apply", backup_line(report["backup"]),
                 f"removed {len(report['removed_sessions'])} sessions: "
                 + ", ".join(f"{s} [{report['rules'][s]}]" for s in report["removed_sessions"]),
                 f"rows deleted: {removed['messages']} messages, {removed['nodes']} nodes, "
                 f"{removed['edges']} edges, {removed['carry_rows']} carry rows, "
                 f"{removed['session_rows']} session rows (FTS kept in step)"]
        if removed.get("rollups"):
            lines.append(f"rollups over them removed: {removed['rollups']} (the next rollup "
                         "pass rebuilds the periods still in its lookback)")
        lines += [f"kept (protected): {c['session_id']}: {'; '.join(c['protected_by'])}"
                  for c in report["protected"]]
        return "\n".join(lines)
    if short:
        return "\n".join([short] + [f"kept (protected): {c['session_id']}: "
                                     f"{'; '.join(c['protected_by'])}"
                                     for c in report.get("protected", [])])
    lines = [f"{title} (read-only): {len(report['candidates'])} candidates in "
             f"{report['sessions_scanned']} sessions; {report['safe']} safe to remove, "
             f"{report['protected']} protected"]
    for c in report["candidates"]:
        verdict = "remove" if c["safe"] else "keep  "
        why = "" if c["safe"] else f" -- protected: {'; '.join(c['protected_by'])}"
        lines.append(f"  {verdict} {c['session_id']} [{c['rule']}] {c['reason']} "
                     f"({c['messages']} messages, {c['nodes']} nodes){why}")
    if report["safe"]:
        lines.append("apply: /trove doctor clean apply (writes a backup first)"
                     + ("" if report["apply_enabled"]
                        else "; needs TROVE_DOCTOR_CLEAN_APPLY_ENABLED=true"))
    return "\n".join(lines)


def format_repair(report: dict) -> str:
    """Problems found; the planned or performed rebuild; the state after."""
    title = "trove doctor repair"
    if report["status"] == "ok":
        return (f"{title}: no problems (quick_check, FTS row counts, FTS integrity-check) "
                f"in {report['database_path']}")
    lines = [f"{title}: {len(report['problems'])} problem(s)"]
    lines += [f"  - {p}" for p in report["problems"]]
    if report["status"] == "refused":
        lines.append(f"refused: {report['reason']}")
    elif report["status"] == "preview":
        lines.append("would: " + "; ".join(report["would"]))
        lines.append("apply: /trove doctor repair apply (writes a backup first)")
    else:
        lines += [backup_line(report["backup"]), "changed: " + "; ".join(report["changed"])]
        after = report["problems_after"]
        lines.append("after: no problems" if not after else
                     "after: still failing: " + "; ".join(after)
                     + " (restore a backup or run sqlite3 .recover)")
    return "\n".join(lines)


def format_source(report: dict) -> str:
    """Blank sources found, and what apply set them to."""
    found = report["found"]
    title = "trove doctor source"
    if report["status"] == "ok":
        return f"{title}: no blank or whitespace-only sources"
    lines = [f"{title}: {found['messages']} messages and {found['sessions']} sessions with a "
             f"blank source (e.g. messages {found['messages_examples']}, sessions "
             f"{found['sessions_examples']})"]
    if report["status"] == "preview":
        lines.append(f"would: {report['would']}; apply: /trove doctor source apply "
                     "(writes a backup first)")
    else:
        changed = report["changed"]
        lines += [backup_line(report["backup"]),
                  f"set source to 'unknown' on {changed['messages']} messages and "
                  f"{changed['sessions']} sessions"]
    return "\n".join(lines)


def format_retention(report: dict) -> str:
    """Messages by age, sessions by idle time, the largest sessions, payload files."""
    db = report["database"]
    lines = [f"trove doctor retention (read-only): {db['path']}, {human_size(db['size_bytes'])}",
             f"  {'age':<12} {'messages':>10} {'chars':>14} {'tokens':>12} {'sessions':>9}"]
    lines += [f"  {b['age']:<12} {_count(b['messages']):>10} {_count(b['chars']):>14} "
              f"{_count(b['tokens']):>12} {_count(b['sessions']):>9}"
              for b in report["messages_by_age"]]
    lines.append("sessions by last activity: " + (", ".join(
        f"{s['idle']}: {s['sessions']}" for s in report["sessions_by_idle"]) or "none"))
    lines.append("largest sessions:")
    lines += [f"  {s['session_id']}: {_count(s['messages'])} messages, {_count(s['chars'])} "
              f"chars, {when(s['first_at'])} .. {when(s['last_at'])}"
              for s in report["largest_sessions"]]
    payloads = report["payloads"]
    lines.append(f"payload files: {payloads['files']} ({human_size(payloads['bytes'])}) "
                 f"in {payloads['path']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- backup, rotate
def format_backup(report: dict) -> str:
    """Where the online backup went."""
    how = ("pg_dump of the server's trove schema (restore with pg_restore)"
           if str(report["path"]).endswith(".pgdump") else "the SQLite online backup API")
    return f"trove backup: {report['path']} ({human_size(report['bytes'] or 0)}), written with {how}"


def format_rotate(report: dict) -> str:
    """Preview, result, no-op or refusal of a rotate."""
    title = f"trove rotate {report.get('session_id') or ''}".rstrip()
    short = refused_or_noop(report, title)
    if short:
        return short
    head = (f"{report['older_messages']} older messages ({_count(report['older_tokens'])} "
            f"tokens) {{}} summarized; the newest {report['tail_messages']} stay verbatim; "
            f"replay floor m{report['replay_floor']}")
    if report["status"] == "preview":
        return (f"{title} (preview): {head.format('would be')}\n"
                f"apply: /trove rotate apply (backup first to {report['backup']})")
    nodes = report["leaf_nodes"] + report["condensed_nodes"]
    return (f"{title}: {head.format('were')}\nbackup written first: {report['backup']}\n"
            f"new summary nodes: {', '.join(f'n{n}' for n in nodes) or 'none'}; the next "
            "prompt uses the rotated context")


def format_rollups(report: dict) -> str:
    """Rollup states per period, or a build's preview, result, no-op or refusal."""
    if "periods" in report:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(report["counts"].items()))
        lines = [f"trove rollups ({'on' if report['enabled'] else 'off'}, "
                 f"{report['time_zone']}, last {report['lookback_days']} days): "
                 f"{counts or 'no material'}"]
        lines += [f"  {r['kind']:<5} {r['key']:<10} {r['state']}"
                  + (f" r{r['rollup_id']}" if r["rollup_id"] else "") + f" ({r['owner']})"
                  for r in report["periods"]]
        if report.get("other_names"):
            lines.append(f"also stored as {', '.join(report['other_names'])} (the same zone): "
                         f"the next pass files them under {report['time_zone']}")
        if report["lineage_problems"]:
            lines.append(f"lineage problems: {len(report['lineage_problems'])} (see doctor)")
        return "\n".join(lines)
    short = refused_or_noop(report, "trove rollups build")
    if short:
        return short
    todo = ", ".join(f"{r['kind']} {r['key']} ({r['state']})" for r in report["to_build"])
    if report["status"] == "preview":
        return (f"trove rollups build (preview): would build {todo or 'nothing'}\n"
                "apply: /trove rollups build apply")
    built = ", ".join(f"{b['kind']} {b['key']} r{b['rollup_id']}" for b in report["built"])
    lines = [f"trove rollups build: built {built or 'nothing'}", backup_line(report["backup"])]
    if report.get("renamed"):
        lines.append(f"filed {report['renamed']} rollups stored under another name of "
                     f"{report['time_zone']} under it")
    if report["waiting"]:
        lines.append("waiting: " + ", ".join(f"{w['kind']} {w['key']}" for w in report["waiting"]))
    lines += [f"error: {e}" for e in report["errors"]]
    return "\n".join(lines)


def _status(target: ops.Target) -> dict:
    return {**ops.status(target, calling_session()), **families.optional_status(target)}


ACTIONS: dict[tuple[str, ...], Action] = {a.words: a for a in (
    Action(("status",), "database, this session, last rotate and last backup",
           _status, format_status, gateway_ok=True),
    Action(("doctor",), "read-only health checks", ops.doctor, format_doctor),
    Action(("doctor", "full"), "health checks including quick_check on a big file",
           lambda t: ops.doctor(t, full=True), format_doctor),
    Action(("doctor", "clean"), "read-only scan for junk/noise sessions", housekeeping.clean_scan,
           format_clean),
    Action(("doctor", "clean", "apply"), "backup, then remove the safe junk sessions",
           housekeeping.clean_apply, format_clean),
    Action(("doctor", "repair"), "SQLite and FTS diagnosis", ops.repair, format_repair),
    Action(("doctor", "repair", "apply"), "backup, then rebuild FTS indexes and REINDEX",
           lambda t: ops.repair(t, apply=True), format_repair),
    Action(("doctor", "source"), "count legacy blank sources", ops.source_fix, format_source),
    Action(("doctor", "source", "apply"), "backup, then set blank sources to 'unknown'",
           lambda t: ops.source_fix(t, apply=True), format_source),
    Action(("doctor", "retention"), "read-only age and size analysis", housekeeping.retention,
           format_retention),
    Action(("backup",), "timestamped online backup of the database", ops.backup, format_backup),
    Action(("rotate",), "preview compacting this session in place", ops.rotate, format_rotate),
    Action(("rotate", "apply"), "backup, then rotate this session",
           lambda t: ops.rotate(t, apply=True), format_rotate),
    Action(("rollups",), "day/week/month rollups: ready, stale, pending, open",
           rollup_actions.status, format_rollups, gateway_ok=True),
    Action(("rollups", "status"), "the same", rollup_actions.status, format_rollups,
           gateway_ok=True),
    Action(("rollups", "build"), "preview which rollups a pass would build",
           rollup_actions.build, format_rollups),
    Action(("rollups", "build", "apply"), "backup, then build the pending and stale rollups",
           lambda t: rollup_actions.build(t, apply=True), format_rollups),
    Action(("embed", "status"), "the embedding index, and whether the model still answers "
           "as the one that made it", embed.status, embed.format_report),
    Action(("embed", "warmup"), "load the embedding model (downloads only here)",
           embed.warmup, embed.format_report),
    Action(("embed", "backfill"), "count what the embedding index lacks",
           embed.backfill, embed.format_report),
    Action(("embed", "backfill", "apply"), "embed what the index lacks (resumable)",
           lambda t: embed.backfill(t, apply=True,
                                    progress=LogProgress("embed backfill", log)),
           embed.format_report),
    Action(("embed", "prune"), "list the vectors other embedding models left",
           embed.prune, embed.format_report),
    Action(("embed", "prune", "apply"), "delete the vectors other embedding models left",
           lambda t: embed.prune(t, apply=True), embed.format_report),
    Action(("help",), "this list", lambda t: {}, lambda r: help_text(), gateway_ok=True),
)}
