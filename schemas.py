"""The trove_* tool schemas the model sees, and the checking of arguments against them.

The host reads the schemas once per agent and wraps them itself, so each
entry is ``{"name", "description", "parameters"}`` with a JSON Schema for the
arguments. ``validate`` checks a call against the same dictionaries, so an
argument documented here is exactly the argument a handler receives, already
typed: integers, booleans, strings (made storable UTF-8); time arguments and
periods are read by ``recall.periods`` (``parse_time`` for a single instant). Descriptions are short: they sit in
every prompt.
"""

from __future__ import annotations

import copy
import math
import re
import time
from dataclasses import dataclass
from datetime import timezone
from typing import Any, Callable

from .recall import periods
from .storage import codec

_SCOPE = {
    "type": "string",
    "enum": ["current", "session", "all"],
    "description": "current (default) = this session; session = the session named by "
                   "session_id; all = every session (raw hits only).",
}
_TIME = {
    "type": "string",
    "description": "A time (2026-11-28T09:00, Unix seconds) or a period whose start (time_from) "
                   "or end (time_to) counts: yesterday, last monday, 2026-11-28.",
}
_PERIOD = {
    "type": "string",
    "description": "Natural period: today, yesterday, this/last week|month, last 3 days, "
                   "monday, last friday, march, march 2026, 2026-03-14, 2026-W11, A..B.",
}
_EXACT_REF = {"type": "boolean",
              "description": "Add exact_ref {store_id, start, end, quote} to each message."}
_REFS = {"type": "array", "items": {"type": "object"},
         "description": "[{store_id, start, end, quote, value?}]"}
_COMPUTATION = {"type": "object", "description": "trove_compute args"}
_SCOPE_SHORT = {"type": "string", "enum": ["current", "session", "all"]}


