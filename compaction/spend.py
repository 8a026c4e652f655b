"""A per-process cap on what summaries may spend on models.

A runaway session (a huge backlog, a tiny window, a loop) can otherwise make
hundreds of summarizer calls an hour. ``SpendGuard`` counts model calls and
tokens (prompt + answer) over a rolling hour; once either cap is reached the
summarizer uses its deterministic level until the window slides, and status
says so. Shared by every engine copy of a process (like the circuit breaker);
0 means no cap.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

WINDOW_SECONDS = 3600.0


class SpendGuard:
    """Rolling-hour counters of summarizer calls and tokens against two caps."""

    def __init__(self, max_calls: int, max_tokens: int,
                 clock: Callable[[], float] = time.monotonic):
        self.max_calls = max(0, int(max_calls))
        self.max_tokens = max(0, int(max_tokens))
        self._clock = clock
        self._events: deque[tuple[float, int]] = deque()  # (when, tokens)
        self._refused = 0
        self._lock = threading.Lock()

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] >= WINDOW_SECONDS:
            self._events.popleft()

    def _over(self) -> str | None:
        calls = len(self._events)
        tokens = sum(t for _, t in self._events)
        if self.max_calls and calls >= self.max_calls:
            return f"{calls} calls in the last hour >= TROVE_SUMMARY_MAX_CALLS_PER_HOUR={self.max_calls}"
        if self.max_tokens and tokens >= self.max_tokens:
            return (f"{tokens} tokens in the last hour >= "
                    f"TROVE_SUMMARY_MAX_TOKENS_PER_HOUR={self.max_tokens}")
        return None

    def refusal(self) -> str | None:
        """Why a model call may not be made now (None: it may); counts refusals."""
        if not (self.max_calls or self.max_tokens):
            return None
        with self._lock:
            self._trim(self._clock())
            reason = self._over()
            if reason:
                self._refused += 1
            return reason

    def record(self, tokens: int) -> None:
        """Count one model call that used ``tokens`` (prompt + answer)."""
        with self._lock:
            now = self._clock()
            self._trim(now)
            self._events.append((now, max(0, int(tokens))))

    def state(self) -> dict:
        """Snapshot for status: the caps, the last hour's use, whether it is exhausted."""
        with self._lock:
            self._trim(self._clock())
            reason = self._over() if (self.max_calls or self.max_tokens) else None
            return {"max_calls_per_hour": self.max_calls,
                    "max_tokens_per_hour": self.max_tokens,
                    "calls_last_hour": len(self._events),
                    "tokens_last_hour": sum(t for _, t in self._events),
                    "exhausted": reason is not None, "reason": reason,
                    "refused_since_start": self._refused}


_guards: dict[tuple[int, int], SpendGuard] = {}
_guards_lock = threading.Lock()


def shared_guard(max_calls: int, max_tokens: int) -> SpendGuard:
    """The process's guard for these caps, so every engine copy counts into one budget."""
    key = (max(0, int(max_calls)), max(0, int(max_tokens)))
    with _guards_lock:
        if key not in _guards:
            _guards[key] = SpendGuard(*key)
        return _guards[key]
