"""Which sessions and messages the engine should not store.

Cron jobs, health checks and throw-away lanes can fill a store with noise.
``SessionFilter`` decides per session from ``TROVE_IGNORE_SESSION_PATTERNS``
(nothing stored) and ``TROVE_STATELESS_SESSION_PATTERNS`` (reads the store,
never writes); ``MessageFilter`` drops single messages matching
``TROVE_IGNORE_MESSAGE_PATTERNS``.

User-supplied regular expressions run on every ingested message, so they must
not be able to stall the host: they run on the ``regex`` package with a
per-search timeout, and without that package message filtering is off (with a
warning) rather than run unbounded on ``re``.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from typing import Iterable, Iterator, NamedTuple

from ..storage import codec

log = logging.getLogger(__name__)

IGNORED = "ignored"
STATELESS = "stateless"
NORMAL = "normal"
DEFAULT_TIMEOUT_S = 0.05
GLOB_SEMANTICS = {
    "*": "any characters within one colon-separated segment (not ':')",
    "**": "any characters, across colons",
    "other characters": "match themselves; the whole candidate must match",
}
MATCHED_AGAINST = ("session_id", "platform", "platform:session_id")


class Classification(NamedTuple):
    """A session's class and the pattern that decided it (None for ``normal``)."""

    kind: str
    pattern: str | None


def glob_regex(pattern: str) -> re.Pattern:
    """A compiled regex for a session glob: ``*`` within a segment, ``**`` across colons."""
    pieces = []
    for token in re.split(r"(\*+)", pattern):
        if token.startswith("**"):
            pieces.append(".*")
        elif token == "*":
            pieces.append("[^:]*")
        elif token:
            pieces.append(re.escape(token))
    return re.compile("".join(pieces), re.DOTALL)


def _clean(patterns: Iterable[str] | str) -> tuple[str, ...]:
    items = patterns.split(",") if isinstance(patterns, str) else patterns
    return tuple(dict.fromkeys(p.strip() for p in items if p and p.strip()))


class SessionFilter:
    """Classifies sessions as ignored, stateless or normal from glob patterns."""

    def __init__(self, ignore_patterns: Iterable[str] | str = (),
                 stateless_patterns: Iterable[str] | str = ()):
        self.ignore_patterns = _clean(ignore_patterns)
        self.stateless_patterns = _clean(stateless_patterns)
        self._ignore = [(p, glob_regex(p)) for p in self.ignore_patterns]
        self._stateless = [(p, glob_regex(p)) for p in self.stateless_patterns]

    def classify(self, session_id: str | None, platform: str | None) -> Classification:
        """``ignored`` / ``stateless`` / ``normal`` for a session; ignored wins over stateless.

        Each pattern is tried against the raw session id, the platform and
        ``platform:session_id`` (the last two only when a platform is known).
        """
        candidates = _candidates(session_id or "", platform or "")
        for kind, compiled in ((IGNORED, self._ignore), (STATELESS, self._stateless)):
            for pattern, regex in compiled:
                if any(regex.fullmatch(c) for c in candidates):
                    return Classification(kind, pattern)
        return Classification(NORMAL, None)

    def describe(self) -> dict:
        """The filter contract for status output: patterns and how they are matched."""
        return {"ignore_patterns": list(self.ignore_patterns),
                "stateless_patterns": list(self.stateless_patterns),
                "matched_against": list(MATCHED_AGAINST), "wildcards": dict(GLOB_SEMANTICS),
                "precedence": "ignored wins over stateless; no match is normal"}


def _candidates(session_id: str, platform: str) -> tuple[str, ...]:
    if not platform:
        return (session_id,)
    return (session_id, platform, f"{platform}:{session_id}")


def _regex_module():
    """The ``regex`` package, or None when it is not installed."""
    try:
        return importlib.import_module("regex")
    except ImportError:
        return None


class MessageFilter:
    """Drops messages matching user regexes, each search bounded by a timeout."""

    def __init__(self, patterns: Iterable[str] | str = (), *,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.patterns = _clean(patterns)
        self.timeout_s = timeout_s
        self.invalid: dict[str, str] = {}
        self.timeouts = 0
        self.warning: str | None = None
        self._compiled: list[tuple[str, object]] = []
        engine = _regex_module()
        if engine is None:
            if self.patterns:
                self.warning = ("the 'regex' package is not installed, so "
                                "TROVE_IGNORE_MESSAGE_PATTERNS is disabled (plain 're' has no "
                                "timeout and one bad pattern could stall every turn)")
                log.warning("hermes-trove: %s", self.warning)
            return
        for pattern in self.patterns:
            try:
                self._compiled.append((pattern, engine.compile(pattern)))
            except engine.error as exc:
                self.invalid[pattern] = str(exc)
                log.warning("hermes-trove: ignoring invalid TROVE_IGNORE_MESSAGE_PATTERNS "
                            "entry %r: %s", pattern, exc)

    @property
    def enabled(self) -> bool:
        """Whether any usable pattern is active."""
        return bool(self._compiled)

    def matches(self, message: dict) -> str | None:
        """The first pattern that matches ``message`` (so it is not stored), else None.

        Plain text is tried first (string content, then text parts); the
        message's normalized JSON (sort_keys) only when no text matched, so
        patterns can also name roles, tools or arguments. A search that times
        out counts as no match and is counted in ``timeouts``.
        """
        if not self._compiled:
            return None
        texts = list(_plain_texts(message))
        found = self._first_match(texts)
        if found is None:
            found = self._first_match([_normalized_json(message)])
        return found

    def _first_match(self, texts: list[str]) -> str | None:
        for pattern, compiled in self._compiled:
            for text in texts:
                try:
                    if compiled.search(text, timeout=self.timeout_s):
                        return pattern
                except TimeoutError:
                    self.timeouts += 1
        return None

    def describe(self) -> dict:
        """Active, invalid and timed-out pattern counts for status output."""
        return {"patterns": [p for p, _ in self._compiled], "invalid": dict(self.invalid),
                "timeout_seconds": self.timeout_s, "timeouts": self.timeouts,
                "enabled": self.enabled, "warning": self.warning,
                "order": "plain text (content, then text parts), then the message's "
                         "normalized JSON if no text matched"}


def _plain_texts(message: dict) -> Iterator[str]:
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]
            elif isinstance(part, str):
                yield part


