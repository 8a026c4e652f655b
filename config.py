"""Trove settings, read once into a typed, validated, immutable object.

Every setting is a ``TROVE_*`` name. Values come from three layers, highest
first: the process environment, the ``trove:`` section of
``$HERMES_HOME/config.yaml``, then the defaults declared on ``TroveConfig``.
A bad value never stops the plugin: it is reported in ``warnings`` (naming the
variable, the value and what is accepted) and the next layer's value is used.

The declaration of each field on ``TroveConfig`` is the single source of truth
for its type, default, accepted range and one-line description; the loader,
``describe()`` and the docs test all read it from there.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

ENV_PREFIX = "TROVE_"
CONFIG_FILE_NAME = "config.yaml"
CONFIG_SECTION = "trove"
DEFAULT_DATABASE_FILE = "trove.db"
# The smallest response a tool may be asked for (TROVE_TOOL_RESPONSE_MAX_TOKENS and the
# max_tokens argument of trove_expand alike): a page must hold its handles (a payload
# ref is ~47 tokens, and its page names it twice) and still carry text.
MIN_TOOL_RESPONSE_TOKENS = 256
KNOWN_SENSITIVE_PATTERNS = frozenset(
    {"api_key", "bearer_token", "password_assignment", "private_key", "secret_assignment",
     "webhook_url"}
)
EMBEDDING_PROVIDERS = ("local", "openai", "fastembed")
# The trove_* tools, in the order the host lists them (schemas.py holds their schemas;
# tests/test_tools.py keeps the two in step), and the opt-in family setting each
# family tool needs: with its family off a tool can only answer "off", so it is left out.
KNOWN_TOOLS = (
    "trove_grep", "trove_expand", "trove_describe", "trove_load_session", "trove_recent",
    "trove_expand_query", "trove_recall", "trove_status", "trove_inspect", "trove_doctor",
    "trove_evidence_pack", "trove_compute", "trove_compile_evidence", "trove_query_state",
    "trove_retrieve",
)
TOOL_FAMILIES = {"trove_query_state": "assertions_enabled", "trove_retrieve": "retrieve_enabled"}
ALL_TOOLS = "all"
NO_TOOLS = "none"
NOT_LISTED = "not in TROVE_EXPOSED_TOOLS"   # the reason hidden_tools gives for a tool left out
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def _setting(kind: str, default: Any, doc: str, *, low: float | None = None,
             high: float | None = None, low_open: bool = False,
             nonempty: bool = False, share_map: bool = False) -> Any:
    """Declare one setting: the dataclass field plus what the loader needs to parse it."""
    meta = {"kind": kind, "doc": doc, "low": low, "high": high,
            "low_open": low_open, "nonempty": nonempty, "share_map": share_map}
    return field(default=default, metadata=meta)


def _bool(default: bool, doc: str) -> Any:
    return _setting("bool", default, doc)


def _int(default: int, doc: str, low: int | None = None, high: int | None = None) -> Any:
    return _setting("int", default, doc, low=low, high=high)


def _float(default: float, doc: str, low: float | None = None,
           high: float | None = None, low_open: bool = False) -> Any:
    return _setting("float", default, doc, low=low, high=high, low_open=low_open)


def _str(default: str, doc: str, nonempty: bool = False) -> Any:
    return _setting("str", default, doc, nonempty=nonempty)


def _list(default: tuple[str, ...], doc: str) -> Any:
    return _setting("list", default, doc)


@dataclass(frozen=True)
class TroveConfig:
    """All trove settings, validated; built by ``load_config`` and never changed after.

    Frozen so that one object can be shared by every engine copy and thread
    without anyone mutating settings behind another's back. ``sources`` and
    ``warnings`` describe how the values were obtained and take no part in
    equality.
    """

    context_threshold: float = _float(
        0.35, "Share of the model's context window at which compaction starts (raised on "
        "small windows by TROVE_MIN_TRIGGER_TOKENS).",
        low=0.0, high=1.0, low_open=True)
    min_trigger_tokens: int = _int(
        32000, "Compaction never starts below this many tokens (capped at 75% of the "
        "window), so a small window keeps room for summaries beside the host's own "
        "system prompt and tool schemas (0 = TROVE_CONTEXT_THRESHOLD alone).", low=0)
    fresh_tail_count: int = _int(
        32, "Most recent messages always kept verbatim, never compacted.", low=1)
    fresh_tail_max_tokens: int = _int(
        0, "Token cap on the verbatim fresh tail (0 = no token cap).", low=0)
    incremental_max_depth: int = _int(
        3, "Deepest summary level built incrementally during a session.", low=1, high=8)
    leaf_chunk_tokens: int = _int(
        20000, "Tokens of raw messages summarized into one leaf node.", low=500)
    dynamic_leaf_chunk_enabled: bool = _bool(
        False, "Size leaf chunks dynamically, up to TROVE_DYNAMIC_LEAF_CHUNK_MAX, "
        "instead of always TROVE_LEAF_CHUNK_TOKENS.")
    dynamic_leaf_chunk_max: int = _int(
        40000, "Largest dynamic leaf chunk; raised to TROVE_LEAF_CHUNK_TOKENS if smaller.", low=500)
    condense_fanout: int = _int(
        4, "How many same-depth parentless nodes merge into one node one level up.",
        low=2, high=32)
    leaf_summary_tokens: int = _int(
        1200, "Token budget of one leaf summary.", low=100, high=20000)
    condensed_summary_tokens: int = _int(
        2000, "Token budget of one condensed (depth >= 1) summary.", low=100, high=20000)
    new_session_retain_depth: int = _int(
        2, "Summary depth carried into a new session (-1 = carry nothing).",
        low=-1, high=8)
    database_path: str = _str(
        "", "SQLite file; empty = HERMES_HOME/trove.db; a relative path is taken "
        "under HERMES_HOME.")
    database_url: str = _str(
        "", "PostgreSQL server (postgresql://user:password@host:port/db; credentials may come "
        "from PG* variables instead); empty = SQLite at TROVE_DATABASE_PATH. Needs psycopg.")
    fts_integrity_check_interval_hours: float = _float(
        24.0, "Hours between deep full-text-index integrity checks (0 = never).", low=0.0)
    enable_slash_command: bool = _bool(False, "Register the /trove slash command.")
    ignore_session_patterns: tuple[str, ...] = _list(
        (), "Sessions matching any of these patterns are not stored at all.")
    stateless_session_patterns: tuple[str, ...] = _list(
        (), "Sessions matching any of these patterns read the store but never write to it.")
    ignore_message_patterns: tuple[str, ...] = _list(
        (), "Regular expressions; messages matching any of them are not stored (nor "
        "summarized); they stay in the prompt while the fresh tail reaches them.")
    summary_model: str = _str("", "Model for summaries (empty = the host's model).")
    summary_fallback_models: tuple[str, ...] = _list(
        (), "Models tried in order when the summary model fails.")
    summary_timeout_ms: int = _int(60000, "Timeout of one summary call.", low=1000)
    summary_circuit_breaker_failure_threshold: int = _int(
        2, "Consecutive summary failures that open the circuit breaker.", low=1)
    summary_circuit_breaker_cooldown_seconds: int = _int(
        300, "Seconds the breaker stays open before summaries are retried.", low=0)
    expansion_model: str = _str("", "Model for trove_expand_query (empty = the host's model).")
    expansion_context_tokens: int = _int(
        32000, "Context budget of one expansion call.", low=1000)
    expansion_timeout_ms: int = _int(120000, "Timeout of one expansion call.", low=1000)
    critical_budget_pressure_ratio: float = _float(
        0.0, "Above this share of the window, compaction uses only the fast "
        "deterministic summarizer (0 = off).", low=0.0, high=1.0)
    tool_response_max_tokens: int = _int(
        4000, "Token cap of one trove_* tool response.", low=MIN_TOOL_RESPONSE_TOKENS,
        high=64000)
    recall_policy_enabled: bool = _bool(
        True, "Append a short recall policy (when to use the trove_* recall tools) to the "
        "user turn, once per prompt, where trove serves the session.")
    exposed_tools: tuple[str, ...] = _list(
        (ALL_TOOLS,), "The trove_* tools registered with the host: all, none, or a list of "
        "names (trove_ may be left out); a tool of an opt-in family that is off is left out "
        "either way.")
    token_encoding: str = _str(
        "cl100k_base", "tiktoken encoding used to count tokens.", nonempty=True)
    token_count_accelerator: bool = _bool(
        True, "Count with the optional rs-bpe package when it is installed and gives "
        "tiktoken's counts on a check at load (cl100k_base: same counts, ~3x faster, "
        "smaller).")
    doctor_clean_apply_enabled: bool = _bool(
        False, "Allow trove_doctor to apply its clean-up instead of only reporting.")
    large_output_externalization_enabled: bool = _bool(
        False, "Store very large tool outputs outside the transcript.")
    large_output_externalization_threshold_chars: int = _int(
        12000, "Tool output size (chars) from which it is externalized.", low=1000)
    large_output_active_replay_stubbing_enabled: bool = _bool(
        False, "Replace big externalized outputs in the live replay by stubs "
        "(needs externalization).")
    large_output_active_replay_stub_threshold_tokens: int = _int(
        25000, "Output size (tokens) from which the live replay gets a stub.", low=500)
    large_output_transcript_gc_enabled: bool = _bool(
        False, "After a compaction, shrink summarized tool rows to their placeholder when a "
        "payload file holds their exact text (read back and verified; otherwise the row "
        "is kept).")
    sensitive_patterns_enabled: bool = _bool(
        False, "Redact secrets found by TROVE_SENSITIVE_PATTERNS before storing.")
    sensitive_patterns: tuple[str, ...] = _list(
        ("api_key", "bearer_token", "password_assignment", "private_key",
         "secret_assignment", "webhook_url"),
        "Named secret detectors to apply; known: api_key, bearer_token, "
        "password_assignment, private_key, secret_assignment, webhook_url "
        "(docs/configuration.md lists every entry).")
    cross_owner_recall: bool = _bool(
        False, "Let cross-session tools (trove_recall, session_scope all, a named "
        "session_id) read sessions of other owners (other gateway users) too.")

    context_threshold_overrides: str = _setting(
        "str", "", "Per-model trigger shares as a JSON object of model-name globs, e.g. "
        "{\"gpt-5*\": 0.6, \"claude-*\": 0.4}; the most specific matching glob replaces "
        "TROVE_CONTEXT_THRESHOLD for that model (empty = none).", share_map=True)
    summary_instructions: str = _str(
        "", "Extra instructions appended to the summarizer prompt (the conversation stays "
        "data, never instructions).")
    summary_max_calls_per_hour: int = _int(
        0, "Summary spend guard: model calls allowed per rolling hour, per process; past it "
        "summaries are deterministic (0 = no limit).", low=0)
    summary_max_tokens_per_hour: int = _int(
        0, "Summary spend guard: prompt + answer tokens allowed per rolling hour, per "
        "process (0 = no limit).", low=0)
    empty_lifecycle_gc_enabled: bool = _bool(
        True, "Prune session rows that never stored a message or summary, at session start.")
    empty_lifecycle_gc_threshold: int = _int(
        50, "Empty session rows (older than the max age) needed before a prune runs; one "
        "prune deletes at most 500.", low=1)
    empty_lifecycle_gc_max_age_hours: float = _float(
        24.0, "Only empty session rows untouched for this many hours are pruned.", low=0.0)
    background_prepare_share: float = _float(
        0.0, "Share of the trigger from which leaf summaries and their merges are prepared "
        "in a background worker, so compaction at the trigger mostly assembles (0 = off; e.g. 0.8).",
        low=0.0, high=1.0)
    threshold_full_sweep_enabled: bool = _bool(
        False, "At the trigger, drain the whole raw backlog in one bounded sweep (at most "
        "12 summarizer calls and 120 s; then deterministic) and condense only when the "
        "frontier exceeds TROVE_SUMMARY_PREFIX_TARGET_TOKENS.")
    summary_prefix_target_tokens: int = _int(
        0, "With the full sweep: the frontier size above which it condenses "
        "(0 = one leaf chunk, TROVE_LEAF_CHUNK_TOKENS).", low=0)
    assertions_enabled: bool = _bool(
        False, "Extract assertions (facts, preferences, commitments...) with exact refs at "
        "compaction time, for trove_query_state.")
    retrieve_enabled: bool = _bool(
        False, "Let trove_retrieve gather evidence and store its evidence view and trace.")
    timezone: str = _str(
        "UTC", "IANA time zone of the days, weeks and months of trove_recent, the time "
        "filters and rollups (e.g. Europe/Paris); a link name is the zone it links to "
        "(`US/Eastern` is `America/New_York`).", nonempty=True)
    rollups_enabled: bool = _bool(
        False, "Build day, week and month rollups of each owner's sessions (never mixing "
        "owners), off the turn's hot path.")
    rollup_summary_tokens: int = _int(
        1500, "Token budget of one day, week or month rollup.", low=100, high=20000)
    rollups_max_builds_per_pass: int = _int(
        8, "Rollups one background pass builds or rebuilds (the rest wait for the next).",
        low=1, high=1000)
    rollups_lookback_days: int = _int(
        93, "How many days back a background rollup pass looks for periods to build.",
        low=1, high=36600)
    embeddings_enabled: bool = _bool(
        False, "Embed messages and summaries for semantic and hybrid search (background "
        "worker; full text only when off).")
    embedding_provider: str = _str(
        "local", "Embedding provider: local (bundled model, offline), openai (any "
        "OpenAI-compatible /v1/embeddings) or fastembed.", nonempty=True)
    embedding_model: str = _str(
        "", "Embedding model name (empty = the provider's default; local: "
        "all-MiniLM-L6-v2-int8, the default, or multilingual-e5-small-q4).")
    embedding_base_url: str = _str(
        "", "Base URL of the openai provider, e.g. http://127.0.0.1:11434/v1.")
    embedding_api_key_env: str = _str(
        "", "Name of the environment variable holding the openai provider's key.")
    embedding_query_timeout_ms: int = _int(
        2000, "Timeout of embedding one query (search falls back to full text).", low=100)
    embedding_batch_timeout_ms: int = _int(
        30000, "Timeout of embedding one background batch.", low=1000)
    embedding_batch_size: int = _int(
        32, "Texts embedded per background batch.", low=1, high=512)
    embedding_threads: int = _int(
        2, "CPU threads the local MiniLM model uses (its worker runs at low priority).",
        low=1, high=64)

    hermes_home: Path = field(default_factory=lambda: Path.home() / ".hermes")
    sources: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False)
    warnings: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def resolved_database_path(self) -> Path:
        """Where the SQLite file lives: ``database_path`` (``~`` expanded) or ``<hermes_home>/trove.db``.

        A relative ``database_path`` is taken under ``hermes_home`` rather than
        the working directory, which changes with every project the agent
        works in and would otherwise scatter the database.
        """
        if not self.database_path:
            return self.hermes_home / DEFAULT_DATABASE_FILE
        path = Path(self.database_path).expanduser()
        return path if path.is_absolute() else self.hermes_home / path

    @property
    def database_target(self) -> str:
        """What ``get_database`` opens: the PostgreSQL URL when one is set, else the
        SQLite file (so a user who sets nothing keeps the embedded default)."""
        return self.database_url or str(self.resolved_database_path)

    @property
    def database_display(self) -> str:
        """The database as status and doctor show it: the file, or the URL with its
        password (in the authority or a ``password=`` option) replaced by ``***``."""
        return redact_url(self.database_url) if self.database_url else str(
            self.resolved_database_path)

    @property
    def exposed_tool_names(self) -> tuple[str, ...]:
        """The trove_* tools the host is given, in ``KNOWN_TOOLS`` order: those
        ``TROVE_EXPOSED_TOOLS`` lists whose opt-in family (if any) is on."""
        return tuple(name for name in KNOWN_TOOLS if name not in self.hidden_tools)

    @property
    def hidden_tools(self) -> dict[str, str]:
        """Each trove_* tool the host is not given, with the setting that leaves it out."""
        listed = set(KNOWN_TOOLS) if ALL_TOOLS in self.exposed_tools else set(self.exposed_tools)
        hidden = {}
        for name in KNOWN_TOOLS:
            family = TOOL_FAMILIES.get(name)
            if name not in listed:
                hidden[name] = NOT_LISTED
            elif family and not getattr(self, family):
                hidden[name] = f"{env_name(family)} is off"
        return hidden

    @property
    def large_output_active_replay_stubbing_effective(self) -> bool:
        """Whether replay stubbing really runs: it needs externalization to be on too."""
        return (self.large_output_active_replay_stubbing_enabled
                and self.large_output_externalization_enabled)

    def describe(self) -> dict:
        """Every setting with its env name, value and source, for a status tool.

        The result is plain JSON-serializable data (lists, not tuples).
        """
        settings = {}
        for f in setting_fields():
            value = getattr(self, f.name)
            if f.name == "database_url" and value:
                value = redact_url(value)
            entry = {"value": list(value) if isinstance(value, tuple) else value,
                     "source": self.sources.get(f.name, "default")}
            settings[env_name(f.name)] = entry
        stub_env = env_name("large_output_active_replay_stubbing_enabled")
        settings[stub_env]["effective"] = self.large_output_active_replay_stubbing_effective
        return {
            "hermes_home": str(self.hermes_home),
            "database_path": self.database_display,
            "settings": settings,
            "warnings": list(self.warnings),
        }


def redact_url(url: str) -> str:
    """A database URL fit to print: the password of ``user:password@`` and of a
    ``password=`` option become ``***`` (the rest names the server for the reader)."""
    text = re.sub(r"^([a-z][a-z0-9+.-]*://[^:@/?#]*):[^@/?#]*@", r"\1:***@", url, flags=re.I)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", text, flags=re.I)


def setting_fields() -> tuple:
    """The dataclass fields of ``TroveConfig`` that are ``TROVE_*`` settings, in declaration order."""
    return tuple(f for f in fields(TroveConfig) if "kind" in f.metadata)


def env_name(field_name: str) -> str:
    """The environment variable of a setting: ``context_threshold`` -> ``TROVE_CONTEXT_THRESHOLD``."""
    return ENV_PREFIX + field_name.upper()


def accepted_values(f) -> str:
    """Human-readable description of what a setting accepts, used in warnings and docs."""
    meta = f.metadata
    kind = meta["kind"]
    if kind == "bool":
        return "one of 1/0/true/false/yes/no/on/off"
    if kind == "list":
        return "a comma-separated string or a list of strings"
    if kind == "str":
        if meta.get("share_map"):
            return 'a JSON object of model globs to shares in (0, 1], e.g. {"gpt-5*": 0.6}'
        return "a non-empty string" if meta["nonempty"] else "a string"
    noun = "an integer" if kind == "int" else "a number"
    low, high = meta["low"], meta["high"]
    low_op = "<" if meta["low_open"] else "<="
    if low is not None and high is not None:
        return f"{noun} with {_fmt(low)} {low_op} value <= {_fmt(high)}"
    if low is not None:
        return f"{noun} with value {'>' if meta['low_open'] else '>='} {_fmt(low)}"
    return noun


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _parse(f, raw: Any) -> Any:
    """Convert one raw env/yaml value to the setting's type; raise ValueError if not acceptable."""
    meta = f.metadata
    kind = meta["kind"]
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ValueError
    if kind == "list":
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ValueError
        return tuple(i.strip() for i in items if i.strip())
    if kind == "str":
        if meta.get("share_map"):
            return _parse_share_map(raw)
        if not isinstance(raw, str) or (meta["nonempty"] and not raw.strip()):
            raise ValueError
        return raw.strip()
    return _parse_number(meta, raw)


