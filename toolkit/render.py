"""How rows become tool answers: raw messages, summary nodes, search hits, cursors."""

from __future__ import annotations

import json

from ..evidence import refs as evidence_refs
from ..recall import query_plan, ranking, search
from ..schemas import continuation
from ..storage import codec
from ..storage.payloads import refs_in
from ..storage.timekeys import iso
from .scope import Access

FIELDS_MAX_CHARS = 2000         # other message keys (name, reasoning...) shown up to this size


def message_item(row: dict, access: Access, *, budget: int, content_offset: int = 0,
                 tool_calls_offset: int = 0, exact_ref: bool = False) -> dict:
    """A raw message for a response: exact text from an offset, within ``budget`` chars.

    ``content`` is the exact content string (or, when ``content_format`` is
    ``json``, the exact JSON text of the parts); ``tool_calls`` is the exact
    JSON text of the tool calls. Pages concatenate back to the stored bytes.
    """
    item = {"kind": "message", "store_id": row["store_id"], "role": row["role"],
            "time": iso(_row_time(row)), "content_format": row["content_format"]}
    if exact_ref:   # the ref's quote repeats the content piece: halve the piece
        budget = max(1, budget // 2)
    if row["session_id"] != access.current:
        item["session_id"] = row["session_id"]
    content = row["content"] if row["content_format"] in ("text", "json") else None
    more = False
    if content is not None:
        piece = content[content_offset:content_offset + budget]
        budget -= len(piece)
        item.update(content=piece, content_offset=content_offset, content_chars=len(content))
        if content_offset + len(piece) < len(content):
            item["next_content_offset"] = content_offset + len(piece)
            more = True
    calls = row.get("tool_calls")
    if calls is not None:
        item["tool_calls_chars"] = len(calls)
        if not more:
            piece = calls[tool_calls_offset:tool_calls_offset + max(budget, 0)]
            item.update(tool_calls=piece, tool_calls_offset=tool_calls_offset)
            if tool_calls_offset + len(piece) < len(calls):
                item["next_tool_calls_offset"] = tool_calls_offset + len(piece)
                more = True
    for key in ("tool_call_id", "tool_name"):
        if row.get(key):
            item[key] = row[key]
    # the exact original of each placeholder is one trove_expand away: in the content
    # and in the tool calls' arguments, where the payload guard moves base64 runs too
    refs = list(dict.fromkeys(refs_in(content or "") + refs_in(calls or "")))
    if refs:
        item["externalized_refs"] = refs
    _other_fields(row, item)
    item["has_more"] = more
    if more:
        item["expand"] = continuation(item)
    if exact_ref:
        _attach_exact_ref(item, row, content_offset if content is not None else 0,
                          len(content or ""), len(calls or ""))
    return item


def _attach_exact_ref(item: dict, row: dict, start: int, content_chars: int,
                      calls_chars: int) -> None:
    """The shown content piece as an exact ref (quote == content[start:end]), or why none.

    Why: a piece with no text (an empty message, a tool-calls-only turn, an offset at the
    end of the text) made a ref with an empty quote, which supports nothing and which
    every evidence tool refuses when cited; it is not handed out."""
    ref = evidence_refs.make_ref(row, start, start + len(item.get("content") or ""))
    if not ref["quote"]:
        item["exact_ref_omitted"] = ("the shown piece is empty (no text at this offset): an "
                                     "empty quote supports nothing")
        return
    item["exact_ref"] = {**ref, "content_hash": row["content_hash"],
                         "content_format": row["content_format"],
                         "content_chars": content_chars, "tool_calls_chars": calls_chars}


def _row_time(row: dict) -> float | None:
    return row["message_at"] if row.get("message_at") is not None else row.get("created_at")


def _other_fields(row: dict, item: dict) -> None:
    """Keys of the original message beyond role/content/tool calls (name, reasoning...)."""
    if not row.get("extra"):
        return
    extra = json.loads(row["extra"])
    text = codec.dump_json(extra)
    if len(text) <= FIELDS_MAX_CHARS:
        item["fields"] = extra
    else:
        item["fields_omitted"] = sorted(str(k) for k in extra)


def _node_summary(node: dict, access: Access, text_chars: int) -> dict:
    """A summary node for a list: metadata, its text (capped) and an expand handle; its
    coverage as the caller may count it (``Access.coverage``)."""
    text = node["text"]
    cover = access.coverage(node)
    item = {"kind": "summary", "node_id": node["node_id"], "depth": node["depth"],
            "time_from": iso(cover["time_from"]), "time_to": iso(cover["time_to"]),
            "message_count": cover["message_count"], "tokens": node["token_count"],
            "text": text[:text_chars]}
    if len(text) > text_chars:
        item["text_truncated"] = True
    if node["session_id"] != access.current:
        item["session_id"] = node["session_id"]
    item["expand"] = access.handle("node_id", node["node_id"], node["session_id"])
    return item


def _hit_item(fused: ranking.Fused, hit: search.Hit, plan: query_plan.QueryPlan, access: Access,
              explain: bool, score: float) -> dict:
    kind, key = fused.key
    row = hit.row
    if kind == "m":
        item = {"kind": "message", "store_id": key, "role": row["role"],
                "time": iso(_row_time(row)), "source": row["source"]}
    else:
        cover = access.coverage(row)
        item = {"kind": "summary", "node_id": key, "depth": row["depth"],
                "time_from": iso(cover["time_from"]), "time_to": iso(cover["time_to"])}
    if row["session_id"] != access.current:
        item["session_id"] = row["session_id"]
    item["snippet"] = search.snippet(plan, hit.text)
    item["expand"] = access.handle("store_id" if kind == "m" else "node_id", key,
                                   row["session_id"])
    if explain:
        item["score_parts"] = {**hit.parts, "score": round(hit.score, 4),
                               "fused": round(score, 6), "ranks": fused.ranks}
    return item


def _mark_more(payload: dict, kept: int) -> None:
    payload["has_more"] = True

