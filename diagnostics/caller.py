"""What a caller who is not the profile's operator sees of trove_status, trove_inspect,
trove_doctor and a messaging gateway's ``/trove status``.

In a messaging gateway any chat member can ask the agent to call a tool, so the
status tools answer the calling session's owner (``toolkit.scope.operator_view``
decides who that is). The database is every owner's: its path, size, totals, the
embedding index's counts, the host's home, every setting (paths among them), the
largest rows of the whole file, the FTS and rollup totals and the host's own
config are the operator's view; a total that grows even tells a group member when
someone else chats. What is left is the caller's own engine and session.

The engine snapshot is filtered by an allow-list (fail closed: a key added to
``TroveEngine.get_status`` later stays the operator's until it is listed here).
"""

from __future__ import annotations

import os
from typing import Mapping

# The calling engine's own state: its session, window, trigger, compactions, binding.
ENGINE_KEYS = ("engine", "session_id", "canonical_session_id", "binding", "platform",
               "conversation_id", "context_length", "threshold_tokens", "trigger_rule",
               "last_prompt_tokens", "last_checked_tokens", "usage_percent",
               "compression_count", "overhead_tokens", "last_compaction",
               "reachability_problems", "token_counter", "session_mode", "review_fork",
               "owner", "last_switch", "background_prepare", "tools")
# Whether semantic search works here; the index's counts and rate are every owner's.
EMBEDDING_KEYS = ("enabled", "provider", "model", "available")
OPERATOR_VIEW = ("database totals, paths, backups, settings, engine errors and the database "
                 "and host checks are the profile operator's view (trove_inspect or "
                 "/trove status in the Hermes CLI, scripts/trove.py on the host)")


def embeddings(block: Mapping | None) -> dict | None:
    """The embedding side without the index's totals (every owner's messages)."""
    if not isinstance(block, Mapping):
        return None
    return {k: block[k] for k in EMBEDDING_KEYS if k in block}


def engine(status: Mapping) -> dict:
    """The engine snapshot a caller may see: its own session's state (``ENGINE_KEYS``),
    whether embeddings work, and how many errors the engine and its background worker
    noted (their texts can name the database's path, another session or a summary
    endpoint: the operator reads them); its last compaction as ``last_compaction`` shows it."""
    view = {k: status[k] for k in ENGINE_KEYS if k in status}
    if "embeddings" in status:
        view["embeddings"] = embeddings(status["embeddings"])
    if "last_compaction" in view:
        view["last_compaction"] = last_compaction(view["last_compaction"])
    worker = view.get("background_prepare")
    if isinstance(worker, Mapping) and isinstance(worker.get("errors"), list):
        view["background_prepare"] = {**worker, "errors": len(worker["errors"])}
    view["errors"] = len(status.get("errors") or ())
    return view


def summary_problem(outcome: str) -> str:
    """A failed summary attempt's outcome (``summarize.attempt_problems``) as a caller may
    read it: its kind (``timeout``, ``error: ConnectError``, ``rejected: a refusal``,
    ``skipped: breaker open``) without the error's text or the spend guard's figures,
    which can name the operator's model route, its endpoint or every owner's spend."""
    text = str(outcome)
    if text.startswith("error:"):
        return "error: " + text[len("error:"):].strip().split(":", 1)[0].strip()
    return text.split(" (", 1)[0]


def last_compaction(last):
    """A compaction record (the engine's, or the one stored with the session) whose
    ``summary_problems`` are reduced to their kinds (``summary_problem``)."""
    if not isinstance(last, Mapping) or not isinstance(last.get("summary_problems"), Mapping):
        return last
    kinds: dict[str, int] = {}
    for outcome, count in last["summary_problems"].items():
        kind = summary_problem(outcome)
        kinds[kind] = kinds.get(kind, 0) + (count if isinstance(count, int) else 0)
    return {**last, "summary_problems": kinds}


