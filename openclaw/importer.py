"""Backfill OpenClaw history (lossless-claw SQLite, JSONL transcripts) into a trove database.

``openclaw_sources`` reads the sources into sessions of the OpenAI chat dicts the
engine stores from Hermes; this module writes them through ``Store``/``Dag`` like
live turns. A dry run cannot write (the target is read-only, or an in-memory
stand-in when missing); an applied import is one outer transaction in which every
``Store``/``Dag`` unit of work is a savepoint, so any failure leaves the target as
it was; the target's ``import_ledger`` makes reruns of an import id add nothing.
SQL here is only transaction control on the target. See docs/import.md.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections import defaultdict
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..storage import migrations
from ..storage import backup as backups
from ..storage.backup import backup_dir, timestamped_name
from ..compaction import tokens
from ..dag import Dag, NewNode
from ..storage.database import Database, DatabaseError, open_private, structural_check
from ..storage.postgres import schema as pg_schema
from ..storage.postgres.connection import display_name, is_url
from .sources import (
    KIND_LCM_MESSAGE,
    ImportFailure,
    InvalidRow,
    Source,
    SourceSession,
    open_readonly,
    parse_timestamp,
    read_jsonl_sources,
    read_lcm_database,
)
from ..storage.owners import LOCAL_OWNER, Owners
from ..store import Store, decode_row
from ..config import load_config
from ..ingest import redaction
from ..ingest.redaction import Redactor

SQLITE_NAMESPACE = "openclaw-trove"
JSONL_NAMESPACE = "openclaw-jsonl"
DEFAULT_SUMMARY_MODEL = "lossless-claw"
SESSION_IDENTITIES = ("session_id", "session_key")
WARNINGS_KEPT = 200

# Ledger source kinds of what the import itself keys (the readers key the messages).
KIND_SESSION = "openclaw_session"
KIND_LCM_SUMMARY = "lcm_summary"


class _MissingSources(InvalidRow):
    """A summary's inputs are not imported: it is skipped with a warning."""


# ---------------------------------------------------------------------------- options, report
@dataclass
class ImportOptions:
    """What to import, from where and into which trove database (the CLI's arguments)."""

    target_db: str
    source_db: str | None = None
    source_jsonl: Sequence[str] = ()
    source_jsonl_dirs: Sequence[str] = ()
    agent: str = "main"
    namespace: str | None = None
    import_id: str | None = None
    session_identity: str | None = None  # SQLite only; None means session_id
    include_summaries: bool = False
    apply: bool = False
    busy_timeout: float = 5.0


@dataclass
class ImportReport:
    """Reconciliation of one run; the source-row counters add up:
    ``scanned = eligible + skipped_empty + invalid_rows + skipped_non_message + skipped_branch``.
    ``messages`` is what the eligible rows became (a row with several tool results splits)
    and ``messages = would_import + skipped_existing``; after ``--apply``
    ``would_import = imported + deduplicated``."""

    mode: str
    source_kind: str
    import_id: str
    namespace: str
    target_db: str
    backup_path: str | None = None
    scanned: int = 0
    eligible: int = 0
    skipped_empty: int = 0
    invalid_rows: int = 0
    skipped_non_message: int = 0
    skipped_branch: int = 0
    messages: int = 0
    would_import: int = 0
    imported: int = 0
    skipped_existing: int = 0
    deduplicated: int = 0
    sessions: dict = field(default_factory=lambda: dict.fromkeys(
        ("scanned", "new", "existing", "without_messages"), 0))
    summaries: dict = field(default_factory=lambda: dict.fromkeys(
        ("scanned", "would_import", "imported", "skipped_existing",
         "skipped_missing_sources", "invalid"), 0))
    dropped_parts: dict = field(default_factory=dict)
    redactions: int = 0
    warning_count: int = 0
    warnings: list = field(default_factory=list)

    def warn(self, text: str) -> None:
        """Count a per-row problem; the first ``WARNINGS_KEPT`` are kept verbatim."""
        self.warning_count += 1
        if len(self.warnings) < WARNINGS_KEPT:
            self.warnings.append(text)

    def drop_part(self, kind: Any) -> None:
        """Count a content block or part type that has no place in a chat message."""
        name = str(kind or "unknown")
        self.dropped_parts[name] = self.dropped_parts.get(name, 0) + 1

    def to_dict(self) -> dict:
        """The report as plain JSON-able data (``--json``)."""
        return asdict(self)


