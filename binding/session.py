"""Following the host's current session: the live-engine registry and the
session-binding half of the engine (a mixin of ``TroveEngine``).

The host reaches the engine on several paths (docs/architecture.md, "Host
session paths"): ``on_session_start`` (gateway, agent init, compaction
boundary), ``bind_session_state`` (the CLI's reset-only /new, /resume and
/branch), and nothing at all when it changes ``agent.session_id`` behind the
engine's back. The order of precedence:

1. ``on_session_start`` and ``bind_session_state`` bind at once and always win;
2. a review fork (the host's harness prompt in the messages it is handed)
   never writes, whatever it is bound to;
3. last, the lazy check before each compaction and tool call: when
   ``HERMES_SESSION_ID`` (the host's per-task context variable, else the
   environment) changed since the last bind to an id no engine of this
   process was given by a host call, the host switched without telling and
   the engine follows. A session another engine was given (a subagent's) is
   never taken over.

Hooks (``pre_llm_call``, ``post_llm_call``) name their session and reach only
an engine bound to it now (``find_engine``); when several copies are, the one a
bind in the hook's own context made (its agent's), else the one bound last.
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref

from ..storage import faults, locks
from ..storage.owners import Owners
from . import cron, forks, host_input, owners, switches

# Session id -> the engines bound to it, oldest first (weak: a dropped agent's copy
# goes). Usually one; a second copy on the same session (two CLIs in one process, a
# gateway hygiene agent) must not hide the first, nor take it away when it leaves.
_live_engines: dict[str, list] = {}
_live_lock = threading.Lock()
# Session ids some engine of this process was bound to by a host call: the lazy
# HERMES_SESSION_ID check never moves an engine onto a session another agent owns.
_claimed_ids: set[str] = set()
# Session id -> the engine copy bound to it in this context (weak). The host builds an
# agent (which binds its copy) and runs its turns in that context or a copy of it
# (cron/scheduler.py ``run_job``: ``contextvars.copy_context()`` after ``AIAgent(...)``),
# so a hook tells apart two copies bound to one id: two cron runs of a job started in
# the same second share ``cron_<job>_<stamp>``, and the copy bound last took both
# runs' hooks, storing the first run's turns in the second run's session.
_bound_here: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "trove_bound_here", default=None)


def register(engine, session_id: str, *, previous: str | None, by_host: bool) -> None:
    """Make ``engine`` the live engine of ``session_id`` (and no longer of the id it
    left, so a late hook for that id cannot reach it)."""
    with _live_lock:
        if previous and previous != session_id:
            _drop(previous, engine)
        _drop(session_id, engine)
        _live_engines.setdefault(session_id, []).append(weakref.ref(engine))
        if by_host:
            _claimed_ids.add(session_id)
        _drop_run_claims(engine, getattr(engine, "canonical_id", None))
    here = {k: r for k, r in (_bound_here.get() or {}).items() if r() not in (None, engine)}
    here[session_id] = weakref.ref(engine)
    _bound_here.set(here)
    _hold_bound(engine)


def _drop(session_id: str, engine) -> None:
    """Take ``engine`` (and copies that are gone) off a session's list (lock held)."""
    refs = [r for r in _live_engines.get(session_id, ()) if r() not in (None, engine)]
    if refs:
        _live_engines[session_id] = refs
    else:
        _live_engines.pop(session_id, None)


def _all_engines() -> list:
    """Every live engine, each once (lock held)."""
    found: dict[int, object] = {}
    for refs in _live_engines.values():
        for ref in refs:
            engine = ref()
            if engine is not None:
                found[id(engine)] = engine
    return list(found.values())


def _hold_bound(engine) -> None:
    """Hold (``locks.hold_sessions``) every stored session an engine of this process is
    bound to in ``engine``'s database, and let go of those none is bound to any more:
    ``doctor clean`` in another process then never removes a session a running Hermes
    may still write to. Never fails the bind."""
    try:
        if not getattr(engine, "stores", False) or not engine._usable_database():
            return
        path = str(engine.store.db.path)
        with _live_lock:
            engines = _all_engines()
        bound = {e.canonical_id for e in engines
                 if getattr(e, "canonical_id", None) and getattr(e, "stores", False)
                 and getattr(e, "_config", None) is not None
                 and str(e.store.db.path) == path}
        with _live_lock:   # a run's session taken and not bound yet keeps its claim
            bound |= {canonical for (db, canonical), ref in _run_claims.items()
                      if db == path and ref() is not None}
        locks.hold_sessions(path, bound | {engine.canonical_id} - {None})
    except Exception as exc:  # bookkeeping must never break a session
        getattr(engine, "errors", []).append(f"session hold: {exc}")