def _parse_share_map(raw: Any) -> str:
    """A ``{glob: share}`` mapping (JSON text, or a mapping from config.yaml) as
    canonical JSON text; every share must be in (0, 1]."""
    if isinstance(raw, str):
        if not raw.strip():
            return ""
        raw = json.loads(raw)  # JSONDecodeError is a ValueError
    if not isinstance(raw, Mapping):
        raise ValueError
    shares = {}
    for pattern, share in raw.items():
        if not isinstance(pattern, str) or not pattern.strip() or isinstance(share, bool):
            raise ValueError
        share = float(share)
        if not (0.0 < share <= 1.0):
            raise ValueError
        shares[pattern.strip()] = share
    return json.dumps(shares) if shares else ""


def _parse_number(meta: Mapping[str, Any], raw: Any) -> int | float:
    if isinstance(raw, bool):
        raise ValueError
    if meta["kind"] == "int":
        if isinstance(raw, str):
            raw = int(raw.strip())
        if not isinstance(raw, int):
            raise ValueError
        value: int | float = raw
    else:
        value = float(raw.strip()) if isinstance(raw, str) else raw
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError
        value = float(value)
    low, high = meta["low"], meta["high"]
    if low is not None and (value <= low if meta["low_open"] else value < low):
        raise ValueError
    if high is not None and value > high:
        raise ValueError
    return value


