"""reviewkit: the host's background review forks in the random walks (opt-in).

With Hermes's defaults a user's CLI runs a *review fork* every
``memory.nudge_interval`` user turns (memory enabled) and after
``skills.creation_nudge_interval`` tool iterations: ``AIAgent._spawn_background_review``
starts a thread named "bg-review" with a fresh agent that SHARES the parent's
session id, gets its own copy of the context engine and runs one turn whose user
message is a harness prompt ("Review the conversation above and ...", see
``binding/forks.py``). The tests' host config turns them off (hostkit.base_config);
``clikit.CliHost(reviews=True)`` turns them on, often, with this module:

* :data:`REVIEW_CONFIG`: the config.yaml part that makes forks fire every few turns;
* :func:`hermes_cli`: a ``cli.HermesCLI`` whose agent has the memory store (the memory
  review needs it) but still no context files of the working directory;
* :class:`ReviewReplies`: the scripted model's answers to a fork's requests (its own
  RNG: the parent's scripted replies stay those of the seed);
* :class:`ForkGate`: holds each fork until the walk runs it between two steps, so a
  seed replays the same and the store can be compared before and after each fork
  (:func:`fork_problems`: nothing of the fork stored, no session row, the user's
  rows unchanged).
"""
from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import hostkit as hk

# memory review every 3 user turns (memory enabled: the memory tool and a MemoryStore),
# skill review after every 2 tool iterations
REVIEW_CONFIG = {
    "memory": {"memory_enabled": True, "nudge_interval": 3},
    "skills": {"creation_nudge_interval": 2},
}

# the openings of the host's review prompts share this (agent/background_review.py)
HARNESS = "Review the conversation above"
# in every fork reply and memory the scripted model writes: never to be stored
FORK_MARK = "[review-fork]"
FORK_THREAD = "bg-review"


def _newest_user_text(body: dict) -> str:
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    return hk._content_text(users[-1].get("content")) if users else ""


def is_fork_request(body: dict) -> bool:
    """Whether a model request is a review fork's: its newest user message is the
    harness prompt (the fork replays the parent's history, then adds it)."""
    return _newest_user_text(body).lstrip().startswith(HARNESS)


class ReviewReplies:
    """The scripted model's side of a fork: the first request gets a memory write,
    a skill listing (both tools the host allows a fork) or a short reply; after a
    tool result, a short reply. Drawn from an RNG of its own, so a walk's parent
    replies are the same with forks on or off and a seed replays the same (the walk
    runs one fork at a time)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"review-forks-{seed}")
        self.lock = threading.Lock()
        self.count = 0

    def __call__(self, body: dict) -> Any:
        msgs = body.get("messages") or []
        with self.lock:
            self.count += 1
            n, roll = self.count, self.rng.random()
        if msgs and msgs[-1].get("role") == "tool":
            return f"{FORK_MARK} Review done, nothing more to keep (review {n})."
        if roll < 0.35:
            return hk.ToolCall("memory", {"action": "add", "target": "memory",
                                          "content": f"{FORK_MARK} walk note {n}: prefers short replies"})
        if roll < 0.6:
            return hk.ToolCall("skills_list", {})
        return f"{FORK_MARK} Nothing to save (review {n})."


# ---------------------------------------------------------------------------
# The CLI object with the memory store
# ---------------------------------------------------------------------------

def hermes_cli(cli_module: Any, *, resume: Optional[str], reviews: bool) -> Any:
    """A ``cli.HermesCLI`` as the tests build it. ``ignore_rules=True`` also means
    ``skip_memory`` for its agent, and without a MemoryStore the host never runs a
    memory review (agent/turn_context.py); so with ``reviews`` the CLI keeps its
    memory and its agent is told, once built, to skip the working directory's
    context files (its system prompt is built at its first turn, after that)."""
    cli = cli_module.HermesCLI(ignore_rules=not reviews, resume=resume)
    if reviews:
        build = cli._init_agent

        def init_agent(*args: Any, **kwargs: Any) -> Any:
            ok = build(*args, **kwargs)
            if cli.agent is not None:
                cli.agent.skip_context_files = True
            return ok

        cli._init_agent = init_agent
    return cli


# ---------------------------------------------------------------------------
# Forks run between steps
# ---------------------------------------------------------------------------

@dataclass
class ForkReport:
    """The forks one :meth:`ForkGate.run` ran and what they changed in the store."""
    forks: int = 0
    problems: List[str] = field(default_factory=list)
    late: int = 0        # in a turn, let go unchecked: it waited on the parent

    def as_dict(self) -> dict:
        return {"forks": self.forks, "problems": self.problems, "late": self.late}


def wait_for_threads(prefix: str, timeout: float = 60.0) -> bool:
    """Join this process's threads whose name starts with ``prefix`` (the engine's
    "trove-" passes, the host's "bg-review"); False when one is still running."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
    return True


# what a session is made of in the store (storage/migrations.py): a fork writes none of it
SESSION_TABLES = ("sessions", "messages", "session_owners", "session_views", "nodes",
                  "node_edges", "session_carry")


def store_snapshot(home: Any) -> Dict[str, list]:
    """Every row of the session tables (:data:`SESSION_TABLES`), sorted, per table."""
    import clikit as ck

    db = ck.connect_store(home)
    if db is None:
        return {}
    out: Dict[str, list] = {}
    try:
        for table in SESSION_TABLES:
            try:
                rows = db.execute(f"SELECT * FROM {table}").fetchall()
            except Exception:   # a table an older schema lacks
                continue
            out[table] = sorted((tuple(map(str, tuple(r))) for r in rows))
    finally:
        db.close()
    return out


