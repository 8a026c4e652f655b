"""terminal_waits: take out the CLI's waits for a terminal that headless tests do not have.

``cli.HermesCLI.chat`` (hermes-agent 0.19.0) waits twice per turn for a screen:
it polls ``_interrupt_queue`` every 0.1 s while the agent thread runs (a user typing
to interrupt), and after the turn it sleeps 0.15 s so prompt_toolkit can paint the
streamed text before the response box. Headless nobody types and nothing paints,
yet the two waits were ~0.2 s of every turn: a third of a host walk's time
(``tests/test_host_walk.py`` replay 280003: 69 turns, 10.4 s of sleep in 37 s).

:func:`skip_terminal_waits` keeps the host's flow as it is and only makes the waits
short: the interrupt queue answers "empty" after 5 ms instead of 100 ms (the loop
then sees the agent thread has ended), and a sleep of at most
``PAINT_WAIT`` seconds on the thread that drives the CLI returns at once. Other
threads' sleeps (the agent's, the review forks') and longer sleeps (exit grace
periods) stay real.
"""
from __future__ import annotations

import queue
import threading
import time
import types
from typing import Any

PAINT_WAIT = 0.15          # cli.py: time.sleep(0.15) after the agent thread ends
POLL = 0.005               # seconds the interrupt queue waits instead of 0.1


class _ShortPollQueue(queue.Queue):
    """The CLI's interrupt queue, polled every ``POLL`` seconds instead of 0.1."""

    def get(self, block: bool = True, timeout: Any = None) -> Any:
        if block and timeout is not None:
            timeout = min(timeout, POLL)
        return super().get(block, timeout)


class _HeadlessTime(types.ModuleType):
    """``time`` for cli.py: the driving thread's paint waits return at once."""

    def __init__(self) -> None:
        super().__init__("time")

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds <= PAINT_WAIT and threading.current_thread() is threading.main_thread():
            return
        time.sleep(seconds)


def skip_terminal_waits(cli_module: Any, cli_object: Any) -> None:
    """Make the terminal waits of one ``HermesCLI`` object (and its module) short."""
    if not isinstance(getattr(cli_module, "time", None), _HeadlessTime):
        cli_module.time = _HeadlessTime()
    if isinstance(getattr(cli_object, "_interrupt_queue", None), queue.Queue):
        cli_object._interrupt_queue = _ShortPollQueue()
