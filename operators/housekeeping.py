"""``doctor clean`` and ``doctor retention``: every session's junk, age and size.

Both read every owner's sessions folded onto their canonical ids
(``_canonical_groups``): ``clean_scan`` classifies junk and noise sessions by rule
and says what protects each one, ``clean_apply`` backs up and then removes only the
safe ones in one transaction, ``retention`` profiles messages by age and sessions
by idle time. They are the profile operator's (``command.Action.gateway_ok`` is
false for them): a messaging gateway's user never runs them.
"""

from __future__ import annotations

import sqlite3
import time

from ..storage import locks, prepared, timeline
from ..diagnostics import health
from ..engine import live_engines
from ..storage.owners import Owners
from ..storage.vectors import VectorStore
from ..ingest.policy import policy_for
from ..ingest.noise import (IGNORED, NOISE_MAX_DISTINCT_USER_TEXTS, NOISE_MAX_MESSAGES,
                            NOISE_MAX_REPLY_CHARS, MessageFilter, SessionFilter, session_noise)
from ..evidence import assertions, retrieve as evidence_views
from ..store import UNKNOWN_SOURCE, decode_row
from .actions import DAY, OperatorError, Target, backup

# doctor clean: what counts as junk, and what protects a session.
EPHEMERAL_PREFIX = "trove-ephemeral-"
EPHEMERAL_MAX_MESSAGES = 6
CLEAN_MIN_IDLE_SECONDS = 3600        # younger activity may be a live session elsewhere
CLEAN_SCAN_MAX_SESSIONS = 100_000
CLEAN_RULES = {
    "ignored_pattern": "the session id matches TROVE_IGNORE_SESSION_PATTERNS",
    "empty": "no messages and no summaries",
    "ephemeral": f"{EPHEMERAL_PREFIX}* session with at most {EPHEMERAL_MAX_MESSAGES} messages",
    "noise": f"a small session (up to {NOISE_MAX_MESSAGES} messages) without tool use whose "
             "user messages are all heartbeat/cron prompts (exact shapes) or match "
             f"TROVE_IGNORE_MESSAGE_PATTERNS, with at most {NOISE_MAX_DISTINCT_USER_TEXTS} "
             f"distinct user texts and replies up to {NOISE_MAX_REPLY_CHARS} chars",
}
AGE_EDGES = (("< 1 day", DAY), ("1-7 days", 7 * DAY), ("7-30 days", 30 * DAY),
             ("30-90 days", 90 * DAY), ("90-365 days", 365 * DAY))
OLDEST_BUCKET = "> 1 year"


# ---------------------------------------------------------------- doctor clean
def _live_sessions(target: Target) -> set[str]:
    """Canonical sessions bound to a live engine of this process (never removed)."""
    live = {e.canonical_id for e in live_engines() if getattr(e, "canonical_id", None)}
    if target.session_id:
        live.add(target.session_id)
    return live


def _canonical_groups(rows: list[dict]) -> dict[str, dict]:
    """Session rows folded onto their canonical session (aliases store nothing)."""
    groups: dict[str, dict] = {}
    for row in rows:
        group = groups.setdefault(row["canonical_id"], {"row": None, "aliases": [],
                                                        "messages": 0, "updated_at": 0.0})
        group["messages"] += row["messages"]
        group["updated_at"] = max(group["updated_at"], row["updated_at"] or 0.0)
        if row["session_id"] == row["canonical_id"]:
            group["row"] = row
        else:
            group["aliases"].append(row["session_id"])
    return {sid: g for sid, g in groups.items() if g["row"] is not None}


def _junk_rule(target: Target, session_id: str, group: dict, sessions: SessionFilter,
               messages: MessageFilter) -> tuple[str, str] | None:
    """Which clean rule a session falls under, with the reason, or None."""
    platform = group["row"]["source"]
    found = sessions.classify(session_id, None if platform == UNKNOWN_SOURCE else platform)
    if found.kind == IGNORED:
        return "ignored_pattern", f"matches TROVE_IGNORE_SESSION_PATTERNS {found.pattern!r}"
    count = group["messages"]
    if count == 0:
        if target.dag.stats(session_id)["nodes"]:
            return None
        return "empty", CLEAN_RULES["empty"]
    if session_id.startswith(EPHEMERAL_PREFIX) and count <= EPHEMERAL_MAX_MESSAGES:
        return "ephemeral", f"ephemeral session with {count} messages"
    if count <= NOISE_MAX_MESSAGES:
        rows = target.store.session_messages(session_id, limit=count)
        verdict = session_noise([decode_row(r) for r in rows], messages)
        if verdict.noise:
            return "noise", "; ".join(verdict.facts)
    return None


def _protections(target: Target, session_id: str, group: dict, live: set[str],
                 now: float, min_idle: float) -> list[str]:
    """Why a junk session must stay: live, recently active, or used by another session."""
    reasons = []
    if session_id in live or live & set(group["aliases"]):
        reasons.append("live session")
    path = str(target.store.db.path)
    if any(locks.held_here(path, s) or locks.in_use_elsewhere(path, s)
           for s in (session_id, *group["aliases"])):
        reasons.append("held by a running Hermes (an engine is bound to it, or compacts it)")
    idle = now - group["updated_at"]
    if idle < min_idle:
        reasons.append(f"active {int(idle)} s ago (under {int(min_idle)} s: may be live "
                       "in a running Hermes)")
    refs = target.dag.external_references([session_id])
    if refs:
        used = ", ".join(sorted({f"{r['session_id']} ({r['how']} n{r['node_id']})"
                                 for r in refs})[:5])
        reasons.append(f"its summaries are used by other sessions: {used}")
    return reasons


