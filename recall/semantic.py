"""Semantic recall: the embedding index, its background worker and vector search.

What is embedded: user and assistant messages as ``"Speaker: text"`` (the
sender's name from ``ranking.speaker_of``, else the role; questions name
people, and a turn embedded without its speaker matches turns *addressed* to
that person as well as turns *by* them), long ones in up to ``MAX_CHUNKS``
chunks, and every summary node. Tool output is left to full text. A row with
nothing to embed gets a NULL-vector row so it is not retried.

Embedding never runs on a turn's hot path: ``EmbeddingWorker`` is a daemon
thread with its own database connection; the engine pokes it after each
ingest and it catches up in bounded batches (``TROVE_EMBEDDING_BATCH_SIZE``),
one transaction per batch. ``backfill`` does the same work on demand
(``/trove embed backfill``): a dry run counts, ``apply`` embeds; it resumes
where it stopped and is idempotent (the pending rows are exactly those with no
row in the space).

Search is scoped first (the sessions' rows only, joined in SQL) and exact:
one matrix product over the scope's vectors; a message's score is its best
chunk's cosine. Above ``vectorscan.PRESCREEN_MIN`` vectors a sign-bit
prescreen picks the candidates first (see ``vectorscan``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from ..config import TroveConfig
from ..storage.database import Database, open_private
from ..storage.payloads import without_placeholders
from ..storage.vectors import EMBEDDED_ROLES, VectorRow, VectorStore
from . import callmemo, ranking, vectorscan
from .meter import RateMeter
from .embeddings import EmbeddingError, Provider, ProviderState, open_provider
from .probe import RECHECK_SECONDS, SpaceCheck
from .search import Hit

CHUNK_CHARS = 1500            # a long message is embedded in pieces of about this size
MAX_CHUNKS = 4                # pieces per message at most (the rest is left to full text)
IDLE_SECONDS = 30.0           # the worker re-checks for work this often without a poke
FAILURE_PAUSE = 60.0          # after a provider error the worker waits this long
WORKER_NICE = 10              # the worker's thread runs at this nice value where the OS allows
WORKER_PAUSE = 0.01           # seconds between two batches, so turns get the write lock
QUERY_MEMO = 32               # query vectors kept for searches that ask again (query_vector)


def message_text(row: dict) -> str:
    """A raw message as embedded: ``"Speaker: text"`` (empty when not embedded); payload
    placeholders are not words (``payloads.without_placeholders``)."""
    if row["role"] not in EMBEDDED_ROLES:
        return ""
    text = row["search_text"] if row.get("search_text") is not None else (row["content"] or "")
    if row.get("content_format") not in ("text", "json") and row.get("search_text") is None:
        text = ""
    name, body = ranking.speaker_of(row, without_placeholders(text))
    body = body.strip()
    return f"{name or row['role']}: {body}" if body else ""


def chunks(text: str) -> list[str]:
    """Up to ``MAX_CHUNKS`` pieces of about ``CHUNK_CHARS``, cut at whitespace."""
    pieces: list[str] = []
    rest = text
    while rest and len(pieces) < MAX_CHUNKS:
        if len(rest) <= CHUNK_CHARS:
            pieces.append(rest)
            break
        cut = rest.rfind(" ", CHUNK_CHARS // 2, CHUNK_CHARS)
        cut = cut if cut > 0 else CHUNK_CHARS
        pieces.append(rest[:cut])
        rest = rest[cut:].lstrip()
    return pieces


def outgoing(config: TroveConfig, redact=None):
    """The function every text passes through before it reaches a provider: with
    ``TROVE_SENSITIVE_PATTERNS_ENABLED`` the ingest redactor (``redact``, handed in by
    the engine or the operator: ``ingest.redaction.redact_for``), else the identity.

    Why: redaction protects what is stored, but rows stored before it was turned on
    (or imported without it) still hold their secrets, and a query is the model's
    own text; an embeddings endpoint is another party, so with redaction on nothing
    is sent to it unredacted (passages, summaries and queries alike, so both sides
    of a comparison see the same placeholders). Redaction on and no redactor given
    sends nothing (an ``EmbeddingError``: the worker reports it, a search runs full
    text)."""
    if not config.sensitive_patterns_enabled:
        return lambda text: text
    if redact is None:
        def refuse(text: str) -> str:
            raise EmbeddingError("TROVE_SENSITIVE_PATTERNS_ENABLED is on and no redactor "
                                 "was given: nothing is sent to the embedding provider")
        return refuse
    return lambda text: redact(text)[0]


def text_hash(text: str) -> str:
    """Identity of an embedded text (identical texts share one model call)."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]


