#!/usr/bin/env python3
"""Operator CLI for a hermes-trove database, without Hermes running.

    python3 scripts/trove.py status                      # the configured database
    python3 scripts/trove.py --db ~/.hermes/trove.db doctor repair
    python3 scripts/trove.py grep "retry backoff" --session S --json

Every command takes ``--db PATH`` (default: the configured database, see
docs/configuration.md) and ``--json``; human-readable text is the default. The
work is done by ``operator_actions`` (the same functions as ``/trove``), reads
of messages go through ``tools.dispatch``. See docs/operators.md.
Exit codes: 0 done, 1 doctor found a failure or doctor repair found problems, 2 error or
refusal (with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import _bootstrap

_bootstrap.load_package()
from hermes_trove import command  # noqa: E402
from hermes_trove.operators import actions as ops  # noqa: E402
from hermes_trove.operators.textview import format_grep, table  # noqa: E402
from hermes_trove.operators import embed, housekeeping, migrate, search  # noqa: E402
from hermes_trove.operators.progress import Progress  # noqa: E402
from hermes_trove.operators.replay import TranscriptError  # noqa: E402
from hermes_trove.tools import iso  # noqa: E402

DOCTOR_CHOICES = ("repair", "clean", "source", "retention")


def bounded(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high], else a clear error (never clamped)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            span = f"between {low:,} and {high:,}" if high is not None else f"at least {low:,}"
            raise argparse.ArgumentTypeError(f"must be {span}, not {value:,}")
        return value
    return parse


GREP_MAX = ops.GREP_MAX_HITS
PAGE_MAX = ops.COUNT_LIMITS[("trove_load_session", "limit")][1]


def build_parser() -> argparse.ArgumentParser:
    """The command line (kept apart from ``main`` so tests and docs can inspect it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS,
                        help="trove database (default: the configured one)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of text")
    parser = argparse.ArgumentParser(prog="trove.py",
                                     description="Operate a hermes-trove database.")
    # Own actions, not the shared ``common`` ones: a default set here must not leak
    # into the subcommands (where it would overwrite a --db given before them).
    parser.add_argument("--db", metavar="PATH", help="trove database (default: the configured one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add = lambda name, text: sub.add_parser(name, parents=[common], help=text,  # noqa: E731
                                            description=text)
    add("status", "database figures and the newest backup")
    doctor = add("doctor", "health checks; repair, clean, source (--apply writes after a "
                 "backup) and retention")
    doctor.add_argument("what", nargs="?", choices=DOCTOR_CHOICES)
    doctor.add_argument("--apply", action="store_true", help="write (backup first)")
    doctor.add_argument("--full", action="store_true", help="quick_check even on a big file")
    add("backup", "timestamped online backup next to the database")
    rollup = add("rollups", "day/week/month rollups: status, or build (--apply writes after "
                 "a backup)")
    rollup.add_argument("what", nargs="?", choices=("status", "build"), default="status")
    rollup.add_argument("--apply", action="store_true", help="build (backup first)")
    embed = add("embed", "embedding index: status (with the model check), warmup (load the "
                "model), backfill (dry run; --apply embeds, resumable) or prune (other "
                "models' vectors; --apply deletes)")
    embed.add_argument("what", choices=["status", "warmup", "backfill", "prune"])
    embed.add_argument("--apply", action="store_true",
                       help="embed the pending rows (backfill), delete (prune)")
    grep = add("grep", "search messages (trove_grep)")
    grep.add_argument("query")
    scope = grep.add_mutually_exclusive_group()
    scope.add_argument("--session", help="one session, with its summaries")
    scope.add_argument("--all", action="store_true", help="every session (the default)")
    grep.add_argument("--limit", type=bounded(1, GREP_MAX), default=10,
                      help=f"hits per page (1-{GREP_MAX}, default 10)")
    grep.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                      help="highlight matches (auto: on a terminal, unless NO_COLOR is set)")
    grep.add_argument("--offset", type=bounded(0, GREP_MAX - 1), default=0,
                      help="skip this many hits (next page: the offset the output names)")
    grep.add_argument("--mode", choices=search.GREP_MODES,
                      help="full_text, semantic or hybrid, as trove_grep takes it (default: "
                      "full text; semantic and hybrid load the embedding model; a mode the "
                      "index cannot serve runs full text with a note)")
    expand = add("expand", "exact text of m<store_id>, sources of n<node_id>, or a payload ref")
    expand.add_argument("id")
    expand.add_argument("--session", help="read as this session (default: any session)")
    expand.add_argument("--offset", type=bounded(0), default=0,
                        help="first source of a node page")
    describe = add("describe", "metadata and a preview of n<node_id>, m<store_id> or a "
                   "payload ref (trove_describe)")
    describe.add_argument("id")
    describe.add_argument("--session", help="read as this session (default: any session)")
    load = add("load-session", "one page of a session's raw messages")
    load.add_argument("session")
    load.add_argument("--after", type=bounded(0), default=0,
                      help="store_id cursor (next_cursor)")
    load.add_argument("--limit", type=bounded(1, PAGE_MAX), default=50,
                      help=f"messages per page (1-{PAGE_MAX})")
    sessions = add("sessions", "sessions with message counts and time ranges")
    sessions.add_argument("--limit", type=bounded(1, housekeeping.CLEAN_SCAN_MAX_SESSIONS),
                          default=100)
    export = add("export", "a session as JSONL, one exact message per line")
    export.add_argument("session")
    export.add_argument("--out", metavar="FILE", help="write here instead of stdout (a new "
                        "file; never the database)")
    export.add_argument("--force", action="store_true", help="replace an existing --out file")
    dag = add("dag", "HTML view of a session's summary DAG")
    dag.add_argument("session")
    dag.add_argument("--out", metavar="FILE", required=True,
                     help="a new HTML file (never the database)")
    dag.add_argument("--force", action="store_true", help="replace an existing --out file")
    replay = add("replay", "replay a transcript through the engine (default: a fresh database)")
    replay.add_argument("transcript")
    replay.add_argument("--window", type=bounded(ops.MIN_REPLAY_WINDOW),
                        default=65_536, help="context window in tokens")
    replay.add_argument("--overhead", type=bounded(0),
                        help="host tokens around the messages")
    replay.add_argument("--session", default="replay-session")
    move = add("migrate", "copy the database to the other engine: a SQLite file to a "
               "PostgreSQL server or back (dry run; --apply copies, idempotent, counts checked)")
    move.add_argument("--to", required=True, metavar="TARGET",
                      help="postgresql://... URL or a SQLite file path")
    move.add_argument("--apply", action="store_true", help="copy (rows the target has stay)")
    return parser


