"""What describes a period best: ready rollups, then every session of the period,
then raw messages.

``select`` is the reading side of ``trove_recent``. For a window it takes, in
order of preference:

1. ready rollups (day, week, month) of the owners the caller may read, lying
   wholly inside the window, coarsest first, that the caller may read whole
   (every session under them allowed and every rollup under them ready);
2. every session of the window not covered by such a rollup, represented
   once: by its summary nodes overlapping the window (``overview``), else by a
   short digest (when, how many messages, its first user request, key terms,
   and the handles that load it), or, for a session of one or two messages, by
   those messages; so "what did we do yesterday?" sees every session on the
   first page, not the newest ten messages of the last one;
3. then raw messages of the window that no summary has taken in yet, outside
   what the rollups cover (bounded by ``message_cap``), newest first.

A rollup covers only its own sessions in its period: another owner's material in
the same period is listed as if there were no rollup. Material the chosen rollups
hold together within the window (``held``: a summary spanning midnight between two
rolled-up days) is not listed again.

Every read is bounded by a ``timeline.Pin`` (the store as it was at the first page),
so the list pages by offset while the session goes on storing, compacting and rolling
up: nothing repeats, nothing is skipped. A rollup counts as ready when it matched its
sources at the pin, or matches them now (rebuilt in place since: same id, new text),
so one that went stale between pages stays listed. Scope decisions are the
caller's (``node_ok`` / ``message_ok`` / ``session_ok`` / ``rollup_ok``, from
``tools.Access``); this module only selects and orders.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..dag import Dag
from ..storage import codec
from ..storage.timekeys import iso
from ..storage.timeline import Eligible, Pin, Timeline
from ..store import Store
from .query_plan import STOP_WORDS, fold

KIND_RANK = {"month": 0, "week": 1, "day": 2}
NODE_SCAN = 500
SESSION_SCAN = 200              # sessions of one period represented at most
DIGEST_SAMPLE = 40              # messages of a session read for its key terms
DIGEST_REQUEST_CHARS = 200
DIGEST_TERMS = 8
DIGEST_MIN_MESSAGES = 3         # smaller sessions are shown by their messages themselves


@dataclass
class Selection:
    """The chosen material in page order, and which tiers it came from."""

    items: list[tuple[str, dict]] = field(default_factory=list)  # (rollup|node|session|message, row)
    used: list[str] = field(default_factory=list)
    skipped_stale: int = 0
    messages_capped: bool = False
    sessions_capped: bool = False


@dataclass(frozen=True)
class _Cover:
    """What one chosen rollup stands for: its sessions during its period."""

    start: float
    end: float
    sessions: frozenset[str]
    owner: str


def held(covers: Sequence[_Cover], session: str, first: float | None, last: float | None,
         start: float, end: float) -> bool:
    """Whether the chosen rollups hold a session's material from ``first`` to ``last``
    (inclusive) as far as it lies in the window ``[start, end)``: together, not one
    alone. A leaf spanning midnight is in its two days' rollups (each holds its own
    day's part), and a summary reaching past the window is only asked for its part in
    it; before, neither counted as held, and the leaf was listed again beside them."""
    if first is None or last is None:
        return False
    point, moved = max(first, start), False
    for lo, hi in sorted((c.start, c.end) for c in covers if session in c.sessions):
        if lo <= point < hi:
            point, moved = hi, True
    return moved and (last < point or point >= end)


def select(store: Store, dag: Dag, timeline: Timeline, start: float, end: float, *,
           sessions: Sequence[str] | None, extra_nodes: list[dict],
           node_ok: Callable[[dict], bool], message_ok: Callable[[dict], bool],
           session_ok: Callable[[str], bool],
           rollup_ok: Callable[[dict], bool] | None, owners: Sequence[str] | None,
           time_zone: str, eligible: Eligible, message_cap: int, pin: Pin) -> Selection:
    """Rollups, then every session of ``[start, end)`` once, then raw messages, all as
    the store was at ``pin``."""
    found = Selection()
    covers: list[_Cover] = []
    rollups: list[dict] = []
    memo: dict = {}
    memo_now: dict = {}
    if rollup_ok is not None:
        candidates = sorted(timeline.rollups_inside(start, end, time_zone, owners, pin),
                            key=lambda r: (KIND_RANK[r["kind"]], -r["period_end"]))
        for rollup in candidates:
            if any(c.owner == rollup["owner"] and c.start <= rollup["period_start"]
                   and rollup["period_end"] <= c.end for c in covers) or not rollup_ok(rollup):
                continue
            if (timeline.freshness(rollup, eligible, memo, pin) != "ready"
                    and timeline.freshness(rollup, eligible, memo_now) != "ready"):
                found.skipped_stale += 1
                continue
            rollups.append(rollup)
            covers.append(_Cover(rollup["period_start"], rollup["period_end"],
                                 frozenset(timeline.sessions_of(rollup["rollup_id"])),
                                 rollup["owner"]))

    def covered(session: str, first: float | None, last: float | None) -> bool:
        return held(covers, session, first, last, start, end)

    nodes = dag.nodes_in_period(start, end, session_ids=sessions, limit=NODE_SCAN,
                                max_node_id=pin.node_id)
    nodes += [n for n in extra_nodes if n["time_to"] is not None and n["node_id"] <= pin.node_id
              and n["time_to"] >= start and n["time_from"] < end]
    nodes = overview([n for n in nodes if node_ok(n)
                      and not covered(n["session_id"], n["time_from"], n["time_to"])],
                     start, end)
    ids = timeline.message_ids_between(start, end, sessions, uncovered=True,
                                       limit=message_cap + 1, pin=pin)
    found.messages_capped = len(ids) > message_cap
    rows = store.get_messages(ids[:message_cap])
    messages = [rows[i] for i in ids[:message_cap] if i in rows and message_ok(rows[i])
                and not covered(rows[i]["session_id"], *(message_time(rows[i]),) * 2)]
    spans = timeline.session_spans(start, end, sessions, SESSION_SCAN + 1, pin)
    found.sessions_capped = len(spans) > SESSION_SCAN
    summarized = {n["session_id"] for n in nodes}
    unrepresented = [span for span in spans[:SESSION_SCAN]
                     if session_ok(span["session_id"]) and span["session_id"] not in summarized
                     and not covered(span["session_id"], span["first_at"], span["last_at"])]
    # a session of a message or two is its own best digest: those messages go first
    tiny = {s["session_id"] for s in unrepresented if s["message_count"] < DIGEST_MIN_MESSAGES}
    digests = [digest(store, timeline, span, start, end, pin) for span in unrepresented
               if span["session_id"] not in tiny]
    first_page = [(r["period_end"], "rollup", r) for r in rollups]
    first_page += [(n["time_to"] or 0, "node", n) for n in nodes]
    first_page += [(d["last_at"], "session", d) for d in digests]
    first_page += [(message_time(m), "message", m) for m in messages if m["session_id"] in tiny]
    for name, present in (("rollups", rollups), ("summaries", nodes),
                          ("session_digests", digests), ("messages", messages)):
        if present:
            found.used.append(name)
    found.items = [(kind, row) for _, kind, row in sorted(first_page, key=lambda t: -t[0])]
    found.items += [("message", m) for m in messages if m["session_id"] not in tiny]
    return found


def digest(store: Store, timeline: Timeline, span: dict, start: float, end: float,
           pin: Pin | None = None) -> dict:
    """A session of the period in a few lines: when, how many messages, its first user
    request and its key terms (words it uses most, stop words aside), from its messages
    at or below the pin (the same digest on every page)."""
    session = span["session_id"]
    out = {**span, "first_request": None, "key_terms": []}
    sample = timeline.message_ids_between(start, end, [session], uncovered=False,
                                          limit=DIGEST_SAMPLE, newest_first=False, pin=pin)
    wanted = sample + ([span["first_user_id"]] if span["first_user_id"] else [])
    rows = store.get_messages(wanted)
    first = rows.get(span["first_user_id"]) if span["first_user_id"] else None
    if first is not None:
        text = " ".join(codec.message_text(codec.decode_message(first)).split())
        out["first_request"] = text[:DIGEST_REQUEST_CHARS]
        if len(text) > DIGEST_REQUEST_CHARS:
            out["first_request_truncated"] = True
    words: Counter = Counter()
    for store_id in sample:
        row = rows.get(store_id)
        if row is None or row["role"] not in ("user", "assistant"):
            continue
        text = fold(codec.message_text(codec.decode_message(row)))
        words.update(w for w in re.findall(r"[^\W\d_][\w-]{3,}", text) if w not in STOP_WORDS)
    out["key_terms"] = [w for w, _ in words.most_common(DIGEST_TERMS)]
    return out


def message_time(row: dict) -> float:
    """When a message happened: its own time, else when it was stored."""
    return row["message_at"] if row.get("message_at") is not None else row["created_at"]


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