def clean_scan(target: Target, now: float | None = None,
               min_idle_seconds: float | None = None) -> dict:
    """Read-only: junk/noise sessions by rule, each marked safe or protected (and why)."""
    cfg = target.config
    now = time.time() if now is None else now
    min_idle = CLEAN_MIN_IDLE_SECONDS if min_idle_seconds is None else min_idle_seconds
    sessions = SessionFilter(cfg.ignore_session_patterns)
    messages = MessageFilter(cfg.ignore_message_patterns)
    groups = _canonical_groups(target.store.list_sessions(limit=CLEAN_SCAN_MAX_SESSIONS))
    live = _live_sessions(target)
    candidates = []
    for session_id, group in groups.items():
        found = _junk_rule(target, session_id, group, sessions, messages)
        if found is None:
            continue
        protected = _protections(target, session_id, group, live, now, min_idle)
        candidates.append({"session_id": session_id, "aliases": group["aliases"],
                           "rule": found[0], "reason": found[1], "messages": group["messages"],
                           "nodes": target.dag.stats(session_id)["nodes"],
                           "last_activity": group["updated_at"], "safe": not protected,
                           "protected_by": protected})
    safe = sum(1 for c in candidates if c["safe"])
    return {"mode": "scan", "database_path": str(target.db_path),
            "sessions_scanned": len(groups), "candidates": candidates, "safe": safe,
            "protected": len(candidates) - safe, "rules": dict(CLEAN_RULES),
            "apply_enabled": cfg.doctor_clean_apply_enabled}


def clean_apply(target: Target, now: float | None = None,
                min_idle_seconds: float | None = None) -> dict:
    """Backup, then remove only the safe candidates' messages, nodes, edges and session
    rows in one transaction (FTS follows by trigger). Needs
    TROVE_DOCTOR_CLEAN_APPLY_ENABLED=true."""
    if not target.config.doctor_clean_apply_enabled:
        return {"status": "refused", "reason": "doctor clean apply is disabled: set "
                "TROVE_DOCTOR_CLEAN_APPLY_ENABLED=true to allow it (run 'doctor clean' to "
                "see what it would remove)"}
    scan = clean_scan(target, now, min_idle_seconds)
    ids = [c["session_id"] for c in scan["candidates"] if c["safe"]]
    kept = [c for c in scan["candidates"] if not c["safe"]]
    if not ids:
        return {"status": "noop", "reason": "no safe candidates to remove", "protected": kept,
                "sessions_scanned": scan["sessions_scanned"]}
    written = backup(target, "pre-clean")
    seen = {c["session_id"]: (c["messages"], c["last_activity"]) for c in scan["candidates"]}
    try:
        with target.store.db.transaction() as conn:
            # Whatever changed since the scan (a write, a new bind elsewhere) stays.
            now_seen = target.store.activity_in(conn, ids)
            path = str(target.store.db.path)
            changed = [s for s in ids if now_seen.get(s) != seen[s]
                       or locks.held_here(path, s) or locks.in_use_elsewhere(path, s)]
            ids = [s for s in ids if s not in changed]
            kept += [{"session_id": s, "protected_by": ["changed since the scan"]}
                     for s in changed]
            vectors = VectorStore.delete_sessions_in(conn, ids)   # before their rows go
            removed = target.dag.delete_session_nodes_in(conn, ids)
            removed["vectors"] = vectors
            removed.update(target.store.delete_sessions_in(conn, ids))
            removed["owner_rows"] = Owners.delete_in(conn, ids)
            removed.update(assertions.delete_sessions_in(conn, ids))
            removed.update(evidence_views.delete_sessions_in(conn, ids))
            removed.update(prepared.delete_sessions_in(conn, ids))
            removed["rollups"] = timeline.delete_sessions_in(conn, ids)
    except sqlite3.IntegrityError as exc:
        raise OperatorError(f"nothing was removed: another session came to depend on a "
                            f"candidate while cleaning ({exc}); run the scan again") from None
    if not ids:
        return {"status": "noop", "reason": "every candidate changed since the scan",
                "protected": kept, "sessions_scanned": scan["sessions_scanned"]}
    return {"status": "cleaned", "backup": written, "removed_sessions": ids,
            "removed": removed, "rules": {c["session_id"]: c["rule"]
                                          for c in scan["candidates"] if c["safe"]},
            "protected": kept, "sessions_scanned": scan["sessions_scanned"]}


# ---------------------------------------------------------------- doctor retention
def _payload_usage(target: Target) -> dict:
    """Payloads stored for the database: files beside it, or rows on a server."""
    return policy_for(target.config).payloads.usage()


def retention(target: Target, now: float | None = None) -> dict:
    """Read-only age and size analysis: messages by age, sessions by idle time, the
    largest sessions and payload files. Trove never deletes by age on its own."""
    now = time.time() if now is None else now
    store = target.store
    labels = [label for label, _ in AGE_EDGES] + [OLDEST_BUCKET]
    by_age = store.message_age_profile(now, [edge for _, edge in AGE_EDGES])
    idle = dict.fromkeys(labels, 0)
    groups = _canonical_groups(store.list_sessions(limit=CLEAN_SCAN_MAX_SESSIONS))
    for group in groups.values():
        age = now - group["updated_at"]
        idle[next((label for label, edge in AGE_EDGES if age < edge), OLDEST_BUCKET)] += 1
    return {"database": health.database_stats(store, target.dag), "now": now,
            "messages_by_age": [{**b, "age": labels[b["bucket"]]} for b in by_age],
            "sessions_by_idle": [{"idle": k, "sessions": v} for k, v in idle.items() if v],
            "largest_sessions": store.largest_sessions(10),
            "payloads": _payload_usage(target)}


