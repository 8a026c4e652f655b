"""The five evidence tools' handlers, called by ``tools.dispatch`` through one adapter.

``tools.py`` owns scope: it builds a ``Scope`` for each call from
``tools.Access`` (the sessions a call may read, a ``load(store_id)`` that
refuses a message outside them, and a ``grep`` that runs trove_grep with exact
refs), so no handler here decides on its own what may be read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timezone, tzinfo
from typing import Any, Callable

from ..recall import periods
from ..schemas import (ArgumentError, Shape, clamp, count_safely, offset_arg, set_cursor,
                       snapshot_arg)
from . import assertions, compute, pack, retrieve
from ..storage import codec
from ..storage.timekeys import iso

ITEM_MARGIN_TOKENS = 16     # the commas, brackets and cursor a trimmed page adds


@dataclass(frozen=True)
class Scope:
    """What one evidence call may read, decided by the tool layer."""

    current: str
    sessions: tuple[str, ...] | None        # searched sessions (None = all)
    load: Callable[[int], dict]             # a message by store_id, within scope (raises)
    grep: Callable[[str], list[dict]]       # exact refs of trove_grep hits for a query
    tz: tzinfo | None = None                # TROVE_TIMEZONE: the user's calendar days


def _mark_more(payload: dict, kept: int) -> None:
    payload["has_more"] = True


def evidence_pack(params: dict, ctx: Any, cap: int, scope: Scope) -> tuple[dict, Shape]:
    """Verify and hydrate a page of exact refs (see ``evidence.pack``)."""
    payload: dict = {}
    limit = clamp("trove_evidence_pack", "limit", params, payload)
    offset = offset_arg(params, "offset")
    try:
        payload.update(pack.evidence_pack(params["refs"], scope.load, offset=offset,
                                          limit=min(limit, max(1, cap // 150)),
                                          computation=params.get("computation"),
                                          tz=scope.tz))
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None

    room = _room(ctx, cap, {**{k: v for k, v in payload.items() if k != "computation"},
                            "items": [], "has_more": True, "next_offset": offset + limit})
    for at, item in enumerate(payload["items"]):
        if item["ok"] and _too_big(ctx, {**item, "before": "", "after": ""}, room):
            ref = item["ref"]
            payload["items"][at] = pack.failed_item(item["index"], ref["store_id"], (
                f"this item (a quote of {len(ref['quote'])} characters and what is read from "
                f"it) alone does not fit the response cap ({cap} tokens): cite a narrower "
                f"quote; the text is readable with trove_expand(store_id={ref['store_id']}, "
                f"content_offset={ref['start']})"))
    pack.count_items(payload)

    def on_trim(trimmed: dict, kept: int) -> None:
        set_cursor(trimmed, offset, kept, "total_refs", "next_offset")

    return payload, Shape(items="items", on_trim=on_trim, texts=("before", "after"),
                          optional=("computation",))


def compute_tool(params: dict, ctx: Any, cap: int, scope: Scope) -> tuple[dict, Shape]:
    """Exact arithmetic over verified refs with a hashed trace (see ``evidence.compute``).

    The trace repeats every input's quote (up to 50 of them), so over the response cap it
    is dropped whole (``omitted_for_size``) and the result and ``trace_hash`` stay: with
    no shape, a valid call over long quotes answered only "does not fit"."""
    try:
        return compute.compute(params["operation"], params["inputs"], scope.load,
                               unit=params.get("unit"),
                               absolute=bool(params.get("absolute")), tz=scope.tz), \
            Shape(optional=("trace",))
    except compute.ComputeError as exc:
        raise ArgumentError(f"{exc} (nothing was computed)") from None


def compile_evidence(params: dict, ctx: Any, cap: int, scope: Scope) -> tuple[dict, Shape]:
    """Check a proposal's claims and refs; report sufficiency (see ``evidence.pack``)."""
    try:
        brief = pack.compile_evidence(params["proposal"], scope.load, scope.tz)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    return brief, Shape(items="claims", on_trim=_mark_more, optional=("computation",))


def query_state(params: dict, ctx: Any, cap: int, scope: Scope) -> tuple[dict, Shape]:
    """Assertions with exact refs: current values, earlier ones, conflicts (opt-in sidecar),
    one page of subjects at a time (``offset`` / ``next_offset``, as trove_recent pages),
    so every subject is reachable without naming it; every page read at the first page's
    ``snapshot`` (``assertions.StatePin``), so assertions extracted between pages never
    make a page repeat or skip a subject or show a value the first page's order did not."""
    if not ctx.config.assertions_enabled:
        return {"enabled": False, "assertions": [], "note": "assertion extraction is off "
                "(TROVE_ASSERTIONS_ENABLED=true turns it on; it runs at compaction time)"}, Shape()
    about = state_about(params)
    at = snapshot_arg(assertions.StatePin, params, about,
                      lambda: assertions.pin(ctx.store.db, ctx.now()),
                      "subject, kind, as_of, session_scope and session_id")
    before, shown = as_of_bound(params.get("as_of"), min(at.now, ctx.now()), scope.tz)
    payload: dict = {**shown}
    limit = clamp("trove_query_state", "limit", params, payload)
    offset = offset_arg(params, "offset")
    # a search of this session covers the rows carried into it (as trove_grep's does)
    carried_into = scope.current if scope.sessions and scope.current in scope.sessions else None
    rows, total = assertions.query(ctx.store.db, scope.sessions, subject=params.get("subject"),
                                   kind=params.get("kind"), before=before, offset=offset,
                                   limit=limit, carried_into=carried_into, at=at)
    payload.update(assertions.state(rows, iso))
    payload.update(total=total, offset=offset)
    set_cursor(payload, offset, len(payload["assertions"]), "total", "next_offset")
    payload["snapshot"] = at.encode(about)
    room = _room(ctx, cap, {**payload, "assertions": [], "has_more": True,
                            "next_offset": offset + limit})
    for entry in payload["assertions"]:
        _fit_entry(ctx, entry, room, cap)

    def on_trim(trimmed: dict, kept: int) -> None:
        set_cursor(trimmed, offset, kept, "total", "next_offset")

    return payload, Shape(items="assertions", on_trim=on_trim)