# ---------------------------------------------------------------- output
def dump_json(value) -> str:
    """Readable JSON, ASCII-escaped only when the text would not encode (lone surrogates)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, indent=2, ensure_ascii=True, default=str)
    return text


# ---------------------------------------------------------------- commands
def run_words(words: tuple[str, ...], args) -> tuple[dict, str, int]:
    """Status, doctor and backup run the ``/trove`` actions: same function, same text."""
    action = command.ACTIONS[words]
    report = action.run(ops.open_target(ops.config_for(args.db), writable=ops.writes(words)))
    code = 0
    if report.get("status") == "refused":
        code = 2
    elif report.get("overall") == "fail" or report.get("status") == "still_failing":
        code = 1
    elif words[:2] == ("doctor", "repair") and report.get("status") == "preview":
        code = 1  # repair found problems (the text names the fix)
    return report, cli_hints(action.render(report)), code


CLI_HINTS = ((re.compile(r"/trove ((?:doctor|embed|rollups)(?: \w+)?) apply\b"),
              r"trove.py \1 --apply"),
             (re.compile(r"/trove (backup|(?:doctor|embed|rollups)(?: \w+)?|status)\b"),
              r"trove.py \1"))


def cli_hints(text: str) -> str:
    """The shared ``/trove`` text with its hints naming the CLI's own commands
    (``trove.py doctor repair --apply``); rotate exists only inside Hermes."""
    for pattern, replacement in CLI_HINTS:
        text = pattern.sub(replacement, text)
    return text


def cmd_doctor(args) -> tuple[dict, str, int]:
    """``doctor [repair|clean|source|retention] [--apply] [--full]``."""
    if args.apply and args.what not in ("repair", "clean", "source"):
        raise ops.OperatorError("--apply needs 'doctor repair', 'doctor clean' or 'doctor source'")
    if args.full and args.what:
        raise ops.OperatorError("--full applies to plain 'doctor' only")
    words = ("doctor",) + ((args.what,) if args.what else ()) + (("apply",) if args.apply else ())
    config = ops.config_for(args.db)
    if not args.what and not ops.has_database(config):
        report = ops.doctor_without_database(config, f"no trove database at "
                                             f"{config.resolved_database_path}")
        return report, command.format_doctor(report), int(report["overall"] == "fail")
    return run_words(words + (("full",) if args.full else ()), args)


def cmd_rollups(args) -> tuple[dict, str, int]:
    """``rollups [status|build] [--apply]``: the ``/trove rollups`` actions."""
    if args.apply and args.what != "build":
        raise ops.OperatorError("--apply needs 'rollups build'")
    return run_words(("rollups", args.what) + (("apply",) if args.apply else ()), args)


def cmd_sessions(args) -> tuple[dict, str, int]:
    """Sessions newest first, with counts and time ranges."""
    report = ops.sessions(ops.open_target(ops.config_for(args.db)), limit=args.limit)
    rows = [[s["session_id"], s.get("title") or "",
             "" if s["canonical_id"] == s["session_id"] else s["canonical_id"],
             s["source"], s["messages"], s["nodes"], iso(s["first_at"]) or "-",
             iso(s["last_at"]) or "-"] for s in report["sessions"]]
    text = table(["session", "title", "alias of", "source", "messages", "nodes", "first",
                  "last"], rows)
    return report, f"{text}\n{len(rows)} of {report['total']} session rows", 0


def cmd_grep(args) -> tuple[dict, str, int]:
    """Search one session or all of them."""
    target = ops.open_target(ops.config_for(args.db))
    report = search.grep(target, args.query, session_id=args.session, limit=args.limit,
                      offset=args.offset, mode=args.mode)
    return report, format_grep(report, args.session, args.color), 0


def render_message(item: dict) -> str:
    """A message item: a header line, then its exact content and tool calls."""
    head = f"m{item['store_id']} {item['role']} {item.get('time') or ''}".rstrip()
    if item.get("session_id"):
        head += f" (session {item['session_id']})"
    parts = [head]
    if item.get("content") is not None:
        parts.append(item["content"])
    if item.get("tool_calls"):
        parts.append(f"tool_calls: {item['tool_calls']}")
    if item.get("has_more"):
        parts.append(f"... continues: expand m{item['store_id']}")
    return "\n".join(parts)


def cmd_expand(args) -> tuple[dict, str, int]:
    """A message's or payload's exact text, or one page of a node's sources."""
    target = ops.open_target(ops.config_for(args.db))
    report = ops.expand(target, args.id, session_id=args.session, source_offset=args.offset)
    if "message" in report:
        return report, render_message(report["message"]), 0
    if "externalized_ref" in report:
        return report, f"{report['externalized_ref']} ({report.get('kind')}, " \
                       f"{report.get('mime')}, {report.get('size_text')})\n{report['content']}", 0
    lines = [f"n{report['node_id']} depth {report['depth']}: {report['child_count']} sources"]
    if report.get("summary") is not None:
        lines.append(f"summary:\n{report['summary']}\nsources:")
    for source in report.get("sources", []):
        if source["kind"] == "summary":
            lines.append(f"-- n{source['node_id']} (summary, depth {source['depth']})\n"
                         f"{source['text']}")
        else:
            lines.append("-- " + render_message(source))
    if report.get("has_more"):
        lines.append(f"more sources: --offset {report['next_source_offset']}")
    return report, "\n".join(lines), 0