def _resolve_hermes_home(environ: Mapping[str, str], hermes_home: str | Path | None) -> Path:
    if hermes_home is None:
        hermes_home = (environ.get("HERMES_HOME") or "").strip() or "~/.hermes"
    return Path(hermes_home).expanduser()


def _read_yaml_section(home: Path, warnings: list[str]) -> dict[str, Any]:
    """Raw values of the ``trove:`` section of ``config.yaml``, keyed by field name.

    A missing file is normal and silent; anything else that stops the file
    from being used becomes a warning.
    """
    path = home / CONFIG_FILE_NAME
    if not path.exists():
        return {}
    try:
        import yaml
    except ImportError:
        warnings.append(f"{path}: PyYAML is not installed, so its '{CONFIG_SECTION}:' "
                        "section is ignored")
        return {}
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warnings.append(f"{path}: cannot be read ({first_line}); it is ignored")
        return {}
    if document is None:
        return {}
    if not isinstance(document, dict):
        warnings.append(f"{path}: the top level is not a mapping; it is ignored")
        return {}
    section = document.get(CONFIG_SECTION)
    if section is None:
        return {}
    if not isinstance(section, dict):
        warnings.append(f"{path}: '{CONFIG_SECTION}:' is not a mapping; it is ignored")
        return {}
    known = {f.name for f in setting_fields()}
    values: dict[str, Any] = {}
    for key, raw in section.items():
        name = str(key).strip().lower()
        name = name[len(ENV_PREFIX):] if name.startswith(ENV_PREFIX.lower()) else name
        if name not in known:
            warnings.append(f"{path}: unknown setting '{CONFIG_SECTION}.{key}' is ignored"
                            + did_you_mean(name, known, f"{CONFIG_SECTION}."))
        elif name in values:
            warnings.append(f"{path}: {env_name(name)} is given twice in "
                            f"'{CONFIG_SECTION}:'; the later one ({key}) is used")
            values[name] = raw
        elif raw is not None:
            values[name] = raw
    return values


