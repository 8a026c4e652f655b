"""Which rows of the host's list a compaction may keep raw, and which it must not.

The tail is the list's end as it stands. Three rules decide its candidates, one
function each, composed by ``candidates``: each stored row once, where the list
first shows it; live rows shown before a summarized one are stale (summarized,
never kept); summarized rows shown after the last block and the last stale row
stay candidates (a list another process built before it compacted), unless the list
showed them before as well (a doubled restore's replay).
"""

from __future__ import annotations

from typing import Sequence

from . import assemble


def candidates(body: list, store_ids: Sequence[int | None], inserted: Sequence[bool],
               covered: set[int], floor: int) -> tuple[list, set[int]]:
    """The rows a compaction may keep raw, as (message, store_id) in list order, and
    the indexes among them of the stale rows it must summarize instead.

    Messages the ignore patterns match are not stored (store_id None) but stay in
    place: kept when the tail reaches them, dropped (never summarized) when older.
    Live rows the list shows before summarized ones (a retried reply only a restored
    transcript shows, an old message edited in place) are stale: kept beside the
    tail they would sit out of order and make two turns of one role in a row, which
    the host merges into a message nobody sent."""
    stale_ids = stale_rows(store_ids, inserted, covered, floor)
    rows = first_showings(_listed_rows(body, store_ids, inserted, covered, floor, stale_ids))
    stale = {i for i, (_, sid) in enumerate(rows) if sid is not None and sid in stale_ids}
    # The newest word is never stale: the tail keeps the list's newest real user
    # message whatever follows it (``assemble.choose_tail``). A pass that kept it raw
    # and summarized the tool group after it may have left the host's list unchanged
    # (no progress the host would take); compacting that list again summarized the
    # question itself, and the prompt went out without it. The engine's own elements
    # are ``inserted``'s, so a user's copy of a block in the list is the user's.
    # The newest is the list's own last user message, found among the rows where the
    # list first shows its row: in a doubled restore whose later copy ends before the
    # earlier one's last exchange, the newest of the rows by their first showing is that
    # exchange's question; kept without its (stale) reply, it stood last and the next
    # turn's message followed it, two user messages the host merged (host walk 1580012).
    last = assemble.newest_user(body, inserted)
    if last is not None:
        stale.discard(next((i for i, (m, sid) in enumerate(rows)
                            if (sid is not None and sid == store_ids[last])
                            or (sid is None and m is body[last])), None))
    return rows, stale


def first_showings(live: list) -> list:
    """Each stored row once, where the list first shows it: a list that shows one
    message twice (the host restored its transcript twice) returns it once."""
    seen: set[int] = set()
    out = []
    for message, sid in live:
        if sid is not None:
            if sid in seen:
                continue
            seen.add(sid)
        out.append((message, sid))
    return out


def stale_rows(store_ids: Sequence[int | None], inserted: Sequence[bool],
               covered: set[int], floor: int) -> set[int]:
    """Store ids of the live rows the list shows before its last summarized element
    (a row a summary covers, or the engine's own block) and not again after it: old
    live rows a compaction summarizes rather than keeps."""
    last = max((i for i, (sid, ins) in enumerate(zip(store_ids, inserted))
                if ins or (sid is not None and (sid in covered or sid <= floor))), default=-1)
    if last < 0:
        return set()
    older = {sid for sid in store_ids[:last] if sid is not None}
    later = {sid for sid in store_ids[last + 1:] if sid is not None}
    return {sid for sid in older - later if sid not in covered and sid > floor}


def _listed_rows(body: list, store_ids: Sequence[int | None], inserted: Sequence[bool],
                 covered: set[int], floor: int, stale_ids: set[int]) -> list:
    """The rows a compaction may keep raw, in list order: every live row, and the
    summarized rows the list shows after its last block and its last stale row.

    Why: a list another process built before it compacted (a second CLI on the same
    session) shows as raw the exchange just before its newest turn, which that
    process has summarized since. Left out, the tail starved to the newest turn while
    the previous exchange fit beside it. Rows kept this way are never summarized again
    (their summary stays in the block); rows before a stale one stay out, so the tail
    is still a stretch of the list as the host shows it. A summarized row the list
    also shows before that point is a replay, not one of them: the host restored its
    transcript twice (block, rows, block, the same rows); kept at its later showing
    beside the live rows of the first copy, it sat after newer rows, two replies in a
    row, which the host merged into a message nobody sent (host walk 610002)."""
    start = max([i for i, ins in enumerate(inserted) if ins]
                + [i for i, sid in enumerate(store_ids) if sid is not None and sid in stale_ids],
                default=-1)
    before = {sid for sid in store_ids[:max(start, 0)] if sid is not None}
    return [(m, sid) for i, (m, sid, ins) in enumerate(zip(body, store_ids, inserted))
            if (sid is None and not ins)
            or (sid is not None and sid > floor
                and (sid not in covered or (i > start and sid not in before)))]
