"""Day / week / month rollups per owner, over all of an owner's sessions, built off
the turn's hot path.

Rollups are kept per owner (``storage.owners``: the CLI user, each gateway
conversation): a summarizer prompt never holds two people's words, and each
person's agent can read its own rollups. A session without a recorded owner
feeds none. A day rollup summarizes, for every session of the owner that may
feed rollups (no ignore or stateless pattern), the leaf summaries lying wholly
inside that local day and the day's other messages raw (``timeline.WHOLE_LEAF``):
a leaf spanning midnight is split, each day reading its own part, so every
message reaches the day it was said, once, and the weeks and months built on
the days count it once. A rollup left over for a day with nothing left (its
sessions removed) is removed with the weeks and months on it (rebuilt in
turn). A week rollup
summarizes its day rollups; a month rollup its whole ISO weeks and the days
of the weeks it shares with the next or previous month (``timekeys.children_of``),
so a month's lineage never leaves the month. Every rollup keeps its exact
sources in ``rollup_sources``, so ``trove_expand`` walks from a month down to
a raw turn.

Summaries use the compaction summarizer's escalation (LLM detailed, LLM
bullets, deterministic); a big day is summarized in chunks whose partial
summaries are merged. Each rollup stores the watermark of its sources
(``Timeline.current_mark``): when a finished day gains a late message, a new
leaf or a rebuilt child, the marks differ, the rollup is stale, and the next
pass rebuilds it in place (same id), which in turn makes its week and month
stale. Only finished periods (ended before ``now``) are built.

Passes run on a background thread (``start_background``) after a compaction
or at session end, at most one per database at a time; a pass asked for while
one runs marks the database dirty and the running thread passes again, so every
session end leads to a pass that sees it. Each pass builds at most
``rollups_max_builds_per_pass`` rollups; operators run them by hand with
``/trove rollups build apply``.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Callable

from ..config import canonical_zone
from ..dag import Dag
from ..storage import codec, timekeys
from ..storage.timeline import Eligible, NewRollup, Timeline
from ..store import Store
from .summarize import SourceItem, Summarizer

log = logging.getLogger(__name__)

BUCKET_SECONDS = 900          # finer than any zone offset (+05:45, +12:45)
ITEM_CHARS = 4000             # a source's text as the summarizer sees it (lineage stays whole)
SOURCE_SCAN = 100_000         # raw messages of one day read at most
_running: set[str] = set()
_dirty: dict[str, tuple] = {}       # database -> the newest request made while a pass ran
_running_lock = threading.Lock()


@dataclass(frozen=True)
class Settings:
    """What a pass needs from the configuration (kept apart so tests can vary it)."""

    time_zone: str
    lookback_days: int
    max_builds: int
    budget_tokens: int
    chunk_tokens: int


@dataclass
class PassReport:
    """What one pass found and did."""

    built: list[dict] = field(default_factory=list)
    waiting: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)     # rollups of emptied periods
    renamed: int = 0          # rollups moved from another name of the zone (``adopt_names``)


def settings_of(config) -> Settings:
    """The rollup settings of a ``TroveConfig``."""
    return Settings(time_zone=config.timezone, lookback_days=config.rollups_lookback_days,
                    max_builds=config.rollups_max_builds_per_pass,
                    budget_tokens=config.rollup_summary_tokens,
                    chunk_tokens=config.leaf_chunk_tokens)


# ---------------------------------------------------------------- the zone's names
def other_names(timeline: Timeline, settings: Settings) -> list[str]:
    """Names rollups are stored under that are the configured zone spelled another
    way (``canonical_zone`` folds them into it: the ``utc`` of older versions, a link
    such as ``US/Eastern`` for ``America/New_York``). A zone that is really another
    one (the setting changed) is not among them: its rollups stay its own."""
    return [name for name in timeline.rollup_zones()
            if name != settings.time_zone and canonical_zone(name) == settings.time_zone]


def adopt_names(timeline: Timeline, settings: Settings) -> tuple[list[int], int]:
    """Move rollups stored under another name of the configured zone to its one key
    (``Timeline.rename_zone``), so they are used again instead of rebuilt under a
    second key and left behind for good; the ids deleted (a period both names held)
    and how many moved. Every pass that writes runs it first."""
    gone, moved = [], 0
    for name in other_names(timeline, settings):
        deleted, count = timeline.rename_zone(name, settings.time_zone)
        gone, moved = gone + deleted, moved + count
    return gone, moved


# ---------------------------------------------------------------- what exists
def _window(settings: Settings, now: float) -> tuple[float, date]:
    """Where a pass's lookback begins, and the first month it lists: ``lookback_days``
    back, widened to the Monday on or before the first day of that month, so every
    week and month listed has all its days scanned (a week never waits forever for a
    day outside the window)."""
    tz = timekeys.zone(settings.time_zone)
    oldest = timekeys.local_date(max(now - settings.lookback_days * 86400.0,
                                     timekeys.CLOCK_FLOOR), tz)   # no message before it
    month = timekeys.month_first(oldest.year, oldest.month)
    return timekeys.midnight(timekeys.week_monday(month), tz), month


def periods_with_material(timeline: Timeline, settings: Settings, eligible: Eligible,
                          now: float) -> list[tuple[str, str, str]]:
    """``(kind, key, owner)`` of every day, week and month holding material of an
    owner that may feed rollups, days first, each kind oldest first. Rollups are per
    owner: one person's sessions never share a rollup (or a summarizer prompt) with
    another's; a session with no recorded owner feeds none."""
    tz = timekeys.zone(settings.time_zone)
    since, month = _window(settings, now)
    buckets = timeline.active_buckets(since, now, BUCKET_SECONDS)
    days = sorted({timekeys.local_date(max(b, since), tz) for b in buckets}
                  | {timekeys.local_date(min(b + BUCKET_SECONDS, now) - 1, tz) for b in buckets})
    fed = []
    for day in days:
        start, end = timekeys.bounds("day", day.isoformat(), tz)
        fed += [(day, owner) for owner in timeline.owners_between(start, end, eligible)
                if timeline.current_mark("day", day.isoformat(), settings.time_zone,
                                         eligible, owner)]
    out = [("day", d.isoformat(), o) for d, o in fed]
    out += [("week", k, o) for k, o in sorted({(timekeys.key_of("week", d), o)
                                               for d, o in fed})]
    out += [("month", k, o) for k, o in sorted({(timekeys.key_of("month", d), o)
                                                for d, o in fed if d >= month})]
    return out