def _params(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


TOOL_SCHEMAS: list[dict] = [
    {
        "name": "trove_grep",
        "description": (
            "Search this session's stored messages and summaries (including what was compacted "
            "out of your context). Natural-language or keyword queries; \"quoted phrases\" and "
            "-excluded words work. Each hit has an expand handle for the exact text."),
        "parameters": _params({
            "query": {"type": "string", "description": "What to look for."},
            "limit": {"type": "integer", "minimum": 1, "description": "Hits, default 10, max 50."},
            "session_scope": _SCOPE,
            "session_id": {"type": "string", "description": "Another session to search."},
            "source": {"type": "string", "description": "Platform filter (cli, telegram, unknown...)."},
            "role": {"type": "string", "enum": ["user", "assistant", "tool", "system"],
                     "description": "Only raw messages of this role."},
            "time_from": _TIME,
            "time_to": _TIME,
            "period": _PERIOD,
            "content_scope": {"type": "string", "enum": ["messages", "externalized", "both"],
                              "description": "messages (default), externalized payloads, or both."},
            "explain": {"type": "boolean", "description": "Add per-hit score parts."},
            "include_current_turn": {"type": "boolean",
                                     "description": "Also match the current turn's own messages."},
            "include_exact_ref": _EXACT_REF,
            "mode": {"type": "string", "enum": ["full_text", "semantic", "hybrid"],
                     "description": "full_text, semantic or hybrid (default: hybrid when "
                                    "embeddings cover the scope, else full_text)."},
        }, ("query",)),
    },
    {
        "name": "trove_expand",
        "description": (
            "Read exact stored content: a summary node's sources (child summaries or raw "
            "messages) page by page, or one raw message by store_id. Long text continues "
            "with content_offset."),
        "parameters": _params({
            "node_id": {"type": "integer", "description": "Summary node to open."},
            "store_id": {"type": "integer", "description": "Raw message to read."},
            "externalized_ref": {"type": "string", "description": "Id of an externalized payload."},
            "source_offset": {"type": "integer", "minimum": 0,
                              "description": "First source of the node to return."},
            "source_limit": {"type": "integer", "minimum": 1,
                             "description": "Sources per page, default 20, max 100."},
            "content_offset": {"type": "integer", "minimum": 0,
                               "description": "Character offset into a message's content."},
            "tool_calls_offset": {"type": "integer", "minimum": 0,
                                  "description": "Character offset into a message's tool calls."},
            "max_tokens": {"type": "integer", "minimum": 64, "description": "Response size cap."},
            "include_exact_ref": _EXACT_REF,
            "session_scope": _SCOPE,
            "session_id": {"type": "string", "description": "Session the id belongs to."},
            "rollup_id": {"type": "integer", "description": "Day/week/month rollup to open."},
        }),
    },
    {
        "name": "trove_describe",
        "description": ("Metadata of a summary node (depth, time range, children, sizes, topics, "
                        "parents) or a raw message, with a short preview; no full content."),
        "parameters": _params({
            "node_id": {"type": "integer"},
            "store_id": {"type": "integer"},
            "externalized_ref": {"type": "string"},
            "session_scope": _SCOPE,
            "session_id": {"type": "string"},
        }),
    },
    {
        "name": "trove_load_session",
        "description": ("One ordered page of a session's raw transcript (this session unless "
                        "session_id names another). Continue with after_store_id = next_cursor."),
        "parameters": _params({
            "session_id": {"type": "string"},
            "after_store_id": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1, "description": "Default 50, max 200."},
            "include_exact_ref": _EXACT_REF,
        }),
    },
    {
        "name": "trove_recent",
        "description": ("What happened in a period: day/week/month rollups when ready, then "
                        "each session of the period once (its summaries or a digest), then raw "
                        "messages. This session by default; session_scope=all covers your "
                        "other sessions too."),
        "parameters": _params({
            "period": {**_PERIOD, "description": _PERIOD["description"] + " Default today."},
            "session_scope": {"type": "string", "enum": ["current", "all"],
                              "description": "current (default) = this session; all = every "
                                             "session you may read."},
            "limit": {"type": "integer", "minimum": 1, "description": "Default 10, max 50."},
            "offset": {"type": "integer", "minimum": 0, "description": "Items to skip (paging)."},
        }),
    },
    {
        "name": "trove_expand_query",
        "description": ("Answer a question from expanded evidence: finds matching summaries and "
                        "messages (or takes node_ids), packs their exact sources and asks a "
                        "helper model. Returns the evidence if no model is available."),
        "parameters": _params({
            "prompt": {"type": "string", "description": "The question to answer."},
            "query": {"type": "string", "description": "Search words for the evidence."},
            "node_ids": {"type": "array", "items": {"type": "integer"},
                         "description": "Summary nodes to use instead of a search."},
            "max_results": {"type": "integer", "minimum": 1, "description": "Default 5, max 20."},
            "context_max_tokens": {"type": "integer", "minimum": 256,
                                   "description": "Evidence budget in tokens."},
        }, ("prompt",)),
    },
    {
        "name": "trove_recall",
        "description": ("Search ALL stored conversations and time (not only this session) for "
                        "a question or keywords; best hits first, each with an expand handle."),
        "parameters": _params({
            "query": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "description": "Default 10, max 50."},
            "explain": {"type": "boolean"},
            "time_from": _TIME,
            "time_to": _TIME,
            "period": _PERIOD,
        }, ("query",)),
    },
    {
        "name": "trove_status",
        "description": ("What matters now: context pressure, the compaction trigger and why, "
                        "the last compaction, what is stored, problems."),
        "parameters": _params({}),
    },
    {
        "name": "trove_inspect",
        "description": ("Inventory of this session's memory: summary frontier, carried nodes, "
                        "counts, last compaction and skip reasons, plus every setting and the "
                        "database. Metadata only."),
        "parameters": _params({}),
    },
    {
        "name": "trove_doctor",
        "description": ("Read-only health checks: database, full-text index, lifecycle, config, "
                        "context pressure. full=true also runs the integrity check on big "
                        "databases."),
        "parameters": _params({"full": {"type": "boolean"}}),
    },
    {
        "name": "trove_evidence_pack",
        "description": ("Verify exact refs: each quote with said_at (message time) and "
                        "happened (the date it states, with the rule); optional computation."),
        "parameters": _params({
            "refs": _REFS,
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
            "computation": _COMPUTATION,
            "session_scope": _SCOPE_SHORT,
            "session_id": {"type": "string"},
        }, ("refs",)),
    },
    {
        "name": "trove_compute",
        "description": ("Exact date/count/sum arithmetic over exact refs; never do it "
                        "yourself. Fails on ambiguity; returns result and hashed trace."),
        "parameters": _params({
            "operation": {"type": "string", "enum": ["date_diff", "count_distinct", "sum",
                                                     "difference", "order", "latest"]},
            "inputs": _REFS,
            "unit": {"type": "string", "description": "days|weeks|months or a unit"},
            "absolute": {"type": "boolean"},
            "session_scope": _SCOPE_SHORT,
            "session_id": {"type": "string"},
        }, ("operation", "inputs")),
    },
    {
        "name": "trove_compile_evidence",
        "description": ("Check an answer's claims against their refs: supported or not; "
                        "sufficient, insufficient or conflicting."),
        "parameters": _params({
            "proposal": {"type": "object",
                         "description": "{question, claims: [{text, refs}], computation?}"},
            "session_scope": _SCOPE_SHORT,
            "session_id": {"type": "string"},
        }, ("proposal",)),
    },
    {
        "name": "trove_query_state",
        "description": ("Stated facts, preferences, commitments... with exact refs: current "
                        "value, earlier values, conflicts; as_of = what was true then."),
        "parameters": _params({
            "subject": {"type": "string"},
            "kind": {"type": "string", "enum": ["fact", "preference", "recommendation",
                                                "commitment", "action", "status"]},
            "as_of": {"type": "string", "description": "ISO date/time"},
            "session_scope": _SCOPE_SHORT,
            "session_id": {"type": "string"},
        }),
    },
    {
        "name": "trove_retrieve",
        "description": ("Fill typed evidence slots with exact refs (at most 3 searches), "
                        "optionally compute; stores the view (view_id) for later turns."),
        "parameters": _params({
            "question": {"type": "string"},
            "slots": {"type": "array", "items": {"type": "object"},
                      "description": "[{name, type: date|amount|place|person|item, query}]"},
            "computation": _COMPUTATION,
            "view_id": {"type": "integer", "description": "Reread a stored view"},
        }),
    },
]