def _pick(f, layers: list[tuple[str, Any]], warnings: list[str]) -> tuple[Any, str]:
    """The value of one setting from the first layer whose value is valid, with that layer's name."""
    candidates = [(src, raw) for src, raw in layers if raw is not None]
    for index, (source, raw) in enumerate(candidates):
        try:
            return _parse(f, raw), source
        except (ValueError, TypeError, AttributeError):
            if index + 1 < len(candidates):
                fallback = f"the value from {candidates[index + 1][0]} instead"
            else:
                fallback = f"the default {f.default!r}"
            warnings.append(f"{env_name(f.name)}={raw!r} (from {source}) is invalid: "
                            f"expected {accepted_values(f)}; using {fallback}")
    return f.default, "default"


def _check_combinations(values: dict[str, Any], warnings: list[str]) -> None:
    """Warn about settings that are each valid but do not fit together; fix what can be fixed."""
    if values["dynamic_leaf_chunk_max"] < values["leaf_chunk_tokens"]:
        warnings.append(
            f"TROVE_DYNAMIC_LEAF_CHUNK_MAX={values['dynamic_leaf_chunk_max']} is smaller "
            f"than TROVE_LEAF_CHUNK_TOKENS={values['leaf_chunk_tokens']}; "
            f"using {values['leaf_chunk_tokens']}")
        values["dynamic_leaf_chunk_max"] = values["leaf_chunk_tokens"]
    if (values["large_output_active_replay_stubbing_enabled"]
            and not values["large_output_externalization_enabled"]):
        warnings.append(
            "TROVE_LARGE_OUTPUT_ACTIVE_REPLAY_STUBBING_ENABLED is on but "
            "TROVE_LARGE_OUTPUT_EXTERNALIZATION_ENABLED is off; stubbing needs "
            "externalization, so it is effectively off")
    path = values["database_path"]
    if "\0" in path or path != path.encode("utf-8", "replace").decode("utf-8"):
        warnings.append(f"TROVE_DATABASE_PATH={path[:200]!r} holds a NUL byte or an unpaired "
                        "surrogate: no file can have that name, so trove keeps nothing until "
                        "it is fixed (the agent runs on; status says why)")
    url = values["database_url"]
    if url and not url.startswith(("postgresql://", "postgres://")):
        warnings.append(f"TROVE_DATABASE_URL={redact_url(url)[:200]!r} is not a "
                        "postgresql:// URL; using SQLite at TROVE_DATABASE_PATH")
        values["database_url"] = ""
    zone = canonical_zone(values["timezone"])
    if zone is None:
        warnings.append(f"TROVE_TIMEZONE={values['timezone']!r} is not a known IANA time "
                        "zone; using 'UTC'")
    values["timezone"] = zone or "UTC"
    if values["embedding_provider"] not in EMBEDDING_PROVIDERS:
        warnings.append(
            f"TROVE_EMBEDDING_PROVIDER={values['embedding_provider']!r} is not one of "
            f"{', '.join(EMBEDDING_PROVIDERS)}; using 'local'"
            + did_you_mean(str(values["embedding_provider"]).lower(), EMBEDDING_PROVIDERS))
        values["embedding_provider"] = "local"
    values["exposed_tools"] = _exposed_tools(values["exposed_tools"], warnings)
    for name, family in TOOL_FAMILIES.items():
        if name in values["exposed_tools"] and not values[family]:
            warnings.append(f"TROVE_EXPOSED_TOOLS lists {name} but {env_name(family)} is "
                            "off; the tool is left out until that is on")
    unknown = [n for n in values["sensitive_patterns"] if n not in KNOWN_SENSITIVE_PATTERNS]
    if unknown:
        warnings.append(
            f"TROVE_SENSITIVE_PATTERNS has unknown names {unknown}; they are kept but "
            f"only {sorted(KNOWN_SENSITIVE_PATTERNS)} are known")


