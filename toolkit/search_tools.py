"""trove_grep and trove_recall: ranked search over raw messages, summaries and payloads."""

from __future__ import annotations

import math
from typing import Any

from ..recall import arms, externalized, query_plan, search, semantic, periods
from ..schemas import ArgumentError, Shape, clamp
from ..storage import timekeys
from ..storage.timekeys import iso
from ..evidence import refs as evidence_refs
from .render import _hit_item, _mark_more, _row_time
from .scope import Access, _unbound, bound_session

RECALL_SESSION_BIAS = 1.0       # recall: hits of the calling session count double (bench/README.md)
RECALL_CONVERSATION_BIAS = 0.05
RECALL_RECENCY_BIAS = 0.05      # decays with a 30-day time constant
RECALL_GREP_ORDER = 0.5         # recall orders this session's rows by its own rank and
                                # trove_grep's, this the share of grep's (0 = off; real
                                # chats hybrid: recall 0.381 -> 0.387, grep 0.407;
                                # _dealt_in_grep_order, bench/README.md)


def _summary_corpus(ctx: Any, access: Access, source: str | None) -> search.SummaryCorpus:
    """This session's summaries plus the carried lineage, optionally by raw-source lineage."""
    closure = access.carried()
    owners = {n["session_id"] for n in ctx.dag.get_nodes(closure).values()} if closure else set()

    def accept(node: dict) -> bool:
        if not access.node_ok(node):
            return False
        return source is None or bool(ctx.dag.nodes_with_source([node["node_id"]], source))

    return search.SummaryCorpus(ctx.dag, [access.current, *sorted(owners - {access.current})],
                                accept)


def tool_grep(params: dict, ctx: Any, cap: int) -> tuple[dict, Shape]:
    """Search this session's raw messages and summaries (or a named/all scope, raw only)."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_grep", "results")
    access = Access(ctx, params, current)
    plan = query_plan.parse_query(params["query"])
    payload: dict = {"query": plan.text[:200], "session_scope": params.get(
        "session_scope", "session" if access.named else "current")}
    limit = clamp("trove_grep", "limit", params, payload)
    content_scope = params.get("content_scope", "messages")
    notes: list[str] = []
    if content_scope == "externalized":
        payload["results"] = _payload_hits(ctx, access, plan, limit)
        return payload, Shape(items="results", on_trim=_mark_more, texts=("snippet",))
    if plan.truncated:
        payload["query_truncated"] = True
    time_from, time_to = time_filter(params, ctx, payload)
    raw_only = bool(params.get("role")) or time_from is not None or time_to is not None
    sessions = access.search_sessions()
    broad = sessions != (current,)
    scope = search.MessageScope(
        sessions, role=params.get("role"), source=params.get("source"),
        time_from=time_from, time_to=time_to, current_session=current,
        current_turn_store_id=None if params.get("include_current_turn")
        else ctx.current_turn_store_id)
    summaries = None if (raw_only or broad) else _summary_corpus(ctx, access, params.get("source"))
    if raw_only or broad:
        payload["summary_results_omitted"] = True
    choice = semantic.choose_mode(ctx.semantic, params.get("mode"), plan.text,
                                  access.search_sessions(), _hidden_turn(ctx, scope))
    payload["mode"] = choice.mode
    if choice.coverage is not None:
        payload["vector_coverage"] = round(choice.coverage, 3)
    notes += [choice.note] if choice.note else []
    fused, hits, found_notes, stages = arms.search_arms(ctx, plan, limit + 1,
                                                    message_scope=scope, summaries=summaries,
                                                    choice=choice)
    fused = arms.placed(ctx.dag, fused, hits, limit)
    explain = bool(params.get("explain"))
    payload["results"] = [_hit_item(f, hits[f.key], plan, access, explain, f.score)
                          for f in fused[:limit]]
    payload["has_more"] = len(fused) > limit
    if content_scope == "both":
        payload["externalized_results"] = _payload_hits(ctx, access, plan, limit)
    if params.get("include_exact_ref"):
        for item in payload["results"]:
            if item["kind"] == "message":
                item["exact_ref"] = evidence_refs.best_sentence_ref(
                    hits[("m", item["store_id"])].row, plan)
    if explain:
        payload["stages"] = stages
    if notes + found_notes:
        payload["notes"] = notes + found_notes
    return payload, Shape(items="results", on_trim=_mark_more, texts=("snippet",))


def _hidden_turn(ctx: Any, scope: search.MessageScope) -> tuple[str, int] | None:
    """The current turn's rows, which a search hides (and vector coverage ignores)."""
    at = scope.current_turn_store_id
    return (scope.current_session, at) if at is not None and scope.current_session else None


