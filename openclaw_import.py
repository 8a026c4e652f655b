"""Backfill OpenClaw history (lossless-claw SQLite, JSONL transcripts) into a trove database.

Source rows become the OpenAI chat dicts the engine stores from Hermes and are
written through ``Store``/``Dag`` like live turns. A dry run cannot write (the
target is read-only, or an in-memory stand-in when missing); an applied import
is one outer transaction in which every ``Store``/``Dag`` unit of work is a
savepoint, so any failure leaves the target as it was; the target's
``import_ledger`` makes reruns of an import id add nothing. SQL here reads only
the source (plus transaction control on the target). See docs/import.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
import time
from collections import defaultdict
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import migrations, tokens
from .dag import Dag, NewNode
from .database import Database, DatabaseError, structural_check
from .store import Store

SQLITE_NAMESPACE = "openclaw-trove"
JSONL_NAMESPACE = "openclaw-jsonl"
DEFAULT_SUMMARY_MODEL = "lossless-claw"
SESSION_IDENTITIES = ("session_id", "session_key")
# OpenClaw role -> stored role (lossless-claw already stores ``toolResult`` as ``tool``).
ROLES = {"system": "system", "user": "user", "assistant": "assistant",
         "tool": "tool", "toolResult": "tool"}
WARNINGS_KEPT = 200
SQLITE_MAGIC = b"SQLite format 3\x00"
MS_THRESHOLD = 1e11  # larger epoch numbers are milliseconds (1e11 s is the year 5138)

# Ledger source kinds: one namespace of source keys each.
KIND_SESSION = "openclaw_session"
KIND_LCM_MESSAGE = "lcm_message"
KIND_LCM_SUMMARY = "lcm_summary"
KIND_JSONL_MESSAGE = "jsonl_message"

# Columns read from each lossless-claw table; absent ones (older schemas) read as NULL.
LCM_COLUMNS = {
    "conversations": ("conversation_id", "session_id", "session_key", "created_at"),
    "messages": ("message_id", "conversation_id", "seq", "role", "content", "created_at"),
    "message_parts": ("message_id", "part_type", "ordinal", "text_content", "tool_call_id",
                      "tool_name", "tool_input", "tool_output", "tool_error", "metadata"),
    "summaries": ("summary_id", "conversation_id", "kind", "depth", "content", "token_count",
                  "created_at", "model"),
    "summary_messages": ("summary_id", "message_id", "ordinal"),
    "summary_parents": ("summary_id", "parent_summary_id", "ordinal"),
}
LCM_REQUIRED = {
    "conversations": ("conversation_id", "session_id"),
    "messages": ("message_id", "conversation_id", "role", "content"),
}


class ImportFailure(RuntimeError):
    """The import could not run or was rolled back; the message is meant for the user."""


class _InvalidRow(ValueError):
    """One source row cannot be understood: it is skipped with a warning."""


class _MissingSources(_InvalidRow):
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


# ---------------------------------------------------------------------------- source model
@dataclass
class _Unit:
    """One source row and the chat messages it became (usually one)."""

    source_key: str
    messages: list
    message_id: int | None = None  # lossless-claw message_id, for summary lineage

    def keys(self) -> list[str]:
        """Ledger keys of the messages: the row key, then ``key#1``, ``key#2`` for splits."""
        return [self.source_key if i == 0 else f"{self.source_key}#{i}"
                for i in range(len(self.messages))]


@dataclass
class _Session:
    """One source session (the unit that becomes one target session)."""

    key: str
    conversation_id: str | None
    units: list = field(default_factory=list)
    lcm_conversations: list = field(default_factory=list)


@dataclass
class _Source:
    """Everything read from the sources of one run."""

    message_kind: str
    identity: str
    sessions: list = field(default_factory=list)
    summaries: list = field(default_factory=list)
    empty_message_ids: set = field(default_factory=set)


