"""Preparing leaf summaries in the background, so compaction mostly assembles.

With a real model one summary takes seconds to minutes, and the host waits
for all of them inside ``compress()``. When the prompt passes
``TROVE_BACKGROUND_PREPARE_SHARE`` of the trigger, the engine starts a worker
(``start``): a daemon thread with its own database connection that
summarizes the oldest unsummarized full chunks outside the fresh tail, with
the engine's summarizer (same escalation, breaker and spend guard), and
stores each result as *ready* in ``prep_summaries``.

At the trigger, ``leaf_pass`` writes the ready summaries whose chunk is
exactly a run of the backlog and whose sources are unchanged (store_ids and
content hashes, so an undo or an edit discards it) as leaf nodes, and
summarizes only the gaps itself. A turn never waits for a worker: a chunk
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
from typing import Sequence

from ..dag import Dag
from ..storage import prepared
from ..storage.database import Database, get_database
from ..store import Store, decode_row
from .compactor import Compactor, PassReport, chunk_by_tokens, message_item
from .summarize import Summarizer, extract_topics

log = logging.getLogger(__name__)

TAIL_MARGIN = 4          # messages kept out of reach beyond the fresh tail (tool groups)
MAX_CHUNKS_PER_RUN = 4   # a run prepares at most this many chunks, then ends
SCAN_LIMIT = 20_000      # raw rows read per run, after what is summarized or prepared
MIN_CHUNK_SHARE = 0.1    # a partial newest chunk is prepared from this share of a chunk
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


_lock = threading.Lock()
_threads: dict[tuple[str, str], threading.Thread] = {}
_state: dict[tuple[str, str], dict] = {}
_OWNER_PREFIX = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


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
    done, error = 0, None
    db = None
    try:
        db = Database(job.db_path)  # its own connection: the turn's is never held
        done = prepare_chunks(db, job, owner=f"{_OWNER_PREFIX}-{threading.get_ident()}")
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
            entry.update(running=False, finished_at=time.time(), last_prepared=done)
            if error:
                entry["errors"] = (entry["errors"] + [error])[-3:]


def candidate_chunks(db: Database, job: Job) -> list[list[dict]]:
    """Chunks of the oldest unsummarized rows outside the fresh tail (plus a margin)
    that no prepared summary covers yet, oldest first. They are left of the tail
    now, so a compaction at the trigger will take them. The newest chunk is
    offered once it holds ``MIN_CHUNK_SHARE`` of a leaf chunk: between two
    compactions only a few turns leave the tail, and a smaller prepared leaf
    still saves the call a bigger one would cost inside ``compress()``."""
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
    older = live[:max(0, len(live) - job.fresh_tail_count - TAIL_MARGIN)]
    sizes = [max(1, int(r.get("token_count") or 0)) for r in older]
    chunks = chunk_by_tokens(sizes, job.chunk_tokens)
    if chunks:
        # The newest chunk ends before its last user message, so what follows it (raw
        # for now, perhaps kept raw by ``leaf_pass``) starts a turn, never mid-unit.
        last = chunks[-1]
        users = [i for i in last if older[i].get("role") == "user" and i > last.start]
        if users and users[-1] > last.start:
            chunks[-1] = range(last.start, users[-1])
        if sum(sizes[i] for i in chunks[-1]) < MIN_CHUNK_SHARE * job.chunk_tokens:
            chunks.pop()  # too little yet: wait for more turns to leave the tail
    return [[older[i] for i in chunk] for chunk in chunks]


def prepare_chunks(db: Database, job: Job, *, owner: str) -> int:
    """Claim and summarize up to ``MAX_CHUNKS_PER_RUN`` chunks; return how many are ready."""
    done = 0
    for rows in candidate_chunks(db, job):
        if done >= MAX_CHUNKS_PER_RUN:
            break
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
    return {"text": result.text, "tokens": result.tokens, "level": result.level,
            "model": result.model, "source_tokens": sum(int(r.get("token_count") or 0)
                                                        for r in rows),
            "topics": extract_topics([i.text for i in items], limit=6),
            "calls": sum(1 for a in result.attempts if a[0] in (1, 2)
                         and not str(a[2]).startswith("skipped"))}


def leaf_pass(compactor: Compactor, db: Database, session_id: str, backlog: list, *,
              chunk_tokens: int, focus: str | None, deterministic_only: bool,
              report: PassReport, may_defer: bool = False) -> set[int]:
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
    """
    with db.transaction() as conn:
        entries = prepared.ready(conn, session_id)
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
