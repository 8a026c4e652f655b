"""Preparing leaf summaries in the background, so compaction mostly assembles.

With a real model one summary takes seconds to minutes, and the host waits
for all of them inside ``compress()``. When the prompt passes
``TROVE_BACKGROUND_PREPARE_SHARE`` of the trigger, the engine starts a worker
(``start``): a daemon thread with its own database connection that
summarizes the oldest unsummarized full chunks outside the fresh tail, with
the engine's summarizer (same escalation, breaker and spend guard), and
stores each result as *ready* in ``prep_summaries``.

After the leaves, the worker predicts the merges the next compaction will
make: it adds the ready leaves to the session's frontier as it stands and
runs the same grouping ``Compactor.condense`` runs (``oldest_full_group``),
level by level, and summarizes those groups ahead too (``prep_condensed``,
keyed by the exact texts the merge reads, so a group is used only when the
compaction merges those very summaries).

At the trigger, ``leaf_pass`` writes the ready summaries whose chunk is
exactly a run of the backlog and whose sources are unchanged (store_ids and
content hashes, so an undo or an edit discards it) as leaf nodes, and
summarizes only the gaps itself; ``condense`` then writes each group whose
key is ready without a call. A turn never waits for a worker: a chunk
still being prepared is summarized in place, and the worker's late result
is dropped as stale. Claims in the database (with a lease) keep two
processes, or two threads, from preparing the same chunk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..dag import Dag
from ..storage import locks, prepared
from ..storage.database import Database, get_database
from ..store import Store, decode_row
from .compactor import (Compactor, PassReport, chunk_by_tokens, group_key, message_item,
                        node_item, oldest_full_group, summary_body)
from .summarize import SourceItem, Summarizer, extract_topics

log = logging.getLogger(__name__)

TAIL_MARGIN = 4          # messages kept out of reach beyond the fresh tail (tool groups)
MAX_CHUNKS_PER_RUN = 4   # a round prepares at most this many chunks
MAX_GROUPS_PER_RUN = 4   # ... and at most this many merges after them
MAX_ROUNDS_PER_RUN = 8   # rounds of (chunks, merges) while there is work, then the run ends
SCAN_LIMIT = 20_000      # raw rows read per run, after what is summarized or prepared
MIN_CHUNK_SHARE = 0.1    # a partial newest chunk is prepared from this share of a chunk
FULL_CHUNK_SHARE = 0.9   # ... and is partial below this share
PARTIAL_HEADROOM_SHARE = 0.5  # ... once the trigger is this share of a chunk away
DEFER_SHARE = 0.35       # compress leaves a newer remainder below this share raw


@dataclass(frozen=True)
class Job:
    """What one worker run needs; plain values, built by the engine."""

    db_path: str
    session_id: str             # canonical session
    fresh_tail_count: int
    chunk_tokens: int
    leaf_budget: int
    summarizer: Summarizer
    lease_seconds: float
    tail_max_tokens: int = 0    # the compaction's token cap on the fresh tail (0 = none)
    headroom_tokens: int = 0    # tokens left before the trigger when the run started
    condensed_budget: int = 0   # 0: merges are not prepared
    fanout: int = 4
    max_depth: int = 3


_lock = threading.Lock()
_threads: dict[tuple[str, str], threading.Thread] = {}
_state: dict[tuple[str, str], dict] = {}
_OWNER_PREFIX = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def running(db_path: str, session_id: str) -> bool:
    """Whether this process's worker for the session is at work (a cheap check, so a
    turn does not build a job that ``start`` would turn down)."""
    with _lock:
        thread = _threads.get((db_path, session_id))
    return thread is not None and thread.is_alive()


def start(job: Job) -> bool:
    """Start a worker for ``job``'s session unless one runs already; never blocks."""
    key = (job.db_path, job.session_id)
    with _lock:
        running = _threads.get(key)
        if running is not None and running.is_alive():
            return False
        thread = threading.Thread(target=_run, args=(job,), daemon=True,
                                  name=f"trove-prepare-{job.session_id[:24]}")
        _threads[key] = thread
        _state.setdefault(key, {"runs": 0, "prepared": 0, "errors": []})
        _state[key].update(running=True, started_at=time.time())
    thread.start()
    return True


def wait(db_path: str, session_id: str, timeout: float | None = None) -> bool:
    """Join the session's worker (tests and benches only; a turn never waits)."""
    with _lock:
        thread = _threads.get((db_path, session_id))
    if thread is None:
        return True
    thread.join(timeout)
    return not thread.is_alive()