SCHEMAS_BY_NAME: dict[str, dict] = {schema["name"]: schema for schema in TOOL_SCHEMAS}


def get_tool_schemas() -> list[dict]:
    """Deep copies of the schemas, so the host (or a test) can never alter ours."""
    return copy.deepcopy(TOOL_SCHEMAS)


# ---------------------------------------------------------------- argument checking
# (default, maximum) of each count argument; values outside are clamped and reported.
COUNT_LIMITS = {
    ("trove_grep", "limit"): (10, 50),
    ("trove_recall", "limit"): (10, 50),
    ("trove_recent", "limit"): (10, 50),
    ("trove_load_session", "limit"): (50, 200),
    ("trove_expand", "source_limit"): (20, 100),
    ("trove_expand_query", "max_results"): (5, 20),
    ("trove_evidence_pack", "limit"): (10, 50),
}
TIME_ARGUMENTS = frozenset({"time_from", "time_to"})
MAX_INTEGER = 2**63 - 1


class ArgumentError(ValueError):
    """A tool argument is missing, of the wrong type or out of its domain."""


def validate(name: str, args: dict) -> tuple[dict, list[str]]:
    """Arguments checked against the tool's schema: (clean values, ignored unknown keys)."""
    schema = SCHEMAS_BY_NAME[name]["parameters"]
    clean: dict = {}
    ignored: list[str] = []
    for key, value in args.items():
        spec = schema["properties"].get(key)
        if spec is None:
            ignored.append(codec.safe_text(str(key))[:60])
        elif value is not None:
            clean[key] = _coerce(str(key), value, spec)
    for key in schema["required"]:
        if clean.get(key) in (None, ""):
            raise ArgumentError(f"{key} is required")
    return clean, ignored


