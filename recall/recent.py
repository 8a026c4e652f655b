"""What describes a period best: ready rollups, then summaries, then raw messages.

``select`` is the reading side of ``trove_recent``. For a window it takes, in
order of preference:

1. ready rollups (day, week, month) lying wholly inside the window, coarsest
   first, that the caller may read whole (every session under them allowed);
2. summary nodes overlapping the window outside the periods those rollups
   cover, without repeating each other (``overview``);
3. raw messages of the window that no summary has taken in yet, outside the
   rolled-up periods (bounded by ``message_cap``).

Scope decisions are the caller's (``node_ok`` / ``message_ok`` /
``rollup_ok``, from ``tools.Access``); this module only selects and orders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..dag import Dag
from ..storage.timekeys import iso
from ..storage.timeline import Eligible, Timeline
from ..store import Store

KIND_RANK = {"month": 0, "week": 1, "day": 2}
NODE_SCAN = 500


@dataclass
class Selection:
    """The chosen material, newest first, and which tiers it came from."""

    items: list[tuple[str, dict]] = field(default_factory=list)   # ("rollup"|"node"|"message", row)
    used: list[str] = field(default_factory=list)
    skipped_stale: int = 0
    messages_capped: bool = False


def select(store: Store, dag: Dag, timeline: Timeline, start: float, end: float, *,
           sessions: Sequence[str] | None, extra_nodes: list[dict],
           node_ok: Callable[[dict], bool], message_ok: Callable[[dict], bool],
           rollup_ok: Callable[[dict], bool] | None, time_zone: str, eligible: Eligible,
           message_cap: int) -> Selection:
    """Rollups, then summaries, then raw messages describing ``[start, end)``."""
    found = Selection()
    covered: list[tuple[float, float]] = []
    rollups: list[dict] = []
    memo: dict = {}
    if rollup_ok is not None:
        candidates = sorted(timeline.rollups_inside(start, end, time_zone),
                            key=lambda r: (KIND_RANK[r["kind"]], -r["period_end"]))
        for rollup in candidates:
            span = (rollup["period_start"], rollup["period_end"])
            if _inside(span, covered, half_open=True) or not rollup_ok(rollup):
                continue
            if timeline.freshness(rollup, eligible, memo) != "ready":
                found.skipped_stale += 1
                continue
            rollups.append(rollup)
            covered.append(span)
    nodes = dag.nodes_in_period(start, end, session_ids=sessions, limit=NODE_SCAN)
    nodes += [n for n in extra_nodes if n["time_to"] is not None
              and n["time_to"] >= start and n["time_from"] < end]
    nodes = overview([n for n in nodes if node_ok(n)
                      and not _inside((n["time_from"], n["time_to"]), covered)], start, end)
    ids = timeline.message_ids_between(start, end, sessions, uncovered=True,
                                       limit=message_cap + 1)
    found.messages_capped = len(ids) > message_cap
    rows = store.get_messages(ids[:message_cap])
    messages = [rows[i] for i in ids[:message_cap] if i in rows and message_ok(rows[i])
                and not _inside((message_time(rows[i]),) * 2, covered)]
    tiers = (("rollups", "rollup", rollups, lambda r: r["period_end"]),
             ("summaries", "node", nodes, lambda n: n["time_to"] or 0),
             ("messages", "message", messages, message_time))
    timed: list[tuple[float, str, dict]] = []
    for name, kind, rows_of_tier, when in tiers:
        if rows_of_tier:
            found.used.append(name)
        timed += [(when(row), kind, row) for row in rows_of_tier]
    found.items = [(kind, row) for _, kind, row in sorted(timed, key=lambda t: -t[0])]
    return found


def message_time(row: dict) -> float:
    """When a message happened: its own time, else when it was stored."""
    return row["message_at"] if row.get("message_at") is not None else row["created_at"]


def _inside(span: tuple, covered: list[tuple[float, float]], half_open: bool = False) -> bool:
    """Whether a time span lies inside a covered period ``[a, b)``: a closed span of
    message times must end before ``b``; a half-open period may end at ``b``."""
    first, last = span
    if first is None or last is None:
        return False
    return any(a <= first and (last <= b if half_open else last < b) for a, b in covered)


def overview(nodes: list[dict], start: float, end: float) -> list[dict]:
    """Nodes that describe a period without repeating each other, newest first.

    Nodes wholly inside the period come first, deepest first; a node whose
    message range lies inside an already chosen node's range is skipped.
    """
    def inside(n: dict) -> bool:
        return n["time_from"] is not None and n["time_from"] >= start and n["time_to"] < end

    order = sorted({n["node_id"]: n for n in nodes}.values(),
                   key=lambda n: (not inside(n), -n["depth"], -(n["time_to"] or 0)))
    chosen: list[dict] = []
    for node in order:
        if not any(c["session_id"] == node["session_id"]
                   and (c["first_store_id"] or 0) <= (node["first_store_id"] or 0)
                   and (node["last_store_id"] or 0) <= (c["last_store_id"] or 0) for c in chosen):
            chosen.append(node)
    return sorted(chosen, key=lambda n: -(n["time_to"] or 0))


def rollup_item(rollup: dict, text_chars: int) -> dict:
    """A rollup for a tool answer: its period, coverage, text (capped) and an expand
    handle (``session_scope="all"``: a rollup spans sessions)."""
    item = {"kind": "rollup", "rollup_id": rollup["rollup_id"], "period": rollup["kind"],
            "key": rollup["period_key"], "from": iso(rollup["period_start"]),
            "to": iso(rollup["period_end"]), "message_count": rollup["message_count"],
            "session_count": rollup["session_count"], "tokens": rollup["token_count"],
            "text": rollup["text"][:text_chars]}
    if len(rollup["text"]) > text_chars:
        item["text_truncated"] = True
    item["expand"] = {"tool": "trove_expand",
                      "args": {"rollup_id": rollup["rollup_id"], "session_scope": "all"}}
    return item
