"""Progress of long operator work: a bar on a terminal, a line per batch otherwise.

``embed backfill --apply`` can take minutes; the operator sees how far it is,
how fast it goes and when it is done. On a terminal one line is redrawn in
place; in a pipe or a log every batch is its own line, so nothing is lost.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

BAR_WIDTH = 30


class Progress:
    """A ``progress(done, total)`` callback that writes to ``stream`` (stderr by default,
    so stdout keeps only the report)."""

    def __init__(self, label: str, stream: TextIO | None = None, clock=time.monotonic,
                 tty: bool | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = clock()
        self.tty = self.stream.isatty() if tty is None else tty
        self.drawn = False

    def line(self, done: int, total: int) -> str:
        """``label: done/total (pct%), rate/s, about T left``."""
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = done / elapsed
        pct = 100.0 * done / total if total else 100.0
        left = (total - done) / rate if rate and total > done else 0.0
        text = f"{self.label}: {done:,}/{total:,} ({pct:.0f}%), {rate:.1f}/s"
        return text + (f", about {left:.0f} s left" if total > done else "")

    def __call__(self, done: int, total: int) -> None:
        text = self.line(done, total)
        if self.tty:
            filled = int(BAR_WIDTH * min(done / total, 1.0)) if total else BAR_WIDTH
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            self.stream.write(f"\r[{bar}] {text}\033[K")
            self.drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, text: str) -> None:
        """End the bar's line and say the work is done (or why it stopped)."""
        if self.drawn:
            self.stream.write("\n")
        self.stream.write(f"{self.label}: {text} after {self.clock() - self.started:.1f} s\n")
        self.stream.flush()


class LogProgress(Progress):
    """The same lines into a logger (the chat cannot show a bar: ``/trove`` answers
    once, so its batches go to the log the host writes and the answer says done)."""

    def __init__(self, label: str, logger: logging.Logger, clock=time.monotonic) -> None:
        super().__init__(label, stream=sys.stderr, clock=clock, tty=False)
        self.logger = logger

    def __call__(self, done: int, total: int) -> None:
        self.logger.info("hermes-trove: %s", self.line(done, total))

    def finish(self, text: str) -> None:
        self.logger.info("hermes-trove: %s: %s after %.1f s", self.label, text,
                         self.clock() - self.started)