def time_filter(params: dict, ctx: Any, payload: dict) -> tuple[float | None, float | None]:
    """The ``period`` / ``time_from`` / ``time_to`` filter as a window in the configured
    zone (reported in the payload); an unreadable value is an argument error."""
    try:
        start, end = periods.window(params.get("period"), params.get("time_from"),
                                    params.get("time_to"), ctx.now(),
                                    timekeys.zone_or_utc(ctx.config.timezone))
    except ValueError as exc:
        raise ArgumentError(f"time filter: {exc}") from None
    if start is not None or end is not None:
        payload["time_window"] = {"from": iso(start), "to": iso(end),
                                  "time_zone": ctx.config.timezone}
    return start, end


def tool_recall(params: dict, ctx: Any, cap: int) -> tuple[dict, Shape]:
    """Search every session and all time; fuse raw and summary arms, favouring this session."""
    current = bound_session(ctx)
    if not current:
        return _unbound("trove_recall", "results")
    access = Access(ctx, {"session_scope": "all"}, current)
    plan = query_plan.parse_query(params["query"])
    payload: dict = {"query": plan.text[:200]}
    limit = clamp("trove_recall", "limit", params, payload)
    sessions = access.search_sessions()  # every session of the caller's owner
    time_from, time_to = time_filter(params, ctx, payload)
    timed = time_from is not None or time_to is not None
    scope = search.MessageScope(sessions, time_from=time_from, time_to=time_to,
                                current_session=current,
                                current_turn_store_id=ctx.current_turn_store_id)
    own = search.MessageScope((current,), time_from=time_from, time_to=time_to,
                              current_session=current,
                              current_turn_store_id=ctx.current_turn_store_id)
    choice = semantic.choose_mode(ctx.semantic, None, plan.text, sessions,
                                  _hidden_turn(ctx, scope))
    if timed:
        payload["summary_results_omitted"] = True
    fused, hits, notes, stages = arms.search_arms(
        ctx, plan, limit * 2, message_scope=scope,
        summaries=None if timed else search.SummaryCorpus(ctx.dag, sessions),
        session_scope=own, choice=choice)
    payload["mode"] = choice.mode
    now = ctx.now()
    biased = {f.key: f.score * _recall_bias(hits[f.key].row, current, ctx.conversation_id, now)
              for f in fused}
    if RECALL_GREP_ORDER > 0:
        mine = _grep_list(ctx, plan, limit * 2, own, timed, choice, hits)
        fused, biased = _dealt_in_grep_order(fused, biased, mine,
                                             {k for k in biased if k[0] == "m"
                                              and hits[k].row["session_id"] == current})
    placed = arms.placed(ctx.dag, sorted(fused, key=lambda f: -biased[f.key]), hits, limit)
    ranked = [(biased[f.key], f) for f in placed]
    explain = bool(params.get("explain"))
    payload["results"] = [_hit_item(f, hits[f.key], plan, access, explain, score)
                          for score, f in ranked[:limit]]
    payload["has_more"] = len(ranked) > limit
    if explain:
        payload["stages"] = stages
    if notes:
        payload["notes"] = notes
    return payload, Shape(items="results", on_trim=_mark_more, texts=("snippet",))


