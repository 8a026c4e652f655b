"""Which summary blocks the engine rendered, and what it returned after each.

A list the host shows may carry one of the engine's blocks. Recognizing it by
its exact text (not by its header, which a user can paste) tells the engine
which messages it inserted itself; the store_ids it returned after that block
tell the store where the rest of the list lines up (see ``store.KnownTail``).
The newest few blocks are remembered, not only the last: a deep copy, a hook or
a stale view may show a list from before the latest compaction.

Pure bookkeeping on plain dicts, kept in memory and in the session state.
"""

from __future__ import annotations

from typing import Callable

from ..store import KnownTail
from .assemble import (block_candidates, block_fingerprint, engine_inserted,
                       legacy_block_fingerprint)

# How many of the newest rendered blocks are remembered per session.
KEEP = 16


def entry(store_ids: list[int], low: int, nodes: int) -> dict:
    """What is remembered of one rendered block: the raw messages returned after
    it, where alignment after them starts (``low``), and the highest node_id when
    it was rendered (summaries above it were written later)."""
    return {"store_ids": list(store_ids), "low": int(low), "nodes": int(nodes)}


def from_state(state: dict) -> dict[str, dict]:
    """The remembered blocks of a session's state (``known_tails``, plus the single
    ``known_tail`` that older versions wrote)."""
    tails = dict(state.get("known_tails") or {})
    legacy = state.get("known_tail") or {}
    if legacy.get("block_hash") and "low" in legacy and legacy["block_hash"] not in tails:
        tails[legacy["block_hash"]] = {"store_ids": legacy.get("store_ids") or [],
                                       "low": legacy["low"]}
    return tails


def merged(*sources: dict[str, dict]) -> dict[str, dict]:
    """Several copies' remembered blocks in one dict, the newest ``KEEP`` kept (later
    sources and later entries are newer)."""
    out: dict[str, dict] = {}
    for source in sources:
        for digest, known in source.items():
            out.pop(digest, None)
            out[digest] = known
    return dict(list(out.items())[-KEEP:])


def _rekey_legacy(tails: dict[str, dict], blocks: list) -> dict[str, dict]:
    """Entries an earlier version keyed by its whitespace-sensitive fingerprint, under
    today's key, for the blocks this list shows."""
    for content in blocks:
        old, new = legacy_block_fingerprint(content), block_fingerprint(content)
        if old in tails and new not in tails:
            tails[new] = tails.pop(old)
    return tails


def read(messages: list, tails: dict[str, dict], load_state: Callable[[], dict],
         candidates: dict[int, str] | None = None
         ) -> tuple[dict[str, dict], list[bool], KnownTail | None]:
    """Read a shown list's blocks: the remembered blocks (``load_state`` is called only
    when the list shows a block not remembered in memory), which messages the engine
    inserted (only a block whose exact text it rendered, and its acknowledgement),
    and the ``KnownTail`` of the first such block (None without one).

    ``candidates`` (position -> block fingerprint of each message opening like a
    block) spares the scan when the caller has them."""
    if candidates is None:
        candidates = block_candidates(messages)
    if set(candidates.values()) - tails.keys():
        blocks = [messages[i].get("content") for i in candidates]
        tails = merged(_rekey_legacy(from_state(load_state()), blocks), tails)
    inserted = engine_inserted(messages, tails, candidates)
    first = next((i for i in sorted(candidates) if inserted[i]), None)
    tail = tails.get(candidates[first]) if first is not None else None
    known = (KnownTail(tuple(tail["store_ids"]), int(tail["low"]), tail.get("nodes"))
             if tail else None)
    return tails, inserted, known