@dataclass
class BatchOutcome:
    """What one batch did."""

    rows: int = 0
    embedded: int = 0
    reused: int = 0
    refused: int = 0       # rows left pending: the provider refused one of their texts


class Indexer:
    """Embeds pending rows of one database into the provider's space, a batch at a time."""

    def __init__(self, db: Database, provider: Provider, config: TroveConfig, redact=None,
                 check: SpaceCheck | None = None):
        self.vectors = VectorStore(db)
        self.check = check or SpaceCheck()      # which space the answers belong to
        self.provider = provider
        self.batch = config.embedding_batch_size
        self.timeout = config.embedding_batch_timeout_ms / 1000.0
        self.clean = outgoing(config, redact)
        self.fits: int | None = None       # most texts per call since the provider refused more
        self._refusal: EmbeddingError | None = None
        self._space: int | None = None
        self.cursor = {"m": 0, "n": 0}     # every row at or below has a row in the space

    def space(self, recheck: float | None = None) -> int:
        """The space the provider's answers belong to (``probe.SpaceCheck``: made on first
        use; ``recheck``: probed again when that many seconds passed). A space change
        restarts the walk; no space (the probe failed) raises: nothing is embedded."""
        space = self.check.space(self.vectors, self.provider, self.timeout, create=True,
                                 recheck=recheck)
        if space is None:
            verdict = self.check.verdict
            raise EmbeddingError(verdict.detail if verdict is not None and verdict.detail
                                 else "the embedding model's probe is running elsewhere")
        if space != self._space:
            self._space, self.cursor = space, {"m": 0, "n": 0}
        return space

    def step(self) -> BatchOutcome:
        """Embed one batch of pending messages, else of pending nodes; 0 rows when done.
        Before embedding, the model is probed again every ``probe.RECHECK_SECONDS``: a
        batch is never written into the space of a model the endpoint no longer serves
        (bounded by that window)."""
        space = self.space()
        messages, nodes = self._pending(space)
        if (messages or nodes) and self.space(RECHECK_SECONDS) != space:
            space = self.space()            # the answers changed: walk the new space
            messages, nodes = self._pending(space)
        if messages:
            outcome = self._embed(space, "m", [(r["store_id"], message_text(r))
                                               for r in messages])
            self.cursor["m"] = messages[-1]["store_id"]
            return outcome
        outcome = self._embed(space, "n", [(r["node_id"], f"summary: {r['text']}")
                                           for r in nodes])
        if nodes:
            self.cursor["n"] = nodes[-1]["node_id"]
        return outcome

    def _pending(self, space: int) -> tuple[list[dict], list[dict]]:
        """The next batch of pending messages, else of pending nodes, past the cursor."""
        messages = self.vectors.pending_messages(space, self.batch, self.cursor["m"])
        nodes = [] if messages else self.vectors.pending_nodes(space, self.batch,
                                                                self.cursor["n"])
        return messages, nodes

    def _embed(self, space: int, kind: str, items: list[tuple[int, str]]) -> BatchOutcome:
        rows: list[tuple[int, int, str, str]] = []          # (ref, chunk, hash, text)
        empty: list[VectorRow] = []
        for ref, text in items:
            pieces = chunks(self.clean(text))
            if not pieces:
                empty.append(VectorRow(kind, ref, 0, "", None))
            rows += [(ref, i, text_hash(p), p) for i, p in enumerate(pieces)]
        known = self.vectors.known_vectors(space, (h for _, _, h, _ in rows))
        todo = list({h: t for _, _, h, t in rows if h not in known}.items())
        made: dict[str, bytes] = {}
        if todo:
            made = self._passages(todo)
            if not made:
                raise self._refusal          # nothing passed: the provider is the problem
            known.update(made)
        # a row is written whole or not at all (no row in the space = pending)
        refused = {ref for ref, _, h, _ in rows if h not in known}
        self.vectors.write(space, empty + [VectorRow(kind, ref, i, h, known[h])
                                           for ref, i, h, _ in rows if ref not in refused])
        return BatchOutcome(len(items), len(made), len(rows) - len(todo), len(refused))

    def _passages(self, todo: list[tuple[str, str]]) -> dict[str, bytes]:
        """Vectors of ``(hash, text)`` pairs; what the provider refuses is left out.

        Why: an endpoint that refuses a request (more inputs than it takes at once,
        one input it will not embed) refuses it again on every retry, and the worker
        retried that one batch forever: no row after it was ever embedded. A refused
        call is split in halves until the parts pass; a text refused alone stays
        pending (retried by the next process or backfill). Other errors (the endpoint
        down, a timeout) end the batch as before."""
        step = self.fits or len(todo)
        made: dict[str, bytes] = {}
        for start in range(0, len(todo), step):
            part = todo[start:start + step]
            try:
                matrix = self.provider.passages([t for _, t in part], self.timeout)
            except EmbeddingError as exc:
                if not exc.refused:
                    raise
                self._refusal = exc
                if len(part) > 1:
                    half = (len(part) + 1) // 2
                    split = {**self._passages(part[:half]), **self._passages(part[half:])}
                    if len(split) == len(part):     # only the size was refused: remember it
                        self.fits = min(self.fits or half, half)
                    made.update(split)
                continue
            made.update((h, vector.astype("float32").tobytes())
                        for (h, _), vector in zip(part, matrix))
        return made


