"""Operator actions on the day / week / month rollups (``/trove rollups``, ``trove.py rollups``).

``status`` lists the periods of the lookback window that hold material and
whether their rollup is ready, stale, pending or still open; ``build`` shows
what a pass would build and, with ``apply``, writes a backup first and runs
one pass (the live engine's summarizer when there is one, else the
deterministic digest: an offline CLI has no model). Building needs
``TROVE_ROLLUPS_ENABLED``: rollups are opt-in.
"""

from __future__ import annotations

import time
from collections import Counter

from ..compaction import rollups, tokens
from ..compaction.summarize import CircuitBreaker, Summarizer
from ..ingest.policy import policy_for
from ..storage.timeline import Timeline
from .. import tools
from .actions import (OPERATOR_SESSION, OperatorError, Target, backup, caller_session,
                      tool_context)


def _context(target: Target):
    settings = rollups.settings_of(target.config)
    return Timeline(target.store.db), settings, policy_for(target.config).feeds_rollups


def caller_access(target: Target) -> tools.Access | None:
    """What a caller who is not the operator may read (``tools.Access`` from their
    session: the one owner rule), None for the operator; with no caller known, the
    access of a session that does not exist: nobody's, so no owner's rollups."""
    if target.operator:
        return None
    caller = caller_session(target) or f"{OPERATOR_SESSION}-unknown-caller"
    return tools.Access(tool_context(target, caller), {}, caller)


def status(target: Target, now: float | None = None) -> dict:
    """Every period with material in the lookback window and its rollup state (a caller
    who is not the operator sees their own owner's periods: ``caller_access``)."""
    timeline, settings, eligible = _context(target)
    rows = rollups.status(timeline, settings, eligible, time.time() if now is None else now)
    access = caller_access(target)   # a gateway user: their owner's periods only
    if access is not None:
        rows = [r for r in rows if access.owns_rollup(r)]
    return {"enabled": target.config.rollups_enabled, "time_zone": settings.time_zone,
            "other_names": rollups.other_names(timeline, settings),
            "lookback_days": settings.lookback_days,
            "counts": dict(Counter(r["state"] for r in rows)), "periods": rows,
            "lineage_problems": timeline.lineage_problems(limit=20) if access is None else []}


def build(target: Target, apply: bool = False, now: float | None = None) -> dict:
    """Preview (or, with ``apply``, back up then run) one rollup pass."""
    moment = time.time() if now is None else now
    report = status(target, moment)
    todo = [r for r in report["periods"] if r["state"] in ("pending", "stale")]
    base = {"mode": "apply" if apply else "preview", "time_zone": report["time_zone"],
            "to_build": [{"kind": r["kind"], "key": r["key"], "owner": r["owner"],
                          "state": r["state"]} for r in todo]}
    if not target.config.rollups_enabled:
        return {**base, "status": "refused",
                "reason": "rollups are off: set TROVE_ROLLUPS_ENABLED=true"}
    if not todo and not report["other_names"]:   # a pass would move those (adopt_names)
        return {**base, "status": "noop", "reason": "every finished period is ready"}
    if not apply:
        return {**base, "status": "preview"}
    if not target.writable and target.engine is None:
        raise OperatorError("rollups build apply needs the database opened for writing "
                            "(the apply word does that: /trove rollups build apply, "
                            "trove.py rollups build --apply)")
    written = backup(target, "pre-rollups")
    timeline, settings, eligible = _context(target)
    summarizer, count = _summarizer(target)
    done = rollups.build_pass(target.store, target.dag, timeline, summarizer, count, settings,
                              eligible, moment)
    return {**base, "status": "built", "backup": written, "built": done.built,
            "waiting": done.waiting, "errors": done.errors, "removed": done.removed,
            "renamed": done.renamed}


def _summarizer(target: Target):
    if target.engine is not None:
        return target.engine.summarizer(), target.engine.counter.count_text
    counter = tokens.get_counter(target.config.token_encoding,
                                 target.config.token_count_accelerator)
    return (Summarizer(llm_call=None, count_tokens=counter.count_text, models=[None],
                       breaker=CircuitBreaker(1, 0), timeout_s=1.0), counter.count_text)