def status(timeline: Timeline, settings: Settings, eligible: Eligible, now: float) -> list[dict]:
    """Every period with material in the lookback window, per owner: ``ready``,
    ``stale``, ``pending`` (finished, no rollup yet) or ``open`` (not finished yet).
    A rollup still stored under another name of the zone (``other_names``; the next
    pass moves it) counts as the period's: it is, not a period to build again."""
    tz = timekeys.zone(settings.time_zone)
    rows, memo = [], {}
    names = [settings.time_zone, *other_names(timeline, settings)]   # not adopted yet
    for kind, key, owner in periods_with_material(timeline, settings, eligible, now):
        start, end = timekeys.bounds(kind, key, tz)
        rollup = next(filter(None, (timeline.get_rollup(kind, key, name, owner)
                                    for name in names)), None)
        if rollup is not None:
            state = timeline.freshness(rollup, eligible, memo)
        else:
            state = "open" if end > now else "pending"
        rows.append({"kind": kind, "key": key, "owner": owner, "state": state, "start": start,
                     "end": end, "rollup_id": rollup["rollup_id"] if rollup else None})
    return rows


def emptied(timeline: Timeline, settings: Settings, eligible: Eligible, now: float) -> list[int]:
    """Rollups of the lookback window whose period has nothing to roll up any more
    (its sessions were removed, or stopped feeding rollups): kept, they would be
    stale forever and block their week and month."""
    since, _ = _window(settings, now)
    found = []
    for owner in timeline.rollup_owners(settings.time_zone, since):
        found += [r["rollup_id"] for r in timeline.rollups_of(owner, settings.time_zone, since)
                  if not timeline.current_mark(r["kind"], r["period_key"], r["time_zone"],
                                               eligible, owner)]
    return found


# ---------------------------------------------------------------- building
def build_pass(store: Store, dag: Dag, timeline: Timeline, summarizer: Summarizer,
               count_tokens: Callable[[str], int], settings: Settings, eligible: Eligible,
               now: float, *, apply: bool = True) -> PassReport:
    """Build or rebuild the finished periods that need it, per owner, days before
    weeks before months, at most ``settings.max_builds``; with ``apply=False`` only
    report them. Rollups whose period has nothing left to roll up are removed first
    (with the weeks and months built on them, rebuilt in turn)."""
    report = PassReport()
    if apply:
        report.removed, report.renamed = adopt_names(timeline, settings)
        report.removed += timeline.delete_with_ancestors(
            emptied(timeline, settings, eligible, now))
    builder = _Builder(store, dag, timeline, summarizer, count_tokens, settings, eligible)
    for kind in timekeys.KINDS:
        for row in status(timeline, settings, eligible, now):
            if row["kind"] != kind or row["state"] not in ("pending", "stale"):
                continue
            entry = {"kind": kind, "key": row["key"], "owner": row["owner"],
                     "state": row["state"]}
            blocked = builder.blocked(kind, row["key"], row["owner"])
            if blocked or not apply or len(report.built) >= settings.max_builds:
                report.waiting.append({**entry, **({"waiting_for": blocked} if blocked else {})})
                continue
            try:
                entry["rollup_id"] = builder.build(kind, row["key"], row["owner"], now)
                report.built.append(entry)
            except Exception as exc:  # one bad period never stops the others
                report.errors.append(f"{kind} {row['key']}: {type(exc).__name__}: {exc}"[:300])
    if apply:
        record_pass(store, report, now)
    return report