def _coerce(key: str, value: Any, spec: dict) -> Any:
    kind = spec["type"]
    if kind == "integer":
        return _integer(key, value)
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ArgumentError(f"{key} must be true or false")
    if kind == "object":
        if not isinstance(value, dict):
            raise ArgumentError(f"{key} must be an object")
        return value            # its fields are checked by the handler
    if kind == "array" and spec["items"]["type"] == "object":
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ArgumentError(f"{key} must be a list of objects")
        return value
    if kind == "array":
        if not isinstance(value, list):
            raise ArgumentError(f"{key} must be a list of integers")
        return [_integer(key, v) for v in value[:100]]
    if key in TIME_ARGUMENTS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ArgumentError(f"{key} must be a string")
    value = codec.safe_text(value)
    if "enum" in spec and value not in spec["enum"]:
        raise ArgumentError(f"{key} must be one of {', '.join(spec['enum'])}")
    return value


def _integer(key: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,19}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{key} must be an integer")
    if abs(value) > MAX_INTEGER:
        raise ArgumentError(f"{key} is out of range")
    return value


def clamp(tool: str, key: str, params: dict, payload: dict) -> int:
    """A count argument inside its (1, maximum) range; a changed value is reported."""
    default, maximum = COUNT_LIMITS[(tool, key)]
    asked = params.get(key, default)
    value = min(max(asked, 1), maximum)
    if value != asked:
        payload[f"{key}_clamped_from"] = asked
    return value


def offset_arg(params: dict, key: str) -> int:
    """A non-negative offset/cursor argument (0 when absent)."""
    value = params.get(key, 0)
    if value < 0:
        raise ArgumentError(f"{key} must be 0 or more")
    return value



def parse_time(value: object) -> float:
    """One instant from a time argument (ISO-8601, naive = UTC; a date = its UTC
    midnight; Unix seconds), for arguments that name a moment rather than a window.
    Periods are read by ``recall.periods``, which this delegates to, so there is one
    parser; raises ValueError with a message the model can act on."""
    return periods.bound(value, time.time(), timezone.utc, at_end=False)

# ---------------------------------------------------------------- response bounds
CHARS_PER_TOKEN_BUDGET = 3      # characters budgeted per token before measuring
RESPONSE_OVERHEAD_TOKENS = 160  # room kept for a response's own fields
MIN_ITEM_CHARS = 240            # a listed text is never cut shorter than this up front


@dataclass
class Shape:
    """How a result may shrink to fit the response cap.

    ``items`` names the list whose tail may be dropped (``on_trim(payload,
    kept)`` then records the cursor); ``texts`` the string fields that may be
    cut, in the items, in the payload itself and in the dicts named by
    ``nested``; ``optional`` top-level keys dropped first, in order.
    """

    items: str | None = None
    on_trim: Callable[[dict, int], None] | None = None
    texts: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    nested: tuple[str, ...] = ()


def error_json(name: Any, message: str, count: Callable[[str], int], cap: int) -> str:
    """``{"error", "tool"}`` as JSON, itself within the cap."""
    payload = {"error": codec.safe_text(message)[:500], "tool": codec.safe_text(str(name))[:80]}
    text = codec.dump_json(payload)
    if count_safely(count, text) > cap:
        text = codec.dump_json({"error": payload["error"][:80], "tool": payload["tool"][:40]})
    return text


def count_safely(count: Callable[[str], int], text: str) -> int:
    """Tokens of ``text`` by the engine's counter; a failing counter over-estimates."""
    try:
        return int(count(text))
    except Exception:
        return math.ceil(len(text) / 2)


def render(payload: dict, shape: Shape, count: Callable[[str], int], cap: int,
           name: str = "") -> str:
    """The payload as JSON no larger than ``cap`` tokens, shrinking it as ``shape`` allows."""
    def fits(candidate: dict) -> tuple[bool, str, int]:
        text = codec.dump_json(candidate)
        if len(text) > cap * 16:   # surely too big: no need to count
            return False, text, len(text) // 4
        tokens = count_safely(count, text)
        return tokens <= cap, text, tokens

    ok, text, tokens = fits(payload)
    if ok:
        return text
    for key in shape.optional:
        if key in payload:
            payload.pop(key)
            payload.setdefault("omitted_for_size", []).append(key)
            ok, text, tokens = fits(payload)
            if ok:
                return text
    items = payload.get(shape.items) if shape.items else None
    if isinstance(items, list) and len(items) > 1:
        fitted = _largest_prefix(payload, shape, items, fits, cap, tokens)
        if fitted:
            return fitted
    return _cut_texts(payload, shape, count, cap, fits, name)


