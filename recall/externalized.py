"""Externalized payloads as the tools see them: visibility, expansion, description, search.

A ref (``trove-payload:<sha256>``) is an id resolved inside the plugin's payload
folder only (``payloads.parse_ref``), never a path. Like a row, a payload is
readable only from a scope that can read a row referring to it: the ref's
hash is a search token of every row holding its placeholder (an image part's too),
so the referring rows are found by one exact match, whatever their age.
Searching payloads is bounded: the newest referring rows, a capped number of
payloads, a capped size each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

from ..storage import codec
from ..storage import payloads as payload_files
from . import query_plan, search

MAX_REFERRING_ROWS = 200     # newest rows with placeholders looked at per search
PLACEHOLDER_WORDS = ("trove", "externalized")   # how every placeholder header begins
MAX_PAYLOADS_SCANNED = 50    # payload files read per search
MAX_SCAN_BYTES = 2_000_000   # larger payloads are described, not scanned
PREVIEW_CHARS = 600
TEXT_KINDS = (payload_files.KIND_TOOL_OUTPUT,)


class PayloadAccessError(ValueError):
    """A ref that is malformed, unknown, or outside the caller's scope."""


def _sha(ref: str) -> str:
    try:
        return payload_files.parse_ref(ref)
    except payload_files.PayloadRefError as exc:
        raise PayloadAccessError(str(exc)) from exc


def visible(store, dag, store_payloads, ref: str, sessions: Sequence[str] | None,
            row_ok: Callable[[dict], bool] | None = None) -> bool:
    """Whether a row (or summary) of ``sessions`` (None = every session) refers to ``ref``,
    or, with ``row_ok`` (the caller's ``Access.message_ok``), any row the caller may read:
    a row under a node carried into the session lies outside its session tags, and its
    payload is as readable as the row itself.

    The ref's hash is a search token of every row holding its placeholder, in text and
    in an image part alike (``codec.flatten_content``), so the referring rows are found
    exactly, however old: one scoped match, then, for ``row_ok``, every row of any
    session holding the hash, page by page, each checked for the ref and by ``row_ok``."""
    sha = _sha(ref)
    if store_payloads is None or not store_payloads.exists(ref):
        return False
    tagged, joined = query_plan.scope_split(sessions)
    match = query_plan.scoped(query_plan.quote(sha), query_plan.tag_scope(tagged))
    if store.match_message_ids(match, limit=1, ranked=False, sessions=joined):
        return True
    if dag.match_node_ids(match, limit=1, ranked=False, sessions=joined):
        return True
    if row_ok is None or sessions is None:
        return False
    anywhere, below = query_plan.scoped(query_plan.quote(sha), None), None
    while True:
        page = store.match_message_ids(anywhere, limit=MAX_REFERRING_ROWS, ranked=False,
                                       below_store_id=below)
        rows = store.get_messages(i for i, _ in page)
        if any(_refers(row, sha) and row_ok(row) for row in rows.values()):
            return True
        if len(page) < MAX_REFERRING_ROWS:
            return False
        below = min(i for i, _ in page)


def _refers(row: dict, sha: str) -> bool:
    """Whether a row's stored content or tool calls hold a placeholder of ``sha``."""
    ref = payload_files.REF_PREFIX + sha
    return any(ref in (row.get(key) or "") for key in ("content", "tool_calls"))


def describe(store_payloads, ref: str) -> dict:
    """Kind, mime, size and a short preview of a textual payload (no path, ever)."""
    info = store_payloads.describe(ref)
    if info.get("kind") in TEXT_KINDS:
        info["preview"] = store_payloads.get_text(ref)[:PREVIEW_CHARS]
    return info


PAGE_MARGIN_TOKENS = 8    # room kept beside the measured metadata (the JSON around the text)
OPTIONAL_KEYS = ("created_at", "size_text", "mime")   # dropped by the renderer when short