def backfill(db: Database, provider: Provider, config: TroveConfig, *, apply: bool,
             max_seconds: float = 300.0, progress=None, redact=None) -> dict:
    """Catch the index up: a dry run counts what is pending; ``apply`` embeds until done
    or ``max_seconds`` pass (run it again to resume). ``progress(done, total)`` is
    called after each batch so long work can show how far it is."""
    indexer = Indexer(db, provider, config, redact)
    before = indexer.vectors.counts(indexer.space())
    report = {"identity": vars(provider.identity), **before, "other_vectors": sum(
        s["vectors"] for s in indexer.vectors.other_spaces(indexer.space()))}
    if not apply:
        return {**report, "status": "preview", "note": "pass apply to embed the pending rows"}
    started, total = time.monotonic(), BatchOutcome()
    while time.monotonic() - started < max_seconds:
        outcome = indexer.step()
        if not outcome.rows:
            break
        total.rows += outcome.rows
        total.embedded += outcome.embedded
        total.reused += outcome.reused
        total.refused += outcome.refused
        if progress is not None:
            progress(total.rows, before["pending"])
    after = indexer.vectors.counts(indexer.space())
    return {**report, **after, "status": "done" if not after["pending"] else "partial",
            "rows": total.rows, "texts_embedded": total.embedded, "texts_reused": total.reused,
            "rows_refused": total.refused,
            "seconds": round(time.monotonic() - started, 2)}


def prune(db: Database, provider: Provider, config: TroveConfig, *, apply: bool) -> dict:
    """The vectors of other models (spaces other than the provider's): a dry run lists
    them, ``apply`` deletes them, one space per transaction.

    Why: a model switch starts a new space and never compares it with the old one, so
    the old vectors are dead weight (1.5 KB a row at 384 dimensions) unless the
    operator switches back; keeping them is the default, freeing them is this."""
    vectors = VectorStore(db)       # the probe says which space is current (never guessed)
    current = SpaceCheck().space(vectors, provider, config.embedding_batch_timeout_ms / 1000.0,
                                 create=False)
    spaces = vectors.other_spaces(current)
    report = {"identity": vars(provider.identity), "spaces": spaces,
              "vectors": sum(s["vectors"] for s in spaces)}
    if not apply:
        return {**report, "status": "preview"}
    for space in spaces:
        vectors.drop_space(space["space_id"])
    return {**report, "status": "done"}


