"""trove_expand, trove_describe, trove_load_session and trove_recent: reading exact rows."""

from __future__ import annotations

import re
from typing import Any

from ..diagnostics import caller
from ..ingest.policy import policy_for
from ..recall import externalized, periods, recent
from ..schemas import (ArgumentError, Shape, budget_chars, clamp, offset_arg, set_cursor,
                       snapshot_arg)
from ..storage import codec, timekeys
from ..storage.timekeys import iso
from ..storage.timeline import Pin, Timeline
from .render import _node_summary, _row_time, message_item
from .scope import Access, _load_message, _load_node, _unbound, bound_session, operator_view

PREVIEW_CHARS = 300
RECENT_MESSAGE_CAP = 500        # trove_recent: unsummarized messages listed at most
_REF_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def _check_ref(ref: str) -> None:
    """Externalized refs are ids, never paths."""
    if ".." in ref or "/" in ref or "\\" in ref or not _REF_PATTERN.fullmatch(ref):
        raise ArgumentError("externalized_ref must be a payload id (letters, digits, . _ : -), "
                            "never a path")


def _one_target(params: dict, keys: tuple[str, ...]) -> str:
    given = [k for k in keys if k in params]
    if len(given) != 1:
        raise ArgumentError(f"give exactly one of {', '.join(keys)}")
    return given[0]


def _externalized(params: dict, ctx: Any, current: str, cap: int, *,
                  describe: bool) -> tuple[dict, Shape]:
    """Describe or page an externalized payload a row of the caller's scope refers to."""
    ref = params["externalized_ref"]
    _check_ref(ref)
    access = Access(ctx, params, current)
    try:
        if not externalized.visible(ctx.store, ctx.dag, ctx.payloads, ref,
                                    access.search_sessions(), access.message_ok):
            raise ArgumentError(f"externalized_ref {ref!r} not found in this scope (pass "
                                "session_id or session_scope='all' for another session's)")
        if describe:
            return externalized.describe(ctx.payloads, ref), Shape(texts=("preview",))
        page = externalized.expand(ctx.payloads, ref,
                                   content_offset=offset_arg(params, "content_offset"),
                                   budget_chars=budget_chars(cap), budget_tokens=cap,
                                   count_tokens=ctx.count_tokens)
    except externalized.PayloadAccessError as exc:
        raise ArgumentError(str(exc)) from exc
    return page, Shape(texts=("content",), optional=externalized.OPTIONAL_KEYS)


def tool_expand(params: dict, ctx: Any, cap: int) -> tuple[dict, Shape]:
    """A node's sources page by page, or one raw message's exact text from an offset."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_expand", "sources")
    target = _one_target(params, ("node_id", "store_id", "externalized_ref", "rollup_id"))
    if target == "externalized_ref":
        return _externalized(params, ctx, current, cap, describe=False)
    access = Access(ctx, params, current)
    exact_ref = bool(params.get("include_exact_ref"))
    if target == "rollup_id":
        return _expand_rollup(params, ctx, access, cap, exact_ref)
    if target == "store_id":
        row = _load_message(ctx, access, params["store_id"])
        item = message_item(row, access, budget=budget_chars(cap),
                            content_offset=offset_arg(params, "content_offset"),
                            tool_calls_offset=offset_arg(params, "tool_calls_offset"),
                            exact_ref=exact_ref)
        return {"message": item,
                "covering_nodes": access.known_node_ids(ctx.dag.covering_nodes(row["store_id"]))}, \
            Shape(texts=("content", "tool_calls"), nested=("message",))
    node = _load_node(ctx, access, params["node_id"])
    payload: dict = {"node_id": node["node_id"], "depth": node["depth"], "child_count": 0}
    return _source_page(params, ctx, access, cap, exact_ref, payload,
                        ctx.dag.children(node["node_id"]))


def _expand_rollup(params: dict, ctx: Any, access: Access, cap: int,
                   exact_ref: bool) -> tuple[dict, Shape]:
    """A day/week/month rollup's sources page by page (rollups, summaries, messages)."""
    timeline = Timeline(ctx.store.db)
    rollup = timeline.get_rollups([params["rollup_id"]]).get(params["rollup_id"])
    if rollup is None:
        raise ArgumentError(f"rollup_id {params['rollup_id']} not found")
    if not access.owns_rollup(rollup):
        raise ArgumentError(f"rollup_id {params['rollup_id']} not found")
    if not _rollup_readable(timeline, access, rollup):
        raise ArgumentError(f"rollup_id {rollup['rollup_id']} covers other sessions; pass "
                            "session_scope='all' to read it")
    payload: dict = {"rollup_id": rollup["rollup_id"], "period": rollup["kind"],
                     "key": rollup["period_key"], "child_count": 0,
                     "state": timeline.freshness(rollup, policy_for(ctx.config).feeds_rollups)}
    if payload["state"] != "ready":
        payload["note"] = ("this rollup is stale (its material changed since it was built): "
                           "its sources below are current and scope-checked; child rollups "
                           "that are not ready are withheld")
    return _source_page(params, ctx, access, cap, exact_ref, payload,
                        timeline.sources(rollup["rollup_id"]))


