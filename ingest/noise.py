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
