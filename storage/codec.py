"""Exact encoding of chat messages into database rows, and back.

A Hermes message is an OpenAI chat dict whose ``content`` may be a string, a
list of parts, ``None`` or missing, and whose other keys vary by role. The store
must give back exactly what it was given, so this module turns a message into
row fields without losing anything and rebuilds an equal dict from them.

Two facts shape it:
- SQLite text must be valid UTF-8, but ``json.loads`` can produce strings with
  lone surrogates. Such strings are stored as ASCII-escaped JSON, which
  round-trips them exactly.
- Host-internal keys (``_db_persisted``...) and the host's ``api_content``
  sidecar (the content plus injected context) are not part of the message the
  user or model wrote; they are neither stored nor part of its identity.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from . import timekeys

# Keys the host adds to messages that are not part of the conversation itself.
HOST_SIDECAR_KEYS = frozenset({"api_content"})
# Keys stored in their own columns; everything else non-internal goes to ``extra``.
COLUMN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id"})
# Marks (in ``extra``) a message that had no ``role`` key at all.
ROLE_ABSENT = "\u0000role_absent"

CONTENT_TEXT = "text"      # content is a str, stored as is
CONTENT_JSON = "json"      # content is any other JSON value (list of parts, ...) or an un-encodable str
CONTENT_NULL = "null"      # content is None
CONTENT_ABSENT = "absent"  # the message had no content key


@dataclass(frozen=True)
class EncodedMessage:
    """Row fields for one message, ready to bind into an INSERT."""

    role: str
    content: str | None
    content_format: str
    tool_calls: str | None
    tool_call_id: str | None
    tool_name: str | None
    extra: str | None
    search_text: str | None
    content_hash: str
    message_at: float | None


def is_host_internal(key: str) -> bool:
    """True for keys the host owns (``_``-prefixed or known sidecars)."""
    return key.startswith("_") or key in HOST_SIDECAR_KEYS


def clean_message(message: dict) -> dict:
    """Return a copy of ``message`` without host-internal keys."""
    return {k: v for k, v in message.items() if not is_host_internal(str(k))}


# The encoders ``json.dumps`` would build on every call with these options (an
# encoder holds no state between calls, so one of each serves every thread).
_READABLE_JSON = json.JSONEncoder(ensure_ascii=False, default=str)
_ASCII_JSON = json.JSONEncoder(ensure_ascii=True, default=str)
_IDENTITY_JSON = json.JSONEncoder(ensure_ascii=True, sort_keys=True, default=str)


def _utf8_safe(text: str) -> bool:
    if text.isascii():  # a flag of the string: no scan, and ASCII is always valid UTF-8
        return True
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def dump_json(value: Any) -> str:
    """JSON that SQLite can store: readable UTF-8 when possible, ASCII-escaped otherwise."""
    text = _READABLE_JSON.encode(value)
    return text if _utf8_safe(text) else _ASCII_JSON.encode(value)


def safe_text(text: str) -> str:
    """Make a string storable as UTF-8 for derived (non-exact) columns such as search text."""
    return text if _utf8_safe(text) else text.encode("utf-8", "replace").decode("utf-8")


IMAGE_PART_TYPES = ("image_url", "input_image", "image")
IMAGE_MARKER = "[image]"      # how an image part reads in a row's text


def flatten_content(content: Any, *, payload_refs: bool = False) -> str:
    """Plain text of a content value: the string itself, or the text parts of a list.

    An image part reads ``[image]``; with ``payload_refs`` (a row's search text) it is
    followed by the ref of each payload it was externalized to, so the ref's hash is a
    search token of that row as it is of a placeholder in text: the rows referring to a
    payload are one exact match, however many images came after (``recall/externalized``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    pieces.append(part["text"])
                elif part.get("type") in IMAGE_PART_TYPES:
                    pieces.append(_image_text(part) if payload_refs else IMAGE_MARKER)
                else:
                    pieces.append(dump_json(part))
            elif isinstance(part, str):
                pieces.append(part)
        return "\n".join(pieces)
    return dump_json(content)


def _image_text(part: dict) -> str:
    """``[image]`` and the refs of the payload placeholders inside an image part."""
    from .payloads import refs_in   # payloads builds on this module: imported when used
    return " ".join([IMAGE_MARKER, *refs_in(dump_json(part))])


def tool_call_text(tool_calls: Any) -> str:
    """Searchable text of an assistant's tool calls: function names and arguments."""
    if not isinstance(tool_calls, list):
        return "" if tool_calls is None else dump_json(tool_calls)
    lines = []
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            args_text = args if isinstance(args, str) else dump_json(args)
            lines.append(f"{fn.get('name', '')}({args_text})")
        else:
            lines.append(dump_json(call))
    return "\n".join(lines)


def message_text(message: dict, *, payload_refs: bool = False) -> str:
    """Everything a reader (or a search) should see of a message, as plain text
    (``payload_refs``: as the search text has it, see ``flatten_content``)."""
    text = flatten_content(message.get("content"), payload_refs=payload_refs)
    calls = tool_call_text(message.get("tool_calls")) if message.get("tool_calls") else ""
    return f"{text}\n{calls}" if text and calls else (text or calls)


def tool_name_of(message: dict) -> str | None:
    """The tool a message belongs to: ``tool_name``/``name`` of a tool result."""
    for key in ("tool_name", "name"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def identity_hash(message: dict) -> str:
    """Deterministic hash of what makes a message *this* message.

    Role, content, tool calls, tool_call_id and tool name; never host sidecars,
    timestamps or bookkeeping keys, so the same turn shown with and without
    ``api_content`` hashes the same.
    """
    basis = [
        message.get("role"),
        message.get("content"),
        message.get("tool_calls"),
        message.get("tool_call_id"),
        tool_name_of(message),
    ]
    canonical = _IDENTITY_JSON.encode(basis)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:32]


def encode_message(message: dict, identity_of: dict | None = None) -> EncodedMessage:
    """Encode a cleaned message into row fields (see ``decode_message`` for the inverse).

    ``identity_of`` is the message as the host sent it, when ``message`` is a
    transformed copy (secrets redacted, payloads externalized): the identity
    stays that of the original. A ``timestamp`` is read by ``timekeys.message_time``
    (a naive ISO time in its writer's zone)."""
    role = message.get("role")
    usable_role = isinstance(role, str) and bool(role) and _utf8_safe(role)
    role_text = role if usable_role else "unknown"
    if "content" not in message:
        content, fmt = None, CONTENT_ABSENT
    elif message["content"] is None:
        content, fmt = None, CONTENT_NULL
    elif isinstance(message["content"], str) and _utf8_safe(message["content"]):
        content, fmt = message["content"], CONTENT_TEXT
    else:
        content, fmt = dump_json(message["content"]), CONTENT_JSON
    extra_keys = {k: v for k, v in message.items() if k not in COLUMN_KEYS}
    if "role" not in message:
        extra_keys[ROLE_ABSENT] = True  # decodes without a role key, as it came
    elif not usable_role:
        extra_keys["role"] = role  # keep the exact original when it is not a usable role
    tool_calls = message.get("tool_calls")
    call_id = message.get("tool_call_id")
    call_id_column = call_id if isinstance(call_id, str) and _utf8_safe(call_id) else None
    if "tool_call_id" in message and call_id_column is None:
        extra_keys["tool_call_id"] = call_id  # odd values stay exact in ``extra``
    searchable = message_text(message, payload_refs=True)
    search_text = None if (fmt == CONTENT_TEXT and searchable == content) else safe_text(searchable)
    return EncodedMessage(
        role=role_text,
        content=content,
        content_format=fmt,
        tool_calls=None if "tool_calls" not in message else dump_json(tool_calls),
        tool_call_id=call_id_column,
        tool_name=safe_text(tool_name_of(message) or "") or None,
        extra=dump_json(extra_keys) if extra_keys else None,
        search_text=search_text,
        content_hash=identity_hash(message if identity_of is None else identity_of),
        message_at=timekeys.message_time(message.get("timestamp")),
    )


def decode_encoded(encoded: EncodedMessage) -> dict:
    """The message an ``EncodedMessage`` stores (what its row decodes to)."""
    return decode_message({"role": encoded.role, "content": encoded.content,
                           "content_format": encoded.content_format,
                           "tool_calls": encoded.tool_calls, "tool_call_id": encoded.tool_call_id,
                           "extra": encoded.extra})


def decode_message(row: dict) -> dict:
    """Rebuild the message dict from the row fields written by ``encode_message``."""
    extra = json.loads(row["extra"]) if row.get("extra") else {}
    message: dict = {} if extra.pop(ROLE_ABSENT, False) else {"role": extra.pop("role", row["role"])}
    fmt = row["content_format"]
    if fmt == CONTENT_TEXT:
        message["content"] = row["content"]
    elif fmt == CONTENT_JSON:
        message["content"] = json.loads(row["content"])
    elif fmt == CONTENT_NULL:
        message["content"] = None
    if row.get("tool_calls") is not None:
        message["tool_calls"] = json.loads(row["tool_calls"])
    if row.get("tool_call_id") is not None:
        message["tool_call_id"] = row["tool_call_id"]
    message.update(extra)
    return message
