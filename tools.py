"""The trove_* tool handlers behind one dispatcher that always answers JSON.

``dispatch(name, args, ctx)`` validates the arguments against the schemas in
``schemas.py``, runs the handler and renders the result so that it never
exceeds ``config.tool_response_max_tokens`` (measured with the engine's own
token counter on the final JSON): lists lose their tail and report a cursor,
long texts are cut and report where to continue. Any failure becomes
``{"error": ..., "tool": name}``; a traceback never reaches the model.

Scope (design invariant 6): every tool works inside the calling engine's
session. Another session is reachable only when the call names it
(``session_id``) or asks for ``session_scope="all"``; nodes carried into this
session from an older one, and what lies under them, count as this session's.
An unbound engine (no session id) gets empty "unbound" answers.

The handlers live in ``toolkit/`` by concern (``scope``, ``render``,
``search_tools``, ``expand_query``, ``read_tools``); this module keeps the
context, the dispatcher, the handler table and the status/inspect/doctor tools.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .storage import codec, faults, timekeys
from .storage.timekeys import iso
from .diagnostics import brief, caller, health
from .evidence import handlers as evidence_handlers, refs as evidence_refs
from .config import MIN_TOOL_RESPONSE_TOKENS, TroveConfig
from .dag import Dag
from .recall import callmemo
from .schemas import (
    SCHEMAS_BY_NAME,
    ArgumentError,
    Shape,
    error_json,
    render,
    validate,
)
from .store import Store
from .toolkit.expand_query import tool_expand_query
from .toolkit.read_tools import tool_describe, tool_expand, tool_load_session, tool_recent
from .toolkit.render import _mark_more
from .toolkit.scope import (Access, _load_message, _unbound, bound_session, is_operator,
                            operator_view)
from .toolkit.search_tools import tool_grep, tool_recall

TOOL_NAMES: tuple[str, ...] = tuple(SCHEMAS_BY_NAME)


@dataclass
class ToolContext:
    """Everything a tool call may use; built by the engine for each call."""

    store: Store
    dag: Dag
    config: TroveConfig
    count_tokens: Callable[[str], int]
    session_id: str | None
    conversation_id: str | None
    current_turn_store_id: int | None
    status: Callable[[], dict]
    llm_call: Callable[[str, str | None, float], str] | None
    data_dir: Path
    now: Callable[[], float] = field(default=time.time)
    payloads: Any = None  # the PayloadStore of externalized payloads (None: none here)
    operator: bool = False  # an operator command (/trove, scripts/trove.py): every owner
    semantic: Any = None  # recall.semantic.Semantic when embeddings are configured


# ---------------------------------------------------------------- dispatch
def dispatch(name: str, args: Any, ctx: ToolContext) -> str:
    """Run one tool call and return its JSON answer; never raises."""
    cap = _response_cap(ctx)
    try:
        handler = HANDLERS.get(name)
        if handler is None:
            raise ArgumentError(f"unknown tool {str(name)[:60]!r}; known: {', '.join(TOOL_NAMES)}")
        params, ignored = validate(name, _as_dict(args))
        if name == "trove_expand" and "max_tokens" in params:
            cap = max(MIN_TOOL_RESPONSE_TOKENS, min(cap, params["max_tokens"]))
        with callmemo.one_call():     # work the call repeats is done once (recall/callmemo)
            payload, shape = handler(params, ctx, cap)
        if ignored:
            payload["ignored_arguments"] = ignored
        return render(payload, shape, ctx.count_tokens, cap, name)
    except ArgumentError as exc:
        return error_json(name, str(exc), ctx.count_tokens, cap)
    except Exception as exc:  # any failure is an answer, never a traceback
        if isinstance(exc, sqlite3.Error):  # say what is wrong with the file and the fix
            fault = faults.describe(ctx.config.database_display, exc, str(name)[:60])
            text = f"{fault['problem']}; repair: {fault['repair']}"
            if not _operator_or_unknown(ctx):   # a gateway user: what is wrong, not where
                text = caller.without_paths(text, ctx.config.database_display)
            return error_json(name, text, ctx.count_tokens, cap)
        return error_json(name, f"{type(exc).__name__}: {exc}", ctx.count_tokens, cap)


def _operator_or_unknown(ctx: ToolContext) -> bool:
    """``operator_view`` for a call that failed on the database: when the owner cannot be
    read either, whoever runs the process decides (``is_operator(None)``)."""
    try:
        return operator_view(ctx, bound_session(ctx))
    except Exception:
        return bool(ctx.operator) or is_operator(None)


def _response_cap(ctx: ToolContext) -> int:
    try:
        return int(ctx.config.tool_response_max_tokens)
    except Exception:
        return 4000


def _as_dict(args: Any) -> dict:
    if args is None:
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ArgumentError("arguments must be a JSON object") from None
    if not isinstance(args, dict):
        raise ArgumentError("arguments must be a JSON object")
    return args


# ---------------------------------------------------------------- operator tools
def _status_snapshot(ctx: ToolContext) -> dict:
    """The engine's status as plain JSON data (a failing status callable is reported)."""
    try:
        return json.loads(codec.dump_json(ctx.status() or {}))
    except Exception as exc:
        return {"status_error": f"{type(exc).__name__}: {exc}"[:200]}


