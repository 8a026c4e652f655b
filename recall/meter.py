"""How fast embedding work goes, and when it will be done.

The background worker and ``backfill`` record each finished batch here; status
reads texts per second over the recent batches and an estimate of the time
left for what is pending. Nothing here knows which model runs: a batch is a
count of texts (rows) and a time.
"""

from __future__ import annotations

import threading
import time
from collections import deque

WINDOW_SECONDS = 120.0        # the rate is measured over the batches of the last two minutes
KEEP_BATCHES = 64


class RateMeter:
    """Finished batches with their durations: texts per second and the time left."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.batches: deque[tuple[float, int, float]] = deque(maxlen=KEEP_BATCHES)
        self.total = 0
        self.lock = threading.Lock()

    def record(self, texts: int, seconds: float) -> None:
        """One batch of ``texts`` rows took ``seconds`` (0 rows: nothing was pending)."""
        if texts <= 0:
            return
        with self.lock:
            self.batches.append((self.clock(), int(texts), max(float(seconds), 0.0)))
            self.total += int(texts)

    def rate(self) -> float | None:
        """Texts per second of work over the batches of the last ``WINDOW_SECONDS``
        (the pauses between batches left out), None before a batch finished."""
        with self.lock:
            now = self.clock()
            recent = [(n, s) for t, n, s in self.batches if now - t <= WINDOW_SECONDS]
        busy = sum(s for _, s in recent)
        return sum(n for n, _ in recent) / busy if recent and busy > 0 else None

    def report(self, pending: int | None) -> dict:
        """``texts_per_second`` and ``eta_seconds`` (None when unknown; 0 when done)."""
        rate = self.rate()
        if pending == 0:
            eta = 0.0
        elif rate and pending:
            eta = round(pending / rate, 1)
        else:
            eta = None
        return {"texts_per_second": round(rate, 2) if rate else None, "eta_seconds": eta,
                "texts_this_process": self.total}