def state(db_path: str, session_id: str | None) -> dict:
    """The worker's state for status: running, runs, chunks prepared, last error,
    and how many chunks the database holds claimed and ready."""
    if not session_id:
        return {"running": False}
    with _lock:
        out = dict(_state.get((db_path, session_id), {"runs": 0, "prepared": 0, "errors": []}))
        thread = _threads.get((db_path, session_id))
    out["running"] = bool(thread is not None and thread.is_alive())
    out["errors"] = list(out.get("errors", []))[-3:]
    try:
        db = get_database(db_path)
        with db.reading() as conn:
            out["chunks"] = prepared.states(conn, session_id)
    except Exception as exc:  # status must answer even if the table is unreadable
        out["chunks"] = {"error": str(exc)}
    return out


def _run(job: Job) -> None:
    key = (job.db_path, job.session_id)
    done, merges, error = 0, 0, None
    db = None
    try:
        db = Database(job.db_path)  # its own connection: the turn's is never held
        owner = f"{_OWNER_PREFIX}-{threading.get_ident()}"
        for _ in range(MAX_ROUNDS_PER_RUN):  # leaves first: every merge needs them
            chunks = prepare_chunks(db, job, owner=owner)
            groups = prepare_groups(db, job, owner=owner)
            done, merges = done + chunks, merges + groups
            if not (chunks or groups) or locks.held_in_process(job.db_path, job.session_id):
                break
    except Exception as exc:  # a worker failure costs a preparation, never a turn
        error = f"{type(exc).__name__}: {exc}"[:300]
        log.warning("hermes-trove: background preparation failed: %s", error)
    finally:
        if db is not None:
            db.close()
        with _lock:
            entry = _state.setdefault(key, {"runs": 0, "prepared": 0, "errors": []})
            entry["runs"] += 1
            entry["prepared"] += done
            entry["prepared_merges"] = entry.get("prepared_merges", 0) + merges
            entry.update(running=False, finished_at=time.time(), last_prepared=done)
            if error:
                entry["errors"] = (entry["errors"] + [error])[-3:]


def candidate_chunks(db: Database, job: Job) -> list[list[dict]]:
    """Chunks of the oldest unsummarized rows outside the fresh tail (``tail_start``)
    that no prepared summary covers yet, oldest first. They are left of the tail
    now, so a compaction at the trigger will take them. The newest chunk is
    offered once it holds ``MIN_CHUNK_SHARE`` of a leaf chunk and the trigger is
    less than ``PARTIAL_HEADROOM_SHARE`` of a chunk away (``headroom_tokens``):
    a smaller prepared leaf still saves the call a bigger one would cost inside
    ``compress()``, but one made early would be followed by another small one
    (more calls, more nodes in the prompt) where waiting makes one."""
    store = Store(db)
    floor = (store.get_session(job.session_id) or {}).get("replay_floor", 0)
    summarized = [n["last_store_id"] for n in Dag(db).frontier(job.session_id)
                  if n.get("last_store_id") is not None and n.get("session_id") == job.session_id]
    with db.reading() as conn:
        prepared_to = prepared.last_store_id(conn, job.session_id)
    start = max([floor, prepared_to, *summarized])
    rows = store.session_messages(job.session_id, after_store_id=start, limit=SCAN_LIMIT)
    covered = Dag(db).covered_store_ids(r["store_id"] for r in rows)
    live = [r for r in rows if r["store_id"] not in covered]
    older = live[:tail_start(live, job)]
    sizes = [max(1, int(r.get("token_count") or 0)) for r in older]
    chunks = chunk_by_tokens(sizes, job.chunk_tokens)
    if chunks:
        # The newest chunk ends before its last user message, so what follows it (raw
        # for now, perhaps kept raw by ``leaf_pass``) starts a turn, never mid-unit.
        last = chunks[-1]
        users = [i for i in last if older[i].get("role") == "user" and i > last.start]
        if users and users[-1] > last.start:
            chunks[-1] = range(last.start, users[-1])
        partial = sum(sizes[i] for i in last) < FULL_CHUNK_SHARE * job.chunk_tokens
        if sum(sizes[i] for i in chunks[-1]) < MIN_CHUNK_SHARE * job.chunk_tokens:
            chunks.pop()  # too little yet: wait for more turns to leave the tail
        elif partial and job.headroom_tokens > PARTIAL_HEADROOM_SHARE * job.chunk_tokens:
            chunks.pop()  # it will grow before the trigger: one bigger leaf, one call
    return [[older[i] for i in chunk] for chunk in chunks]