def _normalized_json(message: dict) -> str:
    return json.dumps(codec.clean_message(message), sort_keys=True, ensure_ascii=False,
                      default=str)


# ---------------------------------------------------------------- whole-session noise
# Machine-made prompts of heartbeat and cron runs: exact shapes, case-sensitive, each
# matched against the WHOLE message (``fullmatch``), so a person writing "Heartbeat
# service on prod keeps crashing", "cron: how should we schedule..." or a chat about
# configuring HEARTBEAT.md is never mistaken for one.
HEARTBEAT_CRON_SHAPES = (
    re.compile(r"\s*HEARTBEAT(?:_OK)?[.!]?\s*"),          # the bare keyword or its ack, alone
    # the heartbeat prompt: one short line from "Read HEARTBEAT.md" to "reply HEARTBEAT_OK"
    re.compile(r"\s*Read HEARTBEAT\.md\b[^\n]{0,300}\bHEARTBEAT_OK\b[^\n]{0,40}"),
    # a cron delivery: its tag first, then a short machine-made line
    re.compile(r"\s*\[(?:Cron delivery|cron)\b[^\]\n]{0,80}\][^\n]{0,200}"),
)
NOISE_MAX_MESSAGES = 40          # a longer session holds real work, whatever it says
NOISE_MAX_DISTINCT_USER_TEXTS = 3  # heartbeats repeat; a person varies what they write
NOISE_MAX_REPLY_CHARS = 400      # an ack or a short digest, not an explanation


class NoiseVerdict(NamedTuple):
    """Whether a whole session is heartbeat/cron noise, and the facts that decided it."""

    noise: bool
    facts: tuple[str, ...]


def _shape_of(text: str) -> str | None:
    """The heartbeat/cron shape a user text has, or None."""
    return next((p.pattern for p in HEARTBEAT_CRON_SHAPES if p.fullmatch(text)), None)


def session_noise(messages: list[dict], message_filter: MessageFilter | None = None
                  ) -> NoiseVerdict:
    """Judge a whole session (decoded messages, in order): noise only when it is small,
    uses no tools, every user message is a heartbeat/cron shape (or matches
    ``TROVE_IGNORE_MESSAGE_PATTERNS``), its user texts barely vary and every reply is
    short. ``facts`` explain the verdict (the first failed test when it is not noise),
    so ``doctor clean`` can say why a session is a candidate."""
    if len(messages) > NOISE_MAX_MESSAGES:
        return NoiseVerdict(False, (f"{len(messages)} messages (> {NOISE_MAX_MESSAGES})",))
    if any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        return NoiseVerdict(False, ("uses tools",))
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return NoiseVerdict(False, ("no user messages",))
    kinds = []
    for message in users:
        text = codec.message_text(message)
        shape = _shape_of(text)
        pattern = message_filter.matches(message) if message_filter is not None else None
        if shape is None and pattern is None:
            return NoiseVerdict(False, (f"user message {' '.join(text.split())[:60]!r} is "
                                        "not heartbeat/cron",))
        kinds.append(f"shape {shape!r}" if shape else f"pattern {pattern!r}")
    distinct = {re.sub(r"\d+", "#", " ".join(codec.message_text(m).split())) for m in users}
    if len(distinct) > NOISE_MAX_DISTINCT_USER_TEXTS:
        return NoiseVerdict(False, (f"{len(distinct)} different user texts",))
    longest = max((len(codec.message_text(m)) for m in messages if m.get("role") != "user"),
                  default=0)
    if longest > NOISE_MAX_REPLY_CHARS:
        return NoiseVerdict(False, (f"a reply of {longest} chars",))
    return NoiseVerdict(True, (
        f"{len(messages)} messages, no tool use",
        f"all {len(users)} user messages are noise ({', '.join(sorted(set(kinds)))})",
        f"{len(distinct)} distinct user text(s)", f"longest reply {longest} chars"))
