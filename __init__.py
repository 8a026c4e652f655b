"""hermes-trove: a lossless context engine plugin for Hermes Agent.

The host imports this folder as a package and calls ``register(ctx)`` once per
process: it wires the engine, the hooks, the skill and ``/trove`` into the host.
Importing the package does no work (the engine and its modules load inside
``register`` and the hooks), and the hooks are plain functions a test can call.

Where each concern lives (see docs/architecture.md):
``engine.py`` the orchestrator; ``store.py`` messages and their FTS; ``dag.py``
summary nodes and lineage; ``tools.py``/``schemas.py`` the agent tools;
``command.py`` ``/trove``; and the packages ``storage``, ``ingest``,
``compaction``, ``recall``, ``diagnostics``, ``operators`` and ``openclaw``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

__version__ = "0.1.0"

log = logging.getLogger(__name__)

PLUGIN_ROOT = Path(__file__).resolve().parent
SKILL_DIR = PLUGIN_ROOT / "skills" / "hermes-trove"
RECALL_POLICY_PATH = SKILL_DIR / "references" / "recall-policy.md"
_policy_cache: dict[str, str] = {}


def recall_policy() -> str:
    """The canonical recall policy: exactly the bytes of the skill's reference file."""
    if "text" not in _policy_cache:
        try:
            _policy_cache["text"] = RECALL_POLICY_PATH.read_text(encoding="utf-8").rstrip("\n")
        except OSError:
            _policy_cache["text"] = ""
    return _policy_cache["text"]


def on_pre_llm_call(session_id: str = "", conversation_history=None, **_kwargs):
    """Append the recall policy to the user turn, only where trove serves the session.

    A background review fork's turn (the host's harness prompt) gets nothing; its
    thread remembers which user session it reviews (its tool calls read it).
    Never raises into the host: a history that is not a list of dicts is read as its
    dict messages (``host_input.messages``), and any failure adds nothing to the turn."""
    from .binding import host_input
    from .storage import faults
    try:
        history = host_input.messages(conversation_history, None, "pre_llm_call")
        return _pre_llm_call(session_id, history, _kwargs)
    except Exception as exc:
        faults.report(None, "pre_llm_call", f"{type(exc).__name__}: {str(exc)[:200]}")
        return None


def _pre_llm_call(session_id, conversation_history: list, _kwargs: dict):
    """``on_pre_llm_call`` on a sanitised history."""
    from .binding import forks
    from .engine import find_engine
    is_fork = forks.review_start(conversation_history or ()) is not None
    forks.note_review_session(session_id if is_fork else None)
    if is_fork:
        # The fork's own engine copy is bound to the id the fork started under, which
        # the host left in this thread's HERMES_SESSION_ID: mark it read-only there.
        fork_engine = find_engine(forks.host_session_hint())
        if fork_engine is not None and fork_engine.session_id != session_id:
            fork_engine.become_review_fork(session_id)
        return None
    engine = find_engine(session_id)
    if engine is not None:   # also records an owner row removed since (one read if not)
        engine.note_owner(_kwargs.get("sender_id"))
    if engine is not None and conversation_history:
        engine.note_user_turn(conversation_history[-1])
    if engine is None:
        return None
    text = policy_for_turn(engine.config, engine.session_mode, list(conversation_history or ()))
    return {"context": text} if text else None


_TOOL_NAME = re.compile(r"\btrove_[a-z_]+")


def policy_for_turn(config, session_mode: str, shown) -> str:
    """The recall policy for this turn, or "" where it would not serve.

    Not on: a session trove does not store (``ignored``), a config that hides a tool
    the policy names, or a turn whose shown history already carries it. The host
    keeps each turn's injected text in that turn's ``api_content`` and sends it again
    on every later request, so appending it on every turn would put one copy per
    user turn in each request; once is enough, until the turn holding it is compacted
    away (then the next turn carries it again). Only user turns with an
    ``api_content`` are read, newest first: the shown list, never the store."""
    text = recall_policy()
    if not text or not config.recall_policy_enabled or session_mode == "ignored":
        return ""
    if not set(_TOOL_NAME.findall(text)) <= set(config.exposed_tool_names):
        return ""
    for message in reversed(shown):
        if (isinstance(message, dict) and message.get("role") == "user"
                and isinstance(message.get("api_content"), str)
                and text in message["api_content"]):
            return ""
    return text