def tail_start(live: Sequence[dict], job: Job) -> int:
    """Where the rows a compaction will keep raw begin, as it will choose them: the
    newest ``fresh_tail_count`` messages within ``tail_max_tokens``, less
    ``TAIL_MARGIN`` messages (tool groups stay whole) and never past the newest
    user message (always kept). Chunks end before it."""
    count, tokens = 0, 0
    for row in reversed(live):
        size = int(row.get("token_count") or 0)
        if count >= job.fresh_tail_count or (
                count and job.tail_max_tokens and tokens + size > job.tail_max_tokens):
            break
        count, tokens = count + 1, tokens + size
    newest_user = max((i for i, r in enumerate(live) if r.get("role") == "user"),
                      default=len(live))
    return max(0, min(len(live) - count - TAIL_MARGIN, newest_user))


def prepare_chunks(db: Database, job: Job, *, owner: str) -> int:
    """Claim and summarize up to ``MAX_CHUNKS_PER_RUN`` chunks; return how many are ready."""
    done = 0
    for rows in candidate_chunks(db, job):
        if done >= MAX_CHUNKS_PER_RUN:
            break
        if locks.held_in_process(job.db_path, job.session_id):
            break  # a compaction runs: it summarizes what is not ready itself
        ids = [r["store_id"] for r in rows]
        digest = prepared.source_hash((r["store_id"], r["content_hash"]) for r in rows)
        with db.transaction() as conn:
            if not prepared.claim(conn, job.session_id, ids, digest, owner, job.lease_seconds):
                continue
        try:
            summary = summarize_rows(job, rows)
        except BaseException:
            with db.transaction() as conn:
                prepared.release(conn, job.session_id, ids[0], owner)
            raise
        with db.transaction() as conn:
            if prepared.fill(conn, job.session_id, ids[0], owner, summary):
                done += 1
    return done


def summarize_rows(job: Job, rows: Sequence[dict]) -> dict:
    """The leaf summary of stored rows, as compaction would make it (plain data)."""
    items = [message_item(r["store_id"], decode_row(r), None) for r in rows]
    result = job.summarizer.summarize(items, budget_tokens=job.leaf_budget, depth=0)
    times = [t for t in (r.get("message_at") or r.get("created_at") for r in rows) if t]
    return {**_result_fields(result, items),
            "source_tokens": sum(int(r.get("token_count") or 0) for r in rows),
            "time_to": max(times) if times else None}


def _result_fields(result, items: Sequence[SourceItem]) -> dict:
    """What a prepared summary keeps of a ``SummaryResult`` (plain data)."""
    return {"text": result.text, "tokens": result.tokens, "level": result.level,
            "model": result.model, "topics": extract_topics([i.text for i in items], limit=6),
            "calls": sum(1 for a in result.attempts if a[0] in (1, 2)
                         and not str(a[2]).startswith("skipped"))}


# ------------------------------------------------------------------ merges ahead
_VIRTUAL_IDS = 1 << 62  # sort key of not-yet-written nodes: after every real node_id


def _ready_run(db: Database, session_id: str, frontier: list[dict]) -> list[dict]:
    """The ready leaves compaction will write next, as frontier nodes: those that
    follow one another from the first unsummarized row on (a gap would be
    summarized in place, and every merge after it would differ)."""
    with db.reading() as conn:
        entries = prepared.ready(conn, session_id)
        summarized = max([n["last_store_id"] or 0 for n in frontier
                          if n.get("session_id") == session_id] or [0])
        out, after = [], summarized
        for entry in entries:
            ids = entry["store_ids"]
            if ids[0] <= after:
                continue  # behind what is summarized: compaction drops it
            nxt = conn.execute("SELECT MIN(store_id) FROM messages m WHERE session_id = ?"
                               " AND store_id > ?", (session_id, after)).fetchone()[0]
            if nxt != ids[0]:
                break
            summary = entry["summary"]
            out.append({"node_id": _VIRTUAL_IDS + len(out), "virtual": True, "depth": 0,
                        "first_store_id": ids[0], "last_store_id": ids[-1],
                        "text": summary.get("text") or "(no text)",
                        "time_to": summary.get("time_to")})
            after = ids[-1]
    return out


