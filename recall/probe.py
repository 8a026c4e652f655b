"""Which embedding space a provider's answers belong to, checked by a probe text.

A space is named by provider, model name, revision and dimension
(``storage.vectors.SpaceIdentity``). For a local model the revision is the
model file's checksum, so another model is another space; an OpenAI-compatible
endpoint is named by its URL and the model name it is asked for, and a server
that starts serving another model under the same name (an ``ollama pull`` of a
new tag, a vLLM redeploy) and the same dimension kept that name: new query
vectors were compared with the old model's vectors, a silently wrong ranking.

So each space keeps the vector its model gave ``PROBE_TEXT`` (``probe`` in
``embedding_spaces``). ``SpaceCheck`` embeds the probe where embeddings already
run (the worker after loading the model and again every ``RECHECK_SECONDS``
before it embeds, or the first search of a process without a worker) and picks
the space whose probe is within ``SAME_COSINE`` of it. Answers that match none
start a new generation of the name (revision ``url#2``): the old vectors stay
out of search, the worker embeds everything again under the new one, and
``/trove embed prune`` frees the old. A probe that fails leaves the vector arm
off (fail closed) with the reason; full text still answers. A space made
before probes were kept takes the first probe it sees.

Measured on this machine: MiniLM-int8 (onnxruntime, 1 or 2 threads, alone or
in a padded batch) and e5-small-q4 give bit-identical probe vectors run to
run and process to process; the two models' vectors of the probe (both 384
wide) have cosine 0.03. ``SAME_COSINE`` leaves room for servers whose results
move with batch composition (GPU float noise, about 1e-3).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..storage.vectors import GENERATION_MARK, SpaceIdentity, VectorStore

# never change the text: every stored probe was made from it (a new text would
# make every space look like another model and embed everything again)
PROBE_TEXT = "trove embedding probe: which model answers under this name?"
SAME_COSINE = 0.99            # the same model when its probe vectors are at least this close
RECHECK_SECONDS = 60.0        # the worker probes again before embedding after this long
RETRY_SECONDS = 30.0          # a failed probe is tried again after this long (vectors off)


@dataclass(frozen=True)
class Verdict:
    """What the last probe found: the space its answers belong to (None: none yet, or
    the probe failed), and what to tell the operator."""

    state: str                # "same", "new", "changed", "failed", "unchecked"
    space: int | None
    revision: str
    detail: str
    vector: bytes | None      # the probe's vector (float32), None when it failed
    at: float

    def report(self) -> dict:
        """The ``model_check`` block of the embedding status."""
        return {"state": self.state, "detail": self.detail,
                "checked_seconds_ago": round(time.monotonic() - self.at, 1)}


def same_answers(np, first: bytes, second: bytes) -> bool:
    """Whether two probe vectors come from the same model (cosine of unit vectors)."""
    a, b = np.frombuffer(first, dtype=np.float32), np.frombuffer(second, dtype=np.float32)
    return a.shape == b.shape and float(a @ b) >= SAME_COSINE


class SpaceCheck:
    """The probe's verdict for one provider, shared by the worker and the searches of a
    process (``Semantic.check``); a probe runs in one thread at a time, and a caller
    that finds one running does not wait for it (a search runs full text meanwhile)."""

    def __init__(self) -> None:
        self.verdict: Verdict | None = None
        self.generation = 0               # bumped when the space changes (query memo key)
        self._lock = threading.Lock()
        self._probing = False

    def space(self, store: VectorStore, provider, timeout: float, *, create: bool,
              recheck: float | None = None) -> int | None:
        """The provider's space, probing when there is no verdict, when the last failed
        ``RETRY_SECONDS`` ago, or when ``recheck`` seconds passed (the worker). ``create``
        (the worker, backfill): a new space is made and the probe kept; a search only
        reads. Raises the provider's error when this call's probe fails."""
        verdict = self.verdict
        due = verdict is None or (verdict.state == "failed" and
                                  time.monotonic() - verdict.at >= RETRY_SECONDS) or (
            recheck is not None and time.monotonic() - verdict.at >= recheck)
        if not due:
            if verdict.space is None and verdict.vector is not None:   # made meanwhile?
                self._settle(store, provider, verdict.vector, create, verdict.state)
            return self.verdict.space
        with self._lock:
            if self._probing:                 # another thread probes: never wait for it
                return verdict.space if verdict is not None else None
            self._probing = True
        try:
            try:
                vector = provider.query(PROBE_TEXT, timeout)
            except Exception as exc:
                self._set(Verdict("failed", None, "", f"the embedding model did not answer "
                                  f"the probe ({type(exc).__name__}: {exc})"[:300], None,
                                  time.monotonic()))
                raise
            probe = provider.np.asarray(vector, dtype=provider.np.float32).tobytes()
            self._settle(store, provider, probe, create, None)
        finally:
            with self._lock:
                self._probing = False
        return self.verdict.space

    def peek(self, store: VectorStore, identity: SpaceIdentity) -> int | None:
        """The space a status read shows without calling the model: the last verdict's,
        else (none yet, or the probe failed) the newest of the name (a status never probes)."""
        if self.verdict is not None and self.verdict.state != "failed":
            return self.verdict.space
        return store.latest_space(identity.provider, identity.model, identity.revision)

    def _settle(self, store: VectorStore, provider, probe: bytes, create: bool,
                state: str | None) -> None:
        """Find (or, with ``create``, make) the space of these answers."""
        identity, np = provider.identity, provider.np
        known = store.generations(identity)
        match = next((row for row in known if row[2] is not None
                      and same_answers(np, row[2], probe)), None)
        if match is None:        # a space made before probes were kept takes this one
            match = next((row for row in known if row[2] is None), None)
            if match is not None and create and not store.set_probe(match[0], probe):
                return self._settle(store, provider, probe, create, state)   # raced
        last = self.verdict
        if match is not None:
            space, revision = match[0], match[1]
            if state or last is None or last.state == "failed":
                fresh = state or "same"
            elif last.space == space:         # what this process found stays said
                fresh = last.state if last.state in ("changed", "new") else "same"
            else:
                fresh = "changed" if last.space is not None else last.state
        elif not known:
            space, revision, fresh = None, identity.revision, state or "new"
        else:
            space, revision, fresh = None, _next_revision(identity.revision, known), \
                state or "changed"
        if space is None and create:
            space = store.space_id(SpaceIdentity(identity.provider, identity.model, revision,
                                                 identity.dim))
            if not store.set_probe(space, probe):      # another process made it first
                return self._settle(store, provider, probe, create, state)
        detail = _detail(fresh, identity, revision, known)
        self._set(Verdict(fresh, space, revision, detail, probe,
                          time.monotonic() if state is None else last.at))

    def _set(self, verdict: Verdict) -> None:
        last = self.verdict
        if last is None or last.space != verdict.space:
            self.generation += 1
        self.verdict = verdict


def _next_revision(base: str, known: list) -> str:
    """``base#n`` for the first n past every generation of the name."""
    taken = {row[1] for row in known}
    n = 2
    while f"{base}{GENERATION_MARK}{n}" in taken:
        n += 1
    return f"{base}{GENERATION_MARK}{n}"


def _detail(state: str, identity: SpaceIdentity, revision: str, known: list) -> str:
    """The verdict in words, for status and the doctor."""
    name = f"{identity.provider} {identity.model}"
    if state == "changed":
        return (f"{name} now answers as a different model than the one that made the "
                f"stored vectors (probe text compared): its answers are a new space "
                f"({revision}); the old vectors are kept out of search, the index is "
                f"embedded again, and /trove embed prune apply frees the old ones")
    if state == "new":
        return f"{name}: a new index (no earlier vectors of this name)"
    if revision != identity.revision:
        return (f"{name} answers as its generation {revision.rsplit(GENERATION_MARK, 1)[1]}"
                f" (the name answered as another model before; /trove embed prune lists "
                f"the older vectors)")
    return f"{name} answers as the model that made its vectors"