def _source_page(params: dict, ctx: Any, access: Access, cap: int, exact_ref: bool,
                 payload: dict, children: list[dict]) -> tuple[dict, Shape]:
    """One page of a node's or a rollup's ordered sources, with its cursor. The count,
    the ordinals and the cursor are over the children the caller may learn exist
    (``_known_children``): another owner's child is neither listed nor counted, so a
    gap, a placeholder or a total never tells that it is there."""
    limit = clamp("trove_expand", "source_limit", params, payload)
    offset = offset_arg(params, "source_offset")
    known = _known_children(ctx, access, children)
    payload["child_count"] = len(known)
    page = known[offset:offset + limit]
    found = _child_rows(ctx, page)
    per_item = budget_chars(cap, len(page))
    payload["sources"] = _render_children(ctx, access, page, found, per_item, exact_ref,
                                          offset)
    set_cursor(payload, offset, len(page), "child_count", "next_source_offset")
    payload["source_offset"] = offset

    def on_trim(trimmed: dict, kept: int) -> None:
        set_cursor(trimmed, offset, kept, "child_count", "next_source_offset")

    return payload, Shape(items="sources", on_trim=on_trim, texts=("content", "text", "tool_calls"))


def _known_children(ctx: Any, access: Access, children: list[dict]) -> list[dict]:
    """The children whose existence the caller may learn (a removed one stays, shown as
    missing). When every session is the caller's owner's (``Access.alone``) that is all
    of them, without reading a row: a day rollup can have thousands of raw sources."""
    if access.alone():
        return children
    found = _child_rows(ctx, children)
    return [c for c in children if c["id"] not in found[c["kind"]]
            or _known_child(access, c, found[c["kind"]][c["id"]])]


def _child_rows(ctx: Any, children: list[dict]) -> dict[str, dict]:
    """Each child's row by kind (``rollup``, ``node``, ``message``)."""
    def ids(kind: str) -> list[int]:
        return [c["id"] for c in children if c["kind"] == kind]

    return {"node": ctx.dag.get_nodes(ids("node")),
            "message": ctx.store.get_messages(ids("message")),
            "rollup": Timeline(ctx.store.db).get_rollups(ids("rollup"))}


def _render_children(ctx: Any, access: Access, children: list[dict], found: dict[str, dict],
                     per_item: int, exact_ref: bool, offset: int) -> list[dict]:
    """A page of a node's or rollup's children the caller may learn exist
    (``_known_children``), each checked on its own: a child the caller may not read
    (another session of its owner) or a child rollup that is not ready (rebuilt since
    with other material) is withheld, never rendered. Ordinals count from ``offset``
    over those children."""
    timeline = Timeline(ctx.store.db)
    eligible = policy_for(ctx.config).feeds_rollups
    items = []
    for ordinal, child in enumerate(children, start=offset):
        row = found[child["kind"]].get(child["id"])
        if row is None:
            item = {"kind": child["kind"], "missing": True, "id": child["id"]}
        elif child["kind"] == "rollup":
            if not _rollup_readable(timeline, access, row):
                item = {"kind": "rollup", "withheld": "out of scope", "id": child["id"]}
            elif timeline.freshness(row, eligible) != "ready":
                item = {"kind": "rollup", "withheld": "stale", "id": child["id"],
                        "period": row["kind"], "key": row["period_key"]}
            else:
                item = recent.rollup_item(row, per_item)
        elif child["kind"] == "node":
            item = (_node_summary(row, access, per_item) if access.node_ok(row) else
                    {"kind": "node", "withheld": "out of scope", "id": child["id"]})
        else:
            item = (message_item(row, access, budget=per_item, exact_ref=exact_ref)
                    if access.message_ok(row) else
                    {"kind": "message", "withheld": "out of scope", "id": child["id"]})
        item["ordinal"] = ordinal
        items.append(item)
    return items