def _exposed_tools(listed: tuple[str, ...], warnings: list[str]) -> tuple[str, ...]:
    """``TROVE_EXPOSED_TOOLS`` as ``("all",)``, ``()`` (none) or known tool names.

    Names are matched without case, ``trove_`` may be left out; unknown names are
    reported and dropped, and a list with no known name at all falls back to the
    default (every tool), as any other unusable value does."""
    words = [word.lower() for word in listed]
    if not words:
        warnings.append(f"TROVE_EXPOSED_TOOLS is empty; using the default {ALL_TOOLS!r} "
                        f"({NO_TOOLS!r} registers no trove tool)")
        return (ALL_TOOLS,)
    if words == [NO_TOOLS]:
        return ()
    names = [word if word.startswith("trove_") or word == ALL_TOOLS else f"trove_{word}"
             for word in words]
    unknown = [raw for raw, name in zip(listed, names)
               if name not in KNOWN_TOOLS and name != ALL_TOOLS]
    known = (ALL_TOOLS,) if ALL_TOOLS in names else tuple(n for n in KNOWN_TOOLS if n in names)
    if unknown:
        fallback = "they are ignored" if known else f"using the default {ALL_TOOLS!r}"
        warnings.append(f"TROVE_EXPOSED_TOOLS has unknown tool names {unknown}; {fallback} "
                        f"(known: {', '.join(KNOWN_TOOLS)}, or {ALL_TOOLS} / {NO_TOOLS})")
    return known if known else (ALL_TOOLS,)

