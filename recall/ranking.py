"""Ranking rules that decide which rows take the few result slots.

Two things full-text scores alone get wrong in conversations:

- **Names.** People ask about people ("when did Caroline start the pottery
  class?"). The turns *by* Caroline hold the answer; the turns that address
  her ("wow Caroline, that's great!") repeat her name but not the fact. So the
  sender's name is a field of its own, read from the ``[Name] `` prefix
  Hermes's gateway puts on shared-chat turns or from the message's ``name``
  field (stored as ``tool_name`` on a user/assistant row). ``speaker_of``
  splits it off the text; the scorer then counts a query word that names the
  sender as a field match and gives that row a bonus.
- **Slots.** A result slot is precious and raw turns are the evidence. A
  summary repeats the words of the turns under it, so it scores as well as
  they do and used to crowd them out. ``place_summaries`` keeps raw hits first
  and lets a summary take a slot only when it adds something the listed raw
  hits do not: a query concept none of them matched, and no listed raw hit
  under it. Summaries that add nothing move after the raw hits.
"""

from __future__ import annotations

import re
from typing import Hashable, Iterable, Sequence

from ..dag import Dag

SPEAKER_BONUS = 0.5           # a query word names the row's sender
_PREFIX = re.compile(r"\[([^\[\]\n]{1,64})\] ")
_SPEAKER_ROLES = ("user", "assistant")


def speaker_of(row: dict, text: str) -> tuple[str | None, str]:
    """The row's sender name (or None) and its text without a ``[Name] `` prefix.

    The prefix wins over the ``name`` field because it is what the host
    showed; a tool row's ``tool_name`` is a tool, never a speaker.
    """
    match = _PREFIX.match(text)
    if match:
        return match.group(1).strip() or None, text[match.end():]
    if row.get("role") in _SPEAKER_ROLES and row.get("tool_name"):
        return row["tool_name"], text
    return None, text


def place_summaries(order: Sequence[Hashable], matched: dict[Hashable, Iterable[str]],
                    limit: int, dag: Dag) -> list[Hashable]:
    """Fused keys (``("m", store_id)`` / ``("n", node_id)``) in their final order.

    Raw hits keep their fused order. A summary keeps its place only when it
    matched a query concept that no raw hit in the first ``limit`` results
    matched and none of those raw hits lies under it; otherwise it moves after
    the raw hits.
    """
    shown_raw = [key for key in order if key[0] == "m"][:limit]
    raw_concepts: set[str] = set()
    for key in shown_raw:
        raw_concepts.update(matched.get(key, ()))
    above = ancestors(dag, [key[1] for key in shown_raw]) if len(shown_raw) < len(order) else set()
    kept, demoted = [], []
    for key in order:
        if key[0] == "m":
            kept.append(key)
            continue
        adds = set(matched.get(key, ())) - raw_concepts
        if adds and key[1] not in above:
            kept.append(key)
            raw_concepts |= adds
        else:
            demoted.append(key)
    return kept + demoted


def ancestors(dag: Dag, store_ids: Iterable[int]) -> set[int]:
    """Every summary node above these raw messages (leaf, then up the lineage).

    Walks up from the few listed rows (a query per level), so it stays cheap
    however much a high node covers.
    """
    level: set[int] = set()
    for store_id in store_ids:
        level.update(dag.covering_nodes(store_id))
    seen: set[int] = set()
    while level - seen:
        fresh = level - seen
        seen |= fresh
        level = {parent for node in fresh for parent in dag.parents(node)}
    return seen
