"""``trove.py migrate --to TARGET [--apply]``: copy a trove database to the other engine.

SQLite file to a PostgreSQL server (a host joining a fleet), or back (a server's
memory taken offline). Every table is copied row by row with its keys (store_id,
node_id ... stay what they were, so exact refs and lineage hold) in dependency
order, a page at a time, ordered by the table's key and resumed after the last
key copied (keyset paging: no OFFSET scan at a million rows). Rows whose key the
target already has are left alone, so a second run copies nothing (idempotent)
and an interrupted one resumes. After a copy the counts are compared table by
table and a difference fails the run; a PostgreSQL target's identity sequences are
moved past the copied ids.

Without ``--apply`` nothing is written: the report is what each table holds on both
sides, read on read-only connections (no file is created, converted or migrated, no
server schema created or migrated; a target not there yet holds nothing). A SQLite
side must be a trove database (``trove_file_problem``): a typo or a foreign file is
an error that names it.

Stop the Hermes processes that write the source first: rows written during the
copy may be missed (a rerun picks them up).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..storage import payloads
from ..storage.database import Connected, get_database, open_read_only, trove_file_problem
from ..storage.postgres import schema as pg_schema
from ..storage.postgres.connection import display_name, is_url
from .actions import OperatorError

PAGE_ROWS = 2000

# Parents before children (foreign keys), each with the key that orders its pages.
TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("trove_meta", ("key",)),
    ("sessions", ("session_id",)),
    ("messages", ("store_id",)),
    ("nodes", ("node_id",)),
    ("node_edges", ("parent_id", "ordinal")),
    ("session_carry", ("session_id", "node_id")),
    ("import_ledger", ("import_id", "source_kind", "source_key")),
    ("session_owners", ("session_id",)),
    ("prep_summaries", ("session_id", "first_store_id")),
    ("prep_condensed", ("session_id", "group_key")),
    ("evidence_assertions", ("assertion_id",)),
    ("evidence_scan", ("session_id",)),
    ("evidence_views", ("view_id",)),
    ("rollups", ("rollup_id",)),
    ("rollup_sources", ("rollup_id", "ordinal")),
    ("rollup_sessions", ("rollup_id", "session_id")),
    ("embedding_spaces", ("space_id",)),
    ("embedding_vectors", ("space_id", "kind", "ref_id", "chunk")),
    ("session_views", ("session_id", "origin", "slot")),
)
# Columns one engine computes itself (PostgreSQL's tsvector): never copied.
COMPUTED = {"fts"}
# SQLite columns without a type (an import's target: a store_id or a session id) that
# the server keeps as text.
TEXT_ON_SERVER = {("import_ledger", "target_id")}
# Tables whose integer key a PostgreSQL identity sequence hands out.
SEQUENCES = {"messages": "store_id", "nodes": "node_id", "evidence_assertions": "assertion_id",
             "evidence_views": "view_id", "rollups": "rollup_id", "embedding_spaces": "space_id"}
# Tables whose keys each database hands out itself, with the columns that say which
# row a key names: the same key in two databases is the same row only when they agree.
IDENTITY = {"messages": ("store_id", ("session_id", "content_hash", "ordinal")),
            "nodes": ("node_id", ("session_id", "depth", "text")),
            "embedding_spaces": ("space_id", ("provider", "model", "revision", "dim"))}


def migrate(source: str, target: str, *, apply: bool, progress=None) -> dict:
    """Copy every table of ``source`` into ``target`` (both a SQLite path or a
    PostgreSQL URL); a dry run without ``apply``. Returns the per-table report."""
    src = _open(source, apply=apply, create=False)
    dst = _open(target, apply=apply, create=True)   # None: a dry run's target not there yet
    if dst is not None and src.path == dst.path:
        raise OperatorError("source and target are the same database")
    if dst is not None:
        _refuse_a_foreign_target(src, dst)
    started = time.perf_counter()
    tables = []
    for table, key in TABLES:
        columns = _columns(src, table)
        before = _count(dst, table) if dst is not None else 0
        entry: dict[str, Any] = {"table": table, "source_rows": _count(src, table),
                                 "target_rows_before": before}
        if apply:
            entry["copied"] = _copy(src, dst, table, key, columns, progress)
            entry["target_rows"] = _count(dst, table)
            entry["verified"] = entry["target_rows"] >= entry["source_rows"] and (
                entry["target_rows"] - before == entry["copied"])
        tables.append(entry)
    if apply and dst.dialect == "postgresql":
        _advance_sequences(dst)
    moved = _copy_payloads(payloads.store_for(source, source, src),
                           payloads.store_for(target, target, dst) if dst is not None else None,
                           apply=apply)
    shown = dst.display if dst is not None else display_name(target) if is_url(target) else target
    report = {"mode": "apply" if apply else "dry_run", "source": src.display,
              "target": shown, "tables": tables, "payloads": moved,
              "seconds": round(time.perf_counter() - started, 2)}
    if apply:
        report["verified"] = all(t["verified"] for t in tables) and moved["verified"]
        report["short"] = {t["table"]: t["source_rows"] - t["target_rows"]
                           for t in tables if not t["verified"]}
    return report


def _open(where: str, *, apply: bool, create: bool) -> Connected | None:
    """One side of the copy (``create``: the target). ``apply`` opens it for writing
    (a new target file is created, an older schema migrated); a dry run read-only, and
    a target that does not exist yet (no file, or a server without a trove schema) is
    None. A SQLite side must be a trove database: a typo or a foreign file is named,
    never created or converted."""
    if is_url(where):
        return get_database(where) if apply else _server_read_only(where, create)
    if create and not Path(where).expanduser().exists():
        return get_database(where) if apply else None
    problem = trove_file_problem(where, allow_older=apply)
    if problem is not None:
        raise OperatorError(problem)
    return get_database(where) if apply else open_read_only(where)


def _server_read_only(url: str, create: bool) -> Connected | None:
    """A server for a dry run, on a read-only connection (the shared one would create
    or migrate its schema); None for a target without a trove schema yet."""
    db = open_read_only(url)
    version, latest = db.schema_version(), pg_schema.latest_version()
    if version == 0 and create:
        return None
    if version != latest:
        why = ("holds no trove database" if version == 0 else
               f"has trove schema version {version}, newer than this hermes-trove (up to "
               f"{latest}): update the plugin" if version > latest else
               f"has trove schema version {version}; this hermes-trove needs {latest}: a "
               "dry run does not migrate it (--apply does)")
        raise OperatorError(f"{db.display} {why}")
    return db


def _refuse_a_foreign_target(src, dst) -> None:
    """Refuse, before anything is written, a target that holds other rows under the
    source's keys (another host's database: store_id 1 there is another message).

    Why: a row whose key the target has is skipped, which is how an interrupted copy
    resumes; into a foreign target that silently dropped the source's rows under the
    report "verified", and attached what was copied (vectors of a space id the target
    uses for another model, nodes and vectors by ref id) to the target's own rows.
    The lowest and highest key of each side are compared where both sides hold them:
    two databases never agree there by chance, a copy of this source always does."""
    for table, (key, columns) in IDENTITY.items():
        names = ", ".join(columns)
        probes: set = set()
        for db in (src, dst):
            with db.reading() as conn:
                probes.update(conn.execute(f"SELECT MIN({key}), MAX({key}) FROM {table}")
                              .fetchone())
        for probe in sorted(p for p in probes if p is not None):
            rows = []
            for db in (src, dst):
                with db.reading() as conn:
                    rows.append(conn.execute(f"SELECT {names} FROM {table} WHERE {key} = ?",
                                             (probe,)).fetchone())
            if None not in rows and tuple(rows[0]) != tuple(rows[1]):
                raise OperatorError(
                    f"{dst.display} already holds other rows under this source's keys "
                    f"({table} {key} {probe} is another row there): migrate copies into "
                    "an empty target or resumes a copy of this same source")


def _columns(db, table: str) -> list[str]:
    with db.reading() as conn:
        cur = conn.execute(f"SELECT * FROM {table} LIMIT 0")
        return [d[0] for d in cur.description if d[0] not in COMPUTED]


def _count(db, table: str) -> int:
    with db.reading() as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _copy(src, dst, table: str, key: tuple[str, ...], columns: list[str], progress) -> int:
    """Copy one table page by page in key order; rows the target has are skipped."""
    names = ", ".join(f'"{c}"' for c in columns)
    order = ", ".join(f'"{k}"' for k in key)
    after = f"({order}) > ({', '.join('?' * len(key))})"
    insert = (f"INSERT OR IGNORE INTO {table}({names}) VALUES"
              f" ({', '.join('?' * len(columns))})")
    positions = [columns.index(k) for k in key]
    as_text = [i for i, c in enumerate(columns) if (table, c) in TEXT_ON_SERVER]
    copied, last = 0, None
    while True:
        where = f" WHERE {after}" if last is not None else ""
        with src.reading() as conn:
            rows = [tuple(r) for r in conn.execute(
                f"SELECT {names} FROM {table}{where} ORDER BY {order} LIMIT ?",
                [*(last or ()), PAGE_ROWS])]
        if not rows:
            return copied
        if as_text and dst.dialect == "postgresql":
            rows = [tuple(str(v) if i in as_text and v is not None else v
                          for i, v in enumerate(r)) for r in rows]
        with dst.transaction() as conn:
            copied += max(0, conn.executemany(insert, rows).rowcount)
        last = tuple(rows[-1][i] for i in positions)
        if progress is not None:
            progress(table, copied)


def _copy_payloads(source, target, *, apply: bool) -> dict:
    """The externalized payloads the rows' placeholders name go along: files beside a
    SQLite file, rows on a server (each is read back whole and hash-checked first).
    ``target`` is None in a dry run to a target that does not exist yet."""
    refs = list(source.refs())
    missing = [ref for ref in refs if target is None or not target.exists(ref)]
    moved = {"source": len(refs), "target_before": len(refs) - len(missing)}
    if not apply:
        return moved
    for ref in missing:
        meta = source.describe(ref)
        target.put(source.get(ref), kind=meta["kind"], mime=meta.get("mime"))
    moved["copied"] = len(missing)
    moved["verified"] = all(target.exists(ref) for ref in refs)
    return moved


def _advance_sequences(db) -> None:
    """Move each identity sequence past the highest copied id (the next insert must
    never collide with a copied row)."""
    with db.transaction() as conn:
        for table, column in SEQUENCES.items():
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'),"
                         f" GREATEST((SELECT COALESCE(max({column}), 0) FROM {table}), 1))")