def predicted_groups(db: Database, job: Job, ready: dict[str, dict]
                     ) -> list[tuple[str, list[dict]]]:
    """The merges the next compaction will make, in its order, as ``(key, group)``,
    if it writes the ready leaves as they are. A group whose summary is not ready
    ends the prediction (what it becomes is unknown yet)."""
    frontier = Dag(db).frontier(job.session_id)
    nodes = frontier + _ready_run(db, job.session_id, frontier)
    out: list[tuple[str, list[dict]]] = []
    while len(out) < 64:
        group = oldest_full_group(nodes, job.fanout, job.max_depth)
        if group is None or not any(n.get("virtual") for n in group):
            break  # merges of written nodes only are not ahead of anything
        key = group_key(group)
        out.append((key, group))
        summary = ready.get(key)
        if summary is None:
            break
        members = {n["node_id"] for n in group}
        nodes = [n for n in nodes if n["node_id"] not in members] + [{
            "node_id": _VIRTUAL_IDS + 1000 + len(out), "virtual": True,
            "depth": max(n["depth"] for n in group) + 1,
            "first_store_id": min(n["first_store_id"] for n in group),
            "last_store_id": max(n["last_store_id"] for n in group),
            "text": summary.get("text") or "(no text)",
            "time_to": max((n.get("time_to") or 0 for n in group), default=None) or None}]
    return out


def prepare_groups(db: Database, job: Job, *, owner: str) -> int:
    """Claim and summarize the predicted merges, up to ``MAX_GROUPS_PER_RUN``; drop
    ready merges the prediction no longer makes. Returns how many are ready."""
    if job.condensed_budget <= 0:
        return 0
    done = 0
    while done < MAX_GROUPS_PER_RUN and not locks.held_in_process(job.db_path, job.session_id):
        with db.reading() as conn:
            ready = prepared.ready_groups(conn, job.session_id)
        groups = predicted_groups(db, job, ready)
        stale = set(ready) - {key for key, _ in groups}
        if stale:
            with db.transaction() as conn:
                prepared.drop_groups(conn, job.session_id, stale)
        if not groups or groups[-1][0] in ready:
            return done
        key, group = groups[-1]
        depth = max(n["depth"] for n in group) + 1
        with db.transaction() as conn:
            if not prepared.claim_group(conn, job.session_id, key, depth, owner,
                                        job.lease_seconds):
                return done  # another worker has it
        try:
            items = [_group_item(n) for n in group]
            result = job.summarizer.summarize(items, budget_tokens=job.condensed_budget,
                                              depth=depth)
        except BaseException:
            with db.transaction() as conn:
                prepared.release_group(conn, job.session_id, key, owner)
            raise
        with db.transaction() as conn:
            if not prepared.fill_group(conn, job.session_id, key, owner,
                                       _result_fields(result, items)):
                return done
        done += 1
    return done


def _group_item(node: dict) -> SourceItem:
    """A merge input: a written node as compaction reads it; a prepared one, not
    written yet so without a node_id, by the messages it covers."""
    if not node.get("virtual"):
        return node_item(node)
    return SourceItem(ref=f"m{node['first_store_id']}-m{node['last_store_id']}",
                      role="summary", text=summary_body(node["text"]),
                      time=node.get("time_to"))


def condense(compactor: Compactor, db: Database, session_id: str, *, fanout: int,
             max_depth: int, focus: str | None, deterministic_only: bool,
             report: PassReport, wait_seconds: float = 0.0) -> None:
    """``Compactor.condense`` with the merges prepared ahead (one in flight is waited
    for up to ``wait_seconds``); the used ones are dropped."""
    ready = ReadyGroups(db, session_id, wait_seconds)
    used = compactor.condense(session_id, fanout=fanout, max_depth=max_depth, focus=focus,
                              deterministic_only=deterministic_only, report=report,
                              ready=ready)
    if used:
        with db.transaction() as conn:
            prepared.drop_groups(conn, session_id, used)


POLL_SECONDS = 0.05


def _await_chunks(db: Database, session_id: str, backlog_ids: set[int], entries: list[dict],
                  wait_seconds: float) -> list[dict]:
    """The ready summaries once the backlog's in-flight chunks are ready (or gone,
    or the wait is over)."""
    deadline = time.time() + wait_seconds
    while True:
        with db.reading() as conn:
            flying = [c for c in prepared.in_flight(conn, session_id)
                      if c["first_store_id"] in backlog_ids]
        if not flying or time.time() >= deadline:
            return entries
        time.sleep(POLL_SECONDS)
        with db.reading() as conn:
            entries = prepared.ready(conn, session_id)


