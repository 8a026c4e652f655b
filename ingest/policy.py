"""What happens to a message between the host and its database row.

In order: noise messages matching ``TROVE_IGNORE_MESSAGE_PATTERNS`` are not
stored; secrets are redacted (opt-in) before anything else sees them (row,
FTS, summaries, replay, payload files); inline media and (opt-in) oversized
tool results move to payload files, leaving a placeholder with an exact ref.
The row's identity is computed before the payload guard, so externalizing
never makes a stored message look new; it is computed after redaction, so a
redacted replay is the same message (turning redaction on re-stores at most
the messages shown at that moment, in their redacted form).

One policy object per process and settings: compiled patterns are shared by
every deep copy of the engine.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from ..storage import codec
from ..config import TroveConfig
from .noise import MessageFilter, SessionFilter
from ..storage.payloads import (PayloadError, PayloadStore, guard_message, refs_in,
                                restore_text)
from ..storage.payloads import store_for as payload_store_for
from . import redaction
from .redaction import Redactor

log = logging.getLogger(__name__)

# Their results are what the model asked to read in full: never replaced by a stub.
NEVER_STUBBED = frozenset({"trove_expand", "trove_describe"})

_policies: dict[tuple, "IngestPolicy"] = {}
_policies_lock = threading.Lock()


@dataclass
class IngestPolicy:
    """The filters and transformations applied to every message before it is stored."""

    sessions: SessionFilter
    messages: MessageFilter
    redactor: Redactor | None
    payloads: PayloadStore
    large_threshold: int | None
    ignored_messages: int = 0
    redactions: int = 0
    warnings: list[str] = field(default_factory=list)

    def feeds_rollups(self, session_id: str, source: str | None) -> bool:
        """Whether a stored session may feed the cross-session rollups: never one that
        matches an ignore or stateless pattern (even one stored before the pattern)."""
        platform = None if source in (None, "", "unknown") else source
        return self.sessions.classify(session_id, platform).kind == "normal"

    def prepare(self, message: dict) -> codec.EncodedMessage | None:
        """The row encoding of a host message, or None when it is noise not to store."""
        original = codec.clean_message(message)
        if self.messages.enabled and self.messages.matches(original) is not None:
            self.ignored_messages += 1
            return None
        base = self._restored(original)
        if self.redactor is not None:
            base, count = self.redactor.redact_message(base)
            self.redactions += count
        guarded = guard_message(base, self.payloads, large_threshold_chars=self.large_threshold)
        for warning in guarded.warnings:
            self._warn(warning)
        # Identity is the message as sent, stubs restored, secrets already replaced:
        # a redacted or stubbed replay of a stored message is that same message.
        return codec.encode_message(guarded.message, identity_of=base)

    def redacting(self, llm_call):
        """``llm_call`` whose answers have their secrets replaced when redaction is on
        (the same callable otherwise): a summary is stored and shown again, and a model
        can repeat or invent a secret its redacted prompt never held, so a model's
        answer the engine keeps obeys the rule a stored message does."""
        redactor = self.redactor
        if llm_call is None or redactor is None:
            return llm_call

        def call(prompt, model, timeout_s):
            answer = llm_call(prompt, model, timeout_s)
            if not isinstance(answer, str):
                return answer
            text, count = redactor.redact(answer)
            self.redactions += count
            return text
        return call

    def for_replay(self, message: dict) -> dict:
        """The message as it may go back to the provider: secrets replaced when redaction
        is on (the same object when nothing changes)."""
        if self.redactor is None:
            return message
        redacted, count = self.redactor.redact_message(message)
        return message if not count else redacted

    def _restored(self, message: dict) -> dict:
        """A tool result replayed as a stub (see ``stub_for``) is the same message as the
        original it stands for: its identity comes from the restored text."""
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str) or not refs_in(content):
            return message
        try:
            restored = restore_text(content, self.payloads)
        except PayloadError:
            return message
        return message if restored == content else {**message, "content": restored}

    def stub_for(self, message: dict, stored_content: str | None) -> dict | None:
        """The provider-visible stub of a large textual tool result, or None to keep it.

        Only when its stored row already holds the externalized placeholder and the
        payload file is there (durability confirmed); trove's own expansion tools
        are never stubbed, and multimodal results stay inline."""
        if (message.get("role") != "tool" or not isinstance(message.get("content"), str)
                or codec.tool_name_of(message) in NEVER_STUBBED or not stored_content):
            return None
        refs = refs_in(stored_content)
        if not refs or not all(self.payloads.exists(ref) for ref in refs):
            return None
        return {**message, "content": stored_content}

    def _warn(self, text: str) -> None:
        log.warning("hermes-trove: %s", text)
        self.warnings = (self.warnings + [text])[-20:]

    def describe(self) -> dict:
        """The filter contract for status: patterns, counts, redaction state, never a secret."""
        return {"session_filters": self.sessions.describe(),
                "message_filter": {**self.messages.describe(),
                                   "ignored_messages": self.ignored_messages},
                "sensitive_patterns": (self.redactor.describe() if self.redactor
                                       else {"enabled": False}),
                "redactions": self.redactions,
                "large_output_externalization_threshold": self.large_threshold,
                "warnings": self.warnings[-5:]}


def policy_for(cfg: TroveConfig) -> IngestPolicy:
    """The shared policy for these settings (built once per process)."""
    key = (str(cfg.database_target), str(cfg.resolved_database_path), cfg.ignore_session_patterns,
           cfg.stateless_session_patterns, cfg.ignore_message_patterns,
           cfg.sensitive_patterns_enabled, cfg.sensitive_patterns,
           cfg.large_output_externalization_enabled,
           cfg.large_output_externalization_threshold_chars)
    with _policies_lock:
        policy = _policies.get(key)
        if policy is None:
            policy = _build(cfg)
            _policies[key] = policy
        return policy


def _build(cfg: TroveConfig) -> IngestPolicy:
    redactor = redaction.configured(cfg)
    policy = IngestPolicy(
        sessions=SessionFilter(cfg.ignore_session_patterns, cfg.stateless_session_patterns),
        messages=MessageFilter(cfg.ignore_message_patterns),
        redactor=redactor,
        payloads=payload_store_for(cfg.database_target, cfg.resolved_database_path),
        large_threshold=(cfg.large_output_externalization_threshold_chars
                         if cfg.large_output_externalization_enabled else None))
    for pattern, error in policy.messages.invalid.items():
        policy._warn(f"TROVE_IGNORE_MESSAGE_PATTERNS: dropped invalid pattern {pattern!r}: {error}")
    if policy.messages.warning:
        policy._warn(policy.messages.warning)
    if redactor is not None and redactor.unknown:
        policy._warn(f"TROVE_SENSITIVE_PATTERNS: unknown names {sorted(redactor.unknown)}")
    return policy
