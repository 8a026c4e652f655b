"""The trove context engine: what the Hermes host talks to.

It orchestrates and holds no SQL: messages go to ``store``, nodes to ``dag``
(through ``compactor``), the prompt is put together by ``assemble`` and tool
calls go to ``tools``. State that several deep copies of the engine must
share (messages, nodes, the last compaction's outcome) lives in the database;
each copy keeps only plain values, so ``copy.deepcopy`` never meets an open
connection (the host falls back to its own compressor if the copy raises).
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from .binding import forks, host_input, switches
from .binding.session import SessionBinding, register
from .binding.session import find_engine, live_engines  # noqa: F401 (the engine API)
from .compaction import assemble, prepare, spend, sweep, tail_rows, tokens
from .compaction.budget import HOST_PROGRESS_SHARE, Budget, RealProjection, host_text_cost
from .storage import faults, identity, locks
from .compaction.compactor import Compactor, PassReport
from .config import TroveConfig, check_reachability, load_config, trigger_and_rule, trigger_tokens
from .dag import Dag
from .storage.database import get_database
from .compaction.host_llm import make_llm_call
from .ingest.policy import IngestPolicy, policy_for
from .recall import semantic
from .diagnostics import startup
from .diagnostics.compaction_text import noop_reason
from .compaction.message_memo import MessageMemo
from .store import Store
from .compaction.summarize import Summarizer, shared_breaker
from .orchestrator.maintenance import Maintenance
from .orchestrator.ingest_side import IngestSide
from .orchestrator.budget_side import BudgetSide
from .orchestrator.fault_side import FaultSide
from .orchestrator.tool_side import ENGINE_NAME, ToolSide

try:  # the host's ABC; scripts that run without Hermes get a plain base class
    from agent.context_engine import ContextEngine
except Exception:  # pragma: no cover - exercised only without hermes-agent
    class ContextEngine:  # type: ignore[no-redef]
        """Stand-in base class when hermes-agent is not installed."""

log = logging.getLogger(__name__)

# Floors of the window-scaled summary budgets (see ``_compactor``).
MIN_LEAF_BUDGET = 200
MIN_CONDENSED_BUDGET = 300
# How long a compaction or rotate waits for another one of the same session to finish.
COMPACTION_LOCK_SECONDS = 120.0
# Folds of the oldest summaries one compaction may make to keep the frontier in the
# block (each reads at most a leaf chunk): one was not enough when the host's tools
# left little room, and the block left its oldest summaries out of the prompt.
FOLDS_PER_PASS = 3



def _clean(message: dict) -> dict:
    """A message as returned to the host: without host-internal ``_`` keys
    (the same object when it has none, so per-message memos keep hitting)."""
    if not any(str(k).startswith("_") for k in message):
        return message
    return {k: v for k, v in message.items() if not str(k).startswith("_")}



class TroveEngine(SessionBinding, IngestSide, BudgetSide, FaultSide, ToolSide, Maintenance,
                  ContextEngine):
    """Lossless context management for one agent (the host deep-copies it per agent)."""

    def __init__(self, config: TroveConfig | None = None):
        self._config = config
        self.session_id: str | None = None      # the id the host gave us
        self.canonical_id: str | None = None    # where its messages are stored
        self.binding = "unbound"                 # unbound | host | env | ephemeral
        self.platform: str | None = None
        self.conversation_id: str | None = None
        self.context_length = 0
        self.threshold_tokens = 0
        self.trigger_rule = ""
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0
        self.threshold_percent = config.context_threshold if config else 0.35
        # The host reads these only to gate its estimates: its preflight check runs on
        # lists longer than protect_first_n + protect_last_n + 1. The tail is trove's
        # (TROVE_FRESH_TAIL_COUNT); reported as 32 it kept the preflight off for the
        # short lists a compaction leaves, and a big turn kept there was counted twice
        # (its api_content sidecar) by no check until the request went over the
        # threshold (host walk seeds 30 and 70003).
        self.protect_first_n = 0
        self.protect_last_n = 0
        self._last_compress_aborted = False
        self._last_compression_made_progress = False
        self._last_summary_error: str | None = None
        self._runtime: dict[str, Any] = {}
        self._known_tails: dict[str, dict] = {}  # block fingerprint -> what followed it
        self._memo = MessageMemo()
        self._rotate_pending = False
        self.session_mode = "normal"            # normal | ignored | stateless
        self.session_filter_match: str | None = None
        self._builtin = None                     # Hermes's compressor, for unstored sessions
        self._counter: tokens.TokenCounter | None = None
        self._overhead_tokens: int | None = None
        self._provider_prompt_tokens = 0         # the provider's last real prompt count
        self._real_projection = RealProjection()  # real tokens the host's list holds
        self.current_turn_store_id: int | None = None
        self.reachability: list[str] = []
        self.last_compaction: dict = {}
        self.errors: list[str] = []
        self._llm_override: tuple | None = None
        self.review_fork = False                 # a host review fork: never writes
        self.last_switch: dict = {}
        self._hint_at_bind: str | None = None
        self.owner: str | None = None
        self.clock: Callable[[], float] = time.time   # the tools' and rollups' "now"
        self._faults = faults.Tracker()           # what is wrong with the database, if anything
        self._origin: str | None = None           # this copy's name in the views table
        self._view = None                          # the view this copy wrote last
        self._last_ingest = None                   # its last ingest (a repeat is not read again)
        self._foreign_noted: set = set()
        self._copy_from: str | None = None         # a /branch's parent: its lists are copied
        self._earlier: tuple[str, ...] = ()        # sessions this copy was bound to, newest first
        self._real_overhead: int | None = None     # learned from the provider's usage
        self._kept_overhead: tuple | None = None   # (session, overhead) kept in its state
        self._declined_at: int | None = None       # the host's figure should_compress declined

    def __deepcopy__(self, memo):
        """The host copies the template per agent: plain state is copied, the frozen
        settings and the LLM override are shared, nothing holds a connection."""
        twin = self.__class__.__new__(self.__class__)
        memo[id(self)] = twin
        shared = ("_config", "_llm_override", "_runtime", "_counter")
        skipped = ("_builtin", "_last_ingest", "_view_db")  # built lazily again by the copy
        for key, value in self.__dict__.items():
            if key in skipped:
                twin.__dict__[key] = None
            else:
                twin.__dict__[key] = value if key in shared else copy.deepcopy(value, memo)
        twin._runtime = dict(self._runtime)
        twin._origin, twin._view = None, None
        return twin

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        """Must equal ``context.engine`` in the host config."""
        return ENGINE_NAME

    # ------------------------------------------------------------------ resources
    @property
    def config(self) -> TroveConfig:
        """Settings, read once per engine (copies share the frozen object)."""
        if self._config is None:
            self._config = load_config()
        return self._config

    @property
    def store(self) -> Store:
        """The message store on the process-wide shared connection."""
        db = get_database(self.config.database_target)
        if self._view is not None and self._view_db is not None and self._view_db is not db:
            self._forget_database_state()      # not a fresh copy's first read (None)
        self._view_db = db
        return Store(db)

    _view_db = None  # the database ``_view`` was read from (set by ``store``)

    def _forget_database_state(self) -> None:
        """The shared connection now holds another file (the old one was deleted or
        replaced under the running agent, see ``Database.file_replaced``): the view
        and reading this copy kept name rows of the old file, and read against the new
        one every message of the next lists was taken for a new one, turn after turn
        (the same turns stored three times). The new file is read afresh; the
        session is recorded in it."""
        self._view, self._last_ingest, self._known_tails, self._origin = None, None, {}, None
        if self.canonical_id and self.stores:
            try:
                Store(get_database(self.config.database_target)).ensure_session(
                    self.canonical_id, conversation_id=self.conversation_id,
                    source=self.platform)
            except Exception as exc:  # the next write reports what is wrong
                self.errors.append(f"database: {exc}")

    @property
    def dag(self) -> Dag:
        """Summary nodes on the same shared connection."""
        return Dag(get_database(self.config.database_target))

    @property
    def counter(self) -> tokens.TokenCounter:
        """The process-wide token counter for the configured encoding."""
        if self._counter is None:
            self._counter = tokens.get_counter(self.config.token_encoding,
                                               self.config.token_count_accelerator)
        return self._counter

    @property
    def policy(self) -> IngestPolicy:
        """Noise filters, redaction and payload guard shared by every copy in the process."""
        return policy_for(self.config)

    def llm_call(self, task: str = "compression"):
        """The host-backed LLM callable for summaries or expansion (None offline)."""
        if self._llm_override is not None:
            return self._llm_override[0]
        return make_llm_call(self._runtime, task)

    def use_llm(self, call) -> None:
        """Replace the host's models with ``call`` (or None: no LLM at all).

        For the offline demo, benchmarks and tests; the host path never calls it."""
        self._llm_override = (call,)

    def summarizer(self) -> Summarizer:
        """A summarizer wired to the user's models and the shared breaker."""
        cfg = self.config
        models = [cfg.summary_model or None, *cfg.summary_fallback_models]
        return Summarizer(llm_call=self.policy.redacting(self.llm_call("compression")),
                          count_tokens=self.counter.count_text, models=models,
                          breaker=self.summary_breaker, timeout_s=cfg.summary_timeout_ms / 1000,
                          instructions=cfg.summary_instructions, spend_guard=self.spend_guard)

    @property
    def summary_breaker(self):
        """The process-wide circuit breaker of the summary routes for these settings."""
        cfg = self.config
        return shared_breaker(cfg.summary_circuit_breaker_failure_threshold,
                              cfg.summary_circuit_breaker_cooldown_seconds)

    @property
    def spend_guard(self):
        """The process-wide summary spend guard for the configured caps."""
        cfg = self.config
        return spend.shared_guard(cfg.summary_max_calls_per_hour, cfg.summary_max_tokens_per_hour)

    # ------------------------------------------------------------------ host hooks
    @faults.host_entry()
    def update_model(self, model: str, context_length: int, base_url: str = "",
                     api_key: Any = "", provider: str = "", api_mode: str = "") -> None:
        """Record the window and runtime; recompute the trigger and check it is reachable."""
        self.context_length = host_input.count(context_length, self.context_length, self,
                                               "update_model")
        self.threshold_tokens, self.trigger_rule = trigger_and_rule(
            self.config, self.context_length, model or "")
        self.threshold_percent = (self.threshold_tokens / self.context_length
                                  if self.context_length else self.config.context_threshold)
        self._runtime = {"model": model, "provider": provider, "base_url": base_url,
                         "api_key": api_key, "api_mode": api_mode}
        self.reachability = check_reachability(self.config, self.context_length,
                                               model=model or "")
        for problem in self.reachability:
            log.warning("hermes-trove: %s", problem)

    @faults.host_entry()
    def on_session_start(self, session_id: str, **kwargs) -> None:
        """Bind the session: a compaction boundary continues the old conversation's
        storage; /new and /reset start a new session carrying high-level summaries."""
        session_id = host_input.session_id(session_id)
        if kwargs.get("hermes_home") and self._config is None:
            self._config = load_config(hermes_home=kwargs["hermes_home"])
        self.platform = kwargs.get("platform") or self.platform
        self.conversation_id = kwargs.get("conversation_id") or self.conversation_id
        if kwargs.get("context_length") and not self.context_length:
            self.update_model(kwargs.get("model") or "", kwargs["context_length"])
        if not session_id:
            self._unbind()
            return
        if self._classify(session_id) != "normal":
            self._bind(session_id, session_id, "host")  # nothing is written for it
            return
        old = kwargs.get("old_session_id")
        boundary = kwargs.get("boundary_reason")
        if self.session_id and session_id != self.session_id and boundary != "compression":
            self._forget_session_memory()  # the gateway's /new and /reset
        created = not boundary and not Path(self.config.resolved_database_path).exists()
        try:
            if not self._usable_database():
                raise faults.Unavailable(self.database_fault)
            self._start_session(session_id, old, boundary)
        except Exception as exc:
            if not faults.is_database_error(exc):
                raise
            if not isinstance(exc, faults.Unavailable):
                self._note_fault(exc, "on_session_start")
            self._bind(session_id, session_id, "host")  # tools still know the session
        if not boundary:
            startup.announce(self.config, self.platform, self.database_fault, created=created)

    def _start_session(self, session_id: str, old: str | None, boundary: str | None) -> None:
        """Record the session (and the one it continues) and bind it."""
        store = self.store
        if old and old != session_id and boundary == "compression":
            canonical = store.ensure_session(old, conversation_id=self.conversation_id,
                                             source=self.platform)
            canonical = store.ensure_session(session_id, conversation_id=self.conversation_id,
                                             source=self.platform, parent_session_id=old,
                                             canonical_id=canonical)
        else:
            canonical = self._run_session(session_id, store.ensure_session(
                session_id, conversation_id=self.conversation_id, source=self.platform,
                parent_session_id=old))
            if old and old != session_id:
                switches.carry_into(self.dag, switches.Switch(switches.NEW, old, session_id),
                                    old_canonical=store.canonical_session(old),
                                    new_canonical=canonical,
                                    retain_depth=self.config.new_session_retain_depth)
        self._bind(session_id, canonical, "host")
        self._start_background_checks()

    def _classify(self, session_id: str) -> str:
        """Apply the ignore/stateless session patterns (ignored wins)."""
        found = self.policy.sessions.classify(session_id, self.platform)
        self.session_mode, self.session_filter_match = found.kind, found.pattern
        return found.kind

    def _stores_session(self, session_id: str) -> bool:
        """Whether another session's messages would be written (its own patterns)."""
        return self.policy.sessions.classify(session_id, self.platform).kind == "normal"

    @property
    def stores(self) -> bool:
        """Whether this session's messages are written (not ignored, not stateless)."""
        return self.session_mode == "normal"

    def _bind(self, session_id: str, canonical: str, how: str) -> None:
        previous = self.session_id
        self._earlier = identity.earlier_sessions(self._earlier, self.canonical_id, canonical)
        self.session_id, self.canonical_id, self.binding = session_id, canonical, how
        self._known_tails = {}
        self._view, self._pending_turn, self._copy_from = None, None, None
        self._hint_at_bind = forks.host_session_hint()
        register(self, session_id, previous=previous, by_host=how == "host")
        if self.stores:
            self.note_owner()
            self.recall_overhead()

    def _unbind(self) -> None:
        self.session_id = self.canonical_id = None
        self.binding = "unbound"

    def _ensure_bound(self) -> str:
        """The canonical session to store under; binds lazily when the host never said.

        ``HERMES_SESSION_ID`` first; failing that an ephemeral session of its own,
        so messages are still kept and no query ever runs unscoped.
        """
        if self.canonical_id:
            return self.canonical_id
        env_id = forks.host_session_hint()
        session_id = env_id or f"trove-ephemeral-{uuid.uuid4().hex[:12]}"
        if self._classify(session_id) != "normal":
            self._bind(session_id, session_id, "env" if env_id else "ephemeral")
            return session_id
        canonical = self.store.ensure_session(session_id, source=self.platform)
        self._bind(session_id, canonical, "env" if env_id else "ephemeral")
        return canonical

    @faults.host_entry()
    def on_session_end(self, session_id: str, messages: list) -> None:
        """Persist what the host shows; not proof the session is over (it runs before
        every host compaction too), so nothing is torn down."""
        session_id = host_input.session_id(session_id)
        messages = host_input.messages(messages, self, "on_session_end")
        if messages and self._usable_database():
            try:
                self._ingest(messages, into=session_id or None, handover=True)
            except Exception as exc:
                if not faults.is_database_error(exc):
                    raise
                self._note_fault(exc, "on_session_end")
        self._start_rollups()

    @faults.host_entry()
    def on_session_reset(self) -> None:
        """Per-session counters restart on /new and /reset."""
        self.last_prompt_tokens = self.last_completion_tokens = self.last_total_tokens = 0
        self.compression_count = 0
        self._noop_at_tokens = None
        self._real_projection.forget()
        self._known_tails = {}

    @faults.host_entry()
    def update_from_response(self, usage: dict) -> None:
        """Track the provider's real usage (it beats any estimate)."""
        usage = usage if isinstance(usage, dict) else {}
        prompt = tokens.as_count(usage.get("prompt_tokens") or usage.get("input_tokens"))
        self.last_prompt_tokens = self._provider_prompt_tokens = prompt
        self.last_completion_tokens = tokens.as_count(usage.get("completion_tokens")
                                                      or usage.get("output_tokens"))
        self.last_total_tokens = (tokens.as_count(usage.get("total_tokens"))
                                  or self.last_prompt_tokens + self.last_completion_tokens)
        # the turn's last request, for whichever copy of the engine ends the turn
        self._set_turn_field("prompt", prompt or None)
        self._real_projection.counted(prompt, self.last_completion_tokens)
        self._declined_at = None  # the request was answered: no overflow follows it

    @faults.host_entry(False)
    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        """True at the trigger, unless the last pass proved nothing more can be done
        at this size (the host would otherwise retry pointlessly within the turn)."""
        if self._rotate_pending:
            return True  # an operator rotated the session: let the host pick it up now
        current = tokens.as_count(self.last_prompt_tokens if prompt_tokens is None
                                  else prompt_tokens)
        self.last_checked_tokens = current  # the number the host's trigger saw (status)
        if not current or current < 0 or self.threshold_tokens <= 0:
            return False
        self._declined_at = tokens.as_count(prompt_tokens) if prompt_tokens is not None else None
        current = self._real_projection.pressure(current)
        self._maybe_prepare(current)
        if current < self.threshold_tokens:
            return False
        self._declined_at = None
        if self._noop_at_tokens is not None and current <= self._noop_at_tokens:
            return False
        return True

    @faults.host_entry(False)
    def has_content_to_compress(self, messages: list) -> bool:
        """More than the newest conversational message (the gateway's /compress
        preflight): with only that, there is nothing a compaction could take. Only a
        block the engine rendered (and its acknowledgement) is not conversation; a
        pasted block header is."""
        messages = [m for m in messages or [] if isinstance(m, dict)]
        try:
            inserted = self._engine_own(messages)
        except Exception:  # a broken database: the header alone must do
            inserted = [assemble.is_trove_message(m) for m in messages]
        body = [m for m, ins in zip(messages, inserted) if m.get("role") != "system" and not ins]
        return len(body) > 1

    def _prepare_state(self) -> dict:
        """The background preparer's state; nothing to read while the database is broken."""
        if not self.canonical_id or not self._usable_database():
            return {"running": False}
        try:
            return prepare.state(self.store.db.path, self.canonical_id)
        except Exception as exc:  # status must answer whatever is wrong
            return {"running": False, "error": str(exc)[:200]}

    def _semantic(self):
        """The process's embedding side of this database (None when embeddings are off)."""
        if not self.config.embeddings_enabled or not self._usable_database():
            return None
        try:
            redactor = self.policy.redactor       # with redaction on, no secret is embedded
            return semantic.shared(self.store.db, self.config,
                                   redactor.redact if redactor is not None else None)
        except Exception as exc:  # semantic search is optional: full text still answers
            self.errors.append(f"embeddings: {exc}")
            return None

    # ------------------------------------------------------------------ compaction
    def compress(self, messages: list, current_tokens: int | None = None,
                 focus_topic: str | None = None, force: bool = False,
                 memory_context: str = "") -> list:
        """Persist, compact what must go, and return system + summaries + fresh tail.

        Never raises into the host: on an internal error the messages come back
        unchanged with ``_last_compress_aborted`` set and the error in status.
        """
        self._last_compress_aborted = False
        self._last_compression_made_progress = False
        self._last_summary_error = None  # a success clears the last failure
        # the host passes its estimate as an int or None; anything else is read the way
        # ``should_compress`` reads it (``tokens.as_count``: a numeric string's number,
        # else 0, "not known"); compared as it came, it raised a TypeError that aborted
        # every compaction
        if current_tokens is not None:
            current_tokens = tokens.as_count(current_tokens)
        try:
            self._follow_host(messages)
            if self.review_fork:
                return messages  # the host never lets a fork compress; be safe anyway
            if self._rotate_pending:
                self._rotate_pending, force = False, True
            if not self._usable_database():
                return self._compress_without_database(messages, current_tokens, focus_topic)
            self._ensure_bound()
            if not self.stores:
                return self._compress_unstored(messages, current_tokens, focus_topic)
            with self._compaction_lock():
                result = self._compress(messages, current_tokens, focus_topic, force)
            self._start_rollups()
            return result
        except Exception as exc:  # never break the agent
            if faults.is_database_error(exc):
                self._note_fault(exc, "compress")
                return self._compress_without_database(messages, current_tokens, focus_topic)
            log.exception("hermes-trove: compaction failed")
            self._last_compress_aborted = True
            self._last_summary_error = f"hermes-trove compaction failed: {exc}"
            self._record({"outcome": "error", "reason": str(exc)[:500]})
            return messages

    def _compress(self, messages: list, current_tokens: int | None,
                  focus: str | None, force: bool) -> list:
        """The compaction plan, in passes that give way step by step:

        1. count-protected tail (within a share of the budget), compact the rest;
        2. still over the trigger: the tail shrinks to the newest user message and
           the newest tool group, the rest is compacted;
        3. still over: condense harder (pairs).
        In every pass, a frontier too big for the summary block has its oldest nodes
        folded into one overview (``Compactor.fold_to_fit``) rather than left out.
        Whatever remains over the trigger is recorded as the precise reason.
        """
        started = time.perf_counter()
        cfg = self.config
        system = messages[0] if messages and messages[0].get("role") == "system" else None
        body = messages[1:] if system is not None else messages
        store_ids, inserted = self._ingest(body, system_prompt=False)
        trigger = self.threshold_tokens or trigger_tokens(cfg, self.context_length or 128_000)
        self._real_projection.recount(self._real_overhead, lambda: self.sent_tokens(body),
                                      self._host_overhead_of(messages, current_tokens))
        if not force and current_tokens is not None \
                and 0 < self._real_projection.pressure(current_tokens) < trigger:
            overflow = self._host_overflow_trigger(current_tokens)
            if overflow is None:
                self.last_compaction = {"at": time.time(), "outcome": "noop",
                                        "note": f"under the trigger ({current_tokens} < {trigger})"}
                return messages
            trigger = overflow
        shown_block = next((m.get("content") for m, ins in zip(body, inserted)
                            if ins and m.get("role") == "user"), None)
        session = self.canonical_id
        floor = (self.store.get_session(session) or {}).get("replay_floor", 0)
        covered = self.dag.covered_store_ids(s for s in store_ids if s is not None)
        live, stale = tail_rows.candidates(body, store_ids, inserted, covered, floor)
        live_msgs = [m for m, _ in live]
        count = self.count_message
        host_rough = self._host_rough(messages, current_tokens)
        budget = self._budget(messages, system, current_tokens, trigger, host_rough)
        before = self.sent_tokens(body)
        deterministic = self._under_critical_pressure(current_tokens)
        # a summary a worker is making right now is waited for, never longer than one call
        wait = 0.0 if deterministic else cfg.summary_timeout_ms / 1000
        report = PassReport()
        swept = sweep.Sweep() if cfg.threshold_full_sweep_enabled else None
        units = assemble.group_units(live_msgs)
        room = budget.real_room
        tail_count = self._tail_counter()

        def tail_cost(message: dict) -> int:
            # a stub (its tail count under its sent count) has no host estimate of its
            # own; any other message, sidecar or not, is priced by the host's estimate
            # too (read as a stub, an old turn the host counts 3x was kept and the
            # host's figure left only the newest message: host walk 1540000)
            exact = tail_count(message)
            rough = host_rough(message) if exact == self.sent_count(message) else exact
            return budget.cost(exact, rough)

        def text_cost(text: str) -> int:
            return budget.cost(self.counter.count_text(text), host_text_cost(text))

        # 1. a count-protected tail within a share of the room; 2. as much of it as
        # fits beside the block; 3. only the newest user message and tool group.
        first_cap = assemble.tail_token_cap(room, cfg.fresh_tail_max_tokens)
        newest, _ = assemble.choose_tail(live_msgs, units, max_count=1, max_tokens=0,
                                         count=tail_cost)
        if sum(tail_cost(live_msgs[i]) for i in newest) > first_cap \
                and not cfg.fresh_tail_max_tokens:
            # a big newest turn does not starve the rest: older turns that fit beside
            # the block's minimum still stay raw
            first_cap = max(first_cap, room - min(2_000, room))
        passes = [(cfg.fresh_tail_count, first_cap, cfg.condense_fanout),
                  (cfg.fresh_tail_count, None, cfg.condense_fanout), (1, 0, 2)]
        result, omitted, host_final, final = messages, [], 0, 0
        block_cost, gave_way, tail_cut, frontier_ids = 0, False, False, None
        for max_count, max_tokens, fanout in passes:
            if max_tokens is None:
                max_tokens = max(0, room - block_cost)
            keep, cut = assemble.choose_tail(live_msgs, units, max_count=max_count,
                                             max_tokens=max_tokens, count=tail_cost)
            keep -= stale
            # When the share left only the newest turn (a big one), the turns before it
            # that may fit beside the block as it turns out are held back from the
            # first summary pass (not under an explicit tail cap): the block's real
            # size decides them, after this pass's condensation. Held against the
            # smallest block (its header and the acknowledgement), not the frontier as
            # it stands: the pass may condense that frontier into less (host walk
            # 220005: a 150-token turn was summarized against the old block, or the new
            # leaves before their merge, and the block as sent left room for it).
            minimal = self._minimal_tail(live_msgs, units)
            held: set[int] = set()
            if cut and max_tokens == first_cap and not cfg.fresh_tail_max_tokens \
                    and len(keep) <= minimal:
                block_floor = text_cost(assemble.BLOCK_HEADER) + text_cost(assemble.ACK_TEXT)
                wider, _ = assemble.choose_tail(live_msgs, units, max_count=max_count,
                                                max_tokens=max(0, room - block_floor),
                                                count=tail_cost)
                held = wider - keep - stale
            compactor = self._compactor(room)
            if swept is not None:
                compactor.summarizer = swept.bound(compactor.summarizer)

            def summarize(indices: list[int], may_defer: bool) -> set[int]:
                """Leaf summaries of these live messages; the store_ids left raw."""
                backlog = [(live[i][1], self.stored_form(live_msgs[i]), None, count(live_msgs[i]))
                           for i in indices if live[i][1] is not None and live[i][1] not in covered]
                if not backlog:
                    return set()
                raw = prepare.leaf_pass(compactor, self.store.db, session, backlog,
                                        chunk_tokens=self._chunk_tokens(backlog), focus=focus,
                                        deterministic_only=deterministic, report=report,
                                        may_defer=may_defer, wait_seconds=wait)
                self._collect_transcript_garbage([r[0] for r in backlog if r[0] not in raw])
                self._extract_assertions(session, max((r[0] or 0) for r in backlog))
                return raw

            raw = summarize([i for i in range(len(live_msgs)) if i not in keep and i not in held],
                            may_defer=max_count == cfg.fresh_tail_count and not held)
            keep = keep | {i for i in range(len(live)) if live[i][1] in raw}
            if swept is None or swept.should_condense(
                    self.dag.frontier(session), lambda n: n["token_count"],
                    target_tokens=cfg.summary_prefix_target_tokens,
                    chunk_tokens=cfg.leaf_chunk_tokens):
                prepare.condense(compactor, self.store.db, session, fanout=fanout,
                                 max_depth=cfg.incremental_max_depth, focus=focus,
                                 deterministic_only=deterministic, report=report,
                                 wait_seconds=wait)
            if held:
                # the held turns that fit beside the block as it stands, condensed, stay raw
                room_now = room - self._block_cost(self.dag.frontier(session), text_cost)
                fits, _ = assemble.choose_tail(live_msgs, units, max_count=max_count,
                                               max_tokens=max(0, room_now), count=tail_cost)
                summarize(sorted(held - fits), may_defer=False)
                keep = keep | (held & fits)
                cut = len(keep) < min(max_count, len(live_msgs))
            tail_cut = cut
            gave_way = cut and len(keep) <= minimal
            tail = self._replay_stubs([self.policy.for_replay(_clean(live_msgs[i]))
                                       for i in sorted(keep)], [live[i][1] for i in sorted(keep)])
            stale = {new for new, old in enumerate(sorted(keep)) if old in stale}
            live, live_msgs = ([live[i] for i in sorted(keep)], [live_msgs[i] for i in sorted(keep)])
            units = assemble.group_units(live_msgs)
            tail_tokens = sum(tail_cost(m) for m in tail)
            block_budget = max(room - tail_tokens, min(2_000, room))
            for _ in range(FOLDS_PER_PASS):
                if compactor.fold_to_fit(
                        session, budget_tokens=block_budget - text_cost(assemble.BLOCK_HEADER),
                        cost=lambda node: text_cost(assemble.node_section(node)),
                        max_source_tokens=cfg.leaf_chunk_tokens, focus=focus,
                        deterministic_only=deterministic, report=report) is None:
                    break
            frontier = self.dag.frontier(session)
            frontier_ids = sorted(n["node_id"] for n in frontier)
            needs_block = bool(frontier) or (tail and tail[0].get("role") != "user")
            if shown_block is not None and not (report.leaf_ids or report.condensed_ids) \
                    and self._renders_frontier(session, shown_block, frontier_ids):
                block, omitted = shown_block, []  # nothing changed: keep the cached prefix
            else:
                block, _, omitted = (assemble.render_context_block(
                    frontier, budget_tokens=block_budget, count_text=text_cost)
                    if needs_block else (None, [], []))
            block_cost = text_cost(block) if block is not None else 0
            result = assemble.build_prompt(system, block, tail)
            returned = result[1:] if system is not None else result
            final = (budget.real_overhead + budget.system_exact
                     + self.sent_tokens(returned))
            host_final = (budget.host_overhead + budget.system_rough
                          + sum(host_rough(m) for m in returned))
            if final < trigger and host_final < trigger:
                break
        over = final >= trigger or host_final >= trigger
        # the guard is for the host's retries within a turn; a /compress (``force``) is
        # between turns, and the next turn's list is counted otherwise (host walk 120000)
        self._noop_at_tokens = (max(final, host_final, current_tokens or 0)
                                if over and not force else None)
        if swept is not None:
            report.sweep = swept.describe()
        return self._finish(messages, result, current_tokens, force, before=before, final=final,
                            host_final=host_final,
                            trigger=trigger, budget=budget, report=report, gave_way=gave_way,
                            tail_cut=tail_cut, omitted=omitted, started=started, tail=live,
                            frontier_ids=frontier_ids)

    @staticmethod
    def _block_cost(frontier: list, text_cost) -> int:
        """What a summary block holding ``frontier`` costs (header, sections and the
        acknowledgement that may follow it), before any node is left out."""
        if not frontier:
            return 0
        return (text_cost(assemble.BLOCK_HEADER) + text_cost(assemble.ACK_TEXT)
                + sum(text_cost(assemble.node_section(n)) for n in frontier))

    def _minimal_tail(self, messages: list, units: list) -> int:
        """How many messages the tail keeps when it gives way entirely: the newest
        unit and the newest real user message."""
        keep, _ = assemble.choose_tail(messages, units, max_count=1, max_tokens=0,
                                       count=lambda m: 1)
        return len(keep)

    def _renders_frontier(self, session: str, block: str, frontier_ids: list[int]) -> bool:
        """Whether a shown block was rendered from exactly this frontier (another
        process may have compacted since: then the block is rendered anew)."""
        try:
            meta = self.store.block_meta(session, identity.fingerprint_block(block))
        except Exception:  # a broken view table must not stop the compaction
            return False
        return bool(meta) and meta.get("frontier") == frontier_ids

    def _finish(self, messages: list, result: list, current_tokens: int | None, force: bool,
                *, before: int, final: int,
                host_final: int, trigger: int, budget: Budget, report: PassReport,
                gave_way: bool, tail_cut: bool, omitted: list, started: float, tail: list,
                frontier_ids: list | None) -> list:
        """Decide progress or no-op, record the outcome and the returned view, update
        host-facing counters."""
        changed = result != [_clean(m) for m in messages]
        unseen = changed and not self._host_takes(messages, result, current_tokens, force)
        changed = changed and not unseen
        tail_tokens = sum(self.sent_count(m) for m, _ in tail)
        outcome = {
            "outcome": "compacted" if changed else "noop",
            "tokens_before": budget.real_overhead + before,
            "tokens_after": final, "host_tokens_after": host_final, "trigger": trigger,
            "overhead": budget.real_overhead, "host_overhead": budget.host_overhead,
            "budget": budget.describe(),
            "leaf_nodes": report.leaf_ids, "condensed_nodes": report.condensed_ids,
            "summarizer_calls": report.summarizer_calls, "levels": report.levels,
            "summary_problems": report.summary_problems,
            "prepared_used": report.prepared_used, "sweep": report.sweep,
            "tail_gave_way": gave_way, "tail_cut_by_tokens": tail_cut,
            "tail_kept": len(tail), "tail_messages": len(tail), "tail_tokens": tail_tokens,
            "omitted_nodes": len(omitted),
            "seconds": round(time.perf_counter() - started, 4),
        }
        if not changed and final < trigger and host_final < trigger:
            outcome["reason"] = noop_reason(len(tail), self.config.fresh_tail_count,
                                            max(final, host_final), trigger)
            log.info("hermes-trove: compaction changed nothing: %s", outcome["reason"])
        if final >= trigger or host_final >= trigger:
            worst = max(final, host_final)
            outcome["reason"] = (
                f"prompt still {worst} tokens >= trigger {trigger}: the newest user message "
                f"and newest tool group alone need {tail_tokens} tokens with "
                f"{budget.real_overhead} tokens of host overhead" if changed or report.leaf_ids
                else f"nothing left to compact: everything shown is the protected newest turn "
                f"({worst} tokens vs trigger {trigger})")
            if self.context_length and final > self.context_length:
                outcome["over_window"] = True
                log.warning("hermes-trove: %s", outcome["reason"])
        if unseen:  # the same list gives the same pass: no retry within the turn
            self._noop_at_tokens = max(self._noop_at_tokens or 0, final, host_final,
                                       current_tokens or 0)
            outcome["reason"] = ("kept the list as it was: the host would not count this pass "
                                 "as progress (as many rows, its estimate down by less than "
                                 f"{round((1 - HOST_PROGRESS_SHARE) * 100)}%)")
        if changed:
            self.compression_count += 1
            self._last_compression_made_progress = True
            self._real_projection.forget()
            self._remember_returned(result, tail, frontier_ids,
                                    has_block=len(result) > len(tail) + (
                                        1 if result and result[0].get("role") == "system" else 0))
        self._record(outcome)
        return result if changed else messages

    def _compactor(self, message_budget: int) -> Compactor:
        """Summary budgets from the settings, scaled down for small windows so a
        handful of summaries still fits beside the tail."""
        cfg = self.config
        return Compactor(self.dag, self.summarizer(), self.counter.count_text,
                         leaf_budget=min(cfg.leaf_summary_tokens,
                                         max(MIN_LEAF_BUDGET, message_budget // 8)),
                         condensed_budget=min(cfg.condensed_summary_tokens,
                                              max(MIN_CONDENSED_BUDGET, message_budget // 5)))

    def _record(self, outcome: dict) -> None:
        """Keep the last compaction's outcome on the engine and in the session state."""
        outcome = {"at": time.time(), **outcome}
        self.last_compaction = outcome
        if outcome.get("outcome") == "noop" and "reason" not in outcome:
            return  # a plain no-op is not worth a disk write on the turn's path
        if self.canonical_id:
            try:
                self.store.update_session_state(self.canonical_id, {"last_compaction": outcome})
            except Exception as exc:  # status bookkeeping must never fail a turn
                self.errors.append(f"state: {exc}")

    def _compaction_lock(self):
        """The bound session's compaction lock (threads and processes; see ``locks``)."""
        return locks.session_compaction(self.store.db.path,
                                        self.canonical_id, COMPACTION_LOCK_SECONDS)