LAST_PASS_KEY = "rollups_last_pass"


def record_pass(store: Store, report: PassReport, now: float) -> None:
    """Remember what the newest pass built (status shows it); a failure to record
    never fails the pass."""
    summary = {"at": now, "built": [f"{b['kind']} {b['key']}" for b in report.built],
               "waiting": len(report.waiting), "errors": report.errors[-3:]}
    try:
        store.set_meta(LAST_PASS_KEY, codec.dump_json(summary))
    except Exception:  # bookkeeping only
        log.warning("hermes-trove: could not record the rollup pass", exc_info=True)


def last_pass(store: Store) -> dict | None:
    """The newest recorded pass (``at``, ``built``, ``waiting``, ``errors``), or None."""
    try:
        text = store.get_meta(LAST_PASS_KEY)
        return json.loads(text) if text else None
    except (ValueError, TypeError):
        return None


class _Builder:
    """Builds one rollup at a time from its sources."""

    def __init__(self, store: Store, dag: Dag, timeline: Timeline, summarizer: Summarizer,
                 count_tokens: Callable[[str], int], settings: Settings, eligible: Eligible):
        self.store, self.dag, self.timeline = store, dag, timeline
        self.summarizer, self.count = summarizer, count_tokens
        self.settings, self.eligible = settings, eligible
        self.tz = timekeys.zone(settings.time_zone)

    def blocked(self, kind: str, key: str, owner: str) -> list[str]:
        """The owner's child periods with material whose rollup is missing or stale."""
        waiting = []
        for child_kind, child_key in timekeys.children_of(kind, key):
            child = self.timeline.get_rollup(child_kind, child_key, self.settings.time_zone,
                                             owner)
            if child is None:
                if self.timeline.current_mark(child_kind, child_key, self.settings.time_zone,
                                              self.eligible, owner):
                    waiting.append(f"{child_kind} {child_key}")
            elif self.timeline.freshness(child, self.eligible) != "ready":
                waiting.append(f"{child_kind} {child_key}")
        return waiting

    def build(self, kind: str, key: str, owner: str, now: float) -> int:
        """Summarize one owner's sources of a period and write the rollup with its
        lineage (only that owner's sessions: never two people in one prompt)."""
        mark = self.timeline.current_mark(kind, key, self.settings.time_zone, self.eligible,
                                          owner)
        start, end = timekeys.bounds(kind, key, self.tz)
        if kind == "day":
            sources, items, sessions, count, span = self._day_sources(start, end, owner)
            depth = 1 if any(kind == "node" for kind, _ in sources) else 0
        else:
            sources, items, sessions, count, span = self._child_rollups(kind, key, owner)
            depth = 2
        if not sources:
            raise ValueError("no sources")
        sizes = [self.count(i.text) for i in items]
        result = self._summarize(items, sizes, depth)
        text = self._header(kind, key, span, len(set(sessions)), count) + result.text
        return self.timeline.save_rollup(NewRollup(
            kind=kind, period_key=key, time_zone=self.settings.time_zone, owner=owner,
            period_start=start, period_end=end, text=text, token_count=self.count(text),
            source_token_count=sum(sizes), level=result.level,
            model=result.model, message_count=count, time_from=span[0], time_to=span[1],
            watermark=mark, sources=sources, session_ids=sessions), now)

    def _header(self, kind: str, key: str, span: tuple, sessions: int, count: int) -> str:
        """The first line of a rollup's text: what it covers, so a reader (the model, an
        operator) never has to guess the zone of its day or whether the small hours
        are in it: the period and zone, for a day the local times of its first and
        last message, and how many sessions and messages lie under it."""
        said = ""
        if kind == "day" and span[0] is not None:
            first, last = (datetime.fromtimestamp(t, self.tz).strftime("%H:%M") for t in span)
            said = f", said {first}-{last}"
        return (f"[{kind} {key} ({self.settings.time_zone}){said}, {sessions} session(s),"
                f" {count} message(s)]\n")

    def _day_sources(self, start: float, end: float, owner: str):
        sessions = self.timeline.feeding_sessions(start, end, self.eligible, owner)
        nodes = self.dag.get_nodes(self.timeline.leaf_ids_within(start, end, sessions))
        ids = self.timeline.message_ids_between(start, end, sessions, uncovered=False,
                                                loose=True, limit=SOURCE_SCAN,
                                                newest_first=False)
        rows = self.store.get_messages(ids)
        timed = [(n["time_from"], "node", n) for n in nodes.values()]
        timed += [(_when(rows[i]), "message", rows[i]) for i in ids if i in rows]
        timed.sort(key=lambda t: (t[0], t[1] == "message"))
        sources, items, under, count, times = [], [], [], 0, []
        for when, kind, row in timed:
            if kind == "node":
                sources.append(("node", row["node_id"]))
                items.append(SourceItem(ref=f"n{row['node_id']}", role="summary", time=when,
                                        text=f"[session {row['session_id']}] {row['text']}"
                                        [:ITEM_CHARS]))
                count += row["message_count"]
                times += [row["time_from"], row["time_to"]]
            else:
                sources.append(("message", row["store_id"]))
                text = codec.message_text(codec.decode_message(row))
                items.append(SourceItem(ref=f"m{row['store_id']}", role=row["role"], time=when,
                                        text=text[:ITEM_CHARS], tool_name=row.get("tool_name")))
                count += 1
                times.append(when)
            under.append(row["session_id"])
        return sources, items, under, count, (min(times, default=None), max(times, default=None))

    def _child_rollups(self, kind: str, key: str, owner: str):
        sources, items, under, count, times = [], [], [], 0, []
        for child_kind, child_key in timekeys.children_of(kind, key):
            child = self.timeline.get_rollup(child_kind, child_key, self.settings.time_zone,
                                             owner)
            if child is None:
                continue
            sources.append(("rollup", child["rollup_id"]))
            items.append(SourceItem(ref=f"r{child['rollup_id']}", role="summary",
                                    text=child["text"][:ITEM_CHARS * 2],
                                    time=child["period_start"]))
            under += self.timeline.sessions_of(child["rollup_id"])
            count += child["message_count"]
            times += [t for t in (child["time_from"], child["time_to"]) if t is not None]
        return sources, items, under, count, (min(times, default=None), max(times, default=None))

    def _summarize(self, items: list[SourceItem], sizes: list[int], depth: int):
        """One summary of the items (``sizes``: their token counts); when they are too
        big for one call, summaries of chunks are merged (same escalation at every step).
        A chunk takes at least two items even past ``chunk_tokens``, so every round at
        least halves the count: with parts bigger than half a chunk (a budget above
        half of ``TROVE_LEAF_CHUNK_TOKENS``) single-item chunks re-summarized each part
        alone, round after round, one model call per part each time."""
        budget = self.settings.budget_tokens
        groups, group, used = [], [], 0
        for item, tokens in zip(items, sizes):
            if len(group) >= 2 and used + tokens > self.settings.chunk_tokens:
                groups.append(group)
                group, used = [], 0
            group.append(item)
            used += tokens
        groups.append(group)
        if len(groups) == 1:
            return self.summarizer.summarize(items, budget_tokens=budget, depth=depth)
        parts = [self.summarizer.summarize(g, budget_tokens=budget, depth=depth) for g in groups]
        merged = [SourceItem(ref=f"part{i + 1}", role="summary", text=p.text)
                  for i, p in enumerate(parts)]
        return self._summarize(merged, [p.tokens for p in parts], depth + 1)


