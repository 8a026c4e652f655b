"""A psycopg 3 connection that speaks the store's SQL (the SQLite dialect's subset it uses).

Why an adapter rather than a second copy of every statement: the store, the DAG,
identity views, owners, leases and the other SQL owners keep one statement per
concern, and this module rewrites the few spellings PostgreSQL writes
differently (``?`` placeholders, ``INSERT OR IGNORE/REPLACE``, two-argument
``MAX``, ``last_insert_rowid()``, ``rowid``, case-insensitive ``LIKE``). What has
no common spelling (FTS, PRAGMAs) is not rewritten: its owners branch on the
dialect and ``storage.postgres.search`` / ``schema`` hold the PostgreSQL SQL.

psycopg is imported only when a ``postgresql://`` URL is opened, so the plugin
loads without it; a missing psycopg is a ``DatabaseError`` naming the extra.
Errors surface as the ``sqlite3`` exception classes the callers already
handle (``IntegrityError`` for a constraint, ``OperationalError`` otherwise).
"""

from __future__ import annotations

import functools
import re
from contextlib import contextmanager
import sqlite3
import threading
import urllib.parse
import zlib
from decimal import Decimal
from typing import Any, Iterator, Sequence

# The writer lock: ``BEGIN IMMEDIATE`` on SQLite serializes every writer of a file;
# on PostgreSQL a transaction-scoped advisory lock on this key (per schema) does.
WRITE_LOCK_NAMESPACE = 0x7472_6F76  # "trov"
LOCK_TIMEOUT = "30s"
URL_PREFIXES = ("postgresql://", "postgres://")

# Conflict targets of the tables written with ``INSERT OR REPLACE``.
PRIMARY_KEYS = {
    "session_views": ("session_id", "origin", "slot"),
    "trove_meta": ("key",),
    "prep_summaries": ("session_id", "first_store_id"),
    "prep_condensed": ("session_id", "group_key"),
    "session_owners": ("session_id",),
    "evidence_scan": ("session_id",),
}


def is_url(target: object) -> bool:
    """Whether a database target names a PostgreSQL server rather than a SQLite file."""
    return isinstance(target, str) and target.startswith(URL_PREFIXES)


def display_name(url: str) -> str:
    """``postgresql://user@host:port/dbname`` without the password or any option,
    for status, doctor and error messages (a URL is never printed whole)."""
    match = re.match(r"^(postgres(?:ql)?://)(?:([^:@/]*)(?::[^@/]*)?@)?([^/?]*)(/[^?]*)?", url)
    if not match:
        return "postgresql://(unparsable URL)"
    scheme, user, hosts, path = match.groups()
    return f"{scheme}{user + '@' if user else ''}{hosts}{path or ''}"


class Row(tuple):
    """A result row read like ``sqlite3.Row``: by position, by column name, ``keys()``."""

    def __new__(cls, values: Sequence, names: tuple[str, ...], index: dict[str, int]):
        row = super().__new__(cls, values)
        row._names = names
        row._index = index
        return row

    def __getitem__(self, key):
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """Column names in order (as ``sqlite3.Row.keys``)."""
        return list(self._names)


# PostgreSQL text cannot hold NUL, and a message is stored exactly as received: a NUL
# is stored as ESCAPE + "0" and ESCAPE itself (a private-use character) doubled,
# undone on every read. A text without either character passes untouched.
ESCAPE = "\ue000"


def escape_text(value):
    """A parameter as PostgreSQL can hold it (see ``ESCAPE``)."""
    if type(value) is str and ("\0" in value or ESCAPE in value):
        return value.replace(ESCAPE, ESCAPE + ESCAPE).replace("\0", ESCAPE + "0")
    return value


def _unescape(value):
    if type(value) is str and ESCAPE in value:
        return re.sub(ESCAPE + "(.)", lambda m: "\0" if m.group(1) == "0" else m.group(1),
                      value, flags=re.S)
    return value


def _row_factory(cursor):
    names = tuple(c.name for c in cursor.description or ())
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        index.setdefault(name, i)
    return lambda values: Row([_unescape(v) for v in values], names, index)


class Cursor:
    """The result of one statement, with the ``sqlite3.Cursor`` reads the callers use."""

    def __init__(self, conn: "Connection", cur):
        self._conn = conn
        self._cur = cur
        self.rowcount = cur.rowcount
        self.description = cur.description

    def fetchone(self):
        """The next row, or None (also after a statement that returns no rows)."""
        return self._cur.fetchone() if self.description is not None else None

    def fetchall(self) -> list:
        """Every remaining row ([] after a statement that returns no rows)."""
        return self._cur.fetchall() if self.description is not None else []

    def fetchmany(self, size: int = 100) -> list:
        """Up to ``size`` more rows."""
        return self._cur.fetchmany(size) if self.description is not None else []

    def __iter__(self) -> Iterator:
        return iter(self.fetchall())

    @property
    def lastrowid(self) -> int | None:
        """The id the last INSERT drew from a sequence in this session (``lastval()``)."""
        return self._conn.execute("SELECT lastval()").fetchone()[0]


