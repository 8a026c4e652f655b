"""Keeping the prompt bounded for sessions trove must not store.

Sessions matching ``TROVE_IGNORE_SESSION_PATTERNS`` (store nothing) or
``TROVE_STATELESS_SESSION_PATTERNS`` (read-only) still need their requests to
fit the window. They are handed to Hermes's own ``ContextCompressor`` (lossy,
but what the user would have without trove); when it cannot be built or fails,
a deterministic head/tail trim keeps the newest turns that fit.

A stored session whose database is unusable gets the trim alone (the engine's
``_compress_without_database``): it returns the host's own message objects, so
when the database works again each is recognized as the row it already was.
"""

from __future__ import annotations

import logging
from typing import Callable

from . import assemble

log = logging.getLogger(__name__)

TRIM_NOTICE = ("[trove context: earlier turns of this session were trimmed to fit the window; "
               "trove is not storing this session now (excluded by configuration, or its "
               "database is unavailable: /trove status says which)]")
# The notice before 2026-12-05 said "excluded by configuration" also during a database
# fault; a list the host still holds may carry it.
_EARLIER_TRIM_NOTICES = ("[trove context: earlier turns of this session were trimmed to fit "
                         "the window; this session is excluded from trove's storage by "
                         "configuration]",)


def is_trim_notice(message: dict) -> bool:
    """Whether ``message`` is the notice ``trim_to_budget`` put before a trimmed tail.

    The trim also bounds the prompt while the database is unusable; once it works
    again the host shows that list, and the notice is the engine's own text, not
    conversation: it is never stored (it read as a user message, and the turns
    after it were taken for new ones and stored a second time)."""
    return (isinstance(message, dict) and message.get("role") == "user"
            and message.get("content") in (TRIM_NOTICE, *_EARLIER_TRIM_NOTICES))


def builtin_compressor(runtime: dict, context_length: int, threshold_percent: float):
    """Hermes's built-in compressor configured like the host would, or None."""
    try:
        from agent.context_compressor import ContextCompressor
        return ContextCompressor(
            model=runtime.get("model") or "", threshold_percent=threshold_percent,
            base_url=runtime.get("base_url") or "", api_key=runtime.get("api_key") or "",
            provider=runtime.get("provider") or "", api_mode=runtime.get("api_mode") or "",
            config_context_length=context_length or None, quiet_mode=True)
    except Exception as exc:  # host absent or its constructor changed
        log.info("hermes-trove: built-in compressor unavailable: %s", exc)
        return None


def trim_to_budget(messages: list, budget_tokens: int, count: Callable[[dict], int]) -> list:
    """System prompt, a notice, and the newest whole units that fit ``budget_tokens``."""
    system = messages[0] if messages and messages[0].get("role") == "system" else None
    body = messages[1:] if system is not None else list(messages)
    # no identity reading here (no database): the engine's own are told by their text
    keep, _ = assemble.choose_tail(body, assemble.group_units(body), max_count=len(body) or 1,
                                   max_tokens=max(0, budget_tokens), count=count,
                                   engine=[assemble.is_trove_message(m) for m in body])
    tail = [body[i] for i in sorted(keep)]
    if len(tail) == len(body):
        return messages
    return assemble.build_prompt(system, TRIM_NOTICE, tail)


def compress_unstored(messages: list, *, compressor, current_tokens: int | None,
                      focus: str | None, budget_tokens: int,
                      count: Callable[[dict], int]) -> tuple[list, str]:
    """Bound the prompt without writing anything: (result, which path did it)."""
    if compressor is not None:
        try:
            result = compressor.compress(messages, current_tokens=current_tokens,
                                         focus_topic=focus)
            if result:
                return result, "builtin"
        except Exception as exc:
            log.warning("hermes-trove: built-in compressor failed, trimming instead: %s", exc)
    return trim_to_budget(messages, budget_tokens, count), "trim"