def did_you_mean(word: str, known, prefix: str = "") -> str:
    """`` (did you mean X?)`` naming the closest known name or value, or "" when none is
    close: a typo is reported with its fix, not only as "unknown"."""
    import difflib
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


# Names of UTC itself (zoneinfo links to it, and what people type): one zone, one key.
UTC_NAMES = frozenset({"utc", "z", "gmt", "uct", "zulu", "universal", "greenwich", "gmt0",
                       "gmt+0", "gmt-0", "etc/utc", "etc/uct", "etc/zulu", "etc/universal",
                       "etc/greenwich", "etc/gmt", "etc/gmt0", "etc/gmt+0", "etc/gmt-0"})


def canonical_zone(name: str) -> str | None:
    """The one spelling of a time zone setting, or None when ``zoneinfo`` knows no such
    zone. The zone names the rollups' key (``time_zone`` of each row) and the periods
    of every time filter, so two names of one zone must not be two zones: every name
    of UTC is ``UTC``; a link (``US/Eastern``, ``Asia/Calcutta``) is the zone it links
    to (``America/New_York``, ``Asia/Kolkata``: ``_zone_link``); any other name takes
    the case of the IANA database. Never raises: an odd value is None."""
    try:
        text = str(name or "").strip()
        if text.lower() in UTC_NAMES:
            return "UTC"
        found = _zone_names().get(text.lower())
        if found is None:   # a zone the listing lacks (an older tzdata listing): as typed
            from zoneinfo import ZoneInfo
            ZoneInfo(text)
            found = text
        target = _zone_link(found)
        return "UTC" if target.lower() in UTC_NAMES else target
    except Exception:
        return None


