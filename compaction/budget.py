"""Prompt budgets in the two units that bound a prompt.

The host decides when to compact on its own rough estimate
(``agent.model_metadata.estimate_request_tokens_rough``: about four characters
a token over messages, system prompt and tool schemas); the provider enforces
its window in real tokens. The two disagree by up to 2x (chars/4 over-counts
long words, under-counts CJK and code), so neither may stand in for the other:

* **host units**: what the host passes as ``current_tokens`` minus its own
  estimate of the messages is the host's overhead, in the host's units, exactly;
* **real tokens**: the provider's ``prompt_tokens`` minus trove's exact count of
  what was sent is the real overhead (learned after a turn), bounded by the
  host's so a provider that reports odd usage cannot starve the tail.

A compaction must bring both under the target. ``Budget.cost`` prices a message
in real-token equivalents so that one budget keeps both sums under it: a
message costs its exact count, or its host estimate scaled to the real room,
whichever is more.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

# The host's fixed prompt overhead (system prompt + ~24 tool schemas) when it
# has not told us better: see the host reference.
DEFAULT_OVERHEAD_TOKENS = 12_500
# The learned real overhead is kept within this factor of the host's overhead
# (plus a little), so a provider reporting odd usage moves the budget boundedly.
REAL_OVERHEAD_FACTOR = 2.0
REAL_OVERHEAD_SLACK = 1_000


def _fallback_estimate(messages: list) -> int:
    chars = sum(len(str(m)) for m in messages)
    return (chars + 3) // 4


@functools.lru_cache(maxsize=1)
def host_estimator() -> Callable[[list], int]:
    """The host's own rough estimate of a message list (chars/4 without it)."""
    try:
        from agent.model_metadata import estimate_messages_tokens_rough
    except Exception:  # scripts and tests without the host
        return _fallback_estimate
    return estimate_messages_tokens_rough


PERSISTED_WRAPPER_CHARS = 600   # room for the host's <persisted-output> note around a preview


def host_kept_text(text: str, tool_name: str, context_length: int) -> str:
    """What of a tool result the host keeps in its list: the whole text, or, past its
    persistence threshold, a preview (``tools.tool_result_storage``: results over
    ``budget_for_context_window(window).resolve_threshold(tool)`` characters are
    written to a file and replaced by their first ``preview_size`` characters and a
    note). The preview is taken a little long, so the count errs high, never low.

    Why: ``post_tool_call`` hands over the raw result before the host shrinks it;
    counted whole, a 300K-character log would read as ~75K tokens of pressure that
    never reaches the request, and start summaries no request needed. Without the
    host (scripts, other hosts) the whole text counts."""
    try:
        from tools.budget_config import budget_for_context_window
        config = budget_for_context_window(int(context_length) if context_length else None)
        threshold = config.resolve_threshold(tool_name)
        preview = int(config.preview_size)
    except Exception:  # no host, or a host whose budget module differs: count it all
        return text
    if threshold == float("inf") or len(text) <= threshold:
        return text
    return text[:preview + PERSISTED_WRAPPER_CHARS]


def api_form(message: dict) -> dict:
    """A user message as the host estimates it on its request copies: its
    ``api_content`` sidecar (the wire text: the message and the context plugins
    add) in place of ``content``, not beside it. The message itself holds both,
    and the host's estimates of its own list count both."""
    sidecar = message.get("api_content")
    if not isinstance(sidecar, str) or not sidecar:
        return message
    return {**{k: v for k, v in message.items() if k != "api_content"}, "content": sidecar}


def as_counted(messages: list, current_tokens: int | None, overhead: int | None,
               rough: Callable[[dict], int]) -> Callable[[dict], int]:
    """The host's estimate of a message as the figure ``current_tokens`` counted it:
    the current turn's user message in its API form (``api_form``) when the figure
    shows the host counted it so, else ``rough`` (the message as it stands).

    Why: the message holds the text and its ``api_content`` sidecar; the host counts
    it once where it estimates its request copies (before each API call) and twice
    where it estimates its own list. Counted twice there, a 10K-token turn alone was
    over the trigger, and the previous exchange that fit beside it by the host's own
    figure was left out (host walk seed 30009). ``overhead`` (host units, learned
    before; None while unknown) tells the two apart."""
    turn = next((m for m in reversed(messages)
                 if isinstance(m, dict) and m.get("role") == "user"), None)
    if turn is None or api_form(turn) is turn or not current_tokens or current_tokens <= 0 \
            or overhead is None:
        return rough
    sidecar = turn["api_content"]
    whole = overhead + sum(rough(m) for m in messages)
    once = whole - rough(turn) + host_estimator()([api_form(turn)])
    if abs(current_tokens - once) >= abs(current_tokens - whole):
        return rough

    def counted(message: dict) -> int:
        if message.get("role") == "user" and message.get("api_content") == sidecar:
            return host_estimator()([api_form(message)])
        return rough(message)
    return counted


# The host's preflight loop counts a pass as progress only when it drops rows or
# cuts its rough estimate by more than this share (``_compression_made_progress``).
HOST_PROGRESS_SHARE = 0.95
# Our prediction of the host's estimate after the pass may be a little off (the
# system prompt is rebuilt at a compaction): a pass this close to the line is
# taken as no progress, which only keeps the list the host has.
HOST_PROGRESS_MARGIN = 0.01


