"""The threshold full sweep: one synchronous, bounded compaction pass.

With ``TROVE_THRESHOLD_FULL_SWEEP_ENABLED`` a compaction at the trigger drains
the whole raw backlog in leaf chunks, then condenses only when the frontier
is larger than ``TROVE_SUMMARY_PREFIX_TARGET_TOKENS`` (0 = one leaf chunk),
rather than whenever ``TROVE_CONDENSE_FANOUT`` nodes of a depth exist. It is
bounded: at most ``MAX_CALLS`` summarizer (model) calls and ``DEADLINE_SECONDS``
of wall clock per invocation; past either, the rest of the sweep uses the
deterministic level, which always completes quickly. (A field bug was an
unbounded sweep that locked a session for 50 minutes.)
"""

from __future__ import annotations

import time
from typing import Callable

MAX_CALLS = 12
DEADLINE_SECONDS = 120.0


class Sweep:
    """The bounds of one sweep; ``bound`` wraps a summarizer to respect them."""

    def __init__(self, *, max_calls: int = MAX_CALLS, deadline_seconds: float = DEADLINE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.max_calls = max_calls
        self.clock = clock
        self.deadline = clock() + deadline_seconds
        self.calls = 0
        self.capped = 0   # summaries made deterministic because a bound was reached

    def exhausted(self) -> bool:
        """Whether the sweep has used its calls or its time."""
        return self.calls >= self.max_calls or self.clock() >= self.deadline

    def bound(self, summarizer) -> "BoundedSummarizer":
        """``summarizer`` that goes deterministic once this sweep is exhausted."""
        return BoundedSummarizer(summarizer, self)

    def should_condense(self, frontier: list, cost: Callable[[dict], int], *,
                        target_tokens: int, chunk_tokens: int) -> bool:
        """Condense only when the frontier costs more than the prefix target."""
        target = target_tokens or chunk_tokens
        return sum(cost(n) for n in frontier) > target

    def describe(self) -> dict:
        """For the compaction outcome in status."""
        return {"calls": self.calls, "max_calls": self.max_calls, "capped": self.capped,
                "deadline_passed": self.clock() >= self.deadline}


class BoundedSummarizer:
    """Delegates to a ``Summarizer``; deterministic-only once the sweep is exhausted."""

    def __init__(self, inner, sweep: Sweep):
        self._inner = inner
        self._sweep = sweep

    def summarize(self, items, *, deterministic_only: bool = False, **kwargs):
        """Summarize like the wrapped summarizer, counting the model calls it made."""
        if not deterministic_only and self._sweep.exhausted():
            deterministic_only = True
            self._sweep.capped += 1
        result = self._inner.summarize(items, deterministic_only=deterministic_only, **kwargs)
        self._sweep.calls += sum(1 for a in result.attempts if a[0] in (1, 2)
                                 and not str(a[2]).startswith("skipped"))
        return result