# ---------------------------------------------------------------------------- conversion
def parse_timestamp(value: Any) -> float | None:
    """Epoch seconds (UTC) of any timestamp OpenClaw writes, so every source orders alike:
    epoch seconds or milliseconds (numbers or digit strings), ``YYYY-MM-DD HH:MM:SS``
    (UTC without a zone marker) and ISO 8601 with ``Z`` or an offset. None when unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            try:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                return None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            return round(moment.timestamp(), 3)
    else:
        return None
    if not math.isfinite(number):
        return None
    return round(number / 1000.0 if abs(number) >= MS_THRESHOLD else number, 3)


def image_url_of(block: Any) -> str | None:
    """The URL or ``data:`` URI of an image block in any shape OpenClaw keeps (pi-ai
    ``{type: image, data, mimeType}``, Anthropic ``source``, OpenAI ``image_url``, plain
    ``url``), so images survive as ``image_url`` parts; None for anything else."""
    if not isinstance(block, dict):
        return None
    direct = block.get("image_url")
    direct = direct.get("url") if isinstance(direct, dict) else direct
    if isinstance(direct, str) and direct:
        return direct
    source = block["source"] if isinstance(block.get("source"), dict) else block
    mime = next((source[k] for k in ("mimeType", "media_type", "mediaType", "mime")
                 if isinstance(source.get(k), str)), "")
    if block.get("type") not in ("image", "input_image") and not mime.startswith("image/"):
        return None
    if isinstance(source.get("url"), str) and source["url"]:
        return source["url"]
    data = source.get("data")
    if isinstance(data, str) and data:
        return data if data.startswith("data:") else f"data:{mime or 'image/png'};base64,{data}"
    return None


def arguments_json(value: Any) -> str:
    """Tool-call arguments as the JSON string OpenAI tool calls carry: objects are dumped,
    JSON text is kept verbatim, other text is wrapped as ``{"input": text}``."""
    if value is None or value == "":
        return "{}"
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except ValueError:
            return json.dumps({"input": value}, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False)


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict:
    """One assistant tool call in the OpenAI shape Hermes stores."""
    return {"id": "" if call_id is None else str(call_id), "type": "function",
            "function": {"name": "" if name is None else str(name),
                         "arguments": arguments_json(arguments)}}


@dataclass
class _Blocks:
    """A message's content sorted by what it becomes in a chat dict."""

    parts: list = field(default_factory=list)  # ("text", str) or ("image", url), in order
    reasoning: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    results: list = field(default_factory=list)  # (tool_call_id, name, text) of tool parts

    def text(self, value: Any) -> None:
        """Add a text piece (empty text adds nothing)."""
        if isinstance(value, str) and value:
            self.parts.append(("text", value))


def _content(parts: list) -> str | list:
    """Text-only content is one string (pieces joined by newlines); content with an image
    is the list of ``text``/``image_url`` parts in their original order."""
    if not any(kind == "image" for kind, _ in parts):
        return "\n".join(value for _, value in parts)
    return [{"type": "text", "text": value} if kind == "text"
            else {"type": "image_url", "image_url": {"url": value}} for kind, value in parts]


def _stamped(message: dict, timestamp: float | None) -> dict:
    if timestamp is not None:
        message["timestamp"] = timestamp
    return message


def _chat_message(role: str, blocks: _Blocks, timestamp: float | None) -> dict | None:
    """A system/user/assistant message, or None when it carries nothing at all."""
    if not blocks.parts and not blocks.calls and not blocks.reasoning:
        return None
    message: dict = {"role": role, "content": _content(blocks.parts)}
    if blocks.calls:
        message["tool_calls"] = blocks.calls
    if blocks.reasoning:
        message["reasoning"] = "\n".join(blocks.reasoning)
    return _stamped(message, timestamp)


def _tool_message(call_id: Any, name: Any, parts: list, timestamp: float | None) -> dict | None:
    """A tool result, or None when it has neither content nor a call to answer."""
    if not parts and not call_id:
        return None
    message: dict = {"role": "tool", "content": _content(parts)}
    if call_id:
        message["tool_call_id"] = str(call_id)
    if name:
        message["name"] = str(name)
    return _stamped(message, timestamp)


