#!/usr/bin/env python3
"""Backfill OpenClaw history (lossless-claw SQLite or JSONL transcripts) into a trove database.

A dry run by default: it reports what would be imported and writes nothing.
``--apply`` backs the target up and imports in one transaction. See docs/import.md.
Exit codes: 0 done (warnings included), 2 error (nothing was imported).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import _bootstrap

_bootstrap.load_package()
from hermes_trove.openclaw import importer as oc  # noqa: E402

WARNINGS_SHOWN = 10
PROGRESS_EVERY_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    """The command line (kept apart from ``main`` so tests and docs can inspect it)."""
    parser = argparse.ArgumentParser(
        prog="import_lossless_claw.py",
        description="Import OpenClaw history into a hermes-trove database "
                    "(dry run unless --apply).")
    source = parser.add_argument_group("sources (one kind per run)")
    source.add_argument("--source-db", metavar="PATH",
                        help="lossless-claw SQLite database (opened read-only)")
    source.add_argument("--source-jsonl", metavar="FILE", action="append", default=[],
                        help="OpenClaw JSONL transcript (repeatable)")
    source.add_argument("--source-jsonl-dir", metavar="DIR", action="append", default=[],
                        help="every *.jsonl below DIR (repeatable; sessions.json gives keys)")
    parser.add_argument("--target-db", metavar="PATH|URL", required=True,
                        help="trove database to import into: a SQLite file or a "
                             "postgresql:// URL (TROVE_DATABASE_URL's form)")
    parser.add_argument("--agent", default="main", help="OpenClaw agent name (default: main)")
    parser.add_argument("--namespace", help="session/source namespace (default: openclaw-trove "
                                            "for SQLite, openclaw-jsonl for JSONL)")
    parser.add_argument("--import-id", help="idempotency key (default: hash of the source paths)")
    parser.add_argument("--session-identity", choices=oc.SESSION_IDENTITIES,
                        help="SQLite only: one target session per session_id (default) "
                             "or per session_key")
    parser.add_argument("--include-summaries", action="store_true",
                        help="SQLite only: import lossless-claw summaries as summary nodes")
    parser.add_argument("--apply", action="store_true", help="write (default: dry run)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


class Progress:
    """Session progress on stderr, at most once a second (small imports print nothing)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.printed = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S or (done == total and self.printed):
            print(f"  ... {done}/{total} sessions", file=sys.stderr, flush=True)
            self.last = now
            self.printed = True


def human_summary(report: oc.ImportReport) -> list[str]:
    """The report in a few lines (the same numbers ``--json`` prints)."""
    r = report
    verb = "imported" if r.mode == "apply" else "would import"
    done = r.imported if r.mode == "apply" else r.would_import
    lines = [
        f"{r.mode}: {r.source_kind} -> {r.target_db} "
        f"(import id {r.import_id}, namespace {r.namespace})",
        f"rows: {r.scanned} scanned, {r.eligible} eligible, {r.skipped_empty} empty, "
        f"{r.invalid_rows} invalid, {r.skipped_non_message} non-message, "
        f"{r.skipped_branch} off the live branch",
        f"messages: {r.messages} from eligible rows; {verb} {done}, "
        f"{r.skipped_existing} already imported"
        + (f", {r.deduplicated} already stored" if r.deduplicated else "")
        + (f"; {r.redactions} secrets redacted" if r.redactions else ""),
        f"sessions: {r.sessions['scanned']} scanned, {r.sessions['new']} new, "
        f"{r.sessions['existing']} existing, {r.sessions['without_messages']} without messages",
    ]
    if r.summaries["scanned"]:
        s = r.summaries
        lines.append(f"summaries: {s['scanned']} scanned; {verb} "
                     f"{s['imported'] if r.mode == 'apply' else s['would_import']}, "
                     f"{s['skipped_existing']} already imported, "
                     f"{s['skipped_missing_sources']} missing sources, {s['invalid']} invalid")
    if r.backup_path:
        lines.append(f"backup: {r.backup_path}")
    if r.mode != "apply":
        lines.append("nothing was written; rerun with --apply to import")
    return lines


def print_warnings(report: oc.ImportReport) -> None:
    """The first warnings on stderr, and how many more there are."""
    for text in report.warnings[:WARNINGS_SHOWN]:
        print(f"warning: {text}", file=sys.stderr)
    hidden = report.warning_count - min(len(report.warnings), WARNINGS_SHOWN)
    if hidden > 0:
        print(f"... and {hidden} more warnings (--json lists up to "
              f"{oc.WARNINGS_KEPT})", file=sys.stderr)


def options_from(args: argparse.Namespace) -> oc.ImportOptions:
    """Parsed arguments as importer options."""
    return oc.ImportOptions(
        target_db=args.target_db, source_db=args.source_db, source_jsonl=args.source_jsonl,
        source_jsonl_dirs=args.source_jsonl_dir, agent=args.agent, namespace=args.namespace,
        import_id=args.import_id, session_identity=args.session_identity,
        include_summaries=args.include_summaries, apply=args.apply)


def main(argv: list[str] | None = None) -> int:
    """Run the import; print the report; 0 on success, 2 on any error."""
    args = build_parser().parse_args(argv)
    try:
        report = oc.run_import(options_from(args), progress=Progress())
    except oc.ImportFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # never a traceback: the import is all-or-nothing anyway
        print(f"error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        print("\n".join(human_summary(report)))
        print_warnings(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