class ReadyGroups(Mapping):
    """Prepared merges by key, for ``Compactor.condense``: a merge a worker is
    making right now is waited for (up to ``wait_seconds`` from the first wait),
    since its call started before the compaction would start the same one."""

    def __init__(self, db: Database, session_id: str, wait_seconds: float):
        self.db, self.session_id = db, session_id
        self.deadline: float | None = None
        self.wait_seconds = wait_seconds
        self._load()

    def _load(self) -> None:
        with self.db.reading() as conn:
            self.ready = prepared.ready_groups(conn, self.session_id)
            self.flying = {k for k, state in prepared.group_states(conn, self.session_id)
                           .items() if state == "claimed"}

    def get(self, key, default=None):
        """The ready summary of ``key``, after waiting for it while it is in flight."""
        while key not in self.ready and key in self.flying:
            if self.deadline is None:
                self.deadline = time.time() + self.wait_seconds
            if time.time() >= self.deadline:
                break
            time.sleep(POLL_SECONDS)
            self._load()
        return self.ready.get(key, default)

    def __getitem__(self, key):
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __iter__(self):
        return iter(self.ready)

    def __len__(self) -> int:
        return len(self.ready) + len(self.flying)


def leaf_pass(compactor: Compactor, db: Database, session_id: str, backlog: list, *,
              chunk_tokens: int, focus: str | None, deterministic_only: bool,
              report: PassReport, may_defer: bool = False,
              wait_seconds: float = 0.0) -> set[int]:
    """``Compactor.leaf_pass`` that first uses ready prepared summaries.

    A ready summary is used when its store_ids are a contiguous run of
    ``backlog`` (``(store_id, message, time, tokens)`` rows, oldest first) and
    the stored rows still hash the same; the runs between are summarized
    here, in order. Used summaries and those the backlog has passed are
    dropped; newer ones stay for the next compaction. With a focus topic,
    prepared summaries (made without it) are not used.

    With ``may_defer`` (the first, roomiest pass) the newest rows after the
    last prepared run, when they are less than ``DEFER_SHARE`` of a
    chunk and start with a user message (a whole turn, never an orphan tool
    result), are not summarized: their store_ids are returned and the caller
    keeps them raw beside the fresh tail, so the compaction makes no model
    call for a sliver the worker will prepare next. If the prompt then does
    not fit, the caller's next pass summarizes them as usual.

    A chunk of the backlog that a worker is summarizing right now is waited
    for, up to ``wait_seconds`` (the summary timeout) and its lease: its call
    started before this compaction, so it ends sooner than the same call made
    here would.
    """
    with db.transaction() as conn:
        entries = prepared.ready(conn, session_id)
    if focus is None and wait_seconds > 0 and backlog:
        entries = _await_chunks(db, session_id, {row[0] for row in backlog}, entries,
                                wait_seconds)
    if not entries or not backlog:
        compactor.leaf_pass(session_id, backlog, chunk_tokens=chunk_tokens, focus=focus,
                            deterministic_only=deterministic_only, report=report)
        return set()
    position = {row[0]: n for n, row in enumerate(backlog)}
    usable: dict[int, dict] = {}
    if focus is None:
        with db.reading() as conn:
            for entry in entries:
                ids = entry["store_ids"]
                start = position.get(ids[0])
                if start is None or [r[0] for r in backlog[start:start + len(ids)]] != ids:
                    continue
                if prepared.source_hash(prepared.chunk_hashes(conn, ids)) == entry["source_hash"]:
                    usable[start] = entry
    cursor = 0
    for start in sorted(usable):
        if start < cursor:
            continue  # overlaps a run already written (cannot happen with one chunking)
        if start > cursor:
            compactor.leaf_pass(session_id, backlog[cursor:start], chunk_tokens=chunk_tokens,
                                focus=focus, deterministic_only=deterministic_only,
                                report=report)
        entry = usable[start]
        end = start + len(entry["store_ids"])
        compactor.write_prepared_leaf(session_id, backlog[start:end], entry["summary"], report)
        cursor = end
    deferred: set[int] = set()
    rest = backlog[cursor:]
    if (rest and usable and may_defer and rest[0][1].get("role") == "user"
            and sum(r[3] for r in rest) < DEFER_SHARE * chunk_tokens):
        deferred = {r[0] for r in rest}
    elif rest:
        compactor.leaf_pass(session_id, rest, chunk_tokens=chunk_tokens, focus=focus,
                            deterministic_only=deterministic_only, report=report)
    newest = backlog[cursor - 1][0] if deferred else backlog[-1][0]
    finished = [e["first_store_id"] for e in entries if e["first_store_id"] <= newest]
    with db.transaction() as conn:
        prepared.drop(conn, session_id, finished)
    return deferred