def _role(value: Any) -> str:
    role = ROLES.get(value) if isinstance(value, str) else None
    if role is None:
        raise _InvalidRow(f"unknown role {value!r}")
    return role


# ---------------------------------------------------------------------------- JSONL source
def _jsonl_blocks(content: Any, report: ImportReport) -> _Blocks:
    """Sort a JSONL ``content`` (a string or a list of blocks) into a ``_Blocks``."""
    blocks = _Blocks()
    if content is None or isinstance(content, str):
        blocks.text(content)
        return blocks
    if not isinstance(content, list):
        raise _InvalidRow("content is neither text nor a list of blocks")
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        url = image_url_of(block)
        if isinstance(block, str):
            blocks.text(block)
        elif kind == "text":
            blocks.text(block.get("text"))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            blocks.reasoning.append(block["thinking"])
        elif kind == "toolCall":
            blocks.calls.append(tool_call(block.get("id"), block.get("name"),
                                          block.get("arguments")))
        elif url:
            blocks.parts.append(("image", url))
        else:
            report.drop_part(kind)
    return blocks


def _jsonl_messages(entry: dict, report: ImportReport) -> list:
    """The chat message of one JSONL ``message`` entry (``toolResult`` becomes ``tool``)."""
    message = entry.get("message")
    if not isinstance(message, dict):
        raise _InvalidRow("message entry without a message object")
    role = _role(message.get("role"))
    stamp = parse_timestamp(message.get("timestamp"))
    stamp = parse_timestamp(entry.get("timestamp")) if stamp is None else stamp
    blocks = _jsonl_blocks(message.get("content"), report)
    if role == "tool":
        built = _tool_message(message.get("toolCallId", message.get("tool_call_id")),
                              message.get("toolName", message.get("name")), blocks.parts, stamp)
    else:
        built = _chat_message(role, blocks, stamp)
    return [built] if built else []


def _add_unit(report: ImportReport, session: _Session, key: str, where: str,
              convert: Callable[[], list], message_id: int | None = None) -> bool:
    """Convert one source row and add it to its session, counting what happened to it.
    Returns False when the row was empty (skipped, nothing to import)."""
    try:
        messages = convert()
    except _InvalidRow as exc:
        report.invalid_rows += 1
        report.warn(f"{where}: {exc}; row skipped")
        return True
    if not messages:
        report.skipped_empty += 1
        return False
    report.eligible += 1
    session.units.append(_Unit(key, messages, message_id))
    return True


def _session_keys(folder: Path, cache: dict, report: ImportReport) -> dict:
    """``{sessionId: sessionKey}`` from the ``sessions.json`` next to transcripts, if any."""
    if folder in cache:
        return cache[folder]
    keys: dict = {}
    index = folder / "sessions.json"
    if index.is_file():
        try:
            data = json.loads(index.read_bytes())
        except (OSError, ValueError) as exc:
            report.warn(f"{index}: unreadable ({exc}); session keys not recovered")
            data = {}
        for session_key, entry in (data.items() if isinstance(data, dict) else ()):
            session_id = entry.get("sessionId") if isinstance(entry, dict) else None
            if isinstance(session_id, str) and session_id:
                keys[session_id] = session_key
    cache[folder] = keys
    return keys


