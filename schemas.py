"""The trove_* tool schemas the model sees, and the checking of arguments against them.

The host reads the schemas once per agent and wraps them itself, so each
entry is ``{"name", "description", "parameters"}`` with a JSON Schema for the
arguments. ``validate`` checks a call against the same dictionaries, so an
argument documented here is exactly the argument a handler receives, already
typed: integers, booleans, strings (made storable UTF-8); time arguments and
periods are read by ``recall.periods``.
Descriptions are short: they sit in every request (``wire_json`` is the form they are
sent and counted in), and ``get_tool_schemas(config)`` gives the host only the tools the
config exposes.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from .storage import codec

# Every schema is in every request the host sends, so descriptions say only what decides
# the choice of tool (when to use it, what it returns, the argument that matters); the rest
# is in docs/tools.md and the bundled skill. tests/test_tool_surface.py pins the total.
_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_SCOPE = {"type": "string", "enum": ["current", "session", "all"]}
_PERIOD = {"type": "string", "description": "e.g. yesterday, last week, march, 2026-03-14"}
_REFS = {"type": "array", "items": {"type": "object"},
         "description": "exact refs [{store_id, start, end, quote}]"}
_COMPUTATION = {"type": "object", "description": "trove_compute args"}


def _params(properties: dict, required: tuple[str, ...] = ()) -> dict:
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _ids(*names: str) -> dict:
    """Integer properties without descriptions (ids, offsets, page sizes)."""
    return {name: _INT for name in names}


TOOL_SCHEMAS: list[dict] = [
    {
        "name": "trove_grep",
        "description": (
            "Search this session's stored messages and summaries, including what was "
            "compacted out of your context; \"phrase\" and -word work. Hits carry an expand "
            "handle to the exact text."),
        "parameters": _params({
            "query": _STR,
            "limit": _INT,
            "session_scope": _SCOPE,
            "session_id": _STR,
            "source": _STR,
            "role": {"type": "string", "enum": ["user", "assistant", "tool", "system"]},
            "time_from": _STR,
            "time_to": _STR,
            "period": _STR,
            "content_scope": {"type": "string", "enum": ["messages", "externalized", "both"]},
            "explain": _BOOL,
            "include_current_turn": _BOOL,
            "include_exact_ref": _BOOL,
            "mode": {"type": "string", "enum": ["full_text", "semantic", "hybrid"]},
        }, ("query",)),
    },
    {
        "name": "trove_expand",
        "description": (
            "Read exact stored text: a summary node's sources (node_id) or one message "
            "(store_id), page by page. Call it with a hit's expand args."),
        "parameters": _params({
            "node_id": _INT,
            "store_id": _INT,
            "externalized_ref": _STR,
            **_ids("source_offset", "source_limit", "content_offset", "tool_calls_offset",
                   "max_tokens"),
            "include_exact_ref": _BOOL,
            "session_scope": _SCOPE,
            "session_id": _STR,
            "rollup_id": _INT,
        }),
    },
    {
        "name": "trove_describe",
        "description": "A summary node's or message's metadata (time range, children, "
                       "topics) and a preview, not the full text.",
        "parameters": _params({
            "node_id": _INT,
            "store_id": _INT,
            "externalized_ref": _STR,
            "session_scope": _SCOPE,
            "session_id": _STR,
        }),
    },
    {
        "name": "trove_load_session",
        "description": "Page through a session's raw transcript in order (after_store_id "
                       "= next_cursor).",
        "parameters": _params({
            "session_id": _STR,
            **_ids("after_store_id", "limit"),
            "include_exact_ref": _BOOL,
        }),
    },
    {
        "name": "trove_recent",
        "description": "What happened in a period (default today): rollups, each session "
                       "once, then raw messages; session_scope=all adds your other sessions.",
        "parameters": _params({
            "period": _PERIOD,
            "session_scope": {"type": "string", "enum": ["current", "all"]},
            **_ids("limit", "offset"),
            "snapshot": _STR,
        }),
    },
    {
        "name": "trove_expand_query",
        "description": "A helper model answers prompt from the exact sources under the "
                       "summaries query finds (or node_ids).",
        "parameters": _params({
            "prompt": _STR,
            "query": _STR,
            "node_ids": {"type": "array", "items": _INT},
            **_ids("max_results", "context_max_tokens"),
        }, ("prompt",)),
    },
    {
        "name": "trove_recall",
        "description": "Search ALL your stored conversations, not only this session; best "
                       "hits first, each with an expand handle.",
        "parameters": _params({
            "query": _STR,
            "limit": _INT,
            "explain": _BOOL,
            "time_from": _STR,
            "time_to": _STR,
            "period": _STR,
        }, ("query",)),
    },
    {
        "name": "trove_status",
        "description": "Context pressure, compaction trigger, last compaction, problems.",
        "parameters": _params({}),
    },
    {
        "name": "trove_inspect",
        "description": "This session's memory inventory: summary frontier, counts, skip "
                       "reasons, settings.",
        "parameters": _params({}),
    },
    {
        "name": "trove_doctor",
        "description": "Read-only health checks of the database, index and config.",
        "parameters": _params({"full": _BOOL}),
    },
    {
        "name": "trove_evidence_pack",
        "description": "Verify exact refs: each quote with when it was said and the date "
                       "it states.",
        "parameters": _params({
            "refs": _REFS,
            **_ids("offset", "limit"),
            "computation": _COMPUTATION,
            "session_scope": _SCOPE,
            "session_id": _STR,
        }, ("refs",)),
    },
    {
        "name": "trove_compute",
        "description": "Date, count and sum arithmetic over exact refs, never by "
                       "hand; fails rather than guess.",
        "parameters": _params({
            "operation": {"type": "string", "enum": ["date_diff", "count_distinct", "sum",
                                                     "difference", "order", "latest"]},
            "inputs": {"type": "array", "items": {"type": "object"}},
            "unit": _STR,
            "absolute": _BOOL,
            "session_scope": _SCOPE,
            "session_id": _STR,
        }, ("operation", "inputs")),
    },
    {
        "name": "trove_compile_evidence",
        "description": "Check an answer's claims against their refs: supported, "
                       "sufficient.",
        "parameters": _params({
            "proposal": {"type": "object",
                         "description": "{question, claims: [{text, refs}], computation?}"},
            "session_scope": _SCOPE,
            "session_id": _STR,
        }, ("proposal",)),
    },
    {
        "name": "trove_query_state",
        "description": "Stated facts, preferences, commitments with exact refs: current "
                       "and earlier values; as_of: what was true then.",
        "parameters": _params({
            "subject": _STR,
            "kind": {"type": "string", "enum": ["fact", "preference", "recommendation",
                                                "commitment", "action", "status"]},
            "as_of": _STR,
            **_ids("offset", "limit"),
            "snapshot": _STR,
            "session_scope": _SCOPE,
            "session_id": _STR,
        }),
    },
    {
        "name": "trove_retrieve",
        "description": "Fill typed evidence slots with exact refs; view_id rereads a "
                       "stored view.",
        "parameters": _params({
            "question": _STR,
            "slots": {"type": "array", "items": {"type": "object"},
                      "description": "[{name, type: date|amount|place|person|item, query}]"},
            "computation": _COMPUTATION,
            "view_id": _INT,
        }),
    },
]

SCHEMAS_BY_NAME: dict[str, dict] = {schema["name"]: schema for schema in TOOL_SCHEMAS}


def get_tool_schemas(config: Any = None) -> list[dict]:
    """Deep copies of the schemas, so the host (or a test) can never alter ours: every
    tool, or with a config only those it exposes (``TroveConfig.exposed_tool_names``:
    ``TROVE_EXPOSED_TOOLS`` minus the opt-in families that are off)."""
    if config is None:
        return copy.deepcopy(TOOL_SCHEMAS)
    exposed = set(config.exposed_tool_names)
    return copy.deepcopy([s for s in TOOL_SCHEMAS if s["name"] in exposed])


def wire_json(schemas: list[dict]) -> str:
    """The ``tools`` array as the host sends it: each schema wrapped as an OpenAI function
    tool and serialized the way the openai client does (compact, UTF-8 as is), which is
    what its tokens are counted on (bench/request_overhead.py, tests/test_tools.py)."""
    return json.dumps([{"type": "function", "function": s} for s in schemas],
                      ensure_ascii=False, separators=(",", ":"))


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
    ("trove_query_state", "limit"): (20, 50),
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
    for key in schema.get("required", ()):
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


def set_cursor(payload: dict, offset: int, returned: int, total: str, following_key: str) -> None:
    """``has_more`` and the next page's offset (``following_key``, None on the last page)
    of a page of ``returned`` items from ``offset`` out of ``payload[total]``.

    Why here: every offset-paged tool (trove_recent, trove_expand's sources,
    trove_evidence_pack, trove_query_state), and the trim that cuts its page to the cap, says where the next
    page starts by this one rule, so a page never repeats or skips an item."""
    following = offset + returned
    payload["has_more"] = following < payload[total]
    payload[following_key] = following if payload["has_more"] else None


def offset_arg(params: dict, key: str) -> int:
    """A non-negative offset/cursor argument (0 when absent)."""
    value = params.get(key, 0)
    if value < 0:
        raise ArgumentError(f"{key} must be 0 or more")
    return value


def snapshot_arg(kind: Any, params: dict, about: str, fresh: Callable[[], Any],
                 same: str) -> Any:
    """The ``snapshot`` a paged tool reads (``storage.snapshot.Snapshot.resume`` of
    ``kind``: a later page's token, else ``fresh()`` for a first page), a bad token a
    clear error naming what must stay the ``same`` between pages. One wording for
    every paged tool (trove_recent, trove_query_state)."""
    try:
        return kind.resume(params.get("snapshot"), about, fresh)
    except ValueError as exc:
        raise ArgumentError(f"snapshot: {exc}; pass the snapshot the first page returned "
                            f"with the same {same}, or none to start over") from None


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
    ``nested``; ``optional`` top-level keys dropped first, in order;
    ``blocks`` keys of those same holders (a message item's other ``fields``, its
    payload refs) replaced by ``<key>_omitted`` when one alone would take more
    than half the cap, or when the texts cut to their least still do not fit.
    """

    items: str | None = None
    on_trim: Callable[[dict, int], None] | None = None
    texts: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    nested: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ("fields", "externalized_refs")


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
    _drop_big_blocks(holders, shape.blocks, count, cap // 2)
    for last in (False, True):
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
        if not last:        # the texts are at their least: the blocks go, whatever their size
            _drop_big_blocks(holders, shape.blocks, count, -1)
    ok, text, _ = fits(payload)
    if ok:
        return text
    return error_json(name, "the result does not fit the response cap; "
                      "ask for fewer items or a smaller page", count, cap)


def _drop_big_blocks(holders: list[dict], keys: tuple[str, ...],
                     count: Callable[[str], int], limit: int) -> None:
    """Replace each block over ``limit`` tokens by ``<key>_omitted`` (a dict's key names,
    else true): a message's other fields (up to 2,000 characters) or its payload refs
    made it unreadable at a small cap, as the texts beside them were cut to nothing
    and it still did not fit."""
    for holder in holders:
        for key in keys:
            block = holder.get(key)
            if block is not None and count_safely(count, codec.dump_json(block)) > limit:
                del holder[key]
                holder[f"{key}_omitted"] = (sorted(str(k) for k in block)
                                            if isinstance(block, dict) else True)


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
        ref = holder.get("exact_ref")
        if isinstance(ref, dict) and ref.get("start") == holder["content_offset"]:
            # the ref's quote is the piece shown: it shrinks with it (left whole, it kept
            # the cut text twice and the item did not fit the smallest caps)
            ref["quote"], ref["end"] = holder[key], ref["start"] + len(holder[key])
    holder["expand"] = continuation(holder)


def continuation(item: dict) -> dict:
    """The ``trove_expand`` call that reads the rest of a message item or of an
    externalized payload page (whichever ``item`` is: the renderer cuts both).

    A row of another session was readable, so ``session_scope='all'`` reaches it
    again: an owned session through the scope, a row under a carried node through
    its lineage. Naming its session instead failed for a carried row whose session
    has no owner recorded (or another owner): a named session must be the caller's."""
    offset = item.get("next_content_offset",
                      item.get("content_offset", 0) + len(item.get("content") or ""))
    if "store_id" not in item and "externalized_ref" in item:
        return {"tool": "trove_expand",
                "args": {"externalized_ref": item["externalized_ref"], "content_offset": offset}}
    args = {"store_id": item["store_id"], "content_offset": offset}
    if "next_tool_calls_offset" in item:
        args["tool_calls_offset"] = item["next_tool_calls_offset"]
    if "session_id" in item:
        args["session_scope"] = "all"
    return {"tool": "trove_expand", "args": args}


def budget_chars(cap: int, parts: int = 1) -> int:
    """Characters each of ``parts`` texts may use before measuring."""
    total = max(0, cap - RESPONSE_OVERHEAD_TOKENS) * CHARS_PER_TOKEN_BUDGET
    return max(MIN_ITEM_CHARS, total // max(1, parts))