def _grep_list(ctx: Any, plan: query_plan.QueryPlan, limit: int, own: search.MessageScope,
               timed: bool, choice: semantic.ModeChoice, hits: dict) -> list:
    """This session's raw rows as ``trove_grep`` would list them (its arms, its summary
    corpus beside them); their hits are added to ``hits``."""
    summaries = None if timed else _summary_corpus(ctx, Access(ctx, {}, own.current_session),
                                                   None)
    mine, more, _, _ = arms.search_arms(ctx, plan, limit, message_scope=own,
                                        summaries=summaries, choice=choice)
    for key, hit in more.items():
        hits.setdefault(key, hit)
    return [f for f in mine if f.key[0] == "m"]


def _dealt_in_grep_order(fused: list, biased: dict, mine: list, own: set) -> tuple[list, dict]:
    """``(fused, scores)`` with this session's rows (``own``) re-ranked by their rank in
    recall's list and in ``trove_grep``'s (``mine``: grep's fused list over this
    session), keeping the scores they earned.

    Why: recall fuses arms over every session, so its order of this session's rows
    drifts from grep's (arms normalised on other chats' rows, every session's words
    counted for rarity), and recall missed replies that grep lists (real chats
    hybrid: recall 0.381 against grep 0.407). Each order is right where the other
    is wrong, so neither wins alone (grep's alone failed the two-session suite of
    tests/test_recall_quality.py): a row's place inside this session is the mean of
    its two ranks weighted by ``RECALL_GREP_ORDER``. The scores this session's rows
    earned in the all-session fusion (session preference included) are then dealt,
    best first, in that order, so other sessions' rows meet the same competition as
    before. A row only grep lists takes the lowest of those scores.
    """
    by_grep = {f.key: rank for rank, f in enumerate(mine)}
    by_recall = {key: rank for rank, key in enumerate(sorted(own, key=lambda k: (-biased[k], k)))}

    def place(key) -> tuple[float, int]:
        grep_rank = by_grep.get(key, len(by_grep))
        return (RECALL_GREP_ORDER * grep_rank
                + (1 - RECALL_GREP_ORDER) * by_recall.get(key, len(by_recall)), grep_rank)

    order = sorted(set(by_grep) | own, key=place)
    pool = sorted((biased[key] for key in own), reverse=True)
    pool += [pool[-1] if pool else 0.0] * (len(order) - len(pool))
    known = {f.key for f in fused}
    return fused + [f for f in mine if f.key not in known], {**biased, **dict(zip(order, pool))}


def _recall_bias(row: dict, current: str, conversation: str | None, now: float) -> float:
    """Soft preference for this session, this conversation and recent material."""
    factor = 1.0
    if row["session_id"] == current:
        factor += RECALL_SESSION_BIAS
    if conversation and row.get("conversation_id") == conversation:
        factor += RECALL_CONVERSATION_BIAS
    when = row.get("time_to") or _row_time(row) or now
    age_days = max(0.0, (now - when) / 86400.0)
    return factor + RECALL_RECENCY_BIAS * math.exp(-age_days / 30.0)


def _payload_hits(ctx: Any, access: "Access", plan: query_plan.QueryPlan,
                  limit: int) -> list[dict]:
    """Externalized payloads of the searched sessions whose text matches (bounded), each
    with a complete expand call: the scope its referring row needs, as message hits have
    (a bare ref from another session's row answered 'not found in this scope').
    A search of this session covers the rows under nodes carried into it too: their
    payloads open from here (``Access.message_ok``), so search finds them."""
    sessions = access.search_sessions()
    carried = access.carried() if sessions is not None and access.current in sessions else ()
    found = externalized.search_payloads(ctx.store, ctx.payloads, plan, sessions, limit,
                                         dag=ctx.dag, carried=carried)
    return [{"kind": "externalized", "externalized_ref": h.ref, "score": round(h.score, 3),
             "snippet": h.snippet, "referred_by_store_id": h.store_id,
             "expand": access.handle("externalized_ref", h.ref, h.session_id)}
            for h in found]