def cmd_describe(args) -> tuple[dict, str, int]:
    """One line of metadata per field, then the preview."""
    report = ops.describe(ops.open_target(ops.config_for(args.db)), args.id,
                          session_id=args.session)
    skip = ("preview", "expand", "kind")
    head = (f"n{report['node_id']} summary" if report.get("kind") == "summary" else
            f"m{report['store_id']} message" if report.get("kind") == "message" else
            str(report.get("externalized_ref") or report.get("kind")))
    lines = [head] + [f"  {k}: {v}" for k, v in report.items() if k not in skip]
    if report.get("preview"):
        lines.append(f"preview: {report['preview']}")
    return report, "\n".join(lines), 0


def cmd_load_session(args) -> tuple[dict, str, int]:
    """One page of raw messages and the cursor for the next."""
    target = ops.open_target(ops.config_for(args.db))
    report = ops.load_session(target, args.session, after=args.after, limit=args.limit)
    lines = [render_message(m) for m in report["messages"]] or ["no messages after that cursor"]
    if report.get("has_more"):
        lines.append(f"next page: --after {report['next_cursor']}")
    return report, "\n\n".join(lines), 0


def cmd_export(args) -> tuple[dict, str, int]:
    """JSONL to a file, or to stdout (then the summary goes to stderr)."""
    target = ops.open_target(ops.config_for(args.db))
    ops.require_session(target, args.session)
    if args.out:
        report = ops.export_to_file(target, args.session, args.out, force=args.force)
        return report, f"exported {report['messages']} messages of {args.session} to " \
                       f"{report['out']}", 0
    report = ops.export_session(target, args.session, sys.stdout.write)
    sys.stdout.flush()
    print(f"exported {report['messages']} messages of {args.session}", file=sys.stderr)
    return report, "", 0


def cmd_dag(args) -> tuple[dict, str, int]:
    """Write the DAG page."""
    report = ops.dag_page(ops.open_target(ops.config_for(args.db)), args.session, args.out,
                          force=args.force)
    return report, f"wrote {report['path']} ({report['nodes']} summary nodes of " \
                   f"{report['session_id']})", 0


