"""Read OpenClaw history (lossless-claw SQLite, JSONL transcripts) as chat messages.

The readers turn source rows into the OpenAI chat dicts (with ``timestamp``) the
engine stores from Hermes, grouped into source sessions; ``openclaw_import``
decides what of that to write and writes it. The lossless-claw reader detects
which columns the database's schema generation has, the JSONL reader keeps only
a transcript's live branch, and a ``sessions.json`` beside transcripts gives them
their gateway session keys. Sources are only ever read: SQLite files are opened
read-only without creating ``-wal``/``-shm`` files. Per-row problems are counted
in the run's report (see ``Tally``); an unusable source raises ``ImportFailure``.
See docs/import.md.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

# OpenClaw role -> stored role (lossless-claw already stores ``toolResult`` as ``tool``).
ROLES = {"system": "system", "user": "user", "assistant": "assistant",
         "tool": "tool", "toolResult": "tool"}
SQLITE_MAGIC = b"SQLite format 3\x00"
MS_THRESHOLD = 1e11  # larger epoch numbers are milliseconds (1e11 s is the year 5138)

# Ledger source kinds of the message rows each reader keys (one namespace of keys each).
KIND_LCM_MESSAGE = "lcm_message"
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
    """The import could not run or was rolled back; the message is meant for the user.

    Defined here because an unreadable source stops the run before the importer
    touches the target; ``openclaw_import`` raises it for everything else."""


class InvalidRow(ValueError):
    """One source row cannot be understood: it is skipped with a warning."""


class Tally(Protocol):
    """What the readers count into: the run's report (``openclaw_import.ImportReport``).

    Spelled out here so the readers depend on no more of the report than they use
    and this module never imports the importer."""

    scanned: int
    eligible: int
    skipped_empty: int
    invalid_rows: int
    skipped_non_message: int
    skipped_branch: int

    def warn(self, text: str) -> None:
        """Count a per-row problem and keep its text."""

    def drop_part(self, kind: Any) -> None:
        """Count a content block or part type that has no place in a chat message."""


# ---------------------------------------------------------------------------- source model
@dataclass
class SourceUnit:
    """One source row and the chat messages it became (usually one)."""

    source_key: str
    messages: list
    message_id: int | None = None  # lossless-claw message_id, for summary lineage

    def keys(self) -> list[str]:
        """Ledger keys of the messages: the row key, then ``key#1``, ``key#2`` for splits."""
        return [self.source_key if i == 0 else f"{self.source_key}#{i}"
                for i in range(len(self.messages))]


@dataclass
class SourceSession:
    """One source session (the unit that becomes one target session)."""

    key: str
    conversation_id: str | None
    units: list = field(default_factory=list)
    lcm_conversations: list = field(default_factory=list)


@dataclass
class Source:
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
        raise InvalidRow(f"unknown role {value!r}")
    return role


# ---------------------------------------------------------------------------- JSONL source
def _jsonl_blocks(content: Any, report: Tally) -> _Blocks:
    """Sort a JSONL ``content`` (a string or a list of blocks) into a ``_Blocks``."""
    blocks = _Blocks()
    if content is None or isinstance(content, str):
        blocks.text(content)
        return blocks
    if not isinstance(content, list):
        raise InvalidRow("content is neither text nor a list of blocks")
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


def _jsonl_messages(entry: dict, report: Tally) -> list:
    """The chat message of one JSONL ``message`` entry (``toolResult`` becomes ``tool``)."""
    message = entry.get("message")
    if not isinstance(message, dict):
        raise InvalidRow("message entry without a message object")
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


def _add_unit(report: Tally, session: SourceSession, key: str, where: str,
              convert: Callable[[], list], message_id: int | None = None) -> bool:
    """Convert one source row and add it to its session, counting what happened to it.
    Returns False when the row was empty (skipped, nothing to import)."""
    try:
        messages = convert()
    except InvalidRow as exc:
        report.invalid_rows += 1
        report.warn(f"{where}: {exc}; row skipped")
        return True
    if not messages:
        report.skipped_empty += 1
        return False
    report.eligible += 1
    session.units.append(SourceUnit(key, messages, message_id))
    return True


def _session_keys(folder: Path, cache: dict, report: Tally) -> dict:
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


def _parse_jsonl(path: Path, report: Tally) -> tuple[dict | None, list]:
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


def _has_id(entry: dict) -> bool:
    return isinstance(entry.get("id"), str) and bool(entry["id"])