def state_about(params: dict) -> str:
    """The query a trove_query_state snapshot pins, folded into its check: ``as_of`` as
    written (case and spacing aside), the subject as subjects compare
    (``assertions.subject_key``), the kind and the scope. A token carried to another of
    these is refused; ``offset`` and ``limit`` may change from page to page. (A JSON
    list: no text of one field can pass for another's.)"""
    as_of = " ".join(str(params.get("as_of") or "").lower().split())
    subject = assertions.subject_key(params.get("subject") or "")
    return codec.dump_json([as_of, subject, params.get("kind") or "",
                            params.get("session_scope", "current"), params.get("session_id") or ""])


def _room(ctx: Any, cap: int, envelope: dict) -> int:
    """Tokens one list item may take: the cap less the answer around the list."""
    return cap - count_safely(ctx.count_tokens, codec.dump_json(envelope)) - ITEM_MARGIN_TOKENS


def _too_big(ctx: Any, item: dict, room: int) -> bool:
    """Whether one item alone is over ``room`` tokens. A token is at least one UTF-8
    byte, so a smaller item is never counted."""
    text = codec.dump_json(item)
    return len(text.encode("utf-8", "surrogatepass")) > room and \
        count_safely(ctx.count_tokens, text) > room


def _fit_entry(ctx: Any, entry: dict, room: int, cap: int) -> None:
    """One subject within ``room``: the longest quotes of its values give way first, each
    value keeping its exact offsets and saying why its quote is missing.

    Why: the cap drops whole subjects only, and a model assertion's quote may be 2,000
    characters, so one subject over the cap failed the whole call."""
    values = [entry["current"], *entry.get("earlier", [])]
    while _too_big(ctx, entry, room):
        quoted = [v for v in values if "quote" in v["ref"]]
        if not quoted:
            return      # the rest is bounded text; the cap's own cutting answers for it
        value = max(quoted, key=lambda v: len(v["ref"]["quote"]))
        size, ref = len(value["ref"].pop("quote")), value["ref"]
        value["ref_error"] = (f"the quote ({size} characters) does not fit the response cap "
                              f"({cap} tokens) with its subject; read it with trove_expand("
                              f"store_id={ref['store_id']}, content_offset={ref['start']})")


def as_of_bound(value: str | None, now: float, tz: tzinfo | None) -> tuple[float | None, dict]:
    """``as_of`` as an exclusive bound on ``valid_from``, and how the answer reports it.

    Read like every other time argument (``recall.periods``, in TROVE_TIMEZONE, the zone
    ``valid_from`` days are midnights of): an instant counts itself (a naive time is
    local); a day, week or month counts whole, so ``as_of="2026-03-08"`` includes what
    became valid that day. Read as the day's UTC midnight it dropped a fact "since
    2026-03-08" west of UTC (valid from 08:00Z in Los Angeles) and kept it east of it.
    """
    if value is None:
        return None, {"as_of": None}
    try:
        found = periods.resolve(value, now, tz or timezone.utc)
    except ValueError as exc:
        raise ArgumentError(f"as_of: {exc}") from None
    if found.kind == "instant":
        return math.nextafter(found.start, math.inf), {"as_of": iso(found.start)}
    return found.end, {"as_of": iso(found.end), "as_of_period": found.label,
                       "as_of_note": "assertions valid before the end of the period"}


def retrieve_tool(params: dict, ctx: Any, cap: int, scope: Scope) -> tuple[dict, Shape]:
    """A bounded evidence controller for one answer (opt-in; see ``evidence.retrieve``)."""
    if not ctx.config.retrieve_enabled:
        return {"enabled": False, "slots": [], "note": "trove_retrieve is off "
                "(TROVE_RETRIEVE_ENABLED=true turns it on); use trove_grep with "
                "include_exact_ref, then trove_evidence_pack / trove_compute"}, Shape()
    try:
        if "view_id" in params:
            return retrieve.load_view(ctx.store.db, params["view_id"], (scope.current,)), \
                Shape(items="slots", on_trim=_mark_more)
        return retrieve.retrieve(str(params.get("question", "")), params.get("slots"),
                                 scope.grep, scope.load, ctx.store.db, scope.current,
                                 params.get("computation"), scope.tz), \
            Shape(items="slots", on_trim=_mark_more)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None


HANDLERS: dict[str, Callable[[dict, Any, int, Scope], tuple[dict, Shape]]] = {
    "trove_evidence_pack": evidence_pack,
    "trove_compute": compute_tool,
    "trove_compile_evidence": compile_evidence,
    "trove_query_state": query_state,
    "trove_retrieve": retrieve_tool,
}