# (database, canonical session) -> the engine copy that took it for a cron run
# (``cron.run_session``), from its choice until it binds elsewhere: two runs whose
# agents are built at once on two threads choose in turn, never the same session.
_run_claims: dict[tuple[str, str], weakref.ref] = {}


def _drop_run_claims(engine, keep: str | None) -> None:
    """Forget ``engine``'s run claims but the one on ``keep`` (and dead ones; lock held)."""
    for key, ref in list(_run_claims.items()):
        if ref() is None or (ref() is engine and key[1] != keep):
            del _run_claims[key]


# The turn in progress of each (database, canonical session) in this process: the
# user message ``pre_llm_call`` named, the one a compaction before it stored and the
# no-op guard of a hopeless compaction (``orchestrator/ingest_side``).
# Shared by every engine copy bound to the session, since the hooks reach one copy
# (the one registered last) and the host may ingest through another (a gateway
# hygiene agent's copy outliving its compaction; two CLIs on one session in one
# process: host walk 100018, in-process).
_turns: dict[tuple[str, str], dict] = {}


def turn_state(key: tuple[str, str], field: str):
    """One field of a session's turn in progress (None when there is none)."""
    with _live_lock:
        return _turns.get(key, {}).get(field)


def set_turn_state(key: tuple[str, str], field: str, value) -> None:
    """Set one field of a session's turn in progress (a session with none left is
    dropped, so the table holds only turns under way)."""
    with _live_lock:
        state = _turns.setdefault(key, {})
        state[field] = value
        if all(v is None for v in state.values()):
            del _turns[key]


def claimed(session_id: str) -> bool:
    """Whether a host call gave ``session_id`` to some engine of this process."""
    with _live_lock:
        return session_id in _claimed_ids


def find_engine(session_id: str | None = None):
    """The live engine bound to a session now (default: the host's
    ``HERMES_SESSION_ID``); when several are, the one bound in the caller's context
    (``_bound_here``: the hook's own agent), else the one bound last; None when every
    engine registered under that id has since switched to another session."""
    key = session_id or forks.host_session_hint() or ""
    with _live_lock:
        engines = [r() for r in reversed(_live_engines.get(key, ()))]
    engines = [e for e in engines if e is not None and e.session_id == key]
    if len(engines) > 1:
        ref = (_bound_here.get() or {}).get(key)
        mine = ref() if ref is not None else None
        if any(e is mine for e in engines):
            return mine
    return engines[0] if engines else None


def live_engines() -> list:
    """Every live engine of this process (status and tests)."""
    with _live_lock:
        return _all_engines()