# ---------------------------------------------------------------------------- target access
class _ConnectionView:
    """Stands in for ``Database`` so ``Store``/``Dag`` run on a connection the importer controls.

    Writable: each ``Store``/``Dag`` unit of work is a savepoint inside the importer's
    single outer transaction, so the whole import commits or rolls back at once.
    Read-only (dry run): any write attempt raises, so a dry run cannot write.
    """

    def __init__(self, conn: sqlite3.Connection, writable: bool, dialect: str = "sqlite"):
        self.conn = conn
        self.writable = writable
        self.dialect = dialect  # Store/Dag spell full-text search per engine
        self.lock = threading.RLock()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A savepoint in the outer transaction (writable views only)."""
        if not self.writable:
            raise RuntimeError("a dry run must not write to the target")
        self.conn.execute("SAVEPOINT trove_import_unit")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK TO trove_import_unit")
            self.conn.execute("RELEASE trove_import_unit")
            raise
        self.conn.execute("RELEASE trove_import_unit")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, for reads."""
        yield self.conn


@contextmanager
def _one_transaction(db: Database) -> Iterator[_ConnectionView]:
    """Run the whole import in one ``Database.transaction`` (BEGIN IMMEDIATE ... COMMIT)
    on the target, so it commits or rolls back as a whole."""
    with db.transaction() as conn:
        yield _ConnectionView(conn, writable=True, dialect=db.dialect)


def _check_target(conn: sqlite3.Connection, path: Path) -> int:
    """The target's schema version; refuses a newer or structurally broken trove database."""
    version = migrations.schema_version(conn)
    if version > migrations.latest_version():
        raise ImportFailure(f"{path} has trove schema {version}, newer than this importer "
                            f"({migrations.latest_version()}); update hermes-trove")
    missing = structural_check(conn) if version else []
    if missing:
        raise ImportFailure(f"{path} is not a healthy trove database (missing "
                            f"{', '.join(missing)})")
    return version


def backup_database(path: Path, timeout: float) -> str:
    """A timestamped copy of the target made with SQLite's online backup API (a file copy
    could catch a half-written WAL), taken before an import writes anything; it goes to
    ``backups/`` next to the database with every other backup (``storage.backup``)."""
    first = backup_dir(path) / timestamped_name(path, "pre-import")
    first.parent.mkdir(parents=True, exist_ok=True)
    dest = backups.unused_path(first)
    try:
        with closing(open_readonly(path, timeout)) as src, closing(sqlite3.connect(dest)) as dst:
            src.backup(dst)
    except sqlite3.Error as exc:
        dest.unlink(missing_ok=True)
        raise ImportFailure(f"cannot back up {path}: {exc}") from exc
    return str(dest)


# ---------------------------------------------------------------------------- the import
@dataclass
class _Run:
    """What the import steps share: options, the target and the report."""

    options: ImportOptions
    source: Source
    report: ImportReport
    store: Store
    dag: Dag
    writable: bool
    session_targets: dict = field(default_factory=dict)  # source session key -> target id
    redactor: Redactor | None = None                     # TROVE_SENSITIVE_PATTERNS_ENABLED


def _target_session(run: _Run, ledger_key: str, session: SourceSession, known: dict) -> str:
    """The target session id: the one this import used before, else
    ``<namespace>:agent:<agent>:<source session>``, suffixed ``@<import id>`` when another
    import already owns that id (the same data under another import id is a new import)."""
    if ledger_key not in known:
        target = f"{run.report.namespace}:agent:{run.options.agent}:{session.key}"
        if run.store.get_session(target) is not None:
            target = f"{target}@{run.report.import_id}"
        known[ledger_key] = target
    return str(known[ledger_key])