def _live_branch(entries: list, linear: bool, where: str, report: Tally) -> list:
    """The live conversation: the path from the last entry with an id back to the root,
    in order. Linear files (version 1, or no line with an id) are the whole file in file
    order. In a tree file a line without an id (a record type this reader does not know,
    a corrupt object) is on no branch: it is skipped, never a reason to read the whole
    file as linear (which imported abandoned branches and, on a rerun, stored every
    message again under line-number keys)."""
    if linear or not entries:
        return entries
    tree = [(line_no, entry) for line_no, entry in entries if _has_id(entry)]
    if not tree:
        return []
    by_id = {entry["id"]: (line_no, entry) for line_no, entry in tree}
    path, seen = [], set()
    node = tree[-1]
    while node is not None and node[1]["id"] not in seen:
        seen.add(node[1]["id"])
        path.append(node)
        parent = node[1].get("parentId")
        node = by_id.get(parent) if parent is not None else None
        if parent is not None and node is None:
            report.warn(f"{where}: entry {path[-1][1]['id']} points to missing parent "
                        f"{parent!r}; the live branch starts there")
    return path[::-1]


def _read_jsonl_file(path: Path, keys: dict, report: Tally) -> SourceSession:
    """One transcript file as one source session (its live branch only)."""
    header, entries = _parse_jsonl(path, report)
    header = header or {}
    session_id = header.get("id") if isinstance(header.get("id"), str) and header.get("id") \
        else path.name.split(".jsonl")[0]
    version = header.get("version")
    linear = (isinstance(version, int) and version < 2) or not any(
        _has_id(entry) for _, entry in entries)
    session = SourceSession(session_id, keys.get(session_id))
    branch = _live_branch(entries, linear, str(path), report)
    on_branch = {line_no for line_no, _ in branch}
    for line_no, entry in entries:
        if entry.get("type") != "message":
            report.skipped_non_message += 1
        elif line_no not in on_branch:
            report.skipped_branch += 1
            if not linear and not _has_id(entry):
                report.warn(f"{path}:{line_no}: message entry without an id in a tree "
                            f"transcript; it is on no branch, skipped")
    for line_no, entry in branch:
        if entry.get("type") == "message":
            key = f"{session_id}/line{line_no}" if linear else f"{session_id}/{entry['id']}"
            _add_unit(report, session, key, f"{path}:{line_no}",
                      lambda entry=entry: _jsonl_messages(entry, report))
    return session


def _jsonl_files(names: Sequence[str], folders: Sequence[str]) -> list[Path]:
    """Every transcript to read: the named files, then ``*.jsonl`` below each directory."""
    files = []
    for name in names:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ImportFailure(f"JSONL source {name} is not a file")
        files.append(path)
    for name in folders:
        folder = Path(name).expanduser()
        if not folder.is_dir():
            raise ImportFailure(f"JSONL source directory {name} is not a directory")
        files += sorted(p for p in folder.rglob("*.jsonl") if p.is_file())
    unique = {path.resolve(): path for path in files}
    return list(unique.values())


def read_jsonl_sources(names: Sequence[str], folders: Sequence[str], report: Tally) -> Source:
    """Read the transcripts ``names`` and every ``*.jsonl`` below ``folders`` into source
    sessions, one per file, so each transcript's live branch becomes one session."""
    source = Source(KIND_JSONL_MESSAGE, "jsonl")
    files = _jsonl_files(names, folders)
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


def _lcm_blocks(row, parts: list, role: str, report: Tally) -> _Blocks:
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


def _lcm_messages(row, parts: list, report: Tally) -> list:
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


def _read_conversation(conn, columns: dict, conversation_id: Any, session: SourceSession,
                       source: Source, report: Tally) -> None:
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


def _read_summaries(conn, columns: dict, report: Tally) -> list:
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


def read_lcm_database(source_db: str, report: Tally, *, timeout: float,
                      identity: str | None = None, include_summaries: bool = False) -> Source:
    """Read a lossless-claw database (any schema generation) into source sessions, one per
    ``identity`` (``session_id`` when None, else ``session_key``), so every generation
    imports alike; with ``include_summaries`` its summaries and their inputs too."""
    identity = identity or "session_id"
    source = Source(KIND_LCM_MESSAGE, identity)
    path = Path(source_db).expanduser()
    if not path.is_file():
        raise ImportFailure(f"source database {path} does not exist")
    try:
        with closing(open_readonly(path, timeout)) as conn:
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
            if include_summaries:
                source.summaries = _read_summaries(conn, columns, report)
    except sqlite3.Error as exc:
        raise ImportFailure(f"cannot read source database {path}: {exc}") from exc
    return source


def _read_lcm_sessions(conn, columns: dict, source: Source, report: Tally) -> None:
    by_key: dict[str, SourceSession] = {}
    for conv in _select(conn, columns, "conversations", "ORDER BY created_at, conversation_id"):
        session_key = conv["session_key"]
        key = (session_key if source.identity == "session_key" else None) or conv["session_id"]
        key = str(key) if key else f"conversation-{conv['conversation_id']}"
        session = by_key.get(key)
        if session is None:
            session = by_key[key] = SourceSession(key, session_key)
            source.sessions.append(session)
        session.conversation_id = session.conversation_id or session_key
        session.lcm_conversations.append(conv["conversation_id"])
        _read_conversation(conn, columns, conv["conversation_id"], session, source, report)