class Connection:
    """One psycopg connection in autocommit mode; transactions are explicit
    (``BEGIN IMMEDIATE`` becomes ``BEGIN`` plus the writer lock)."""

    def __init__(self, url: str):
        psycopg = _psycopg()
        try:
            self.raw = psycopg.connect(url, autocommit=True, row_factory=_row_factory,
                                       connect_timeout=10)
        except psycopg.Error as exc:
            raise _driver_error(exc, url) from None
        self.url = url
        self._lock = threading.RLock()
        self.raw.adapters.register_loader("numeric", _number_loader(psycopg))
        # Python ints as bigint, as SQLite's integers (never int2 for a small value,
        # which a recursive query's columns or a comparison would then be typed as)
        self.raw.adapters.register_dumper(int, psycopg.types.numeric.Int8Dumper)
        self.raw.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        schema = self.raw.execute("SELECT current_schema()").fetchone()[0] or "public"
        self.schema = schema
        self.write_lock_key = (WRITE_LOCK_NAMESPACE << 32) | zlib.crc32(schema.encode())
        self.server_version = self.raw.info.server_version

    def execute(self, sql: str, params: Sequence | None = None) -> Cursor:
        """Run one statement of the store's SQL (rewritten for PostgreSQL)."""
        head = sql.lstrip()[:16].upper()
        if head.startswith("BEGIN"):
            return self._begin()
        if head.startswith("PRAGMA"):
            raise sqlite3.OperationalError(f"no PRAGMA on PostgreSQL: {sql.strip()[:60]}")
        psycopg = _psycopg()
        with self._lock:
            try:
                bound = ({k: escape_text(v) for k, v in params.items()}
                         if isinstance(params, dict) else tuple(map(escape_text, params or ())))
                cur = self.raw.execute(translate(sql), bound)
            except psycopg.Error as exc:
                raise _driver_error(exc, self.url) from None
            return Cursor(self, cur)

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> Cursor:
        """Run one statement per parameter row, pipelined (one round trip per batch,
        not per row); ``rowcount`` is the total."""
        rows = [tuple(map(escape_text, params)) for params in rows]
        if not rows:
            return _Empty()
        psycopg = _psycopg()
        with self._lock:
            cur = self.raw.cursor()
            try:
                cur.executemany(translate(sql), rows)
            except psycopg.Error as exc:
                raise _driver_error(exc, self.url) from None
            return Cursor(self, cur)

    @contextmanager
    def index_first(self) -> Iterator[None]:
        """Plan the statements of this block without sequential scans. Why: a full-text
        match that stops early (``LIMIT``) looks cheapest as a table scan that tests each
        row's tsvector, and the planner prices that test at one operator call, while it
        reads each row's compressed tsvector out of line: 5-7x slower than the GIN
        bitmap for a common word (57 vs 8 ms for 5,000 matches at 50K rows). Session
        setting, reset after (inside a transaction a rollback undoes it too)."""
        psycopg = _psycopg()
        with self._lock:
            self.raw.execute("SET enable_seqscan = off")
            try:
                yield
            finally:
                # after a failed statement inside a transaction only a rollback is
                # accepted, and the rollback undoes the SET itself
                if self.raw.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
                    self.raw.execute("RESET enable_seqscan")

    def getlimit(self, category: int) -> int:
        """The bound-parameter limit (``sqlite3.Connection.getlimit``'s one use here)."""
        return 65535

    def _begin(self) -> Cursor:
        with self._lock:
            self.raw.execute("BEGIN")
            try:
                self.raw.execute("SELECT pg_advisory_xact_lock(%s)", (self.write_lock_key,))
            except Exception as exc:
                self.raw.execute("ROLLBACK")
                raise sqlite3.OperationalError(f"database is locked: {exc}") from None
        return _Empty()

    def close(self) -> None:
        """Close the server connection."""
        self.raw.close()


class _Empty:
    rowcount = 0
    description = None

    def fetchone(self):
        return None

    def fetchall(self):
        return []

    def __iter__(self):
        return iter(())


@functools.lru_cache(maxsize=2048)
def translate(sql: str) -> str:
    """The PostgreSQL spelling of one statement (cached: the store's statements are few)."""
    for pattern, replacement in _WHOLE_REWRITES:  # spellings that span a string literal
        sql = pattern.sub(replacement, sql)
    pieces = re.split(r"('(?:[^']|'')*')", sql)
    out = []
    for i, piece in enumerate(pieces):
        if i % 2:  # a string literal: only psycopg's % needs escaping
            out.append(piece.replace("%", "%%"))
            continue
        piece = piece.replace("%", "%%").replace("?", "%s")
        for pattern, replacement in _REWRITES:
            piece = pattern.sub(replacement, piece)
        out.append(piece)
    text = "".join(out)
    if re.match(r"\s*INSERT\s+OR\s+IGNORE\b", text, re.I):
        text = re.sub(r"INSERT\s+OR\s+IGNORE", "INSERT", text, count=1, flags=re.I)
        text = text.rstrip().rstrip(";") + " ON CONFLICT DO NOTHING"
    elif re.match(r"\s*INSERT\s+OR\s+REPLACE\b", text, re.I):
        text = _upsert(text)
    return text


