"""Vector search that stays fast at a million rows: a sign-bit prescreen, then exact rescoring.

Exact search reads every vector of the scope (1.5 KB each at 384 dimensions):
fine for a session, far too slow over all sessions of a big store. So a scope
with more than ``PRESCREEN_MIN`` vectors is searched in two steps:

1. **Prescreen** in memory: every vector of the space as 384 sign bits of
   (vector - mean), 48 bytes a row (about 60 MB for 1M rows with ids and
   session codes); the query's bits are compared by Hamming distance (XOR and
   a popcount over 64-bit words) and the ``PRESCREEN_KEEP`` nearest rows of
   the scope are kept. Centering first matters: embedding models give every
   text a large common component, and the signs of raw vectors mostly encode
   that component.
2. **Rescore** those rows exactly (cosine of the float32 vectors, read by
   primary key).

The bits are loaded on first use and caught up by ref_id on later queries
(new rows have higher ids); a row embedded late with a lower id is picked up
when the counts disagree, by a full reload.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from ..storage.vectors import VectorStore

PRESCREEN_MIN = 20_000        # scopes with more vectors than this are prescreened
PRESCREEN_KEEP = 500          # rows rescored exactly after the prescreen
LOAD_BATCH = 10_000           # rows read per query while loading the bits (bounds the memory)
RECHECK_SECONDS = 60.0        # how often the loaded count is compared with the table


@dataclass
class _Bits:
    """The in-memory prescreen of one (space, kind)."""

    ids: object = None            # int64 ref ids, one per chunk
    codes: object = None          # int32 session codes
    words: object = None          # uint64 (n, dim/64) sign bits
    mean: object = None           # float32 (dim,) centering vector
    sessions: dict = field(default_factory=dict)
    upto: int = 0                 # highest ref_id loaded
    skipped: int = 0              # chunks read but left out: not of the space's size
    checked: float = 0.0          # when the counts were last compared


class BitIndex:
    """Sign-bit prescreen of one database's vectors, per (space, kind)."""

    def __init__(self, np):
        self.np = np
        self.lock = threading.Lock()
        self.tables: dict[tuple[int, str], _Bits] = {}

    def search(self, vectors: VectorStore, space: int, kind: str, query,
               sessions: Sequence[str] | None, keep: int = PRESCREEN_KEEP) -> list[int]:
        """Ref ids of the ``keep`` rows of the scope whose bits are nearest the query's."""
        np = self.np
        with self.lock:
            bits = self._caught_up(vectors, space, kind, int(np.asarray(query).size))
        if bits.ids is None or not len(bits.ids):
            return []
        qwords = _words(np, (np.asarray(query, np.float32) - bits.mean) > 0)
        distance = _popcount(np, bits.words ^ qwords)
        if sessions is not None:
            codes = [bits.sessions[s] for s in sessions if s in bits.sessions]
            distance = np.where(np.isin(bits.codes, codes), distance, 1 << 20)
        keep = min(keep, len(distance))
        nearest = np.argpartition(distance, keep - 1)[:keep]
        nearest = nearest[distance[nearest] < (1 << 20)]
        return list(dict.fromkeys(int(i) for i in bits.ids[nearest]))

    def size(self, space: int, kind: str) -> int | None:
        """How many chunks are loaded for (space, kind); None before the first load."""
        bits = self.tables.get((space, kind))
        return None if bits is None or bits.ids is None else len(bits.ids)

    def warm(self, vectors: VectorStore, space: int, kind: str, dim: int) -> None:
        """Load or catch up the bits now (the worker does it when idle)."""
        with self.lock:
            self._caught_up(vectors, space, kind, dim)

    def _caught_up(self, vectors: VectorStore, space: int, kind: str, dim: int) -> _Bits:
        np = self.np
        bits = self.tables.get((space, kind))
        now = time.monotonic()
        if bits is not None and bits.ids is not None and now - bits.checked > RECHECK_SECONDS:
            bits.checked = now      # rows embedded late (lower ids) or removed: reload
            loaded = len(bits.ids) + bits.skipped
            if vectors.count_vectors(space, kind) != loaded + self._newer(
                    vectors, space, kind, bits.upto):
                bits = None
        if bits is None:
            bits = self.tables[(space, kind)] = _Bits(checked=now)
        while True:
            rows = vectors.scan(space, kind, bits.upto, LOAD_BATCH)
            if len(rows) == LOAD_BATCH and rows[0][0] != rows[-1][0]:
                last = rows[-1][0]          # never split one row's chunks across batches
                rows = [r for r in rows if r[0] != last]
            if not rows:
                break
            upto, read = rows[-1][0], len(rows)
            rows = sized(rows, 3, dim)
            bits.skipped += read - len(rows)
            bits.upto = upto
            if not rows:
                continue
            matrix = np.frombuffer(b"".join(r[3] for r in rows), np.float32).reshape(len(rows), -1)
            if bits.mean is None:
                bits.mean = matrix.mean(axis=0)
            words = _words(np, (matrix - bits.mean) > 0)
            codes = np.array([bits.sessions.setdefault(r[2], len(bits.sessions)) for r in rows],
                             np.int32)
            ids = np.array([r[0] for r in rows], np.int64)
            if bits.ids is None:
                bits.ids, bits.codes, bits.words = ids, codes, words
            else:
                bits.ids = np.concatenate([bits.ids, ids])
                bits.codes = np.concatenate([bits.codes, codes])
                bits.words = np.concatenate([bits.words, words])
        return bits

    @staticmethod
    def _newer(vectors: VectorStore, space: int, kind: str, upto: int) -> int:
        """Chunks above ``upto`` (not loaded yet, and not a sign of late rows)."""
        return len(vectors.scan(space, kind, upto, LOAD_BATCH))


def sized(rows: list, at: int, dim: int) -> list:
    """The rows whose vector (``row[at]``, float32 bytes) has ``dim`` dimensions.

    Why: a space's vectors all have its dimension, but one row that does not (a torn
    or foreign write, a restore from another build) made the matrix of every search
    of its scope fail to build (numpy's reshape error as the tool's answer). Such a
    row is left out of vector search; full text still finds it."""
    size = 4 * dim
    return [row for row in rows if len(row[at]) == size]


def _popcount(np, words):
    """Set bits per row (numpy >= 2 counts in C; older numpy through a byte table)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words).sum(axis=1, dtype=np.int32)
    table = np.array([bin(i).count("1") for i in range(256)], np.int32)
    return table[words.view(np.uint8)].sum(axis=1)


def _words(np, signs):
    """Sign bits packed into uint64 words per row (padded to whole words)."""
    packed = np.packbits(signs, axis=-1)
    pad = (-packed.shape[-1]) % 8
    if pad:
        widths = [(0, 0)] * (packed.ndim - 1) + [(0, pad)]
        packed = np.pad(packed, widths)
    return np.ascontiguousarray(packed).view(np.uint64)