@functools.lru_cache(maxsize=1)
def _zone_names() -> dict[str, str]:
    """Every IANA zone name ``zoneinfo`` lists, by its lower-case form (read once)."""
    try:
        from zoneinfo import available_timezones
        return {n.lower(): n for n in sorted(available_timezones())}
    except Exception:
        return {}


@functools.lru_cache(maxsize=256)
def _zone_link(name: str) -> str:
    """The zone a link name stands for, else ``name``. Offline only: the links are the
    ``L target link`` lines of the installed database's ``tzdata.zi`` (``_zone_links``),
    and one is taken only when the two zone files ``zoneinfo`` would load hold the same
    bytes, so a ``tzdata.zi`` of another build (the ``tzdata`` package merges zones a
    system build keeps apart) never folds zones whose rules differ here."""
    seen, target = {name}, name
    while (ahead := _zone_links().get(target)) and ahead not in seen:   # a chain, no loop
        seen.add(ahead)
        target = ahead
    if target == name or _zone_bytes(name) is None or _zone_bytes(name) != _zone_bytes(target):
        return name
    return target


@functools.lru_cache(maxsize=1)
def _zone_links() -> dict[str, str]:
    """Link name -> target of every ``tzdata.zi`` installed (``zoneinfo.TZPATH`` first,
    then the ``tzdata`` package: the order ``zoneinfo`` reads zones in); {} when none."""
    links: dict[str, str] = {}
    for folder in _zone_folders():
        try:
            lines = folder.joinpath("tzdata.zi").read_text(encoding="utf-8").splitlines()
        except Exception:  # missing or unreadable: the next one
            continue
        for parts in (line.split() for line in lines):
            if len(parts) == 3 and parts[0] == "L":
                links.setdefault(parts[2], parts[1])
    return links


def _zone_bytes(name: str) -> bytes | None:
    """The TZif file ``zoneinfo`` loads for a zone (the first folder holding it), or None."""
    for folder in _zone_folders():
        try:
            return folder.joinpath(*name.split("/")).read_bytes()
        except Exception:
            continue
    return None


def _zone_folders() -> list:
    """Where ``zoneinfo`` looks for zones, in its order: ``TZPATH``, then ``tzdata``."""
    import zoneinfo
    folders: list = [Path(d) for d in zoneinfo.TZPATH]
    try:
        from importlib import resources
        folders.append(resources.files("tzdata.zoneinfo"))
    except Exception:  # no tzdata package: the system's alone
        pass
    return folders


def load_config(environ: Mapping[str, str] | None = None,
                hermes_home: str | Path | None = None) -> TroveConfig:
    """Read every setting from env, then config.yaml, then defaults; never raise for bad values.

    ``environ`` defaults to ``os.environ``; ``hermes_home`` defaults to
    ``HERMES_HOME`` from ``environ``, else ``~/.hermes``. Problems found on the
    way are collected in the returned object's ``warnings``.
    """
    environ = os.environ if environ is None else environ
    home = _resolve_hermes_home(environ, hermes_home)
    warnings: list[str] = []
    from_yaml = _read_yaml_section(home, warnings)
    known_envs = {env_name(f.name) for f in setting_fields()}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known_envs:
            warnings.append(f"unknown environment variable {name} is ignored"
                            + did_you_mean(name, known_envs))

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in setting_fields():
        layers = [("env", environ.get(env_name(f.name))), ("config.yaml", from_yaml.get(f.name))]
        values[f.name], sources[f.name] = _pick(f, layers, warnings)
    _check_combinations(values, warnings)
    return TroveConfig(**values, hermes_home=home,
                       sources=MappingProxyType(sources), warnings=tuple(warnings))