def tool_status(params: dict, ctx: ToolContext, cap: int) -> tuple[dict, Shape]:
    """What matters now, compactly (``brief.model_status``); the inventory is trove_inspect.
    A caller who is not the operator (``operator_view``) sees no database-wide figure."""
    current, status = bound_session(ctx), _status_snapshot(ctx)
    report = brief.model_status(ctx.store, ctx.dag, ctx.config, status, session_id=current)
    if not operator_view(ctx, current):   # a gateway user: no database-wide figure or path
        report = caller.model_status(report, status)
    if report["last_compaction"] and report["last_compaction"].get("at"):
        report["last_compaction"]["at"] = iso(report["last_compaction"]["at"])
    return report, Shape(optional=("last_compaction", "background_prepare"))


def tool_inspect(params: dict, ctx: ToolContext, cap: int) -> tuple[dict, Shape]:
    """Operator inventory of this session: frontier, carried nodes, counts, last decisions,
    plus the full status (engine snapshot, database, token counter, every setting); a
    caller who is not the operator (``operator_view``) gets its own engine's status only,
    its lifecycle keys among them. Frontier counts are what the caller may count
    (``Access.coverage``)."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_inspect", "frontier")
    status = _status_snapshot(ctx)
    counter = getattr(getattr(ctx.count_tokens, "__self__", None), "name", None)
    operator = operator_view(ctx, current)
    full = (health.status_report(ctx.store, ctx.dag, ctx.config, status, session_id=current,
                                 counter_name=counter) if operator else
            caller.status_report(status, session_id=current, counter_name=counter))
    report = {**health.inspect_report(ctx.store, ctx.dag, status if operator else
                                      caller.engine(status), current,
                                      cover=Access(ctx, {}, current).coverage),
              "status": full}
    for node in report["frontier"]:
        node["time_from"], node["time_to"] = iso(node["time_from"]), iso(node["time_to"])
    return report, Shape(items="frontier", on_trim=_mark_more,
                         optional=("status", "carried_node_ids"))


def tool_doctor(params: dict, ctx: ToolContext, cap: int) -> tuple[dict, Shape]:
    """Read-only health checks (see ``health.run_doctor``; its own engine's only for a
    caller who is not the operator, ``operator_view``)."""
    current = bound_session(ctx)
    report = health.run_doctor(ctx.store, ctx.dag, ctx.config, _status_snapshot(ctx),
                               session_id=current, full=bool(params.get("full")),
                               operator=operator_view(ctx, current))
    return report, Shape(items="checks", on_trim=_mark_more, texts=("detail",))


# ---------------------------------------------------------------- evidence tools
def _evidence_tool(name: str) -> Callable[[dict, ToolContext, int], tuple[dict, Shape]]:
    """The handler of one evidence tool, given the scope this call may read (via Access)."""
    def handler(params: dict, ctx: ToolContext, cap: int) -> tuple[dict, Shape]:
        current = bound_session(ctx)
        if not current:
            return _unbound(name, "items")
        access, cache = Access(ctx, params, current), {}

        def load(store_id: int) -> dict:
            if store_id not in cache:   # a row rewritten by transcript GC keeps its original
                cache[store_id] = evidence_refs.with_original(
                    _load_message(ctx, access, store_id), ctx.payloads)
            return cache[store_id]

        def grep(query: str) -> list[dict]:
            found = json.loads(dispatch("trove_grep", {"query": query, "limit": 10,
                                                       "include_exact_ref": True}, ctx))
            return [h["exact_ref"] for h in found.get("results", []) if h.get("exact_ref")]

        scope = evidence_handlers.Scope(current, access.search_sessions(), load, grep,
                                        timekeys.zone_or_utc(ctx.config.timezone))
        return evidence_handlers.HANDLERS[name](params, ctx, cap, scope)
    return handler


HANDLERS: dict[str, Callable[[dict, ToolContext, int], tuple[dict, Shape]]] = {
    "trove_grep": tool_grep,
    "trove_expand": tool_expand,
    "trove_describe": tool_describe,
    "trove_load_session": tool_load_session,
    "trove_recent": tool_recent,
    "trove_expand_query": tool_expand_query,
    "trove_recall": tool_recall,
    "trove_status": tool_status,
    "trove_inspect": tool_inspect,
    "trove_doctor": tool_doctor,
    **{name: _evidence_tool(name) for name in evidence_handlers.HANDLERS},
}