def _import_session(run: _Run, session: SourceSession, target: str, new_session: str | None,
                    imported: dict, count_tokens: Callable[[dict], int] | None) -> None:
    """Store a session's messages not yet imported under this import id (creating the
    session first when ``new_session`` holds its ledger key).

    The whole session is shown to ``Store.ingest`` so already-stored rows line up and
    only new ones are appended, exactly like a transcript the host shows again: rows
    already imported are shown as stored (so they line up whatever the redaction
    setting was then), new ones redacted when the settings say so (``redactor_for``)."""
    report = run.report
    keyed = [(key, message) for unit in session.units
             for key, message in zip(unit.keys(), unit.messages)]
    fresh = [key for key, _ in keyed if key not in imported]
    report.messages += len(keyed)
    report.skipped_existing += len(keyed) - len(fresh)
    report.would_import += len(fresh)
    if run.redactor is not None:  # what the engine stores, so the same row and identity
        keyed = [(key, message if key in imported else _redacted(run, message))
                 for key, message in keyed]
    if not fresh or not run.writable:
        return
    stored = run.store.get_messages(int(imported[key]) for key, _ in keyed
                                    if key in imported and imported[key] is not None)
    keyed = [(key, decode_row(stored[int(imported[key])])
              if key in imported and imported[key] is not None
              and int(imported[key]) in stored else message) for key, message in keyed]
    if new_session:
        run.store.ensure_session(target, conversation_id=session.conversation_id,
                                 source=report.namespace)
        # The operator imports the profile's own history: its local user owns it (a
        # session without an owner row would be nobody's, readable from itself only).
        Owners(run.store.db).record(target, LOCAL_OWNER, platform=report.namespace)
        run.store.record_imported_rows(report.import_id, KIND_SESSION,
                                       [(new_session, "session", target)])
    result = run.store.ingest(target, [message for _, message in keyed],
                              conversation_id=session.conversation_id,
                              source=report.namespace, count_tokens=count_tokens)
    rows = [(key, "message", store_id) for (key, _), store_id in zip(keyed, result.store_ids)
            if key not in imported]
    run.store.record_imported_rows(report.import_id, run.source.message_kind, rows)
    imported.update((key, store_id) for key, _, store_id in rows)
    report.imported += result.inserted
    report.deduplicated += len(rows) - result.inserted


def _redacted(run: _Run, message: dict) -> dict:
    """``message`` with its secrets replaced (counted in the report), as the engine's
    ingest policy replaces them before a live message is stored."""
    redacted, count = run.redactor.redact_message(message)
    run.report.redactions += count
    return redacted


def redactor_for(options: ImportOptions) -> Redactor | None:
    """The secret redaction the target's settings ask for: TROVE_SENSITIVE_PATTERNS_ENABLED
    and TROVE_SENSITIVE_PATTERNS from the environment, else ``$HERMES_HOME/config.yaml``,
    as the engine reads them. Imported history holds the same pasted keys as live turns:
    without this an import stored in clear (rows, full-text index, summaries made of
    them) what the engine redacts."""
    return redaction.configured(load_config(os.environ))


def _import_sessions(run: _Run, progress: Callable[[int, int], None] | None) -> None:
    known = run.store.imported_rows(run.report.import_id, KIND_SESSION)
    imported = run.store.imported_rows(run.report.import_id, run.source.message_kind)
    count_tokens = tokens.get_counter().count_message if run.writable else None
    sessions = run.source.sessions
    for done, session in enumerate(sessions, 1):
        run.report.sessions["scanned"] += 1
        if not session.units:
            run.report.sessions["without_messages"] += 1
        else:
            ledger_key = f"{run.source.identity}:{session.key}"
            new_session = None if ledger_key in known else ledger_key
            run.report.sessions["new" if new_session else "existing"] += 1
            target = run.session_targets[session.key] = _target_session(run, ledger_key,
                                                                        session, known)
            _import_session(run, session, target, new_session, imported, count_tokens)
        if progress:
            progress(done, len(sessions))


def _message_store_ids(run: _Run) -> tuple[set, dict]:
    """Which lossless-claw messages are (or, in a dry run, would be) imported, and their
    store_ids in order (known only after they were written)."""
    ledger = run.store.imported_rows(run.report.import_id, KIND_LCM_MESSAGE)
    ordered: dict = defaultdict(list)
    for key, store_id in sorted(ledger.items(), key=lambda kv: _split_key(kv[0])):
        ordered[_split_key(key)[0]].append(store_id)
    ready = set(ordered) | {unit.message_id for session in run.source.sessions
                            for unit in session.units}
    return ready, ordered