def cmd_replay(args) -> tuple[dict, str, int]:
    """Replay into --db (backed up first when it exists) or a fresh temporary database."""
    db = args.db or Path(tempfile.mkdtemp(prefix="trove-replay-")) / "trove.db"
    report = ops.replay_transcript(args.transcript, db, window=args.window,
                                   session_id=args.session, overhead=args.overhead)
    lines = [f"replayed {report['messages']} messages in {report['turns']} turns into "
             f"{report['database_path']} (session {report['session_id']})",
             f"stored {report['stored']} messages in session {report['session_id']}, "
             f"{report['compactions']} compactions, "
             f"{report['nodes']} summary nodes, largest prompt {report['max_prompt_tokens']:,} "
             f"tokens of a {report['window']:,} window, {report['seconds']} s"]
    if report["backup"]:
        lines.insert(0, command.backup_line(report["backup"]))
    return report, "\n".join(lines), 0


def cmd_embed(args) -> tuple[dict, str, int]:
    """``embed warmup``, ``embed prune [--apply]`` and ``embed backfill [--apply]``; a
    backfill's apply shows its progress on stderr (a bar on a terminal, a line per batch
    otherwise) and says when it is done."""
    if args.apply and args.what in ("warmup", "status"):
        raise ops.OperatorError("--apply needs 'embed backfill' or 'embed prune'")
    if not (args.what == "backfill" and args.apply):
        return run_words(("embed", args.what) + (("apply",) if args.apply else ()), args)
    target = ops.open_target(ops.config_for(args.db), writable=True)
    bar = Progress("embed backfill")
    report = embed.backfill(target, apply=True, progress=None if args.json else bar)
    if not args.json:
        bar.finish("done, the index is caught up" if report["status"] == "done" else
                   f"stopped with {report['pending']:,} pending (run it again to continue)")
    return report, cli_hints(embed.format_report(report)), 0


def cmd_status(args) -> tuple[dict, str, int]:
    """``/trove status``'s report; an unusable database path is said first, with its
    repair (exit 1), instead of stopping at "no trove database"."""
    config = ops.config_for(args.db)
    fault = ops.database_unusable(config)
    if fault:
        report = ops.status_unusable(config, fault)
        return report, cli_hints(command.format_status(report)), 1
    return run_words(("status",), args)


def cmd_migrate(args) -> tuple[dict, str, int]:
    """Copy the configured (or --db) database to --to; the text is one line per table."""
    source = ops.config_for(args.db).database_target
    target = args.to if migrate.is_url(args.to) else str(Path(args.to).expanduser().resolve())
    report = migrate.migrate(source, target, apply=args.apply)
    lines = [f"trove migrate ({report['mode']}): {report['source']} -> {report['target']}"]
    for t in report["tables"]:
        done = (f", copied {t['copied']}, target now {t['target_rows']}"
                f"{'' if t['verified'] else ' MISMATCH'}" if args.apply else "")
        lines.append(f"  {t['table']:<20} source {t['source_rows']:>9}, target had "
                     f"{t['target_rows_before']:>9}{done}")
    if args.apply:
        lines.append("counts verified" if report["verified"] else
                     f"counts differ: {report['short']} (rows the target already had "
                     "under the same keys were kept)")
    else:
        lines.append("dry run: nothing written (add --apply to copy)")
    return report, "\n".join(lines), 0 if report.get("verified", True) else 1


COMMANDS = {
    "status": cmd_status,
    "backup": lambda a: run_words(("backup",), a),
    "doctor": cmd_doctor, "sessions": cmd_sessions, "grep": cmd_grep, "expand": cmd_expand,
    "load-session": cmd_load_session, "describe": cmd_describe, "export": cmd_export,
    "dag": cmd_dag, "replay": cmd_replay,
    "rollups": cmd_rollups,
    "embed": lambda a: cmd_embed(a),
    "migrate": cmd_migrate,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; print text or JSON; 0 done, 1 doctor failure, 2 error."""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace")
    args = build_parser().parse_args(argv)
    try:
        report, text, code = COMMANDS[args.command](args)
    except BrokenPipeError:  # `export ... | head -1`: the reader left, not an error of ours
        return quiet_exit()
    except (ops.OperatorError, TranscriptError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # an operator tool answers, never with a traceback
        print(f"error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        if code == 2 and not args.json:
            print(f"error: {text}", file=sys.stderr)
        elif args.json and not (args.command == "export" and not args.out):
            print(dump_json(report))
        elif text:
            print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `trove.py ... | head`: the reader left, not an error of ours
        return quiet_exit(code)
    return code


def quiet_exit(code: int = 0) -> int:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush
    does not print a second error, and exit with ``code``."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return code


if __name__ == "__main__":
    sys.exit(main())