_WHOLE_REWRITES = [
    (re.compile(r"printf\('%0(\d+)d\.',\s*([\w.]+|\w+\([^()]*\))\)", re.I),
     r"(lpad(CAST(\2 AS text), \1, '0') || '.')"),
    (re.compile(r"\bchar\(9, 10, 13\)", re.I), "(chr(9) || chr(10) || chr(13))"),
]
_REWRITES = [
    (re.compile(r"\blast_insert_rowid\(\)", re.I), "lastval()"),
    (re.compile(r"\bMAX\(([^(),]+),([^(),]+)\)", re.I), r"GREATEST(\1,\2)"),
    (re.compile(r"\bMIN\(([^(),]+),([^(),]+)\)", re.I), r"LEAST(\1,\2)"),
    (re.compile(r"\bIFNULL\(", re.I), "COALESCE("),
    (re.compile(r"\binstr\(", re.I), "strpos("),
    (re.compile(r"(?<!I)\bLIKE\b", re.I), "ILIKE"),
    (re.compile(r"\browid\b", re.I), "ctid"),
    (re.compile(r"(?<![:\w]):([A-Za-z_]\w*)"), r"%(\1)s"),  # named parameters
]


def _upsert(text: str) -> str:
    match = re.match(r"\s*INSERT\s+OR\s+REPLACE\s+INTO\s+(\w+)\s*\(([^)]*)\)", text, re.I)
    if not match or match.group(1) not in PRIMARY_KEYS:
        raise sqlite3.OperationalError(f"INSERT OR REPLACE without a known key: {text[:80]}")
    table, columns = match.group(1), [c.strip() for c in match.group(2).split(",")]
    key = PRIMARY_KEYS[table]
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key)
    head = re.sub(r"INSERT\s+OR\s+REPLACE", "INSERT", text, count=1, flags=re.I)
    return (head.rstrip().rstrip(";") + f" ON CONFLICT ({', '.join(key)}) "
            + (f"DO UPDATE SET {sets}" if sets else "DO NOTHING"))


def _number_loader(psycopg):
    """``numeric`` results (``sum`` of integers) as int or float, as SQLite returns them."""

    class NumberLoader(psycopg.adapt.Loader):
        def load(self, data: Any):
            value = Decimal(bytes(data).decode())
            return int(value) if value == value.to_integral_value() else float(value)

    return NumberLoader


def _driver_error(exc: Exception, url: str) -> sqlite3.Error:
    """A psycopg error as the ``sqlite3`` class the callers handle (``IntegrityError``
    for a constraint, ``OperationalError`` otherwise), its text without the password
    and its SQLSTATE kept as ``sqlstate`` (None for a connection-level failure).

    Why keep the code: a statement the server refused (a syntax error, an unknown
    column) and a server that cannot be reached both arrive as psycopg errors, and
    ``storage.faults.is_outage`` must tell them apart: one failed operation must not
    take the whole store away from the process."""
    import psycopg
    cls = sqlite3.IntegrityError if isinstance(exc, psycopg.IntegrityError) else (
        sqlite3.OperationalError)
    error = cls(_clean(exc, url))
    error.sqlstate = getattr(exc, "sqlstate", None)
    return error


def _clean(exc: Exception, url: str) -> str:
    """An error's text without the URL's password (psycopg quotes the conninfo rarely,
    but a message must never carry it).

    Replacing the whole URL is not enough: libpq quotes the one piece of a URL it
    cannot read, e.g. ``invalid percent-encoded token: "pa%zzword"`` for a password
    with a stray ``%``. So every spelling of the password (as written, and decoded
    when it decodes) is masked wherever it appears."""
    text = str(exc).strip() or type(exc).__name__
    text = text.replace(url, display_name(url))
    for secret in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _passwords(url: str) -> set[str]:
    """The password of a URL as it may be quoted back: from the user info and from a
    ``password=`` query parameter, raw and percent-decoded (empty ones left out)."""
    found: set[str] = set()
    match = re.match(r"^postgres(?:ql)?://([^@/?#]*)@", url)
    if match and ":" in match.group(1):
        found.add(match.group(1).split(":", 1)[1])
    query = url.partition("?")[2]
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "password":
            found.add(value)
    out = set()
    for secret in found:
        out.add(secret)
        try:
            out.add(urllib.parse.unquote(secret, errors="strict"))
        except UnicodeDecodeError:
            pass
    return {s for s in out if s}


@functools.lru_cache(maxsize=1)
def _psycopg():
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(
            "TROVE_DATABASE_URL names a PostgreSQL server, but psycopg 3 is not installed "
            "in the Python that runs Hermes: pip install 'psycopg[binary]>=3.1' "
            "(see requirements-extras.txt)") from exc
    return psycopg