def _split_key(key: str) -> tuple[int, int]:
    head, _, index = key.partition("#")
    return int(head), int(index or 0)


def _summary_children(summary: dict, ready: set, empty: set, depths: dict) -> tuple:
    """``(depth, inputs)`` of a summary: source message ids for a leaf, source summary ids
    for a condensed one. Raises when its text is empty, inputs are missing (empty source
    messages excepted: they have nothing to point at) or inputs have mixed depths."""
    if not isinstance(summary["content"], str) or not summary["content"].strip():
        raise InvalidRow("empty summary text")
    kind = summary["kind"]
    if kind == "leaf" or (kind is None and not summary["parent_ids"]):
        ids = list(dict.fromkeys(summary["message_ids"]))
        missing = [m for m in ids if m not in ready and m not in empty]
        usable = [m for m in ids if m in ready]
        if missing or not usable:
            raise _MissingSources(f"source messages not imported: {missing[:5] or 'none given'}")
        return 0, usable
    if kind not in ("condensed", None):
        raise InvalidRow(f"unknown summary kind {kind!r}")
    parents = list(dict.fromkeys(summary["parent_ids"]))
    missing = [p for p in parents if p not in depths]
    if missing or not parents:
        raise _MissingSources(f"input summaries not imported: {missing[:5] or 'none given'}")
    levels = {depths[p] for p in parents}
    if len(levels) != 1:
        raise InvalidRow(f"input summaries have different depths {sorted(levels)}")
    return levels.pop() + 1, parents


def _write_summary(run: _Run, summary: dict, session_id: str, depth: int, inputs: list,
                   store_ids: dict, node_ids: dict) -> int:
    """Write one summary as a level-0 node with its lineage; return the node id."""
    if depth == 0:
        children = [sid for m in inputs for sid in store_ids[m]]
        source_tokens = sum(r["token_count"] for r in run.store.get_messages(children).values())
        lineage = {"child_store_ids": children}
    else:
        children = [node_ids[p] for p in inputs]
        source_tokens = sum(n["token_count"] for n in run.dag.get_nodes(children).values())
        lineage = {"child_node_ids": children}
    text, count = summary["content"], summary["token_count"]
    count = count if isinstance(count, int) and count > 0 else tokens.estimate_tokens(text)
    node = NewNode(session_id=session_id, depth=depth, text=text, token_count=count,
                   source_token_count=source_tokens, level=0,
                   model=summary["model"] or DEFAULT_SUMMARY_MODEL, **lineage)
    return run.dag.add_node(node, now=parse_timestamp(summary["created_at"]))


def _import_summaries(run: _Run) -> None:
    """Summaries as nodes, in depth order, once their inputs are imported."""
    report, counters = run.report, run.report.summaries
    ready, store_ids = _message_store_ids(run)
    node_ids = run.store.imported_rows(report.import_id, KIND_LCM_SUMMARY)
    nodes = run.dag.get_nodes(node_ids.values())
    depths = {sid: nodes[nid]["depth"] for sid, nid in node_ids.items() if nid in nodes}
    conversation_targets = {conv: run.session_targets[s.key] for s in run.source.sessions
                            if s.key in run.session_targets for conv in s.lcm_conversations}
    for summary in run.source.summaries:
        summary_id = summary["summary_id"]
        counters["scanned"] += 1
        if summary_id in node_ids:
            counters["skipped_existing"] += 1
            continue
        session_id = conversation_targets.get(summary["conversation_id"])
        try:
            depth, inputs = _summary_children(summary, ready, run.source.empty_message_ids,
                                              depths)
            if session_id is None:
                raise _MissingSources("its conversation has no imported messages")
        except InvalidRow as exc:
            missing = isinstance(exc, _MissingSources)
            counters["skipped_missing_sources" if missing else "invalid"] += 1
            report.warn(f"summary {summary_id}: {exc}; skipped")
            continue
        counters["would_import"] += 1
        depths[summary_id] = depth
        if run.writable:
            node_ids[summary_id] = _write_summary(run, summary, session_id, depth, inputs,
                                                  store_ids, node_ids)
            run.store.record_imported_rows(report.import_id, KIND_LCM_SUMMARY,
                                           [(summary_id, "node", node_ids[summary_id])])
            counters["imported"] += 1