def status_report(status: Mapping, *, session_id: str | None,
                  counter_name: str | None = None) -> dict:
    """trove_inspect's ``status`` for a caller: in place of ``health.status_report``'s
    database statistics and settings, the caller's engine and a line saying where the
    rest is."""
    return {"bound": bool(session_id), "session_id": session_id, "engine": engine(status),
            "token_counter": status.get("token_counter") or counter_name or "unknown",
            "operator_view": OPERATOR_VIEW}


def model_status(report: dict, status: Mapping) -> dict:
    """trove_status (``brief.model_status``) for a caller: the plugin's version without
    its folder, embeddings without the index's totals, and the problems of the caller's
    own session (reachability, its session mode); engine errors and the operator's config
    warnings become one line pointing to the operator."""
    report = dict(report)
    plugin = report.get("plugin")
    if isinstance(plugin, str):   # "<folder> v<version> @ <commit> (...)": drop the folder
        report["plugin"] = plugin.split(" ", 1)[1] if " " in plugin else "hermes-trove"
    report["embeddings"] = embeddings(report.get("embeddings"))
    own = [p for p in report.get("problems") or ()
           if p.startswith(("compaction cannot free room", "this session is"))]
    hidden = len(status.get("errors") or ()) + (1 if "status_error" in status else 0)
    if hidden:
        own.append(f"{hidden} engine error(s): the operator sees them (trove_doctor in the "
                   "Hermes CLI)")
    report["problems"] = own
    return report


SPEND_GUARD_REACHED = ("the profile's hourly summary cap is reached: summaries use the "
                       "deterministic digest until the rolling hour frees room (the operator "
                       "sees the figures)")


SUMMARY_ROUTES = "the operator's summary route(s)"
SUMMARY_MODEL = "the operator's summary model"


def node_model(model: str | None) -> str | None:
    """A summary node's ``model`` for a caller: the deterministic digest says so, a
    model's name (a route the operator configured) becomes ``SUMMARY_MODEL``."""
    return model if model in (None, "", "deterministic") else SUMMARY_MODEL


def summaries(status: Mapping) -> dict:
    """The status ``health.check_summaries`` reads, for a caller: whether summaries work
    (reached, degraded), never which routes. The spend guard is one per process, so its
    calls, tokens, caps and the moment its hour frees room count every owner's
    compactions: the caller learns only that it is reached. The circuit breaker's routes
    are the models and endpoints the operator configured: the caller learns only that
    one is open. The last compaction's failed attempts keep their kinds
    (``last_compaction``)."""
    view = dict(status)
    spend = status.get("summary_spend")
    if isinstance(spend, Mapping):
        view["summary_spend"] = {"exhausted": bool(spend.get("exhausted")),
                                 "reason": SPEND_GUARD_REACHED}
    breaker = status.get("summary_breaker")
    if isinstance(breaker, Mapping):
        shut = any(isinstance(s, Mapping) and s.get("state") == "open"
                   for s in breaker.values())
        view["summary_breaker"] = {SUMMARY_ROUTES: {"state": "open"}} if shut else {}
    if "last_compaction" in status:
        view["last_compaction"] = last_compaction(status["last_compaction"])
    return view


def without_paths(value, database: str):
    """``value`` (a fault's text, an answer) with the database's path or server name and
    its folder (the backups' too) replaced by words: a caller learns what is wrong, the
    operator where."""
    if isinstance(value, str):
        folder = os.path.dirname(database)
        value = value.replace(database, "the trove database") if database else value
        return value.replace(folder, "the trove data folder") if len(folder) > 1 else value
    if isinstance(value, Mapping):
        return {k: without_paths(v, database) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_paths(v, database) for v in value]
    return value


def unusable_answer(answer: dict, database: str) -> dict:
    """A tool's answer while the database cannot be used (``unavailable.tool_answer``)
    for a caller: the engine as ``engine`` shows it, no path."""
    if isinstance(answer.get("engine"), Mapping):
        answer = {**answer, "engine": engine(answer["engine"])}
    return without_paths(answer, database)
