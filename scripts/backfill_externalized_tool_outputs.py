#!/usr/bin/env python3
"""Create payload files for large tool outputs already stored in a trove database.

The database is only read (opened ``mode=ro``); rows are never rewritten. For
each tool row whose text is over ``--threshold`` characters, the exact text is
stored as a ``tool_output`` payload under ``<folder of the db>/payloads``, the
same file (same ref) the ingest guard would create for it.

A dry run by default. ``--apply`` writes the missing payload files (re-running
creates nothing new) and a manifest (store_id, ref, size, created; never any
content). ``--rollback MANIFEST --apply`` deletes the files that manifest
created, except those some stored row still refers to.
Exit codes: 0 done; 2 error (nothing was changed, except by an --apply that
stopped half-way, which its manifest rolls back).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import _bootstrap

_bootstrap.load_package()
from hermes_trove.storage import codec, payloads  # noqa: E402
from hermes_trove.config import load_config  # noqa: E402

DEFAULT_THRESHOLD = 12000
MANIFEST_KIND = "hermes-trove tool-output backfill"
MANIFEST_VERSION = 1
ENTRIES_SHOWN = 10


class BackfillError(Exception):
    """A problem that stops the run before anything is changed."""


def build_parser() -> argparse.ArgumentParser:
    """The command line (kept apart from ``main`` so tests can inspect it)."""
    parser = argparse.ArgumentParser(
        prog="backfill_externalized_tool_outputs.py",
        description="Store large tool outputs of a trove database as payload files "
                    "(dry run unless --apply; the database is never modified).")
    parser.add_argument("--db", metavar="PATH",
                        help="trove database (default: the configured one)")
    parser.add_argument("--threshold", type=int, default=DEFAULT_THRESHOLD, metavar="CHARS",
                        help=f"tool output size from which to externalize "
                             f"(default {DEFAULT_THRESHOLD})")
    parser.add_argument("--manifest", metavar="PATH",
                        help="where --apply writes its manifest "
                             "(default: next to the db, backfill-manifest-<UTC>.json)")
    parser.add_argument("--rollback", metavar="MANIFEST",
                        help="delete the payload files this manifest created")
    parser.add_argument("--apply", action="store_true", help="write/delete (default: dry run)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def open_readonly(db_path: Path) -> sqlite3.Connection:
    """A read-only connection: this script must never change the database."""
    if not db_path.is_file():
        raise BackfillError(f"database not found: {db_path}")
    try:
        conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        conn.execute("SELECT 1 FROM messages LIMIT 1")
    except sqlite3.Error as exc:
        raise BackfillError(f"cannot read {db_path} as a trove database: {exc}") from exc
    return conn


def large_tool_texts(conn: sqlite3.Connection, threshold: int):
    """``(store_id, text)`` for every tool output text the ingest guard would externalize."""
    rows = conn.execute(
        "SELECT store_id, role, content, content_format, tool_calls, tool_call_id, extra"
        " FROM messages WHERE role = 'tool' AND length(content) > ? ORDER BY store_id",
        (max(threshold, payloads.MIN_TOOL_OUTPUT_CHARS),))
    for row in rows:
        message = codec.decode_message(dict(row))
        for text in payloads.tool_output_texts(message, threshold):
            yield row["store_id"], text


def referenced_refs(conn: sqlite3.Connection) -> set[str]:
    """Every payload ref that some stored row mentions in a placeholder."""
    found: set[str] = set()
    rows = conn.execute(
        "SELECT content, tool_calls, extra FROM messages WHERE"
        " instr(content, ?) > 0 OR instr(tool_calls, ?) > 0 OR instr(extra, ?) > 0",
        (payloads.REF_PREFIX,) * 3)
    for row in rows:
        for value in row:
            if value:
                found.update(payloads.refs_in(value))
    return found


def plan(db_path: Path, threshold: int) -> dict:
    """What a backfill would do, without writing anything: the scrubbed report."""
    store = payloads.PayloadStore.beside_database(db_path)
    conn = open_readonly(db_path)
    entries, seen = [], set()
    try:
        for store_id, text in large_tool_texts(conn, threshold):
            data = payloads.encode_text(text)
            ref = payloads.ref_for(data)
            entries.append({"store_id": store_id, "ref": ref, "size": len(data),
                            "created": ref not in seen and not store.exists(ref)})
            seen.add(ref)
    finally:
        conn.close()
    return {"mode": "dry-run", "database": str(db_path), "payload_root": str(store.root),
            "threshold": threshold,
            "effective_threshold": max(threshold, payloads.MIN_TOOL_OUTPUT_CHARS),
            "candidates": len(entries), "would_create": sum(e["created"] for e in entries),
            "bytes": sum(e["size"] for e in entries), "entries": entries}


def store_payloads(db_path: Path, threshold: int, refs: set[str]) -> int:
    """Write the planned payloads (``refs``) that are still missing; return how many were new."""
    store = payloads.PayloadStore.beside_database(db_path)
    conn = open_readonly(db_path)
    created = 0
    try:
        for _store_id, text in large_tool_texts(conn, threshold):
            data = payloads.encode_text(text)
            if payloads.ref_for(data) in refs:
                created += store.put(data, kind=payloads.KIND_TOOL_OUTPUT,
                                     mime=payloads.TOOL_OUTPUT_MIME).created
    finally:
        conn.close()
    return created


def default_manifest_path(db_path: Path) -> Path:
    """``backfill-manifest-<UTC>.json`` next to the db, never an existing file."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path, n = db_path.parent / f"backfill-manifest-{stamp}.json", 1
    while path.exists():
        path, n = db_path.parent / f"backfill-manifest-{stamp}-{n}.json", n + 1
    return path


