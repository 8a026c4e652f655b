"""hostkit: drive the real Hermes Agent 0.19.0 host offline, in-process, from pytest.

API (details in each docstring)
-------------------------------
FakeOpenAIServer(responder=None, *, model="fake-model", context_length=None,
                 prompt_tokens_fn=estimate_prompt_tokens, chunk_size=40)
    127.0.0.1:<ephemeral>; .start()/.stop()/context manager; .port, .base_url;
    .requests / .chat_bodies / .main_bodies (streaming) / .aux_bodies (non-streaming);
    .responder(body) -> Reply | str | ToolCall | [ToolCall] | None ("ok").
Reply(text="", tool_calls=[], prompt_tokens=None, completion_tokens=None, finish_reason=None, status=200)
ToolCall(name, arguments={}, id=None); scripted(*replies, then="ok"); tool_then_text(name, args, text)
make_hermes_home(tmp_path, port, *, context_length=65536, plugin_dir=REPO_ROOT, extra_config=None,
                 plugin_name=None, engine="trove", model="fake-model") -> Path
host_env(hermes_home, *, home=None, block_network=True, extra_env=None) -> ctx manager yielding HostEnv
make_agent(*, session_db=True, cli_runtime=True, statuses=None, **AIAgent_kwargs) -> AIAgent
run_turns(agent, texts, *, history=None) -> [result]; end_session(agent, messages); manual_compress(agent, history, focus)
live_engine(agent), template_engine(), uses_plugin_engine(agent, "trove", plugin_name=None),
plugin_module("hermes-trove"), plugin_loaded(name), run_slash_command(name, args), fixed_overhead(body)
write_probe_plugin(dest, name="trove-probe"), write_probe_settings(home, threshold_tokens=..., compress_once=...)
pytest fixtures ``fake_llm`` and ``trove_host`` (import them into the test module).

Offline config (make_hermes_home)
---------------------------------
model {provider: custom, base_url, api_key, context_length}: context_length in config short-circuits
the model-metadata lookups (agent/model_metadata.py:2118), so no models.dev / OpenRouter fetch;
the host still probes the fake server (GET /api/v1/models, /api/tags, /v1/props, /props, /version,
/v1/models; POST /api/show on the first compaction) and accepts 404s.
security.tirith_enabled=false (+ env TIRITH_ENABLED=false): no scanner download (tools/tirith_security.py).
security.allow_lazy_installs=false (+ env HERMES_DISABLE_LAZY_INSTALLS=1): no pip installs.
agent.environment_probe=false: no python/pip/uv subprocess probe in the system prompt
(agent/system_prompt.py:374, tools/env_probe.py) -> deterministic prompt.
memory.* off + skip_memory=True: no MemoryStore, no memory-review fork (agent/turn_context.py:494).
skills.creation_nudge_interval=0: no background skill-review agent after 10 tool iterations
(agent/turn_finalizer.py:577-595) - it would send extra requests to the fake model.
Update checks, curator, title generation, skills-hub sync and the model catalog live in the CLI
(cli.py / hermes_cli), not in AIAgent: an in-process agent never runs them (curator/model_catalog
are switched off anyway). No telemetry path exists in AIAgent. NetworkGuard (on by default in
host_env) records/refuses any non-loopback connect: the tests assert it stays empty.

Process-wide state host_env resets (reset_host_state)
-----------------------------------------------------
hermes_cli.plugins._plugin_manager (singleton, plugins.py:2029) and sys.modules["hermes_plugins*"]
(the plugin package, plugins.py _load_directory_module); hermes_cli.config _LOAD_CONFIG_CACHE /
_RAW_CONFIG_CACHE / _LAST_EXPANDED_CONFIG_BY_PATH / _HERMES_HOME_ENSURED / env cache;
model_tools._tool_defs_cache; tools.registry check_fn cache; agent.auxiliary_client._client_cache;
agent.model_metadata endpoint caches; gateway.session_context vars (AIAgent init sets
HERMES_SESSION_ID in the ContextVar and os.environ, agent_init.py:1290); hermes_logging file
handlers (they point at the previous home's logs/). Path constants frozen at import time are
re-pointed: run_agent._hermes_home (run_agent.py:125, used for logs), hermes_state.DEFAULT_DB_PATH,
tools.skills_tool/skill_manager_tool/skills_sync HERMES_HOME+SKILLS_DIR, ... (see _module_paths).
Plugins are discovered once at ``import model_tools`` (model_tools.py:206); host_env re-runs
discover_plugins() under the new home, like a fresh process. Not undone: tools a plugin registers
with ctx.register_tool stay in tools.registry (deregister is policy-gated).
NOTE: tests import the repo as package ``hermes_trove`` (conftest) while the host imports it as
``hermes_plugins.hermes_trove``: two module copies, so isinstance() against the tests' classes and
module-level registries do NOT cross over. Use plugin_module() to reach the host's copy.

Findings (hermes-agent 0.19.0, paths relative to site-packages)
----------------------------------------------------------------
(a) Selection, agent/agent_init.py:1822-1930. context.engine (default "compressor") is read at
    :1832; "compressor" never activates plugins. Otherwise plugins/context_engine/<name> (repo-
    shipped) is tried, then hermes_cli.plugins.get_plugin_context_engine() (:1849, triggers
    discovery); it is used only if ``candidate.name == context.engine``, as copy.deepcopy(candidate)
    (:1861). Fallbacks log on logger "run_agent" at WARNING, nothing user-visible:
    "Context engine 'trove' not found — falling back to built-in compressor" (:1876; plugin not
    enabled / failed to load / no engine registered / name mismatch) or "Context engine 'trove'
    could not be safely copied for this agent (<err>) — falling back ..." (:1865). Success logs
    INFO "Using context engine: trove" only when not quiet_mode (:1908). register_context_engine
    rejects a second engine or a non-ContextEngine with a WARNING (hermes_cli/plugins.py:616).
    Assert "really ours": the live engine is ``agent.context_compressor`` (:1882);
    uses_plugin_engine(agent, "trove", plugin_name="hermes-trove") checks not isinstance
    ContextCompressor, .name == "trove", it is a deep copy (not the template, same class) and
    type(engine).__module__ starts with "hermes_plugins.hermes_trove". Also
    agent._context_engine_tool_names holds the engine's tool names.
(b) One turn with a tool (observed with the probe; engine calls in order):
    at AIAgent init: __deepcopy__ -> update_model(model, context_length, base_url, api_key(str),
    provider="custom", api_mode="chat_completions") (:1899) -> get_tool_schemas() (:2007) ->
    on_session_start(session_id, hermes_home=, platform="cli", model=, context_length=,
    conversation_id=None) (:2031).
    each run_conversation: [preflight, agent/turn_context.py:567-690, only when
    len(messages) > protect_first_n+protect_last_n+1 or the messages alone exceed threshold_tokens:
    should_defer_preflight_to_real_usage(rough) -> should_compress(rough incl. system+tools)
    -> compress() up to 3 passes] -> pre_llm_call hook -> model call -> update_from_response(usage)
    (conversation_loop.py:2249; usage dict has prompt/completion/total + input/output/cache_*/
    reasoning tokens) -> handle_tool_call(name, args, messages=<live list>) (tool_executor.py:1421)
    -> should_compress(last real prompt_tokens) (conversation_loop.py:5142, after every tool
    batch) -> [before each later model call, len(messages)>1:
    should_defer_preflight_to_real_usage(rough) -> should_compress(rough) ->compress, max 3/turn]
    (conversation_loop.py:1130-1180) -> model call -> update_from_response -> post_llm_call hook
    -> plugin hook "on_session_end" (every turn!). A compaction adds: compress(messages,
    current_tokens=, focus_topic=None, force=False[, memory_context only if non-empty])
    (conversation_compression.py:1060; kwargs filtered by signature, :195) -> engine.on_session_end
    (sid, pre-compaction messages) only with a session DB (commit_memory_session, :1202) ->
    on_session_start(sid, boundary_reason="compression", old_session_id=sid (in_place: same id),
    platform, conversation_id) (:1385). engine.on_session_end is never called per turn.
(c) compress() gets the transcript WITHOUT the system prompt (also via the CLI /compress path,
    manual_compress). Messages: user {role, content, api_content (= content + "\n\n" + injected
    hook context; absent on the current message during turn-start compaction)}; assistant
    {role, content, reasoning, finish_reason, tool_calls[{id, call_id, response_item_id, type,
    function{name, arguments:str}}]}; tool {role, content, name, tool_name, tool_call_id}; with a
    session DB persisted messages also carry "_db_persisted": True. What the host does with the
    result (conversation_compression.py): ``_last_compress_aborted`` -> unchanged (:1085);
    equal to a deep copy of the input -> no-op (:1106); [] -> refused + warning (:1119); appends
    a todo snapshot user msg (_todo_snapshot_synthetic) if todos exist (:1169); guarantees a real
    user turn (:1171); with DB + in_place: archive_and_compact(sid, compressed) (old rows soft-
    archived); sets engine.last_prompt_tokens=-1, awaiting_real_usage_after_compression=True,
    last_compression_rough_tokens (:1457); "Session compressed N times" status once
    compression_count >= 2 (:1418). The list replaces ``messages`` for the rest of the turn: next
    request = system + returned list (+ new turn messages) and result["messages"] starts with it.
(d) Hooks go through PluginManager.invoke_hook (hermes_cli/plugins.py:1892): each callback called
    with kwargs only (+ telemetry_schema_version="hermes.observer.v1"), exceptions logged and
    swallowed, non-None returns collected. pre_llm_call (agent/turn_context.py:696): once per
    run_conversation after preflight compaction, kwargs session_id, task_id, turn_id,
    user_message, conversation_history (list copy incl. the current user message, no system
    prompt), is_first_turn, model, platform, sender_id. Returns {"context": str} or a non-empty
    str; parts joined by "\n\n" (oversized ones spilled to a file) and stored as the current user
    message's ``api_content`` (turn_context.py:828), which goes on the wire instead of content -
    and stays in history, so earlier turns keep their injected text in later requests.
    post_llm_call (agent/turn_finalizer.py:485): once per turn after the tool loop, only if there
    is a final response and no interrupt; kwargs session_id, task_id, turn_id, user_message,
    assistant_response, conversation_history (full transcript of this turn, no system prompt),
    model, platform; return value ignored. Plugin hook on_session_end (turn_finalizer.py:616)
    fires at the end of EVERY run_conversation (session_id, task_id, turn_id, completed,
    interrupted, model, platform).
(e) get_tool_schemas() is read once per agent at init (agent_init.py:2007): each schema is
    normalized (agent.memory_manager.normalize_tool_schema), wrapped {"type": "function",
    "function": schema}, appended after the host tools (skipped if the name exists or has no name;
    only if enabled_toolsets is None or contains "context_engine"). The fake server sees them at
    the end of body["tools"]. A call to one of agent._context_engine_tool_names is dispatched to
    engine.handle_tool_call(name, args_dict, messages=<live list>) (tool_executor.py:1408-1433);
    the returned string becomes the tool message {role: tool, name, tool_name, tool_call_id,
    content}; exceptions -> '{"error": "Context engine tool ... failed: ..."}'. Results over
    100,000 chars are replaced by a 1,500-char preview + file path (tool_executor.py:1648,
    tools/budget_config.py).
(f) Deep copy: once per AIAgent (agent_init.py:1861), verified: two agents -> two copies, the
    registered template is never used by an agent. register(ctx) runs once per discovery.
    engine.on_session_end(session_id, messages) runs only from shutdown_memory_provider
    (run_agent.py:3452: CLI exit cli.py:1233, gateway expiry, one-shot), commit_memory_session
    (run_agent.py:3479: before-compaction with a session DB, gateway), session transitions
    (run_agent.py:633, /new /resume; cli.py:7095). end_session(agent, msgs) = CLI exit.
(g) ctx.register_command(name, handler, description="", args_hint="") (plugins.py:529): name
    lower-cased, "/" stripped, spaces -> "-"; refused if it clashes with a built-in command.
    get_plugin_command_handler(name) returns the raw handler (plugins.py:2345); the CLI calls
    resolve_plugin_command_result(handler(rest_of_line_stripped)) and prints str(result) if
    truthy (cli.py:9234; async handlers awaited, 30 s cap); the gateway maps "_" -> "-", awaits
    coroutines and replies str(result) (gateway/run.py:11194). The handler gets only the args
    string. ctx.register_skill(name, path: pathlib.Path, description="") exists (plugins.py:1198):
    name [a-zA-Z0-9_-]+ without ":", path (the SKILL.md file) must exist and must be a Path
    (path.exists() is called); registered as "<manifest name>:<name>", loadable via skill_view,
    not listed in the system prompt.
(h) Timing (this machine): host_env enter 0.1 s (first in a process ~1 s: importing run_agent);
    AIAgent init 0.25-0.9 s (first ~1.7 s); an agent's first turn 0.3-1.4 s (system prompt build
    + local-server probes of the fake endpoint); later turns 0.04-0.1 s, a tool round trip
    included. tests/test_hostkit.py (10 tests): ~8 s.
(i) Fixed overhead of the first request (platform cli, default toolsets, 21 host tools):
    system prompt 9,668 chars + tool schemas 41,906 chars (compact JSON) = 51,574 chars =
    12,893 prompt_tokens as the fake computes them (chars // 4); the host's own rough estimate
    of the same is 12,370. Each engine tool adds its schema (probe_echo: 192 chars). A first
    request "hi" with the probe: 51,792 chars -> 12,948 prompt_tokens.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, List, Optional, Union

REPO_ROOT = Path(__file__).resolve().parent.parent


# The fake OpenAI-compatible server lives in fake_openai.py; its names are part of this API.
from fake_openai import (FakeOpenAIServer, Reply, ToolCall, _content_text,  # noqa: E402,F401
                         estimate_prompt_tokens, is_main_request, request_chars, scripted,
                         tool_then_text)

# ---------------------------------------------------------------------------
# $HERMES_HOME
# ---------------------------------------------------------------------------

def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _manifest_name(plugin_dir: Path, default: str) -> str:
    manifest = Path(plugin_dir) / "plugin.yaml"
    try:
        import yaml

        data = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
        name = data.get("name")
        return str(name) if name else default
    except Exception:
        return default


def base_config(port: int, *, context_length: int = 65536, engine: str = "trove",
                plugin_name: str = "hermes-trove", model: str = "fake-model") -> dict:
    """The config.yaml hostkit writes (see module docstring, "Offline config")."""
    return {
        "model": {
            "provider": "custom",
            "default": model,
            "base_url": f"http://127.0.0.1:{port}/v1",
            "api_key": "hostkit-not-a-key",
            "context_length": int(context_length),
        },
        "context": {"engine": engine},
        "plugins": {"enabled": [plugin_name]},
        "compression": {"enabled": True, "in_place": True},
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        # deterministic system prompt; no python/pip/uv subprocess probes; no snapshot of
        # the git checkout the tests run in (its last commit subjects and status went into
        # the prompt, so a test near a trigger passed or failed by the commit messages)
        "agent": {"environment_probe": False, "coding_context": "off"},
        # no built-in memory store, no memory-review fork, no provider plugin
        "memory": {"memory_enabled": False, "user_profile_enabled": False, "provider": "", "nudge_interval": 0},
        # no background skill-review fork after 10 tool iterations (it would call the fake model)
        "skills": {"creation_nudge_interval": 0},
        # CLI-only background jobs / remote catalogs: keep them off should a test use the CLI
        "curator": {"enabled": False},
        "model_catalog": {"enabled": False},
        "sessions": {"auto_prune": False, "write_json_snapshots": False},
    }


def make_hermes_home(
    tmp_path: Union[str, Path],
    port: int,
    *,
    context_length: int = 65536,
    plugin_dir: Union[str, Path, None] = REPO_ROOT,
    extra_config: Optional[dict] = None,
    plugin_name: Optional[str] = None,
    engine: str = "trove",
    model: str = "fake-model",
) -> Path:
    """Create ``<tmp_path>/hermes_home`` with config.yaml and the plugin symlinked in.

    ``plugin_dir`` is symlinked as ``plugins/<plugin_name>`` (default: the
    ``name`` in its plugin.yaml, else "hermes-trove"); ``plugins.enabled`` lists
    that manifest name (the host keys flat plugins by manifest name).
    ``plugin_dir=None`` installs no plugin. ``extra_config`` is deep-merged.
    """
    import yaml

    home = Path(tmp_path) / "hermes_home"
    (home / "plugins").mkdir(parents=True, exist_ok=True)
    enabled_name = plugin_name or "hermes-trove"
    if plugin_dir is not None:
        plugin_dir = Path(plugin_dir).resolve()
        enabled_name = _manifest_name(plugin_dir, plugin_name or "hermes-trove")
        link = home / "plugins" / (plugin_name or enabled_name)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(plugin_dir, target_is_directory=True)
    cfg = base_config(port, context_length=context_length, engine=engine,
                      plugin_name=enabled_name, model=model)
    cfg = _deep_merge(cfg, extra_config or {})
    (home / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return home


# ---------------------------------------------------------------------------
# Network guard: only loopback / unix sockets may connect
# ---------------------------------------------------------------------------

_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost", "0:0:0:0:0:0:0:1"}


class NetworkGuard:
    """Refuse (and record) every non-loopback connect / DNS lookup in this process."""

    def __init__(self) -> None:
        self.blocked: List[Any] = []
        self._orig_connect = None
        self._orig_connect_ex = None
        self._orig_getaddrinfo = None

    def _check_addr(self, sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            host = str(address[0])
            if host not in _LOOPBACK_HOSTS and not host.startswith("127."):
                self.blocked.append(("connect", address))
                raise OSError(101, f"hostkit: network access blocked ({address!r})")

    def __enter__(self) -> "NetworkGuard":
        guard = self
        self._orig_connect = socket.socket.connect
        self._orig_connect_ex = socket.socket.connect_ex
        self._orig_getaddrinfo = socket.getaddrinfo
        orig_connect, orig_connect_ex, orig_gai = self._orig_connect, self._orig_connect_ex, self._orig_getaddrinfo

        def connect(sock, address):
            guard._check_addr(sock, address)
            return orig_connect(sock, address)

        def connect_ex(sock, address):
            guard._check_addr(sock, address)
            return orig_connect_ex(sock, address)

        def getaddrinfo(host, *args, **kwargs):
            h = host.decode() if isinstance(host, bytes) else host
            if h is not None and str(h) not in _LOOPBACK_HOSTS and not str(h).startswith("127."):
                guard.blocked.append(("dns", h))
                raise socket.gaierror(socket.EAI_NONAME, f"hostkit: DNS blocked ({h})")
            return orig_gai(host, *args, **kwargs)

        socket.socket.connect = connect  # type: ignore[method-assign]
        socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
        return self

    def __exit__(self, *exc) -> None:
        socket.socket.connect = self._orig_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = self._orig_connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = self._orig_getaddrinfo  # type: ignore[assignment]


# ---------------------------------------------------------------------------
# Host process state
# ---------------------------------------------------------------------------

# env vars that would change provider resolution or host behaviour
_ENV_PREFIXES_TO_DROP = ("HERMES_", "OPENAI_", "OPENROUTER_", "ANTHROPIC_", "NOUS_", "AUXILIARY_", "TERMINAL_")
_ENV_SUFFIXES_TO_DROP = ("_API_KEY", "_TOKEN", "_BASE_URL")


def _module_paths(home: Path) -> List[tuple]:
    """(module, attribute, value) for host path constants frozen at import time."""
    return [
        ("run_agent", "_hermes_home", home),
        ("hermes_state", "DEFAULT_DB_PATH", home / "state.db"),
        ("agent.auxiliary_client", "_AUTH_JSON_PATH", home / "auth.json"),
        ("tools.skills_tool", "HERMES_HOME", home),
        ("tools.skills_tool", "SKILLS_DIR", home / "skills"),
        ("tools.skill_manager_tool", "HERMES_HOME", home),
        ("tools.skill_manager_tool", "SKILLS_DIR", home / "skills"),
        ("tools.skills_sync", "HERMES_HOME", home),
        ("tools.skills_sync", "SKILLS_DIR", home / "skills"),
        ("tools.process_registry", "CHECKPOINT_PATH", home / "processes.json"),
        ("tools.checkpoint_manager", "CHECKPOINT_BASE", home / "checkpoints"),
    ]


def _call_quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        pass


def reset_host_state(hermes_home: Optional[Path] = None) -> None:
    """Drop the host's process-wide caches so the next agent starts from scratch.

    Safe to call when the host was never imported (only touches loaded modules).
    """
    mods = sys.modules

    # plugin manager singleton + the imported plugin packages
    plugins_mod = mods.get("hermes_cli.plugins")
    if plugins_mod is not None:
        plugins_mod._plugin_manager = None
    for name in [n for n in mods if n == "hermes_plugins" or n.startswith("hermes_plugins.")]:
        del mods[name]

    # config.yaml / .env caches
    config_mod = mods.get("hermes_cli.config")
    if config_mod is not None:
        for attr in ("_LOAD_CONFIG_CACHE", "_RAW_CONFIG_CACHE", "_LAST_EXPANDED_CONFIG_BY_PATH", "_HERMES_HOME_ENSURED"):
            cache = getattr(config_mod, attr, None)
            if hasattr(cache, "clear"):
                cache.clear()
        if hasattr(config_mod, "invalidate_env_cache"):
            _call_quietly(config_mod.invalidate_env_cache)

    # tool schema memo + check_fn TTL cache
    model_tools = mods.get("model_tools")
    if model_tools is not None and hasattr(model_tools, "_clear_tool_defs_cache"):
        _call_quietly(model_tools._clear_tool_defs_cache)
    registry_mod = mods.get("tools.registry")
    if registry_mod is not None and hasattr(registry_mod, "invalidate_check_fn_cache"):
        _call_quietly(registry_mod.invalidate_check_fn_cache)

    # auxiliary (call_llm) clients, endpoint metadata probes
    aux = mods.get("agent.auxiliary_client")
    if aux is not None:
        cache = getattr(aux, "_client_cache", None)
        if hasattr(cache, "clear"):
            cache.clear()
        for fn in ("_reset_aux_unhealthy_cache", "clear_runtime_main"):
            if hasattr(aux, fn):
                _call_quietly(getattr(aux, fn))
    meta = mods.get("agent.model_metadata")
    if meta is not None:
        for attr in ("_model_metadata_cache", "_endpoint_model_metadata_cache", "_endpoint_model_metadata_cache_time",
                     "_endpoint_probe_path_cache", "_LOCAL_CTX_PROBE_CACHE"):
            cache = getattr(meta, attr, None)
            if hasattr(cache, "clear"):
                cache.clear()

    # HERMES_SESSION_* context variables (the CLI-style init sets them in this thread)
    sc = mods.get("gateway.session_context")
    if sc is not None and hasattr(sc, "reset_session_vars"):
        _call_quietly(sc.reset_session_vars)
    if sc is not None and hasattr(sc, "_session_context_engaged"):
        sc._session_context_engaged = False  # a fresh process: no gateway task bound yet

    # file log handlers point at the previous home's logs/
    hl = mods.get("hermes_logging")
    if hl is not None:
        if hasattr(hl, "_reset_queued_handlers"):
            _call_quietly(hl._reset_queued_handlers)
        hl._logging_initialized = False

    # path constants computed from get_hermes_home() at import time
    if hermes_home is not None:
        for mod_name, attr, value in _module_paths(Path(hermes_home)):
            mod = mods.get(mod_name)
            if mod is not None and hasattr(mod, attr):
                setattr(mod, attr, value)


@dataclass
class HostEnv:
    """What :func:`host_env` yields."""

    hermes_home: Path
    home: Path
    network: Optional[NetworkGuard]
    agents: List[Any] = field(default_factory=list)
    session_dbs: List[Any] = field(default_factory=list)
    server: Optional[FakeOpenAIServer] = None  # set by the fixtures below, for convenience

    @property
    def blocked(self) -> List[Any]:
        """Non-loopback connects / DNS lookups the guard refused."""
        return list(self.network.blocked) if self.network else []


_CURRENT_ENV: List[HostEnv] = []


def current_env() -> Optional[HostEnv]:
    return _CURRENT_ENV[-1] if _CURRENT_ENV else None


@contextlib.contextmanager
def host_env(
    hermes_home: Union[str, Path],
    *,
    home: Union[str, Path, None] = None,
    block_network: bool = True,
    extra_env: Optional[dict] = None,
) -> Iterator[HostEnv]:
    """Point the host at *hermes_home*, isolate it, and reset its caches (on entry and exit).

    - ``HERMES_HOME`` = *hermes_home*; ``HOME`` = *home* (default ``<hermes_home>/../user_home``)
      so ``~/.hermes`` is never touched; provider/HERMES_* env vars of the caller are
      removed; the whole ``os.environ`` is restored on exit.
    - the host is imported under this home on first use (``run_agent``), then its
      process-wide state is reset (:func:`reset_host_state`) and plugins are
      discovered from this home (like the real process does at import time).
    - with ``block_network`` every non-loopback connect/DNS lookup raises and is
      recorded in ``env.blocked``.
    - agents created by :func:`make_agent` inside are closed on exit.
    """
    hermes_home = Path(hermes_home).resolve()
    user_home = Path(home) if home is not None else hermes_home.parent / "user_home"
    user_home.mkdir(parents=True, exist_ok=True)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    guard = NetworkGuard() if block_network else None
    env = HostEnv(hermes_home=hermes_home, home=user_home, network=guard)
    stack = contextlib.ExitStack()
    try:
        for key in list(os.environ):
            if key.startswith(_ENV_PREFIXES_TO_DROP) or key.endswith(_ENV_SUFFIXES_TO_DROP):
                os.environ.pop(key, None)
        os.environ.update({
            "HERMES_HOME": str(hermes_home),
            "HOME": str(user_home),
            "TIRITH_ENABLED": "false",
            "HERMES_DISABLE_LAZY_INSTALLS": "1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        })
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            os.environ.pop(key, None)
        os.environ.update({k: str(v) for k, v in (extra_env or {}).items()})
        if guard is not None:
            stack.enter_context(guard)
        import run_agent  # noqa: F401  - first import binds module constants; patched below

        reset_host_state(hermes_home)
        from hermes_cli.plugins import discover_plugins

        discover_plugins()
        _CURRENT_ENV.append(env)
        yield env
    finally:
        if _CURRENT_ENV and _CURRENT_ENV[-1] is env:
            _CURRENT_ENV.pop()
        for agent in reversed(env.agents):
            _call_quietly(agent.close)
        for db in env.session_dbs:
            _call_quietly(db.close)
        reset_host_state(None)
        stack.close()
        os.environ.clear()
        os.environ.update(saved_env)
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)


# ---------------------------------------------------------------------------
# Agents and turns
# ---------------------------------------------------------------------------

def make_agent(*, session_db: Any = True, cli_runtime: bool = True, statuses: Optional[list] = None, **kw: Any) -> Any:
    """Build ``run_agent.AIAgent`` the way the CLI does (inside :func:`host_env`).

    Defaults: ``model="fake-model", quiet_mode=True, skip_memory=True,
    skip_context_files=True, platform="cli"``; any keyword overrides them.
    ``cli_runtime``: resolve base_url/api_key/provider/api_mode from config.yaml
    with ``hermes_cli.runtime_provider.resolve_runtime_provider`` (what the CLI
    passes) unless given explicitly. ``session_db``: True opens
    ``$HERMES_HOME/state.db`` (the CLI always has one; it adds ``_db_persisted``
    keys to messages and makes the host call ``engine.on_session_end`` before
    each compaction); False/None for none; or pass a ``SessionDB``.
    Status / warning lines the host emits are appended to ``agent.hostkit_statuses``
    as ``(kind, text)``.
    """
    from run_agent import AIAgent

    env = current_env()
    params: dict = dict(model="fake-model", quiet_mode=True, skip_memory=True,
                        skip_context_files=True, platform="cli")
    params.update(kw)
    if cli_runtime and not {"base_url", "api_key"} & set(kw):
        from hermes_cli.runtime_provider import resolve_runtime_provider

        runtime = resolve_runtime_provider(target_model=params["model"])
        for key in ("base_url", "api_key", "provider", "api_mode"):
            if runtime.get(key) and key not in kw:
                params[key] = runtime[key]
    if session_db is True:
        from hermes_state import SessionDB

        home = env.hermes_home if env else Path(os.environ["HERMES_HOME"])
        session_db = SessionDB(home / "state.db")
        if env is not None:
            env.session_dbs.append(session_db)
    if session_db:
        params["session_db"] = session_db
    collected = statuses if statuses is not None else []
    if "status_callback" not in kw:
        params["status_callback"] = lambda kind, text: collected.append((kind, text))
    agent = AIAgent(**params)
    agent.hostkit_statuses = collected
    if env is not None:
        env.agents.append(agent)
    return agent


def run_turns(agent: Any, user_texts: Iterable[str], *, history: Optional[list] = None,
              **run_kw: Any) -> List[dict]:
    """Run ``agent.run_conversation`` once per text, carrying ``conversation_history``.

    Returns every result dict (``result["messages"]`` is the history after that turn).
    """
    results: List[dict] = []
    hist = history
    for text in user_texts:
        result = agent.run_conversation(text, conversation_history=hist, **run_kw)
        results.append(result)
        hist = result.get("messages")
    return results


def end_session(agent: Any, messages: Optional[list] = None) -> None:
    """What the CLI does at exit: ``engine.on_session_end`` (+ memory shutdown)."""
    agent.shutdown_memory_provider(messages if messages is not None else getattr(agent, "_session_messages", None))


def manual_compress(agent: Any, history: list, focus: Optional[str] = None) -> list:
    """What ``/compress [focus]`` does in the CLI: a forced compaction of *history*."""
    from agent.model_metadata import estimate_request_tokens_rough

    approx = estimate_request_tokens_rough(
        history, system_prompt=getattr(agent, "_cached_system_prompt", "") or "",
        tools=getattr(agent, "tools", None) or None,
    )
    compressed, _prompt = agent._compress_context(history, None, approx_tokens=approx,
                                                  focus_topic=focus or None, force=True)
    return compressed


# ---------------------------------------------------------------------------
# Introspection helpers
# ---------------------------------------------------------------------------

def live_engine(agent: Any) -> Any:
    """The context engine this agent really uses (the host's attribute name)."""
    return agent.context_compressor


def template_engine() -> Any:
    """The instance the plugin registered (``register(ctx)``); agents get deep copies."""
    from hermes_cli.plugins import get_plugin_context_engine

    return get_plugin_context_engine()


def plugin_module_name(plugin_name: str = "hermes-trove") -> str:
    return "hermes_plugins." + plugin_name.replace("/", "__").replace("-", "_")


def plugin_module(plugin_name: str = "hermes-trove") -> Any:
    """The plugin package as the host imported it (NOT the tests' ``hermes_trove``)."""
    return sys.modules[plugin_module_name(plugin_name)]


def uses_plugin_engine(agent: Any, name: str = "trove", plugin_name: Optional[str] = None) -> bool:
    """True when the host selected a plugin engine named *name* for *agent*.

    Checks: not the built-in ``ContextCompressor``; ``engine.name == name``; a
    deep copy of (not the same object as) the registered template; and, when
    *plugin_name* is given, its class lives in the host's plugin package.
    """
    from agent.context_compressor import ContextCompressor

    engine = live_engine(agent)
    if isinstance(engine, ContextCompressor) or getattr(engine, "name", None) != name:
        return False
    template = template_engine()
    if template is None or engine is template or type(engine) is not type(template):
        return False
    if plugin_name is not None and not type(engine).__module__.startswith(plugin_module_name(plugin_name)):
        return False
    return True


def plugin_loaded(plugin_name: str) -> dict:
    """The host's record of a plugin (``hermes_cli.plugins`` list entry), or {}."""
    from hermes_cli.plugins import get_plugin_manager

    for entry in get_plugin_manager().list_plugins():
        if entry["key"] == plugin_name or entry["name"] == plugin_name:
            return entry
    return {}


def run_slash_command(name: str, args: str = "") -> Any:
    """Invoke a plugin slash command like the CLI does (``/name args``)."""
    from hermes_cli.plugins import get_plugin_command_handler, resolve_plugin_command_result

    handler = get_plugin_command_handler(name)
    if handler is None:
        raise KeyError(f"no plugin slash command /{name}")
    return resolve_plugin_command_result(handler(args))


def fixed_overhead(body: dict) -> dict:
    """Chars/tokens of the system prompt + tool schemas in one request body."""
    msgs = body.get("messages") or []
    system_chars = sum(len(_content_text(m.get("content"))) for m in msgs if m.get("role") == "system")
    tools_chars = len(json.dumps(body.get("tools") or [], separators=(",", ":"))) if body.get("tools") else 0
    return {"system_chars": system_chars, "tools_chars": tools_chars, "n_tools": len(body.get("tools") or []),
            "chars": system_chars + tools_chars, "tokens": (system_chars + tools_chars) // 4}


# The probe plugin lives in probe_plugin.py; its names are part of this API.
from probe_plugin import write_probe_plugin, write_probe_settings  # noqa: E402,F401

# ---------------------------------------------------------------------------
# pytest fixtures (import them into a test module: ``from hostkit import fake_llm``)
# ---------------------------------------------------------------------------

try:
    import pytest as _pytest
except Exception:  # pragma: no cover - hostkit also works outside pytest
    _pytest = None

if _pytest is not None:

    @_pytest.fixture
    def fake_llm() -> Iterator[FakeOpenAIServer]:
        """A started :class:`FakeOpenAIServer` answering "ok"; set ``.responder`` to script it."""
        with FakeOpenAIServer() as server:
            yield server

    @_pytest.fixture
    def trove_host(tmp_path, fake_llm) -> Iterator[HostEnv]:
        """The repo's plugin installed in a fresh HERMES_HOME, host reset; ``env.server`` is the fake.

        Fails the test if the host tried to reach the network.
        """
        home = make_hermes_home(tmp_path, fake_llm.port)
        with host_env(home) as env:
            env.server = fake_llm
            yield env
        assert not env.blocked, f"host tried to reach the network: {env.blocked}"