def _run_steps(run: _Run, progress: Callable[[int, int], None] | None) -> None:
    _import_sessions(run, progress)
    if run.options.include_summaries:
        _import_summaries(run)


# ---------------------------------------------------------------------------- entry point
def default_import_id(options: ImportOptions) -> str:
    """A stable id for "these sources", so rerunning the same command is idempotent:
    a short hash of the resolved source paths."""
    names = [options.source_db] if options.source_db else \
        list(options.source_jsonl) + list(options.source_jsonl_dirs)
    resolved = sorted(str(Path(n).expanduser().resolve()) for n in names)
    digest = hashlib.sha256("\n".join(resolved).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{'lcm' if options.source_db else 'jsonl'}-{digest[:12]}"


def _validate(options: ImportOptions) -> None:
    jsonl = bool(options.source_jsonl or options.source_jsonl_dirs)
    if bool(options.source_db) == jsonl:
        raise ImportFailure("give either --source-db or --source-jsonl/--source-jsonl-dir")
    if jsonl and (options.session_identity or options.include_summaries):
        raise ImportFailure("--session-identity and --include-summaries apply to --source-db")
    if options.session_identity not in (None, *SESSION_IDENTITIES):
        raise ImportFailure(f"--session-identity must be one of {', '.join(SESSION_IDENTITIES)}")
    for name, value in (("--agent", options.agent), ("--namespace", options.namespace),
                        ("--import-id", options.import_id), ("--target-db", options.target_db)):
        if value is not None and not str(value).strip():
            raise ImportFailure(f"{name} must not be empty")
    if options.source_db and not is_url(options.target_db) and \
            Path(options.source_db).expanduser().resolve() == \
            Path(options.target_db).expanduser().resolve():
        raise ImportFailure("--target-db must not be the source database")


def _read_source(options: ImportOptions, report: ImportReport) -> Source:
    """The run's one kind of source, read in full before the target is touched."""
    if options.source_db:
        return read_lcm_database(options.source_db, report, timeout=options.busy_timeout,
                                 identity=options.session_identity,
                                 include_summaries=options.include_summaries)
    return read_jsonl_sources(options.source_jsonl, options.source_jsonl_dirs, report)


def _dry_run(options: ImportOptions, source: Source, report: ImportReport,
             progress: Callable[[int, int], None] | None) -> None:
    """Plan against the target read-only (an empty in-memory trove when it is new)."""
    if is_url(options.target_db):
        _dry_run_on_server(options, source, report, progress)
        return
    target = Path(options.target_db).expanduser()
    conn = open_readonly(target, options.busy_timeout) if target.exists() else None
    scratch = None
    try:
        if conn is None or _check_target(conn, target) == 0:
            scratch = Database(":memory:")  # a new target: plan against an empty trove
        view = _ConnectionView(scratch.conn if scratch else conn, writable=False)
        _run_steps(_Run(options, source, report, Store(view), Dag(view), False,
                             redactor=redactor_for(options)), progress)
    finally:
        for handle in (scratch, conn):
            if handle is not None:
                handle.close()


def _server(url: str, read_only: bool):
    """A private connection to a PostgreSQL target and its schema version; refuses a
    schema newer than this code or one missing required objects (as ``_check_target``)."""
    try:
        db = open_private(url, read_only=read_only)
    except (DatabaseError, migrations.SchemaTooNewError) as exc:
        raise ImportFailure(str(exc)) from exc
    version = db.schema_version()
    problem = None
    if version > pg_schema.latest_version():
        problem = (f"{db.display} has trove schema {version}, newer than this importer "
                   f"({pg_schema.latest_version()}); update hermes-trove")
    elif version and db.missing_objects:
        problem = (f"{db.display} is not a healthy trove database (missing "
                   f"{', '.join(db.missing_objects)})")
    if problem:
        db.close()
        raise ImportFailure(problem)
    return db, version


def _dry_run_on_server(options: ImportOptions, source: Source, report: ImportReport,
                       progress: Callable[[int, int], None] | None) -> None:
    """The dry run against a PostgreSQL target: opened without migrating, never written
    (an empty schema is planned against an empty in-memory trove, as a new file is)."""
    db, version = _server(options.target_db, read_only=True)
    scratch = None if version else Database(":memory:")
    try:
        view = (_ConnectionView(scratch.conn, writable=False) if scratch else
                _ConnectionView(db.conn, writable=False, dialect=db.dialect))
        _run_steps(_Run(options, source, report, Store(view), Dag(view), False,
                             redactor=redactor_for(options)), progress)
    finally:
        for handle in (scratch, db):
            if handle is not None:
                handle.close()


def _apply_on_server(options: ImportOptions, source: Source, report: ImportReport,
                     progress: Callable[[int, int], None] | None) -> None:
    """The import into a PostgreSQL target: a pg_dump of the trove schema first (into
    ``$HERMES_HOME/backups``, where the operator commands put theirs) when it holds a
    trove already, then one transaction; a failure rolls everything back on the server."""
    probe, version = _server(options.target_db, read_only=True)  # before any migration
    probe.close()
    db, _ = _server(options.target_db, read_only=False)
    try:
        if version:
            home = Path(os.environ.get("HERMES_HOME") or "~/.hermes").expanduser()
            dest = backup_dir(home / "trove.db") / timestamped_name("trove-server", "pre-import")
            try:
                report.backup_path = str(backups.backup_database(
                    options.target_db, backups.unused_path(dest.with_suffix(".pgdump"))))
            except RuntimeError as exc:
                raise ImportFailure(f"cannot back up {db.display}: {exc}") from exc
        try:
            with _one_transaction(db) as view:
                _run_steps(_Run(options, source, report, Store(view), Dag(view), True,
                                     redactor=redactor_for(options)), progress)
        except ImportFailure:
            raise
        except (Exception, KeyboardInterrupt) as exc:
            raise ImportFailure(f"import failed and was rolled back, {db.display} is unchanged "
                                f"({type(exc).__name__}: {exc})") from exc
    finally:
        db.close()


def _apply(options: ImportOptions, source: Source, report: ImportReport,
           progress: Callable[[int, int], None] | None) -> None:
    """Back up the target, then import everything in one transaction."""
    if is_url(options.target_db):
        _apply_on_server(options, source, report, progress)
        return
    target = Path(options.target_db).expanduser()
    existed = target.exists()
    if existed:
        with closing(open_readonly(target, options.busy_timeout)) as conn:
            _check_target(conn, target)
        report.backup_path = backup_database(target, options.busy_timeout)
    try:
        db = Database(str(target))
    except (DatabaseError, migrations.SchemaTooNewError) as exc:
        raise ImportFailure(str(exc)) from exc
    failure = None
    try:
        with _one_transaction(db) as view:
            _run_steps(_Run(options, source, report, Store(view), Dag(view), True,
                                 redactor=redactor_for(options)), progress)
    except ImportFailure as exc:
        failure = exc
    except (Exception, KeyboardInterrupt) as exc:
        failure = ImportFailure(f"import failed and was rolled back, {target} is unchanged "
                                f"({type(exc).__name__}: {exc})")
        failure.__cause__ = exc
    finally:
        db.close()
    if failure is not None:
        if not existed:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{target}{suffix}").unlink(missing_ok=True)
        raise failure


def run_import(options: ImportOptions,
               progress: Callable[[int, int], None] | None = None) -> ImportReport:
    """Import (or, without ``apply``, plan importing) OpenClaw history; return the report.

    Raises ``ImportFailure`` with a user-facing message for anything that stops the
    run (bad arguments, unreadable sources or target, a failure while writing); the
    target is then unchanged. ``progress(done, total)`` is called after each session.
    """
    _validate(options)
    kind = "lossless-claw" if options.source_db else "jsonl"
    report = ImportReport(
        mode="apply" if options.apply else "dry-run", source_kind=kind,
        import_id=options.import_id or default_import_id(options),
        namespace=options.namespace or (SQLITE_NAMESPACE if options.source_db
                                        else JSONL_NAMESPACE),
        target_db=(display_name(options.target_db) if is_url(options.target_db)
                   else str(Path(options.target_db).expanduser())))
    source = _read_source(options, report)
    try:
        (_apply if options.apply else _dry_run)(options, source, report, progress)
    except sqlite3.Error as exc:
        raise ImportFailure(f"cannot use target database {report.target_db}: {exc}") from exc
    return report