def _known_child(access: Access, child: dict, found: dict) -> bool:
    """Whether the caller may learn a child's id (``Access.known_node_ids``): another
    owner's row, summary or rollup under a readable parent is withheld without it."""
    if child["kind"] == "rollup":
        return access.owns_rollup(found)
    if child["kind"] == "node":
        return access.knows_node(found)
    return access.knows_row(found)


def _known_range(access: Access, node: dict) -> dict:
    """A summary's first and last row ids, each None when another owner's row."""
    known = set(access.known_store_ids([node["first_store_id"], node["last_store_id"]]))
    return {key: node[key] if node[key] in known else None
            for key in ("first_store_id", "last_store_id")}


def tool_describe(params: dict, ctx: Any, cap: int) -> tuple[dict, Shape]:
    """Metadata and a short preview of a node or a message, without loading children."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_describe", "results")
    target = _one_target(params, ("node_id", "store_id", "externalized_ref"))
    if target == "externalized_ref":
        return _externalized(params, ctx, current, cap, describe=True)
    access = Access(ctx, params, current)
    if target == "store_id":
        row = _load_message(ctx, access, params["store_id"])
        text = codec.message_text(codec.decode_message(row))
        return {"kind": "message", "store_id": row["store_id"], "role": row["role"],
                "session_id": row["session_id"], "source": row["source"],
                "time": iso(_row_time(row)), "content_format": row["content_format"],
                "content_chars": len(row["content"] or ""),
                "tool_calls_chars": len(row["tool_calls"] or ""), "tokens": row["token_count"],
                "covering_nodes": access.known_node_ids(ctx.dag.covering_nodes(row["store_id"])),
                "preview": text[:PREVIEW_CHARS],
                "expand": access.handle("store_id", row["store_id"], row["session_id"])}, \
            Shape(texts=("preview",))
    node = _load_node(ctx, access, params["node_id"])
    children = _known_children(ctx, access, ctx.dag.children(node["node_id"]))
    cover = access.coverage(node)
    return {"kind": "summary", "node_id": node["node_id"], "session_id": node["session_id"],
            "carried": node["session_id"] != current and node["node_id"] in access.carried(),
            "depth": node["depth"],
            "level": node["level"], "model": (node["model"] if operator_view(ctx, current)
                                              else caller.node_model(node["model"])),
            "time_from": iso(cover["time_from"]), "time_to": iso(cover["time_to"]),
            "child_count": len(children),
            "child_kind": children[0]["kind"] if children else None,
            "descendant_messages": cover["message_count"],
            **_known_range(access, node),
            "tokens": node["token_count"], "source_tokens": cover["source_token_count"],
            "topics": node["topics"],
            "parents": access.known_node_ids(ctx.dag.parents(node["node_id"])),
            "preview": node["text"][:PREVIEW_CHARS],
            "expand": access.handle("node_id", node["node_id"], node["session_id"])}, \
        Shape(texts=("preview",), optional=("topics",))


def tool_load_session(params: dict, ctx: Any, cap: int) -> tuple[dict, Shape]:
    """One ordered page of a session's raw transcript, continuing with ``next_cursor``."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_load_session", "messages")
    access = Access(ctx, params, current)
    target = access.named or current
    if target != current and ctx.store.get_session(target) is None \
            and not ctx.store.session_messages(target, 0, 1):
        raise ArgumentError(f"session {target!r} not found")
    payload: dict = {"session_id": target}
    limit = clamp("trove_load_session", "limit", params, payload)
    after = offset_arg(params, "after_store_id")
    rows = ctx.store.session_messages(target, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    per_item = budget_chars(cap, len(rows))
    exact_ref = bool(params.get("include_exact_ref"))
    payload["after_store_id"] = after
    payload["messages"] = [message_item(r, access, budget=per_item, exact_ref=exact_ref)
                           for r in rows]
    payload["has_more"] = more
    payload["next_cursor"] = rows[-1]["store_id"] if more else None

    def on_trim(trimmed: dict, kept: int) -> None:
        trimmed["has_more"] = True
        trimmed["next_cursor"] = trimmed["messages"][kept - 1]["store_id"] if kept else after

    return payload, Shape(items="messages", on_trim=on_trim, texts=("content", "tool_calls"))


def tool_recent(params: dict, ctx: Any, cap: int) -> tuple[dict, Shape]:
    """What happened in a natural period: ready rollups, else summaries, else raw messages."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_recent", "items")
    scope = params.get("session_scope", "current")
    access = Access(ctx, {"session_scope": scope}, current)
    timeline = Timeline(ctx.store.db)
    asked = params.get("period", "today")
    about = f"{' '.join(asked.lower().split())}|{scope}"      # the query a snapshot pins
    pin = _recent_pin(params, timeline, ctx.now(), about)
    try:
        period = periods.resolve(asked, min(pin.now, ctx.now()),
                                 timekeys.zone_or_utc(ctx.config.timezone))
    except ValueError as exc:
        raise ArgumentError(f"period: {exc}") from None
    payload: dict = {"period": period.label, "from": iso(period.start), "to": iso(period.end),
                     "time_zone": ctx.config.timezone, "session_scope": scope}
    limit = clamp("trove_recent", "limit", params, payload)
    offset = offset_arg(params, "offset")
    found = recent.select(
        ctx.store, ctx.dag, timeline, period.start, period.end,
        sessions=access.search_sessions(),
        extra_nodes=([] if scope == "all" else
                     list(ctx.dag.get_nodes(ctx.dag.carried_node_ids(current)).values())),
        node_ok=access.node_ok, message_ok=access.message_ok,
        session_ok=access.allows_session,
        rollup_ok=lambda r: _rollup_readable(timeline, access, r),
        owners=access.rollup_owners(), time_zone=ctx.config.timezone,
        eligible=policy_for(ctx.config).feeds_rollups, message_cap=RECENT_MESSAGE_CAP, pin=pin)
    page = found.items[offset:offset + limit]
    per_item = budget_chars(cap, len(page))
    payload["used"] = found.used
    payload["items"] = [_recent_item(kind, row, access, per_item) for kind, row in page]
    payload["total"] = len(found.items)
    payload["offset"] = offset
    set_cursor(payload, offset, len(page), "total", "next_offset")
    payload["snapshot"] = pin.encode(about)
    if found.skipped_stale:
        payload["stale_rollups_skipped"] = found.skipped_stale
    if found.sessions_capped:
        payload["sessions_note"] = (f"only the {recent.SESSION_SCAN} sessions active last in "
                                    "this period are listed; narrow the period")
    if found.messages_capped:
        payload["note"] = (f"only the newest {RECENT_MESSAGE_CAP} unsummarized messages are "
                           "listed; narrow the period or use trove_load_session")
    elif not found.items:
        payload["note"] = "nothing was stored in this period" + (
            "" if scope == "all" else " in this session (try session_scope='all')")

    def on_trim(trimmed: dict, kept: int) -> None:
        set_cursor(trimmed, offset, kept, "total", "next_offset")

    return payload, Shape(items="items", on_trim=on_trim, texts=("text", "content", "tool_calls"))


def _recent_pin(params: dict, timeline: Timeline, now: float, about: str) -> Pin:
    """The store trove_recent reads: the one its ``snapshot`` names (a later page: the
    same list as the first page, whatever was stored, compacted or rolled up since),
    else the store now (a first page, which returns it; a blank one, as models pass
    for an optional argument, is none)."""
    return snapshot_arg(Pin, params, about, lambda: timeline.pin(now),
                        "period and session_scope")


def _recent_item(kind: str, row: dict, access: Access, per_item: int) -> dict:
    if kind == "rollup":
        return recent.rollup_item(row, per_item)
    if kind == "node":
        return _node_summary(row, access, per_item)
    if kind == "session":
        return _session_digest(row, access, per_item)
    return message_item(row, access, budget=per_item)


def _session_digest(row: dict, access: Access, per_item: int) -> dict:
    """A session of the period without summaries, in a few lines, with the handle
    that pages its raw messages from the first one of the period."""
    session = row["session_id"]
    item = {"kind": "session", "session_id": session, "from": iso(row["first_at"]),
            "to": iso(row["last_at"]), "message_count": row["message_count"],
            "first_request": (row["first_request"] or "")[:max(40, per_item // 2)] or None,
            "key_terms": row["key_terms"]}
    if row.get("first_request_truncated") or (
            row["first_request"] and len(row["first_request"]) > max(40, per_item // 2)):
        item["first_request_truncated"] = True
    args: dict = {"after_store_id": row["first_store_id"] - 1}
    if session != access.current:
        args["session_id"] = session
    item["load"] = {"tool": "trove_load_session", "args": args}
    return item


def _rollup_readable(timeline: Timeline, access: Access, rollup: dict) -> bool:
    """Whether a caller may read a rollup: every session under it is in its scope."""
    return all(access.allows_session(s) for s in timeline.sessions_of(rollup["rollup_id"]))