class SessionBinding:
    """The engine's session-following methods. The engine provides ``store``,
    ``dag``, ``config``, ``platform``, ``conversation_id``, ``stores``,
    ``_classify``, ``_bind`` and the per-session attributes reset here."""

    @property
    def _session_id(self) -> str | None:
        """What the host compares with ``agent.session_id`` after a reset to decide
        whether to call ``bind_session_state`` (run_agent.reset_session_state)."""
        return self.session_id

    def note_owner(self, sender_id: str | None = None) -> None:
        """Record whose session this is (see ``binding.owners``); ``sender_id`` is the
        user id ``pre_llm_call`` gives. Called at every bind and turn: when nothing is
        new it costs one primary-key read, which also notices an owner row that went
        away (a clean-up in another process) and records it again. Never fails the
        caller."""
        if not self.canonical_id or not self.stores:
            return
        key, facts = owners.session_owner(session_id=self.canonical_id, platform=self.platform,
                                          conversation_id=self.conversation_id,
                                          sender_id=sender_id)
        noted = (self.canonical_id, key, *facts.values())
        try:
            if noted == getattr(self, "_owner_noted", None) and \
                    Owners(self.store.db).owner_of(self.canonical_id) is not None:
                return  # nothing new and the row is there: no write on the turn's path
            self.owner = Owners(self.store.db).record(self.canonical_id, key, **facts)
            self._owner_noted = noted
        except Exception as exc:  # bookkeeping must never break a session
            self.errors.append(f"owner: {exc}")

    @faults.host_entry()
    def bind_session_state(self, session_db, session_id: str) -> None:
        """The CLI's /new, /resume and /branch: the host set ``agent.session_id`` and
        reset, without ``on_session_start``. Follow it (see ``binding.switches``)."""
        session_id = host_input.session_id(session_id)
        if not session_id or session_id == self.session_id:
            return
        self._switch_session(session_id, switches.host_session_row(session_db, session_id))

    def _switch_session(self, session_id: str, host_row: dict | None) -> None:
        """Bind to the session the host switched to: resume its own store, or start
        it with the carry-over a /new or /branch gets; per-session memory restarts."""
        old, old_canonical = self.session_id, self.canonical_id
        self._forget_session_memory()
        if self._classify(session_id) != "normal":
            self._bind(session_id, session_id, "host")
            return
        store = self.store
        switch = switches.classify(store, old_session_id=old, new_session_id=session_id,
                                   host_row=host_row)
        canonical = self._run_session(session_id, store.ensure_session(
            session_id, conversation_id=self.conversation_id, source=self.platform,
            parent_session_id=old if switch.kind != switches.RESUME else None))
        carried = switches.carry_into(self.dag, switch, old_canonical=old_canonical,
                                      new_canonical=canonical,
                                      retain_depth=self.config.new_session_retain_depth)
        self._bind(session_id, canonical, "host")
        if switch.kind == switches.BRANCH:
            self._copy_from = old_canonical  # the branch stores its own copy of that history
        self.last_switch = {"kind": switch.kind, "from": old, "to": session_id,
                            "carried_nodes": len(carried), "at": time.time()}

    def _run_session(self, session_id: str, canonical: str) -> str:
        """Where this copy stores ``session_id``: ``canonical``, except for a cron run
        whose host id an earlier run of the same second used (``cron.run_session``)."""
        return cron.run_session(self.store, self.dag, session_id, canonical,
                                self._run_taken, (self.session_id, self.canonical_id))

    def _run_taken(self, canonical: str) -> bool:
        """Whether another run has ``canonical`` in this database: another live engine
        copy of this process stores into it or took it, or another process took it
        (``locks.claim_run``). When none has, this copy takes it, in the same step:
        two runs choosing at once never both find it free."""
        path = str(self.store.db.path)
        with _live_lock:
            claim = _run_claims.get((path, canonical))
            holder = claim() if claim is not None else None
            if holder is not None and holder is not self:
                return True
            if any(e is not self and getattr(e, "canonical_id", None) == canonical
                   and getattr(e, "_config", None) is not None
                   and str(e.store.db.path) == path for e in _all_engines()):
                return True
            if not locks.claim_run(path, canonical):
                return True
            _drop_run_claims(self, None)
            _run_claims[(path, canonical)] = weakref.ref(self)
            return False

    def end_run(self) -> None:
        """The host ended this copy's cron run (its ``on_session_end`` hook after the
        run's one turn): let go of the run's claim at once (``locks.release_run``).
        Kept until this process's next bind, a gateway that ran one job and then
        idled kept it from every other process. What the run stored keeps its session
        taken (``cron.run_session``); the copy stays bound to it."""
        canonical = self.canonical_id
        if not canonical or cron.job_of(canonical) is None or not self.stores:
            return
        path = str(self.store.db.path)
        with _live_lock:
            claim = _run_claims.get((path, canonical))
            if claim is None or claim() is not self:
                return
            del _run_claims[(path, canonical)]
        locks.release_run(path, canonical)

    def _forget_session_memory(self) -> None:
        """What one session's compactions taught this copy; wrong for any other."""
        self._known_tails = {}
        self._view = self._pending_turn = None
        self._noop_at_tokens = None
        self._rotate_pending = False
        self.current_turn_store_id = None
        self.last_compaction = {}

    def _follow_host(self, messages: list | None = None) -> None:
        """The lazy check before a compaction or tool call.

        Precedence: ``on_session_start`` and ``bind_session_state`` bind at once
        and always win; a review fork (its harness prompt in ``messages``) never
        writes; last, when ``HERMES_SESSION_ID`` changed since the last bind to an
        id no engine of this process was given by a host call, the host switched
        without telling and the engine follows."""
        if messages:  # judged per call: only a fork's own turn shows its harness last
            self.review_fork = forks.review_start(messages) is not None
        if self.review_fork or self.binding != "host":
            return
        hint = forks.host_session_hint()
        if hint and hint != self.session_id and hint != self._hint_at_bind:
            if not claimed(hint):
                self._switch_session(hint, None)

    def _tool_session(self) -> str | None:
        """The session a tool call reads: a review fork reads (never writes) the user
        session its hooks named on this thread; everyone else its own."""
        if self.review_fork and forks.review_session():
            return self.store.canonical_session(forks.review_session())
        return self.canonical_id

    def become_review_fork(self, user_session_id: str) -> None:
        """This copy serves a background review fork of ``user_session_id``: it never
        writes again, and the throwaway session the fork was started under (empty:
        nothing was stored for it) is removed so every review leaves no trace."""
        self.review_fork = True
        own = self.canonical_id
        if not own:
            return
        try:
            store = self.store
            if (own == store.canonical_session(user_session_id) or store.count_messages(own)
                    or self.dag.session_nodes(own)):
                return
            with store.db.transaction() as conn:
                store.delete_sessions_in(conn, [own])
                Owners.delete_in(conn, [own])
        except Exception as exc:  # tidying must never break the fork's turn
            self.errors.append(f"review fork cleanup: {exc}")