def write_manifest(path: Path, report: dict) -> None:
    """The run's record (refs, sizes, whether this run creates each), written atomically."""
    if path.exists():
        raise BackfillError(f"manifest {path} already exists; choose another --manifest")
    manifest = {"kind": MANIFEST_KIND, "version": MANIFEST_VERSION,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **{k: report[k] for k in ("database", "payload_root", "threshold", "entries")}}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def load_manifest(path: Path, store: payloads.PayloadStore) -> list[dict]:
    """The entries of a manifest written for this database's payload folder."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackfillError(f"cannot read manifest {path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        raise BackfillError(f"{path} is not a backfill manifest")
    if Path(manifest.get("payload_root", "")).resolve() != store.root.resolve():
        raise BackfillError(f"{path} was written for payloads in {manifest.get('payload_root')}, "
                            f"not {store.root}; pass the matching --db")
    entries = manifest.get("entries")
    if not isinstance(entries, list):
        raise BackfillError(f"{path} has no entry list")
    for entry in entries:
        try:
            payloads.parse_ref(entry.get("ref") if isinstance(entry, dict) else None)
        except payloads.PayloadRefError as exc:
            raise BackfillError(f"{path}: {exc}") from exc
    return entries


def rollback(db_path: Path, manifest_path: Path, apply: bool) -> dict:
    """Delete (with ``apply``) the files the manifest created that no stored row refers to."""
    store = payloads.PayloadStore.beside_database(db_path)
    entries = [e for e in load_manifest(manifest_path, store) if e.get("created") is True]
    conn = open_readonly(db_path)
    try:
        in_use = referenced_refs(conn)
    finally:
        conn.close()
    kept = sorted({e["ref"] for e in entries if e["ref"] in in_use})
    targets = list(dict.fromkeys(e["ref"] for e in entries if e["ref"] not in in_use))
    deleted = missing = 0
    for ref in targets:
        if not apply:
            deleted += store.exists(ref)
        elif store.delete(ref):
            deleted += 1
        else:
            missing += 1
    return {"mode": "rollback" if apply else "rollback dry-run", "database": str(db_path),
            "manifest": str(manifest_path), "created_by_manifest": len(targets) + len(kept),
            ("deleted" if apply else "would_delete"): deleted, "already_missing": missing,
            "kept_referenced": kept}


def print_text(report: dict) -> None:
    """The report in a few lines (the same numbers ``--json`` prints)."""
    for key, value in report.items():
        if key == "entries":
            for entry in value[:ENTRIES_SHOWN]:
                print(f"  store_id {entry['store_id']}: {entry['ref']} "
                      f"{payloads.human_size(entry['size'])}"
                      f"{' (new)' if entry['created'] else ' (exists)'}")
            if len(value) > ENTRIES_SHOWN:
                print(f"  ... and {len(value) - ENTRIES_SHOWN} more (--json lists all)")
        else:
            print(f"{key}: {value}")
    if report["mode"].endswith("dry-run"):
        print("dry run: nothing was written; add --apply to do it")


def run(args: argparse.Namespace) -> dict:
    """One invocation: a plan, or plan + manifest + payload files, or a rollback.

    The manifest is written before any payload file, so a run that stops
    half-way can still be rolled back (files it never wrote count as missing).
    """
    db_path = Path(args.db).expanduser() if args.db else load_config().resolved_database_path
    if args.rollback:
        return rollback(db_path, Path(args.rollback).expanduser(), args.apply)
    if args.threshold < 1:
        raise BackfillError("--threshold must be a positive number of characters")
    manifest = Path(args.manifest).expanduser() if args.manifest else None
    if args.apply and manifest is not None and manifest.exists():
        raise BackfillError(f"manifest {manifest} already exists; choose another --manifest")
    report = plan(db_path, args.threshold)
    if not args.apply:
        return report
    manifest = manifest or default_manifest_path(db_path)
    write_manifest(manifest, report)
    planned = {e["ref"] for e in report["entries"] if e["created"]}
    try:
        created = store_payloads(db_path, args.threshold, planned)
    except OSError as exc:
        raise BackfillError(f"stopped writing payloads ({exc}); what was written is listed "
                            f"in {manifest}: undo with --rollback {manifest} --apply") from exc
    report.update(mode="apply", manifest=str(manifest), created=created)
    del report["would_create"]
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        report = run(args)
    except (BackfillError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