def _when(row: dict) -> float:
    return row["message_at"] if row.get("message_at") is not None else row["created_at"]


# ---------------------------------------------------------------- background
def start_background(store: Store, dag: Dag, summarizer: Summarizer,
                     count_tokens: Callable[[str], int], settings: Settings, eligible: Eligible,
                     now: Callable[[], float]) -> threading.Thread | None:
    """Run a pass on a daemon thread; when one already runs for this database, mark it
    dirty instead (returns None): the running thread passes again with the newest
    request's arguments once it is done, so work asked for during a pass is never
    dropped."""
    key = str(store.db.path)
    request = (store, dag, summarizer, count_tokens, settings, eligible, now)
    with _running_lock:
        if key in _running:
            _dirty[key] = request
            return None
        _running.add(key)

    def run() -> None:
        job = request
        while job is not None:
            try:
                j_store, j_dag, j_summarizer, j_count, j_settings, j_eligible, j_now = job
                report = build_pass(j_store, j_dag, Timeline(j_store.db), j_summarizer,
                                    j_count, j_settings, j_eligible, j_now())
                for error in report.errors:
                    log.warning("hermes-trove: rollup %s", error)
            except Exception:  # a background pass must never take anything down
                log.exception("hermes-trove: rollup pass failed")
            with _running_lock:
                job = _dirty.pop(key, None)
                if job is None:
                    _running.discard(key)

    thread = threading.Thread(target=run, name="trove-rollups", daemon=True)
    thread.start()
    return thread


def running(db_path: str) -> bool:
    """Whether a background pass runs (or is about to run again) for this database."""
    with _running_lock:
        return str(db_path) in _running
