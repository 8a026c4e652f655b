"""The compact status the model sees (``trove_status``): what matters now.

The full inventory (every setting with its source and wildcard docs, database
files, the engine snapshot) cost the model ~1,600 tokens per call and buried
the answer. ``model_status`` keeps what a model can act on: context pressure,
the compaction trigger and why it is set there, the last compaction, what is
stored for this session, and problems. ``trove_inspect`` and the operator CLI
keep the full inventory.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..config import TroveConfig
from ..dag import Dag
from ..store import Store
from .host import describe_identity, plugin_identity

MAX_PROBLEMS = 5
LAST_COMPACTION_KEYS = ("outcome", "at", "reason", "note", "trigger", "tokens_before",
                        "tokens_after", "tail_gave_way", "path")


def _pressure(status: Mapping) -> dict:
    """Prompt size against the window and the trigger, and the room left before it."""
    prompt, trigger = status.get("last_prompt_tokens"), status.get("threshold_tokens")
    pressure: dict[str, Any] = {"prompt_tokens": prompt, "window_tokens":
                                status.get("context_length"),
                                "usage_percent": status.get("usage_percent"),
                                "trigger_tokens": trigger,
                                "trigger_rule": status.get("trigger_rule")}
    if isinstance(prompt, int) and isinstance(trigger, int) and trigger > 0:
        pressure["tokens_until_compaction"] = max(trigger - prompt, 0)
    return {k: v for k, v in pressure.items() if v is not None}


def _last_compaction(status: Mapping) -> dict | None:
    last = status.get("last_compaction") or {}
    if not isinstance(last, Mapping) or not last:
        return None
    picked = {k: last[k] for k in LAST_COMPACTION_KEYS if k in last}
    for key in ("leaf_nodes", "condensed_nodes"):
        if isinstance(last.get(key), list):
            picked[key] = len(last[key])
    return picked


def problems(config: TroveConfig, status: Mapping) -> list[str]:
    """Everything a model or operator should know is wrong, newest engine errors first."""
    found = [f"compaction cannot free room: {p}" for p in status.get("reachability_problems")
             or ()]
    mode = status.get("session_mode")
    if mode and mode != "normal":
        found.append(f"this session is {mode} (matched {status.get('session_filter_match')!r}):"
                     " trove does not store it")
    found += [f"engine error: {e}" for e in reversed(status.get("errors") or ())]
    found += [f"config: {w}" for w in config.warnings]
    if "status_error" in status:
        found.append(f"status unavailable: {status['status_error']}")
    return found[:MAX_PROBLEMS] + ([f"... {len(found) - MAX_PROBLEMS} more (trove_doctor)"]
                                   if len(found) > MAX_PROBLEMS else [])


def _worker(status: Mapping) -> dict | None:
    """The background preparer's state when it is on (None when off): a few counters."""
    worker = status.get("background_prepare") or {}
    if not worker.get("share"):
        return None
    return {key: worker[key] for key in ("share", "running", "runs", "prepared", "errors", "chunks")
            if key in worker}


def _embeddings(block: Any) -> Any:
    """The embedding block, with the model check only when it says something is wrong
    (``recall.probe``: changed or failed); "same" costs the model tokens every call."""
    if not isinstance(block, Mapping) or not isinstance(block.get("model_check"), Mapping):
        return block
    if block["model_check"].get("state") in ("changed", "failed"):
        return dict(block)
    return {k: v for k, v in block.items() if k != "model_check"}


def model_status(store: Store, dag: Dag, config: TroveConfig, status: Mapping, *,
                 session_id: str | None) -> dict:
    """The compact ``trove_status``: bound session, pressure and trigger, the last
    compaction, what is stored, problems; a pointer to the full inventory."""
    stored = None
    if session_id:
        stored = {"messages": store.count_messages(session_id),
                  "summary_nodes": dag.stats(session_id)["nodes"],
                  "compactions_this_run": status.get("compression_count", 0)}
    return {"bound": bool(session_id), "session_id": session_id,
            "pressure": _pressure(status), "last_compaction": _last_compaction(status),
            "stored": stored, "problems": problems(config, status),
            "plugin": describe_identity(plugin_identity()),
            "background_prepare": _worker(status),
            "embeddings": _embeddings(status.get("embeddings")),
            "more": "trove_inspect: settings, database and frontier; trove_doctor: health checks"}