def _largest_prefix(payload: dict, shape: Shape, items: list, fits, cap: int,
                    measured: int) -> str | None:
    """Keep the longest head of the list that fits and return its JSON; None (one item
    kept) when even a single item is too big.

    An interpolation search: each measurement predicts the next length from
    the tokens per item it saw, so a page settles in two or three counts.
    """
    def trial(n: int) -> dict:
        attempt = dict(payload)
        attempt[shape.items] = items[:n]
        if shape.on_trim:
            shape.on_trim(attempt, n)
        return attempt

    low, high = 0, len(items) - 1      # head[:low] fits; head[:high + 1] does not
    guess = int(len(items) * cap / max(measured, 1) * 0.98)
    best = None
    while low < high:
        middle = guess if low < guess <= high else (low + high + 1) // 2
        ok, text, tokens = fits(trial(middle))
        if ok:
            low, best = middle, text
        else:
            high = middle - 1
        guess = int(middle * cap / max(tokens, 1) * (1.02 if ok else 0.98))
    payload.update(trial(max(low, 1)))
    if low and best is None:
        best = fits(payload)[1]
    return best


def _cut_texts(payload: dict, shape: Shape, count: Callable[[str], int], cap: int, fits,
               name: str) -> str:
    """Shorten the longest shrinkable text (then the next) until the payload fits."""
    holders = [payload] + [payload[k] for k in shape.nested if isinstance(payload.get(k), dict)]
    if shape.items and isinstance(payload.get(shape.items), list):
        holders += [i for i in payload[shape.items] if isinstance(i, dict)]
    for _ in range(24):
        ok, text, measured = fits(payload)
        if ok:
            return text
        texts = [(len(h[k]), i, k) for i, h in enumerate(holders) for k in shape.texts
                 if isinstance(h.get(k), str) and h[k]]
        if not texts:
            break
        length, index, key = max(texts)
        excess_chars = int(len(text) * (1 - 0.9 * cap / max(measured, 1))) + 1
        _cut(holders[index], key, length - excess_chars)
    ok, text, _ = fits(payload)
    if ok:
        return text
    return error_json(name, "the result does not fit the response cap; "
                      "ask for fewer items or a smaller page", count, cap)


def _cut(holder: dict, key: str, keep: int) -> None:
    """Cut one text to ``keep`` chars, recording where it continues when it has an offset.

    A message's tool calls are only shown once its content is complete, so
    cutting the content withdraws them from this page.
    """
    has_offset = f"{key}_offset" in holder
    holder[key] = holder[key][:max(1 if has_offset else 0, keep)]   # paging always advances
    if not has_offset:
        holder[f"{key}_truncated"] = True
        return
    holder[f"next_{key}_offset"] = holder[f"{key}_offset"] + len(holder[key])
    holder["has_more"] = True
    if key == "content":
        for stale in ("tool_calls", "tool_calls_offset", "next_tool_calls_offset"):
            holder.pop(stale, None)
    holder["expand"] = continuation(holder)


def continuation(item: dict) -> dict:
    """The ``trove_expand`` call that reads the rest of a message item."""
    args = {"store_id": item["store_id"],
            "content_offset": item.get("next_content_offset",
                                       item.get("content_offset", 0) + len(item.get("content") or ""))}
    if "next_tool_calls_offset" in item:
        args["tool_calls_offset"] = item["next_tool_calls_offset"]
    if "session_id" in item:
        args["session_id"] = item["session_id"]
    return {"tool": "trove_expand", "args": args}


def budget_chars(cap: int, parts: int = 1) -> int:
    """Characters each of ``parts`` texts may use before measuring."""
    total = max(0, cap - RESPONSE_OVERHEAD_TOKENS) * CHARS_PER_TOKEN_BUDGET
    return max(MIN_ITEM_CHARS, total // max(1, parts))