def fork_problems(before: Dict[str, list], after: Dict[str, list]) -> List[str]:
    """What a fork changed in the store: any row of a session table (a fork stores
    nothing: its turn is not the user's, its throwaway binding leaves no session
    behind, and it must not move the user's views, owners or summaries)."""
    out = []
    for table in sorted(set(before) | set(after)):
        old, new = before.get(table, []), after.get(table, [])
        if old == new:
            continue
        gone, added = set(old) - set(new), [r for r in new if r not in set(old)]
        out.append(f"a fork changed {table}: {len(added)} row(s) added, {len(gone)} removed or "
                   f"changed; first added: {[tuple(v[:60] for v in r[:4]) for r in added[:2]]}")
    return out


def leaked_rows(home: Any) -> List[str]:
    """Stored rows (any session, any role) holding a harness prompt or a fork's text."""
    import clikit as ck

    out = []
    for row in ck.stored_rows(home, roles=None):
        text = str(row.get("content") or "")
        if HARNESS in text or FORK_MARK in text:
            out.append(f"{row['session_id']} {row['role']} {text[:60]!r}")
    return out


class ForkGate:
    """Holds every review fork this process's host spawns until the walk runs it.

    Installed for a CliHost's life (and in a second CLI process): it wraps
    ``agent.background_review.spawn_background_review_thread`` so the fork's thread
    waits before it starts its turn. Each fork runs alone, the store snapshotted
    before it and compared after it (the engine's own "trove-" passes waited for on
    both sides), the figures gathered in :meth:`take_report`.

    When: ``in_turn`` False, :meth:`run` between two steps. ``in_turn`` True, inside
    the next main model request of a turn (:meth:`responder`), the parent blocked
    waiting for its answer: its user message ingested, its preflight compaction done,
    its reply not stored yet, so a fork reads the session while the parent's turn is
    under way, still one order per seed. Not inside an auxiliary request: the host's
    title generation asks from a thread of its own while the parent goes on writing,
    and the engine's summaries may come from its background passes. A fork that
    cannot finish there (it waits on the blocked parent) is let go and waited for
    afterwards, unchecked (``late``)."""

    IN_TURN_TIMEOUT = 20.0

    def __init__(self, home: Any, *, in_turn: bool = False, timeout: float = 120.0) -> None:
        self.home = home
        self.in_turn = in_turn
        self.timeout = timeout
        self._held: List[tuple] = []        # (event, holder) per fork not run yet
        self._late: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._report = ForkReport()
        self._original: Optional[Callable] = None

    def install(self) -> "ForkGate":
        """Wrap the host's fork factory (undone by :meth:`uninstall`)."""
        from agent import background_review

        self._original = original = background_review.spawn_background_review_thread

        def spawn(*args: Any, **kwargs: Any) -> Any:
            target, prompt = original(*args, **kwargs)
            go = threading.Event()
            holder: dict = {}
            with self._lock:
                self._held.append((go, holder))

            def held_target() -> None:
                holder["thread"] = threading.current_thread()
                go.wait()
                target()

            return held_target, prompt

        background_review.spawn_background_review_thread = spawn
        return self

    def uninstall(self) -> None:
        """Run what is held and put the host's factory back."""
        with contextlib.suppress(Exception):
            self.run()
        if self._original is not None:
            from agent import background_review

            background_review.spawn_background_review_thread = self._original
            self._original = None

    def responder(self, inner: Callable[[dict], Any]) -> Callable[[dict], Any]:
        """``inner`` (the fake model) with the held forks run first on every main
        request that is not a fork's own (``in_turn``; else ``inner`` itself)."""
        if not self.in_turn:
            return inner

        def respond(body: dict) -> Any:
            if hk.is_main_request(body) and not is_fork_request(body):
                self._run_held(self.IN_TURN_TIMEOUT)
            return inner(body)

        return respond

    def run(self) -> None:
        """Between two steps (or at the end): every held fork runs now, and a late one
        is waited for."""
        self._run_held(self.timeout)
        for thread in self._late:
            thread.join(self.timeout)
            if thread.is_alive():
                self._report.problems.append("a review fork did not finish")
        self._late.clear()

    def take_report(self) -> ForkReport:
        """The forks run and the problems found since the last call."""
        with self._lock:
            report, self._report = self._report, ForkReport()
        return report

    def _run_held(self, timeout: float) -> None:
        with self._run_lock:
            while True:
                with self._lock:
                    if not self._held:
                        return
                    go, holder = self._held.pop(0)
                self._run_one(go, holder, timeout)

    def _run_one(self, go: threading.Event, holder: dict, timeout: float) -> None:
        wait_for_threads("trove-", timeout)
        before = store_snapshot(self.home)
        go.set()
        deadline = time.monotonic() + timeout
        while "thread" not in holder and time.monotonic() < deadline:
            time.sleep(0.01)   # the host started the thread: it records itself first
        thread = holder.get("thread")
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        if thread is None or thread.is_alive():
            if thread is not None and self.in_turn:
                self._late.append(thread)   # it waits on the parent: checked by nothing
                self._report.late += 1
            else:
                self._report.problems.append("a review fork did not finish")
            return
        wait_for_threads("trove-", timeout)
        self._report.forks += 1
        self._report.problems.extend(fork_problems(before, store_snapshot(self.home)))