def on_post_tool_call(session_id: str = "", result=None, tool_call_id: str = "",
                      tool_name: str = "", **_kwargs):
    """A tool result joined the list: the engine's count of the real tokens the list
    holds grows by it, so the check before the next model call sees what the host's
    chars/4 misses (``TroveEngine.note_tool_result``). Never raises into the host."""
    from .engine import find_engine
    from .storage import faults
    try:
        engine = find_engine(session_id)
        if engine is not None and result is not None:
            engine.note_tool_result(result, tool_call_id, tool_name)
    except Exception as exc:
        faults.report(None, "post_tool_call", f"{type(exc).__name__}: {str(exc)[:200]}")
    return None


def on_post_llm_call(session_id: str = "", conversation_history=None, **_kwargs):
    """Persist the whole turn as soon as it ends, so a crash loses nothing.

    A background review fork shares the user's session id: its turn is not the
    user's conversation and is not stored (the part it replays is stored already).
    A history that is not a list of dicts is read as its dict messages, as
    ``on_session_end`` reads one: never an exception into the host."""
    from .binding import forks, host_input
    from .engine import find_engine
    from .storage import faults
    try:
        engine = find_engine(session_id)
        conversation_history = host_input.messages(conversation_history, engine,
                                                   "post_llm_call")
        if engine is None or not conversation_history:
            return None
        if forks.review_start(conversation_history) is not None:
            return None
    except Exception as exc:
        faults.report(None, "post_llm_call", f"{type(exc).__name__}: {str(exc)[:200]}")
        return None
    try:
        history = list(conversation_history)
        # the fault rule of every hook (storage/faults.is_outage): during an outage the
        # turn is stored from the host's list after the retry, not tried on every turn
        if engine._usable_database():
            engine.ingest(history)
        engine.learn_overhead(history)
        engine.note_owner(_kwargs.get("sender_id"))
    except Exception as exc:  # a hook must never break the turn (logged a bounded number of times)
        if faults.is_database_error(exc):   # an outage is noted; a refused statement reported
            engine._note_fault(exc, "post_llm_call")
        else:
            faults.report(engine, "post_llm_call", f"could not persist the turn: {exc}"[:300])
    finally:
        engine.turn_done()
    return None


def on_session_end(session_id: str = "", **_kwargs):
    """The host finished running a conversation (fired at the end of every
    ``run_conversation``). A cron run has one, so its end is the run's end: the run's
    claim on its session goes at once (``SessionBinding.end_run``). Other sessions go
    on; the engine's own ``on_session_end`` persists. Never raises into the host."""
    from .binding import cron, host_input
    from .engine import find_engine
    from .storage import faults
    try:
        session_id = host_input.session_id(session_id)
        if cron.job_of(session_id) is not None:
            engine = find_engine(session_id)
            if engine is not None:
                engine.end_run()
    except Exception as exc:
        faults.report(None, "on_session_end", f"{type(exc).__name__}: {str(exc)[:200]}")
    return None


def register(ctx) -> None:
    """Register one engine template (the host deep-copies it per agent) and the rest."""
    from .config import load_config
    from .engine import TroveEngine

    cfg = load_config()
    ctx.register_context_engine(TroveEngine(cfg))
    ctx.register_hook("pre_llm_call", on_pre_llm_call)
    ctx.register_hook("post_llm_call", on_post_llm_call)
    ctx.register_hook("post_tool_call", on_post_tool_call)
    ctx.register_hook("on_session_end", on_session_end)
    register_skill = getattr(ctx, "register_skill", None)
    if callable(register_skill) and (SKILL_DIR / "SKILL.md").exists():
        try:
            register_skill("hermes-trove", SKILL_DIR / "SKILL.md",
                           description="Recall exact earlier context with trove_* tools")
        except Exception as exc:  # an older host or a name clash must not stop the plugin
            log.info("hermes-trove: skill not registered: %s", exc)
    if cfg.enable_slash_command:
        from .command import register_command
        register_command(ctx)
    log_config_warnings(cfg.warnings)


_logged_warnings: set[str] = set()


def log_config_warnings(warnings) -> None:
    """Log each config warning once per process: the host runs ``register`` more than
    once (plugin discovery, then again for the agent), which logged every one twice."""
    for warning in warnings:
        if warning not in _logged_warnings:
            _logged_warnings.add(warning)
            log.warning("hermes-trove config: %s", warning)
