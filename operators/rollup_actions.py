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
from .actions import OperatorError, Target, backup


def _context(target: Target):
    settings = rollups.settings_of(target.config)
    return Timeline(target.store.db), settings, policy_for(target.config).feeds_rollups


def status(target: Target, now: float | None = None) -> dict:
    """Every period with material in the lookback window and its rollup state."""
    timeline, settings, eligible = _context(target)
    rows = rollups.status(timeline, settings, eligible, time.time() if now is None else now)
    return {"enabled": target.config.rollups_enabled, "time_zone": settings.time_zone,
            "lookback_days": settings.lookback_days,
            "counts": dict(Counter(r["state"] for r in rows)), "periods": rows,
            "lineage_problems": timeline.lineage_problems(limit=20)}


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
    if not todo:
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
            "waiting": done.waiting, "errors": done.errors, "removed": done.removed}


def _summarizer(target: Target):
    if target.engine is not None:
        return target.engine.summarizer(), target.engine.counter.count_text
    counter = tokens.get_counter(target.config.token_encoding,
                                 target.config.token_count_accelerator)
    return (Summarizer(llm_call=None, count_tokens=counter.count_text, models=[None],
                       breaker=CircuitBreaker(1, 0), timeout_s=1.0), counter.count_text)