TRIGGER_FLOOR_MAX_SHARE = 0.75   # TROVE_MIN_TRIGGER_TOKENS never pushes the trigger past this


def trigger_tokens(cfg: TroveConfig, context_length: int, model: str = "") -> int:
    """Where compaction starts for a window (see ``trigger_and_rule``)."""
    return trigger_and_rule(cfg, context_length, model)[0]


def threshold_for_model(cfg: TroveConfig, model: str = "") -> tuple[float, str]:
    """The trigger share for ``model`` and the setting that chose it.

    ``TROVE_CONTEXT_THRESHOLD_OVERRIDES`` globs are matched case-insensitively;
    the longest (most specific) matching glob wins, so a user who switches
    models mid-session gets that model's trigger at the next ``update_model``."""
    overrides = json.loads(cfg.context_threshold_overrides or "{}")
    name = (model or "").lower()
    matches = [p for p in overrides if name and fnmatch.fnmatchcase(name, p.lower())]
    if not matches:
        return cfg.context_threshold, f"TROVE_CONTEXT_THRESHOLD={cfg.context_threshold}"
    pattern = max(matches, key=len)
    share = overrides[pattern]
    return share, f"TROVE_CONTEXT_THRESHOLD_OVERRIDES[{pattern!r}]={share} for {model}"


def trigger_and_rule(cfg: TroveConfig, context_length: int,
                     model: str = "") -> tuple[int, str]:
    """Where compaction starts for a window, and which setting decided it:
    ``context_threshold`` of the window, raised to ``min_trigger_tokens`` (at most
    75% of the window).

    The host's fixed overhead (system prompt and ~24 tool schemas, about 12.5K
    tokens) does not shrink with the window: at 64K the default share of 0.35
    leaves about 10K tokens for summaries and the tail, too few to keep the
    older summaries in the prompt; the floor makes that 32K - 12.5K."""
    threshold, rule = threshold_for_model(cfg, model)
    share = int(context_length * threshold)
    floor = min(cfg.min_trigger_tokens, int(context_length * TRIGGER_FLOOR_MAX_SHARE))
    if floor > share:
        return floor, f"TROVE_MIN_TRIGGER_TOKENS floor; {rule} alone: {share:,}"
    return share, f"{rule} of the window"


def check_reachability(cfg: TroveConfig, context_length: int,
                       fixed_overhead_tokens: int = 12500, model: str = "") -> list[str]:
    """Problems that make compaction unreachable or useless for a window of ``context_length`` tokens.

    Compaction starts at ``context_length * context_threshold`` tokens. The
    system prompt, tool schemas and the like (``fixed_overhead_tokens``) are
    always in the window, so only the room between them and the trigger can be
    freed; summaries and the fresh tail must fit in that room or compaction
    cannot bring the context back under the trigger. Returns an empty list when
    the configuration works for this window.
    """
    if context_length <= 0:
        return [f"context length {context_length} is not a positive number of tokens"]
    trigger = trigger_tokens(cfg, context_length, model)
    room = trigger - fixed_overhead_tokens
    where = (f"the compaction trigger is {trigger} tokens "
             f"({threshold_for_model(cfg, model)[1]} x {context_length}, "
             f"TROVE_MIN_TRIGGER_TOKENS={cfg.min_trigger_tokens})")
    if room <= 0:
        return [f"{where}, at or below the fixed overhead of {fixed_overhead_tokens} "
                "tokens: compaction would run on every turn and could never free room; "
                "raise TROVE_CONTEXT_THRESHOLD or use a larger window"]
    problems = []
    budgets = [("TROVE_LEAF_SUMMARY_TOKENS", cfg.leaf_summary_tokens),
               ("TROVE_CONDENSED_SUMMARY_TOKENS", cfg.condensed_summary_tokens)]
    if cfg.fresh_tail_max_tokens > 0:
        budgets.append(("TROVE_FRESH_TAIL_MAX_TOKENS", cfg.fresh_tail_max_tokens))
    for name, budget in budgets:
        if budget > room:
            problems.append(f"{name}={budget} is larger than the {room} tokens left "
                            f"under the trigger ({where}, minus {fixed_overhead_tokens} "
                            "fixed overhead)")
    ratio = cfg.critical_budget_pressure_ratio
    if 0 < ratio <= trigger / context_length:
        problems.append(f"TROVE_CRITICAL_BUDGET_PRESSURE_RATIO={ratio} is at or below "
                        f"the trigger ({trigger / context_length:.2f} of the window): every "
                        "compaction would use the deterministic summarizer only")
    return problems
