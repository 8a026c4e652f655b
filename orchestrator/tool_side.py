"""The agent-facing half of the engine (a mixin of ``TroveEngine``): the trove_*
tool schemas, the tool call (ingest the live messages first, then dispatch), the
context a tool sees, and the status the tools and /trove report.

Pure moves out of ``engine.py``; the methods read the engine's own attributes.
"""

from __future__ import annotations

import json

from ..config import NOT_LISTED
from ..diagnostics import caller, unavailable
from ..recall import semantic
from ..storage import faults
from ..toolkit.scope import is_operator

ENGINE_NAME = "trove"


class ToolSide:
    """The trove_* tools and status of ``TroveEngine``."""

    # ------------------------------------------------------------------ tools
    def get_tool_schemas(self) -> list:
        """Bare OpenAI function schemas of the tools this config exposes (the host reads
        them once per agent): ``TROVE_EXPOSED_TOOLS`` minus opt-in families that are off."""
        from ..schemas import get_tool_schemas
        return get_tool_schemas(self.config)

    def handle_tool_call(self, name: str, args: dict, **kwargs) -> str:
        """Persist the live messages first, then run the tool; always a JSON string.

        A tool ``TROVE_EXPOSED_TOOLS`` hides (a call from an older transcript or a host
        that kept an old tool list) gets a clear error; a tool of an opt-in family that
        is off still answers, saying how to turn it on."""
        from .. import tools
        if self.config.hidden_tools.get(str(name)) == NOT_LISTED:
            return self._hidden_tool_answer(str(name))
        try:
            live = kwargs.get("messages")
            self._follow_host(live)
            if live and self._usable_database():
                self.ingest(live)
        except Exception as exc:  # the tool still answers from what is stored
            if faults.is_database_error(exc):
                self._note_fault(exc, f"ingest before {str(name)[:60]}")
            else:
                self.errors.append(f"ingest before tool: {exc}")
        fault = None
        try:
            context = self.tool_context() if self._usable_database() else None
        except Exception as exc:
            if not faults.is_database_error(exc):
                raise
            fault = self._note_fault(exc, str(name)[:60])
            context = None
        if context is None:
            answer = unavailable.tool_answer(str(name), self.database_fault or fault or {},
                                             self.get_status())
            if not is_operator(self.owner):   # a gateway user: what is wrong, not where
                answer = caller.unusable_answer(answer, self.config.database_display)
            return json.dumps(answer, default=str)
        return tools.dispatch(name, args, context)

    def _hidden_tool_answer(self, name: str) -> str:
        """The error a hidden tool answers with: which setting hides it, what is exposed."""
        from ..schemas import error_json
        exposed = ", ".join(self.config.exposed_tool_names) or "none"
        return error_json(name, f"{name} is not available here: TROVE_EXPOSED_TOOLS leaves it "
                          f"out (exposed: {exposed})", self.counter.count_text,
                          self.config.tool_response_max_tokens)

    def tool_context(self):
        """What a tool may see: the store, the bound session (or none), the bounds."""
        from ..tools import ToolContext
        cfg = self.config
        return ToolContext(
            store=self.store, dag=self.dag, config=cfg, count_tokens=self.counter.count_text,
            session_id=None if self.session_mode == "ignored" else self._tool_session(),
            conversation_id=self.conversation_id,
            current_turn_store_id=self.current_turn_store_id, status=self.get_status,
            llm_call=self.llm_call("compression"),
            data_dir=cfg.resolved_database_path.parent, payloads=self.policy.payloads,
            now=self.clock,
            semantic=self._semantic())

    # ------------------------------------------------------------------ status
    def get_status(self) -> dict:
        """Runtime health for trove_status and /trove status."""
        state = {}
        if self.session_id:
            try:
                state = (self.store.get_session(self.canonical_id) or {}).get("state", {})
            except Exception as exc:
                self.errors.append(f"status: {exc}")
        last = self.last_compaction or state.get("last_compaction") or {}
        counter = self.counter
        return {
            "engine": ENGINE_NAME,
            "session_id": self.session_id,
            "canonical_session_id": self.canonical_id,
            "binding": self.binding,
            "platform": self.platform,
            "conversation_id": self.conversation_id,
            "context_length": self.context_length,
            "threshold_tokens": self.threshold_tokens,
            "trigger_rule": self.trigger_rule,
            "last_prompt_tokens": self.last_prompt_tokens,
            "last_checked_tokens": getattr(self, "last_checked_tokens", None),
            "usage_percent": round(100 * max(self.last_prompt_tokens, 0)
                                   / self.context_length, 1) if self.context_length else 0,
            "compression_count": self.compression_count,
            "overhead_tokens": self._overhead_tokens,
            "last_compaction": last,
            "reachability_problems": self.reachability,
            "token_counter": {"name": counter.name, "exact": counter.exact,
                              "reason": counter.reason, "accelerator": counter.accelerator},
            "database_path": self.config.database_display,
            "session_mode": self.session_mode,
            "review_fork": self.review_fork,
            "owner": self.owner,
            "last_switch": self.last_switch,
            "session_filter_match": self.session_filter_match,
            "ingest_policy": self.policy.describe(),
            "summary_spend": self.spend_guard.state(),
            "summary_breaker": self.summary_breaker.state(),
            "empty_lifecycle_gc": getattr(self, "lifecycle_gc", None),
            "background_prepare": {"share": self.config.background_prepare_share,
                                   **self._prepare_state()},
            "embeddings": semantic.status_of(self.config, self._semantic()),
            "tools": {"exposed": list(self.config.exposed_tool_names),
                      "hidden": self.config.hidden_tools},
            "errors": self.errors[-5:],
            "database_fault": self.database_fault,
        }