def host_sees_progress(before: list, after: list, current_tokens: int | None) -> bool:
    """Whether the host's preflight loop will count ``before`` -> ``after`` as progress.

    Why: when it does not, the loop stops without taking the new list as the turn's
    history, although its in-place compaction has already written that list to
    state.db; the turn's end then writes it a second time and a later /resume
    restores both copies (host walk 120017: a 20K-token turn whose block was only
    re-rendered). A result the host will not take as progress is better not
    returned at all. ``current_tokens`` is the host's rough estimate of the request
    (without it, only fewer rows can be known to count)."""
    if len(after) < len(before):
        return True
    if not current_tokens or current_tokens <= 0:
        return False
    estimate = host_estimator()
    predicted = current_tokens - estimate(before) + estimate(after)
    return predicted < current_tokens * (HOST_PROGRESS_SHARE - HOST_PROGRESS_MARGIN)


class RealProjection:
    """The real tokens the host's list is known to hold: the provider's count of the
    last request plus its reply, plus each user message noted since; unknown after a
    compaction changed the list, until the next reply.

    Why: the host asks for a compaction on chars/4, which counts CJK text about five
    times low; two 20K-token Chinese turns stayed under its figure of the threshold
    and the request went out over the window, the host never asking (host walk
    120004). The trigger reads the larger of the two figures."""

    def __init__(self) -> None:
        self.tokens: int | None = None

    def counted(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The provider counted a request and its reply."""
        self.tokens = prompt_tokens + completion_tokens if prompt_tokens > 0 else None

    def grew(self, message_tokens: int) -> None:
        """A user message joined the list since the provider counted it."""
        if self.tokens is not None:
            self.tokens += message_tokens

    def recount(self, overhead_tokens: int | None, count_list: Callable[[], int],
                host_overhead: int | None = None) -> None:
        """``compress`` counts the list at hand: an /undo or /retry since the reply
        may have shrunk it with no hook telling. Before the first reply (or after a
        compaction) nothing else knows the list's real size: it is counted then too,
        with the host's overhead while the real one is not learned yet."""
        if self.tokens is not None and overhead_tokens is not None:
            self.tokens = overhead_tokens + count_list()
        elif self.tokens is None and (overhead_tokens or host_overhead) is not None:
            overhead = overhead_tokens if overhead_tokens is not None else host_overhead
            self.tokens = overhead + count_list()

    def forget(self) -> None:
        """A compaction changed the list (or the session changed): unknown again."""
        self.tokens = None

    def pressure(self, host_tokens: int) -> int:
        """The request's size for the trigger."""
        return max(host_tokens, self.tokens or 0)


def host_text_cost(text: str) -> int:
    """The host's estimate of one user message holding ``text`` (the summary block)."""
    return (len(str({"role": "user", "content": text})) + 3) // 4


def bounded_real_overhead(learned: int | None, host_overhead: int) -> int:
    """The real-token overhead to budget with: the learned one within bounds of the
    host's, else the host's own (system prompt and schemas are text and JSON, where
    chars/4 is close)."""
    if learned is None:
        return host_overhead
    ceiling = int(host_overhead * REAL_OVERHEAD_FACTOR) + REAL_OVERHEAD_SLACK
    return max(0, min(int(learned), ceiling))


# System prompt and schemas are text and JSON, where chars/4 is close to real
# tokens: the host's estimate of them is not taken below this share of the real.
HOST_OVERHEAD_FLOOR = 0.9


def host_overhead_floor(real_overhead: int | None) -> int:
    """The least host-unit overhead that the provider's real overhead allows."""
    return int(real_overhead * HOST_OVERHEAD_FLOOR) if real_overhead else 0


@dataclass(frozen=True)
class Budget:
    """Room for one compaction's result (the messages after the system prompt).

    ``target`` is where the result aims (below the trigger); ``host_overhead`` and
    ``real_overhead`` are what the host adds around the messages in each unit;
    ``system_rough`` / ``system_exact`` the system prompt when the list carries one."""

    target: int
    host_overhead: int
    real_overhead: int
    system_rough: int = 0
    system_exact: int = 0

    @property
    def real_room(self) -> int:
        """Real tokens the messages may take."""
        return max(0, self.target - self.real_overhead - self.system_exact)

    @property
    def host_room(self) -> int:
        """Host-estimate units the messages may take."""
        return max(0, self.target - self.host_overhead - self.system_rough)

    @property
    def scale(self) -> float:
        """Real tokens per host unit at which both rooms fill together."""
        if self.host_room <= 0:
            return float(max(1, self.real_room))
        return self.real_room / self.host_room

    def cost(self, exact: int, rough: int) -> int:
        """A message's price in real-token equivalents (see the module)."""
        return max(int(exact), int(rough * self.scale + 0.999))

    def describe(self) -> dict:
        """What status shows of the budget (which number is which counter)."""
        return {"target": self.target, "host_overhead": self.host_overhead,
                "real_overhead": self.real_overhead, "real_room": self.real_room,
                "host_room": self.host_room}