def expand(store_payloads, ref: str, *, content_offset: int, budget_chars: int,
           budget_tokens: int, count_tokens) -> dict:
    """One page of a payload's exact original text, continuing with ``content_offset``.

    The page holds at most ``budget_chars`` characters and, dense text included,
    fits ``budget_tokens``: the room for the text is what the page's own metadata,
    measured, leaves (a fixed reserve starved small caps into empty pages whose
    cursor never moved). A page short of the end always carries at least one
    character, so paging always advances; the response cap still holds, as the
    renderer cuts the text further when it must."""
    text = store_payloads.get_text(ref)
    info = {k: v for k, v in store_payloads.describe(ref).items() if k != "ref"}
    page = {"kind": "externalized", "externalized_ref": ref, **info, "content": "",
            "content_offset": content_offset, "content_chars": len(text)}
    if content_offset < len(text):
        page.update(has_more=True, next_content_offset=content_offset,
                    expand={"tool": "trove_expand",
                            "args": {"externalized_ref": ref, "content_offset": content_offset}})
    lean = {k: v for k, v in page.items() if k not in OPTIONAL_KEYS}
    room = budget_tokens - count_tokens(codec.dump_json(lean)) - PAGE_MARGIN_TOKENS
    piece = text[content_offset:content_offset + max(budget_chars, 0)]
    while len(piece) > 1 and count_tokens(piece) > room:
        piece = piece[:len(piece) * 3 // 4]
    page["content"] = piece
    end = content_offset + len(piece)
    page["has_more"] = end < len(text)
    if page["has_more"]:
        page["next_content_offset"] = end
        page["expand"] = {"tool": "trove_expand",
                          "args": {"externalized_ref": ref, "content_offset": end}}
    else:
        page.pop("next_content_offset", None)
        page.pop("expand", None)
    return page


@dataclass
class PayloadHit:
    """One payload whose text matches the query."""

    ref: str
    score: float
    snippet: str
    store_id: int
    session_id: str = ""     # the referring row's session (its expand handle's scope)


def search_payloads(store, store_payloads, plan: query_plan.QueryPlan,
                    sessions: Sequence[str] | None, limit: int, *, dag=None,
                    carried: Collection[int] = ()) -> list[PayloadHit]:
    """Textual payloads referred to by rows of ``sessions``, or by rows under the
    ``carried`` nodes (a session's carried closure: rows it may read, and expand the
    payloads of, although they lie outside its session tags), that contain query terms.

    Score = share of the query's concepts (and needles) found in the payload."""
    if store_payloads is None or plan.empty:
        return []
    tagged, joined = query_plan.scope_split(sessions)
    match = query_plan.scoped(query_plan.quote(PLACEHOLDER_WORDS),
                              query_plan.tag_scope(tagged))
    ids = {i for i, _ in store.match_message_ids(match, limit=MAX_REFERRING_ROWS, ranked=False,
                                                 sessions=joined)}
    if carried and dag is not None:
        ids.update(dag.rows_under_containing(carried, " ".join(PLACEHOLDER_WORDS),
                                             limit=MAX_REFERRING_ROWS))
    rows = store.get_messages(sorted(ids, reverse=True)[:MAX_REFERRING_ROWS])
    hits: list[PayloadHit] = []
    seen: set[str] = set()
    for store_id in sorted(rows, reverse=True):
        for ref in payload_files.refs_in(rows[store_id].get("content") or ""):
            if ref in seen or len(seen) >= MAX_PAYLOADS_SCANNED:
                continue
            seen.add(ref)
            hit = _score_payload(store_payloads, ref, plan, store_id)
            if hit is not None:
                hit.session_id = rows[store_id]["session_id"]
                hits.append(hit)
    hits.sort(key=lambda h: (-h.score, -h.store_id))
    return hits[:limit]


def _score_payload(store_payloads, ref: str, plan: query_plan.QueryPlan,
                   store_id: int) -> PayloadHit | None:
    try:
        info = store_payloads.describe(ref)
        if info.get("kind") not in TEXT_KINDS or info.get("size", 0) > MAX_SCAN_BYTES:
            return None
        text = store_payloads.get_text(ref)
    except payload_files.PayloadError:
        return None
    folded = query_plan.fold(text)
    wanted = [c.variants for c in plan.concepts] + [(n,) for n in plan.needles]
    found = sum(1 for variants in wanted if any(query_plan.fold(v) in folded for v in variants))
    if not found:
        return None
    return PayloadHit(ref=ref, score=found / len(wanted), snippet=search.snippet(plan, text),
                      store_id=store_id)
