"""The operator's search (``/trove grep``, ``trove.py grep``): ``trove_grep`` with an
operator scope, an optional search mode, pages, and one hit per copied message.

Both front ends call ``grep`` and print its report with ``textview.format_grep``,
so the chat and the shell show the same table.
"""

from __future__ import annotations

import re
from typing import Any

from .actions import (GREP_DEFAULT_HITS, GREP_MAX_HITS, OperatorError, Target, _scope,
                      call_tool)

GREP_MODES = ("full_text", "semantic", "hybrid")


def semantic_side(target: Target, mode: str | None) -> Any:
    """The embedding side a search may use, only when the operator asked for
    ``semantic`` or ``hybrid`` (plain grep stays cheap and prints the same in the chat
    and the shell): the live engine's (its model is loaded in the background), else
    the configured provider loaded now."""
    if mode not in ("semantic", "hybrid") or not target.config.embeddings_enabled:
        return None
    if target.engine is not None:
        return target.engine._semantic()
    return open_semantic(target)


def open_semantic(target: Target) -> Any:
    """The configured provider loaded now, on the target's connection, for an offline
    read. Its status never calls the model (``SpaceCheck.peek``: the newest space of
    the name); a search probes it first (``recall.probe``), as it embeds the query."""
    from ..recall import semantic
    from ..ingest.redaction import redact_for
    return semantic.Semantic.open(target.database, target.config, redact_for(target.config))


def grep(target: Target, query: str, session_id: str | None = None,
         limit: int | None = None, offset: int = 0, mode: str | None = None) -> dict:
    """``trove_grep`` in one session (with its summaries) or, by default, all sessions;
    ``offset`` pages through the tool's best ``GREP_MAX_HITS`` hits (``next_offset``);
    ``mode`` (``full_text``, ``semantic``, ``hybrid``) as the tool takes it: a mode
    the index cannot serve runs full text with a note saying why."""
    if mode is not None and mode not in GREP_MODES:
        raise OperatorError(f"mode must be one of {', '.join(GREP_MODES)}, not {mode!r}")
    limit = GREP_DEFAULT_HITS if limit is None else limit
    if limit < 1 or offset < 0:
        raise OperatorError(f"--limit must be at least 1 and --offset at least 0 "
                            f"(got limit {limit}, offset {offset})")
    if offset + limit > GREP_MAX_HITS:
        raise OperatorError(f"offset + limit must stay within the {GREP_MAX_HITS} best hits "
                            f"(got offset {offset}, limit {limit}); narrow the query instead")
    caller, scope = _scope(target, session_id)
    args = {"query": query, **scope, "limit": offset + limit, **({"mode": mode} if mode else {})}
    report = call_tool(target, "trove_grep", args, caller, semantic_side(target, mode))
    hits = merge_copies(target, report.get("results", []))
    more = len(hits) > offset + limit or bool(report.get("has_more"))
    report["results"] = hits[offset:offset + limit]
    report["offset"] = offset
    report["next_offset"] = (offset + limit) if more and offset + limit < GREP_MAX_HITS else None
    report["terms"] = query_terms(query)
    return report


def merge_copies(target: Target, hits: list[dict]) -> list[dict]:
    """One hit per message text: after ``/branch`` the branch holds its own copy of the
    parent's history, so a search of every session would list each old message twice.
    The best-ranked copy stays; ``also_in`` names the other sessions with the same one."""
    ids = [h["store_id"] for h in hits if h.get("kind") == "message" and h.get("store_id")]
    rows = target.store.get_messages(ids) if len(ids) > 1 else {}
    first: dict[tuple, dict] = {}
    kept = []
    for hit in hits:
        row = rows.get(hit.get("store_id")) if hit.get("kind") == "message" else None
        key = (row["role"], row["content_hash"], row["tool_calls"]) if row else None
        if key is not None and key in first:
            other = first[key].setdefault("also_in", [])
            if hit.get("session_id") and hit["session_id"] not in other + [
                    first[key].get("session_id")]:
                other.append(hit["session_id"])
            continue
        if key is not None:
            first[key] = hit
        kept.append(hit)
    return kept


def query_terms(query: str) -> list[str]:
    """The words a grep looks for (quoted phrases split, ``-excluded`` words left out),
    for highlighting."""
    words = re.findall(r"(?<![\w-])-?[\w.]+", query)
    return list(dict.fromkeys(w for w in words if not w.startswith("-") and len(w) > 1))