class EmbeddingWorker(threading.Thread):
    """Background model loading and catch-up, on its own connection.

    It first loads the provider (so a slow load or checksum never delays a
    turn), then embeds pending rows batch by batch; ``poke`` wakes it when new
    rows arrive.
    """

    def __init__(self, semantic: "Semantic"):
        super().__init__(name="trove-embeddings", daemon=True)
        self.semantic = semantic
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.last_error = ""
        self.batches = 0
        self.meter = RateMeter()

    def poke(self) -> None:
        """New rows may be pending: wake the worker."""
        self.wake.set()

    def stop(self) -> None:
        """Finish the current batch and end the thread."""
        self.stopping.set()
        self.wake.set()

    def run(self) -> None:
        _lower_priority()
        semantic = self.semantic
        semantic.state = open_provider(semantic.config)
        if semantic.provider is None:
            return
        try:
            db = open_private(semantic.db.path)
        except Exception as exc:  # no connection: no index, but never a dead thread's trace
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        # vectors are derived data (a lost batch is simply embedded again), so this
        # connection commits without an fsync and holds the write lock for less time
        if db.dialect == "sqlite":
            db.conn.execute("PRAGMA synchronous=NORMAL")
        try:
            indexer = Indexer(db, semantic.provider, semantic.config, semantic.redact,
                              semantic.check)
            while not self.stopping.is_set():
                try:   # everything the worker does, warming included, is retried, never raised
                    began = time.monotonic()
                    worked = indexer.step().rows
                    self.batches += bool(worked)
                    self.meter.record(worked, time.monotonic() - began)
                    if not worked:
                        self._warm(indexer)
                    self.last_error = ""
                    self.stopping.wait(WORKER_PAUSE)   # let turns take the write lock
                except Exception as exc:  # never kill the host; retry later
                    self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                    self.stopping.wait(FAILURE_PAUSE)
                    continue
                if not worked:
                    self.wake.wait(IDLE_SECONDS)
                    self.wake.clear()
        finally:
            db.close()

    def _warm(self, indexer: Indexer) -> None:
        """Caught up: load the prescreen bits of a big index now, not in a query.

        Read through the worker's own connection: the engine's may be closed or
        reopened while the worker idles (it died on a closed one, and with it the
        index's catch-up until the next process)."""
        space = indexer.space()
        for kind in ("m", "n"):
            if indexer.vectors.count_vectors(space, kind) > vectorscan.PRESCREEN_MIN:
                self.semantic.bits.warm(indexer.vectors, space, kind,
                                        indexer.provider.identity.dim)