def _parse_jsonl(path: Path, report: ImportReport) -> tuple[dict | None, list]:
    """The header and the ``(line_no, entry)`` list of a transcript; bad lines are counted."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ImportFailure(f"cannot read {path}: {exc}") from exc
    header, entries = None, []
    for line_no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and entry.get("type") == "session" and header is None \
                and not entries:
            header = entry
            continue
        report.scanned += 1
        if not isinstance(entry, dict):
            report.invalid_rows += 1
            report.warn(f"{path}:{line_no}: not a JSON object (truncated or corrupt line); "
                        f"skipped")
            continue
        entries.append((line_no, entry))
    return header, entries


def _live_branch(entries: list, linear: bool, where: str, report: ImportReport) -> list:
    """The live conversation: the path from the last entry back to the root, in order.
    Linear files (version 1, or lines without ids) are the whole file in file order."""
    if linear or not entries:
        return entries
    by_id = {entry["id"]: (line_no, entry) for line_no, entry in entries}
    path, seen = [], set()
    node = entries[-1]
    while node is not None and node[1]["id"] not in seen:
        seen.add(node[1]["id"])
        path.append(node)
        parent = node[1].get("parentId")
        node = by_id.get(parent) if parent is not None else None
        if parent is not None and node is None:
            report.warn(f"{where}: entry {path[-1][1]['id']} points to missing parent "
                        f"{parent!r}; the live branch starts there")
    return path[::-1]


def _read_jsonl_file(path: Path, keys: dict, report: ImportReport) -> _Session:
    """One transcript file as one source session (its live branch only)."""
    header, entries = _parse_jsonl(path, report)
    header = header or {}
    session_id = header.get("id") if isinstance(header.get("id"), str) and header.get("id") \
        else path.name.split(".jsonl")[0]
    version = header.get("version")
    linear = (isinstance(version, int) and version < 2) or not all(
        isinstance(entry.get("id"), str) for _, entry in entries)
    session = _Session(session_id, keys.get(session_id))
    branch = _live_branch(entries, linear, str(path), report)
    on_branch = {line_no for line_no, _ in branch}
    for line_no, entry in entries:
        if entry.get("type") != "message":
            report.skipped_non_message += 1
        elif line_no not in on_branch:
            report.skipped_branch += 1
    for line_no, entry in branch:
        if entry.get("type") == "message":
            key = f"{session_id}/line{line_no}" if linear else f"{session_id}/{entry['id']}"
            _add_unit(report, session, key, f"{path}:{line_no}",
                      lambda entry=entry: _jsonl_messages(entry, report))
    return session


def _jsonl_files(options: ImportOptions) -> list[Path]:
    """Every transcript to read: the named files, then ``*.jsonl`` below each directory."""
    files = []
    for name in options.source_jsonl:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ImportFailure(f"JSONL source {name} is not a file")
        files.append(path)
    for name in options.source_jsonl_dirs:
        folder = Path(name).expanduser()
        if not folder.is_dir():
            raise ImportFailure(f"JSONL source directory {name} is not a directory")
        files += sorted(p for p in folder.rglob("*.jsonl") if p.is_file())
    unique = {path.resolve(): path for path in files}
    return list(unique.values())


def read_jsonl_sources(options: ImportOptions, report: ImportReport) -> _Source:
    """Read every JSONL transcript of the run into source sessions."""
    source = _Source(KIND_JSONL_MESSAGE, "jsonl")
    files = _jsonl_files(options)
    if not files:
        report.warn("no *.jsonl transcripts found")
    cache: dict = {}
    for path in files:
        keys = _session_keys(path.parent, cache, report)
        source.sessions.append(_read_jsonl_file(path, keys, report))
    return source


# ---------------------------------------------------------------------------- lossless-claw source
def open_readonly(path: str | Path, timeout: float) -> sqlite3.Connection:
    """Open a SQLite file read-only without creating anything next to it.

    A WAL-mode file with no ``-wal`` beside it (closed cleanly, nobody using it) is
    opened ``immutable`` because a plain read-only open would leave ``-wal``/``-shm``
    files behind; otherwise ``mode=ro`` reads it with normal locking.
    """
    file = Path(path).expanduser()
    try:
        with open(file, "rb") as handle:
            header = handle.read(100)
    except OSError as exc:
        raise ImportFailure(f"cannot read {file}: {exc}") from exc
    if header and not header.startswith(SQLITE_MAGIC):
        raise ImportFailure(f"{file} is not a SQLite database")
    wal_mode = len(header) > 18 and header[18] == 2
    quiet_wal = wal_mode and not Path(f"{file}-wal").exists()
    uri = file.resolve().as_uri() + ("?mode=ro&immutable=1" if quiet_wal else "?mode=ro")
    conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def _table_columns(conn: sqlite3.Connection) -> dict[str, set]:
    return {table: {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
            for table in LCM_COLUMNS}


def _select(conn, columns: dict, table: str, tail: str = "", params: Sequence = ()) -> list:
    """Rows of ``table`` with every column of ``LCM_COLUMNS`` (absent ones as NULL)."""
    fields = ", ".join(c if c in columns[table] else f"NULL AS {c}" for c in LCM_COLUMNS[table])
    return conn.execute(f"SELECT {fields} FROM {table} {tail}", params).fetchall()


def _json_object(text: Any) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


def _lcm_blocks(row, parts: list, role: str, report: ImportReport) -> _Blocks:
    """Sort a lossless-claw message and its parts into a ``_Blocks``. Text parts only fill
    an empty ``content``; tool parts are calls on assistant turns, results on tool turns."""
    blocks = _Blocks()
    content = row["content"] if isinstance(row["content"], str) else ""
    blocks.text(content)
    for part in parts:
        kind, meta, text = part["part_type"], _json_object(part["metadata"]), part["text_content"]
        url = image_url_of(meta) if kind == "file" else None
        if kind == "text" and not content:
            blocks.text(text)
        elif kind == "text":
            continue  # already in ``content``
        elif kind == "reasoning" and isinstance(text, str) and text:
            blocks.reasoning.append(text)
        elif kind == "tool" and role == "assistant":
            arguments = part["tool_input"]
            if arguments is None:
                arguments = meta.get("arguments", meta.get("input"))
            blocks.calls.append(tool_call(part["tool_call_id"] or meta.get("id"),
                                          part["tool_name"] or meta.get("name"), arguments))
        elif kind == "tool" and role == "tool":
            output = next((v for v in (part["tool_output"], part["tool_error"], text)
                           if isinstance(v, str)), "")
            blocks.results.append((part["tool_call_id"], part["tool_name"], output))
        elif url:
            blocks.parts.append(("image", url))
        else:
            report.drop_part(kind)
    return blocks


def _lcm_messages(row, parts: list, report: ImportReport) -> list:
    """The chat messages of one lossless-claw message row (see docs/import.md)."""
    role = _role(row["role"])
    stamp = parse_timestamp(row["created_at"])
    blocks = _lcm_blocks(row, parts, role, report)
    if role != "tool":
        built = _chat_message(role, blocks, stamp)
        return [built] if built else []
    results = blocks.results
    if not row["content"] and len(results) > 1:  # several results: one tool message each
        return [_tool_message(call_id, name, [("text", text)], stamp)
                for call_id, name, text in results]
    call_id, name, text = results[0] if results else (None, None, None)
    pieces = blocks.parts if row["content"] or text is None else [("text", text)] + blocks.parts
    built = _tool_message(call_id, name, pieces, stamp)
    return [built] if built else []


def _parts_by_message(conn, columns: dict, conversation_id: Any) -> dict:
    if not columns["message_parts"]:
        return {}
    grouped: dict = defaultdict(list)
    for part in _select(conn, columns, "message_parts",
                        "WHERE message_id IN (SELECT message_id FROM messages"
                        " WHERE conversation_id = ?) ORDER BY message_id, ordinal",
                        (conversation_id,)):
        grouped[part["message_id"]].append(part)
    return grouped


def _read_conversation(conn, columns: dict, conversation_id: Any, session: _Session,
                       source: _Source, report: ImportReport) -> None:
    parts = _parts_by_message(conn, columns, conversation_id)
    for row in _select(conn, columns, "messages",
                       "WHERE conversation_id = ? ORDER BY seq, message_id", (conversation_id,)):
        message_id = row["message_id"]
        report.scanned += 1
        kept = _add_unit(report, session, str(message_id), f"message {message_id}",
                         lambda row=row: _lcm_messages(row, parts.get(message_id, []), report),
                         message_id)
        if not kept:
            source.empty_message_ids.add(message_id)


def _read_summaries(conn, columns: dict, report: ImportReport) -> list:
    """Summaries in depth order with their inputs (leaf -> messages, condensed -> summaries)."""
    if not columns["summaries"]:
        report.warn("the source has no summaries table; --include-summaries imports nothing")
        return []
    links: dict = {"summary_messages": defaultdict(list), "summary_parents": defaultdict(list)}
    for table, grouped in links.items():
        if columns[table]:
            for row in _select(conn, columns, table, "ORDER BY summary_id, ordinal"):
                grouped[row["summary_id"]].append(row[LCM_COLUMNS[table][1]])
    return [{**dict(row), "message_ids": links["summary_messages"].get(row["summary_id"], []),
             "parent_ids": links["summary_parents"].get(row["summary_id"], [])}
            for row in _select(conn, columns, "summaries",
                               "ORDER BY depth, created_at, summary_id")]


def read_lcm_database(options: ImportOptions, report: ImportReport) -> _Source:
    """Read a lossless-claw database (any schema generation) into source sessions."""
    identity = options.session_identity or "session_id"
    source = _Source(KIND_LCM_MESSAGE, identity)
    path = Path(options.source_db).expanduser()
    if not path.is_file():
        raise ImportFailure(f"source database {path} does not exist")
    try:
        with closing(open_readonly(path, options.busy_timeout)) as conn:
            columns = _table_columns(conn)
            for table, needed in LCM_REQUIRED.items():
                missing = [c for c in needed if c not in columns[table]]
                if missing:
                    raise ImportFailure(f"{path} is not a lossless-claw database "
                                        f"({table} lacks {', '.join(missing)})")
            if identity == "session_key" and "session_key" not in columns["conversations"]:
                report.warn("this database has no session_key column (first schema); "
                            "sessions are grouped by session_id")
            _read_lcm_sessions(conn, columns, source, report)
            if options.include_summaries:
                source.summaries = _read_summaries(conn, columns, report)
    except sqlite3.Error as exc:
        raise ImportFailure(f"cannot read source database {path}: {exc}") from exc
    return source


def _read_lcm_sessions(conn, columns: dict, source: _Source, report: ImportReport) -> None:
    by_key: dict[str, _Session] = {}
    for conv in _select(conn, columns, "conversations", "ORDER BY created_at, conversation_id"):
        session_key = conv["session_key"]
        key = (session_key if source.identity == "session_key" else None) or conv["session_id"]
        key = str(key) if key else f"conversation-{conv['conversation_id']}"
        session = by_key.get(key)
        if session is None:
            session = by_key[key] = _Session(key, session_key)
            source.sessions.append(session)
        session.conversation_id = session.conversation_id or session_key
        session.lcm_conversations.append(conv["conversation_id"])
        _read_conversation(conn, columns, conv["conversation_id"], session, source, report)


# ---------------------------------------------------------------------------- target access
class _ConnectionView:
    """Stands in for ``Database`` so ``Store``/``Dag`` run on a connection the importer controls.

    Writable: each ``Store``/``Dag`` unit of work is a savepoint inside the importer's
    single outer transaction, so the whole import commits or rolls back at once.
    Read-only (dry run): any write attempt raises, so a dry run cannot write.
    """

    def __init__(self, conn: sqlite3.Connection, writable: bool):
        self.conn = conn
        self.writable = writable
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
    """Run the whole import in one BEGIN IMMEDIATE ... COMMIT on the target."""
    with db.lock:
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield _ConnectionView(db.conn, writable=True)
        except BaseException:
            db.conn.execute("ROLLBACK")
            raise
        db.conn.execute("COMMIT")


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
    could catch a half-written WAL), taken before an import writes anything."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = path.with_name(f"{path.stem}.pre-import-{stamp}{path.suffix}")
    counter = 1
    while dest.exists():
        dest = path.with_name(f"{path.stem}.pre-import-{stamp}-{counter}{path.suffix}")
        counter += 1
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
    source: _Source
    report: ImportReport
    store: Store
    dag: Dag
    writable: bool
    session_targets: dict = field(default_factory=dict)  # source session key -> target id


def _target_session(run: _Run, ledger_key: str, session: _Session, known: dict) -> str:
    """The target session id: the one this import used before, else
    ``<namespace>:agent:<agent>:<source session>``, suffixed ``@<import id>`` when another
    import already owns that id (the same data under another import id is a new import)."""
    if ledger_key not in known:
        target = f"{run.report.namespace}:agent:{run.options.agent}:{session.key}"
        if run.store.get_session(target) is not None:
            target = f"{target}@{run.report.import_id}"
        known[ledger_key] = target
    return str(known[ledger_key])


def _import_session(run: _Run, session: _Session, target: str, new_session: str | None,
                    imported: dict, count_tokens: Callable[[dict], int] | None) -> None:
    """Store a session's messages not yet imported under this import id (creating the
    session first when ``new_session`` holds its ledger key).

    The whole session is shown to ``Store.ingest`` so already-stored rows line up and
    only new ones are appended, exactly like a transcript the host shows again."""
    report = run.report
    keyed = [(key, message) for unit in session.units
             for key, message in zip(unit.keys(), unit.messages)]
    fresh = [key for key, _ in keyed if key not in imported]
    report.messages += len(keyed)
    report.skipped_existing += len(keyed) - len(fresh)
    report.would_import += len(fresh)
    if not fresh or not run.writable:
        return
    if new_session:
        run.store.ensure_session(target, conversation_id=session.conversation_id,
                                 source=report.namespace)
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
        raise _InvalidRow("empty summary text")
    kind = summary["kind"]
    if kind == "leaf" or (kind is None and not summary["parent_ids"]):
        ids = list(dict.fromkeys(summary["message_ids"]))
        missing = [m for m in ids if m not in ready and m not in empty]
        usable = [m for m in ids if m in ready]
        if missing or not usable:
            raise _MissingSources(f"source messages not imported: {missing[:5] or 'none given'}")
        return 0, usable
    if kind not in ("condensed", None):
        raise _InvalidRow(f"unknown summary kind {kind!r}")
    parents = list(dict.fromkeys(summary["parent_ids"]))
    missing = [p for p in parents if p not in depths]
    if missing or not parents:
        raise _MissingSources(f"input summaries not imported: {missing[:5] or 'none given'}")
    levels = {depths[p] for p in parents}
    if len(levels) != 1:
        raise _InvalidRow(f"input summaries have different depths {sorted(levels)}")
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
        except _InvalidRow as exc:
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
    if options.source_db and Path(options.source_db).expanduser().resolve() == \
            Path(options.target_db).expanduser().resolve():
        raise ImportFailure("--target-db must not be the source database")


def _dry_run(options: ImportOptions, source: _Source, report: ImportReport,
             progress: Callable[[int, int], None] | None) -> None:
    """Plan against the target read-only (an empty in-memory trove when it is new)."""
    target = Path(options.target_db).expanduser()
    conn = open_readonly(target, options.busy_timeout) if target.exists() else None
    scratch = None
    try:
        if conn is None or _check_target(conn, target) == 0:
            scratch = Database(":memory:")  # a new target: plan against an empty trove
        view = _ConnectionView(scratch.conn if scratch else conn, writable=False)
        _run_steps(_Run(options, source, report, Store(view), Dag(view), False), progress)
    finally:
        for handle in (scratch, conn):
            if handle is not None:
                handle.close()


def _apply(options: ImportOptions, source: _Source, report: ImportReport,
           progress: Callable[[int, int], None] | None) -> None:
    """Back up the target, then import everything in one transaction."""
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
            _run_steps(_Run(options, source, report, Store(view), Dag(view), True), progress)
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
        target_db=str(Path(options.target_db).expanduser()))
    source = read_lcm_database(options, report) if options.source_db \
        else read_jsonl_sources(options, report)
    try:
        (_apply if options.apply else _dry_run)(options, source, report, progress)
    except sqlite3.Error as exc:
        raise ImportFailure(f"cannot use target database {report.target_db}: {exc}") from exc
    return report
