"""The optional feature families in status: embeddings and rollups, on or off and how far.

``/trove status`` and ``scripts/trove.py status`` both show, for each family,
whether it is on and, when on, its state: for embeddings what the embedding
status API reports (``recall.semantic``: provider, model, indexed, pending,
texts per second, time left, last error); for rollups the ready / pending /
stale / open counts and the last pass with what it built. Nothing here
assumes a model: it renders what the status API returns.
"""

from __future__ import annotations

from typing import Any

from ..compaction import rollups
from ..recall import semantic
from .actions import Target
from .search import open_semantic
from . import rollup_actions


def embeddings_status(target: Target) -> dict:
    """The live engine's embedding status (its worker's rate included); offline, the
    configured provider loaded once to count what its space holds and lacks."""
    if target.engine is not None:
        return semantic.status_of(target.config, target.engine._semantic())
    if not target.config.embeddings_enabled:
        return semantic.status_of(target.config, None)
    try:
        return open_semantic(target).status()
    except Exception as exc:  # optional: status still answers
        return {"enabled": True, "provider": target.config.embedding_provider,
                "available": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}


def rollups_status(target: Target) -> dict:
    """On/off; when on, the period counts by state and the newest pass."""
    if not target.config.rollups_enabled:
        return {"enabled": False, "reason": "TROVE_ROLLUPS_ENABLED is false"}
    try:
        report = rollup_actions.status(target)
    except Exception as exc:  # optional: status still answers
        return {"enabled": True, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"enabled": True, "counts": report["counts"],
            "lookback_days": report["lookback_days"],
            "last_pass": rollups.last_pass(target.store)}


def optional_status(target: Target) -> dict:
    """Both families, for the status report."""
    return {"embeddings": embeddings_status(target), "rollups": rollups_status(target)}


def without_database(config) -> dict:
    """Both families before the first message: on/off from the settings only."""
    embeddings = (semantic.status_of(config, None) if not config.embeddings_enabled else
                  {"enabled": True, "provider": config.embedding_provider,
                   "model": config.embedding_model or None, "available": False,
                   "reason": "no database yet (indexing starts with the first message)"})
    rollups_on = {"enabled": True, "counts": {}, "last_pass": None}
    return {"embeddings": embeddings,
            "rollups": rollups_on if config.rollups_enabled else
            {"enabled": False, "reason": "TROVE_ROLLUPS_ENABLED is false"}}


def _duration(seconds: Any) -> str:
    seconds = float(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def embeddings_line(status: dict) -> str:
    """``embeddings: on (provider model): N indexed, M pending, X texts/s, ~T left``."""
    if not status.get("enabled"):
        return f"embeddings: off ({status.get('reason') or 'TROVE_EMBEDDINGS_ENABLED is false'})"
    name = " ".join(str(v) for v in (status.get("provider"), status.get("model")) if v)
    if not status.get("available"):
        return f"embeddings: on ({name}) but not available: {status.get('reason')}"
    parts = [f"{int(status.get('indexed') or 0):,} indexed",
             f"{int(status.get('pending') or 0):,} pending"]
    rate = status.get("texts_per_second")
    if rate:
        parts.append(f"{rate:g} texts/s")
    if status.get("pending") == 0:
        parts.append("caught up")
    elif status.get("eta_seconds") is not None:
        parts.append(f"about {_duration(status['eta_seconds'])} left")
    elif "texts_per_second" not in status:
        parts.append("not indexing in this process (run embed backfill)")
    else:
        parts.append("time left: not measured yet")
    error = status.get("worker_error") or status.get("last_error")
    parts.append(f"last error: {error}" if error else "last error: none")
    check = status.get("model_check") or {}
    if check.get("state") in ("changed", "failed"):      # recall.probe: say it here too
        parts.append(f"model check: {check['detail']}")
    return f"embeddings: on ({name}): " + ", ".join(parts)


def rollups_line(status: dict, when) -> str:
    """``rollups: on: ready N, pending N, stale N, open N; last pass ... built ...``."""
    if not status.get("enabled"):
        return f"rollups: off ({status.get('reason')})"
    if status.get("error"):
        return f"rollups: on, status failed: {status['error']}"
    counts = status.get("counts") or {}
    text = "rollups: on: " + ", ".join(f"{state} {counts.get(state, 0)}" for state in
                                      ("ready", "pending", "stale", "open"))
    last = status.get("last_pass")
    if not last:
        return text + "; last pass: none recorded"
    built = ", ".join(last.get("built") or []) or "nothing"
    text += f"; last pass {when(last.get('at'))} built {built}"
    if last.get("waiting"):
        text += f", {last['waiting']} waiting"
    if last.get("errors"):
        text += f", error: {last['errors'][-1]}"
    return text