def _lower_priority() -> None:
    """Nice this thread (Linux: per thread), so turns win the CPU over catch-up."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    except (AttributeError, OSError):
        pass


@dataclass
class Semantic:
    """The embedding side of one database: provider state, index reads, optional worker."""

    db: Database
    config: TroveConfig
    state: ProviderState
    worker: EmbeddingWorker | None = None
    redact: object = None          # ``Redactor.redact`` when redaction is on (``outgoing``)
    check: SpaceCheck = field(default_factory=SpaceCheck)   # the probe's verdict
    _bits: vectorscan.BitIndex | None = field(default=None, repr=False)
    _queries: dict = field(default_factory=dict, repr=False)   # (model, space, text) -> vector
    _queries_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _counts: dict = field(default_factory=dict, repr=False)   # (space, kind) -> (n, when)
    _clean: object = field(default=None, repr=False)            # ``outgoing(config)``

    @property
    def bits(self) -> vectorscan.BitIndex:
        """The in-memory prescreen for big scopes (built on first use)."""
        if self._bits is None:
            self._bits = vectorscan.BitIndex(self.provider.np)
        return self._bits

    @classmethod
    def open(cls, db: Database, config: TroveConfig, redact=None) -> "Semantic":
        """Load the configured provider now (operators, benches; never in a turn)."""
        return cls(db, config, open_provider(config), redact=redact)

    @property
    def provider(self) -> Provider | None:
        return self.state.provider

    def space(self) -> int | None:
        """The space the provider's answers belong to, if it has one (never creates one).

        Decided by the probe (``probe.SpaceCheck``, shared with the worker): the first
        search of a process without a worker probes, within the query timeout. None
        when the answers have no space yet or the probe failed (fail closed: the vector
        arm is off, ``vectors_off`` says why); a query is only ever compared with
        vectors of its own space."""
        provider = self.provider
        if provider is None:
            return None
        try:
            return self.check.space(VectorStore(self.db), provider,
                                    self.config.embedding_query_timeout_ms / 1000.0,
                                    create=False)
        except Exception:  # the verdict records why; full text answers
            return None

    def vectors_off(self) -> str:
        """Why the vector arm is off although a provider is loaded ("" when it is not):
        the probe failed, or it has not answered yet."""
        if self.provider is None:
            return self.state.reason
        self.space()
        verdict = self.check.verdict
        if verdict is None:
            return "the embedding model is being checked (probe text); ran full text"
        return verdict.detail if verdict.state == "failed" else ""

    def status(self) -> dict:
        """``embeddings: {enabled, provider, model, indexed, pending}`` and why it is off."""
        report = {"enabled": self.config.embeddings_enabled,
                  "provider": self.config.embedding_provider,
                  "model": self.provider.identity.model if self.provider else
                  (self.config.embedding_model or None)}
        if self.provider is None:
            return {**report, "available": False, "reason": self.state.reason}
        store = VectorStore(self.db)
        report.update(available=True, **store.counts(self.check.peek(store,
                                                                     self.provider.identity)))
        verdict = self.check.verdict
        report["model_check"] = verdict.report() if verdict is not None else {
            "state": "unchecked", "detail": "the probe text has not been embedded in this "
            "process yet (the worker or the first search does it)"}
        if self.worker is not None:
            report.update(self.worker.meter.report(report.get("pending")))
            if self.worker.last_error:
                report["worker_error"] = self.worker.last_error
        return report

    def coverage(self, sessions: Sequence[str] | None,
                 hidden: tuple[str, int] | None = None) -> float:
        """Share of the scope's embeddable messages that have vectors (0 without a space);
        ``hidden`` leaves out the current turn (see ``VectorStore.scope_counts``)."""
        space = self.space()
        if space is None:
            return 0.0
        total, done = VectorStore(self.db).scope_counts(space, sessions, hidden)
        return done / total if total else 1.0

    def query_vector(self, text: str):
        """The query's vector, or None when the provider fails in time (full text then).

        The last ``QUERY_MEMO`` vectors are kept: one trove_recall embeds the question
        and each of its sentences for several searches (all sessions, this session as
        grep ranks it, each sentence alone), and a model call costs milliseconds."""
        provider = self.provider
        if provider is None:
            return None
        key = (provider.identity, self.check.generation, text)   # the model that made it
        with self._queries_lock:
            if key in self._queries:
                return self._queries[key]
        if self._clean is None:
            self._clean = outgoing(self.config, self.redact)
        try:
            vector = provider.query(self._clean(text),
                                    self.config.embedding_query_timeout_ms / 1000.0)
        except Exception:  # a slow or broken model degrades to full text, never fails a call
            return None
        if getattr(vector, "flags", None) is not None:
            vector.flags.writeable = False     # shared by the calls that ask again
        with self._queries_lock:
            self._queries[key] = vector
            while len(self._queries) > QUERY_MEMO:
                self._queries.pop(next(iter(self._queries)))
        return vector

    def _scope_matrix(self, store: VectorStore, space: int, kind: str,
                      sessions: Sequence[str] | None, dim: int):
        """``(refs, matrix)`` of every vector of the scope, read once per tool call
        (``callmemo``: one recall searches the same scope's vectors several times)."""
        key = ("vectors", id(self.db), space, kind,
               None if sessions is None else tuple(sessions), dim)
        return callmemo.kept(key, lambda: self._matrix(store.vectors(space, kind, sessions),
                                                       dim))

    def _matrix(self, rows: list, dim: int) -> tuple[list, object]:
        """``(refs, n x dim float32 matrix)`` of ``(ref, vector bytes)`` rows; a vector
        of another size is left out (``vectorscan.sized``: one torn row made every
        search of its scope fail with numpy's reshape error)."""
        rows = vectorscan.sized(rows, 1, dim)
        if not rows:
            return [], None
        np = self.provider.np
        matrix = np.frombuffer(b"".join(v for _, v in rows), dtype=np.float32)
        return [ref for ref, _ in rows], matrix.reshape(len(rows), -1)

    def _vector_count(self, store: VectorStore, space: int, kind: str) -> int:
        """How many vectors the space holds, counted again after
        ``vectorscan.RECHECK_SECONDS``: it only decides exact scan or prescreen, and
        counting reads every vector row (about 13 ms at 18K rows), once per vector arm
        of every search before this."""
        now = time.monotonic()
        cached = self._counts.get((space, kind))
        if cached is not None and now - cached[1] < vectorscan.RECHECK_SECONDS:
            return cached[0]
        total = store.count_vectors(space, kind)
        self._counts[(space, kind)] = (total, now)
        return total

    def search(self, vector, kind: str, sessions: Sequence[str] | None,
               limit: int) -> list[tuple[int, float]]:
        """Best ``limit`` (id, cosine) of messages (``"m"``) or nodes (``"n"``) in scope."""
        space = self.space()
        if space is None or vector is None:
            return []
        store = VectorStore(self.db)
        total = self.bits.size(space, kind)
        if total is None:
            total = self._vector_count(store, space, kind)
        np = self.provider.np
        dim = int(np.asarray(vector).size)
        if total > vectorscan.PRESCREEN_MIN:
            nearest = self.bits.search(store, space, kind, vector, sessions)
            refs, matrix = self._matrix(store.vectors_of(space, kind, nearest), dim)
        else:
            refs, matrix = self._scope_matrix(store, space, kind, sessions, dim)
        if not refs:
            return []
        scores = matrix @ np.asarray(vector, dtype=np.float32)
        return _distinct_best(refs, matrix, scores, np.argsort(-scores, kind="stable"),
                              limit)


def _distinct_best(refs: Sequence[int], matrix, scores, order,
                   limit: int) -> list[tuple[int, float]]:
    """The best ``limit`` rows by their best chunk, one row per distinct vector.

    Why: chats repeat themselves ("lol", "Anyway, what's new with you?" said fifty
    times), and every copy has the same vector, so one short line that happens to
    sit near the question took every slot of the arm and pushed the answer out of
    it (generated chats, plain turns: the arm listed one line 20 times). A copy has
    the same score and the same vector: the newest copy takes the one slot
    (``placed`` would list the others after the raw hits anyway).
    """
    best: dict[int, float] = {}
    holders: dict[float, list[list]] = {}     # score -> [[row kept, its index], ...]
    for index in order:
        ref, score = refs[int(index)], float(scores[index])
        same = next((held for held in holders.get(score, ())
                     if (matrix[held[1]] == matrix[index]).all()), None)
        if same is not None:                  # the same text again: keep its newest row
            if ref > same[0] and ref not in best:
                best[ref] = best.pop(same[0])
                same[0], same[1] = ref, index
            continue
        if len(best) >= limit:
            break                             # sorted: nothing after this can enter
        if ref not in best:                   # a row's weaker chunk adds nothing
            best[ref] = score
            holders.setdefault(score, []).append([ref, index])
    return sorted(best.items(), key=lambda pair: -pair[1])


# ---------------------------------------------------------------- search modes
MODES = ("full_text", "semantic", "hybrid")
HYBRID_COVERAGE = 0.95        # hybrid is the default when vectors cover this share of the scope
WEIGHTS = {"full_text": 0.5, "vector": 0.5}   # measured: bench/README.md (recall quality)


@dataclass
class ModeChoice:
    """Which search mode runs, how much of the scope the vectors cover, and the query vector."""

    mode: str
    coverage: float | None
    vector: object = None
    note: str = ""


def choose_mode(semantic: "Semantic | None", requested: str | None, query: str,
                sessions: Sequence[str] | None,
                hidden: tuple[str, int] | None = None) -> ModeChoice:
    """The mode a search runs in: the requested one when it can run, else full text.

    Without a request: hybrid when the index covers the scope
    (``HYBRID_COVERAGE``; the current turn, ``hidden``, is not part of it: it is
    never searched and is embedded after it), else full text. A request the index cannot serve
    falls back to full text with a note saying why.
    """
    if semantic is None or semantic.provider is None:
        reason = semantic.state.reason if semantic is not None else "embeddings are off"
        note = f"semantic search is unavailable: {reason}" if requested not in (
            None, "full_text") else ""
        return ModeChoice("full_text", None, note=note)
    off = "" if requested == "full_text" else semantic.vectors_off()
    if off:                           # fail closed: no space, no vector arm
        failed = semantic.check.verdict is not None     # the probe failed: always said
        note = f"semantic search is unavailable: {off}" if requested or failed else ""
        return ModeChoice("full_text", None, note=note)
    coverage = semantic.coverage(sessions, hidden)
    if requested == "full_text" or (requested is None and coverage < HYBRID_COVERAGE):
        return ModeChoice("full_text", coverage)
    if coverage == 0.0:
        return ModeChoice("full_text", coverage,
                          note="no vectors cover this scope yet; ran full text")
    vector = semantic.query_vector(query)
    if vector is None:
        return ModeChoice("full_text", coverage,
                          note="the query could not be embedded in time; ran full text")
    if semantic.space() is None:      # the model answering now has no vectors here yet
        return ModeChoice("full_text", 0.0, note="no vectors of the embedding model's current "
                                                 "answers cover this scope yet; ran full text")
    return ModeChoice(requested or "hybrid", coverage, vector)


def vector_arms(semantic: Semantic, vector, messages, summaries, limit: int, own=None):
    """Vector arms over raw messages, this session's (``own``, when given) and
    summaries (when given), with their hits.

    The corpora are those full text searched, so the scope rules (session,
    role, time, current turn, carried lineage) apply unchanged: rows they do
    not load are dropped.
    """
    arms: dict[str, list] = {}
    hits: dict = {}
    corpora = [("vector_messages", "m", messages, messages.scope.session_ids)]
    if own is not None:
        corpora.append(("vector_session", "m", own, own.scope.session_ids))
    if summaries is not None:
        corpora.append(("vector_summaries", "n", summaries, summaries.session_ids))
    for arm, kind, corpus, sessions in corpora:
        found = semantic.search(vector, kind, sessions, limit * 2)
        loaded = corpus.load([ref for ref, _ in found])
        kept = [(ref, cos) for ref, cos in found if ref in loaded][:limit]
        arms[arm] = [((kind, ref), cos) for ref, cos in kept]
        for ref, cos in kept:
            row, text = loaded[ref]
            hits[(kind, ref)] = Hit(ref, row, text, cos, {"cosine": round(cos, 4), "matched": [],
                                                          "coverage": 0.0})
    return arms, hits


# ---------------------------------------------------------------- one per database
_shared: dict[tuple, Semantic] = {}
_shared_lock = threading.Lock()


def shared(db: Database, config: TroveConfig, redact=None) -> Semantic:
    """The process's one ``Semantic`` (and worker) for a database and provider setting.

    The host copies the engine per agent; the model and its worker are loaded
    once per process, in the background (``state`` says "loading" until then).
    """
    key = (db.path, config.embedding_provider, config.embedding_model,
           config.embedding_base_url)
    with _shared_lock:
        found = _shared.get(key)
        if found is None:
            found = Semantic(db, config, ProviderState(None, "the embedding model is loading"),
                             redact=redact)
            found.worker = EmbeddingWorker(found)
            found.worker.start()
            _shared[key] = found
        found.db = db     # the caller's live connection (a reopened file gets a new one)
        return found


def forget_shared(path: str | None = None) -> None:
    """Stop and drop the shared workers (of one database, or all): tests, shutdown."""
    with _shared_lock:
        for key in [k for k in _shared if path is None or k[0] == path]:
            worker = _shared.pop(key).worker
            if worker is not None:
                worker.stop()
                worker.join(timeout=30)


def status_of(config: TroveConfig, found: Semantic | None) -> dict:
    """The ``embeddings`` block of the engine's status (off: why)."""
    if found is None:
        return {"enabled": False, "provider": config.embedding_provider,
                "model": config.embedding_model or None, "available": False,
                "reason": "TROVE_EMBEDDINGS_ENABLED is false"}
    return found.status()
