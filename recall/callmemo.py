"""One tool call's memo: work a call repeats is done once inside it.

A ``trove_recall`` runs, beside its all-session search, the search ``trove_grep``
runs over the calling session, and each sentence of a question is searched again
on its own: the same full-text search of the same scope and the same read of a
scope's vectors come up several times in one call (18K vectors of 1.5 KB read
about 8 times a call on the real-chat bench). Inside ``one_call()`` (this thread
only) ``kept(key, compute)`` computes each key once; outside it, every time.
Nothing outlives the call, so nothing kept can go stale between calls.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")
_local = threading.local()


@contextlib.contextmanager
def one_call():
    """Keep repeated work for the duration of one tool call (nested: the outer one's)."""
    outer = getattr(_local, "memo", None)
    if outer is None:
        _local.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _local.memo = None


def kept(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, once per ``key`` inside ``one_call``; every time outside it."""
    memo = getattr(_local, "memo", None)
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]
