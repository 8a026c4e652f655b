#!/usr/bin/env python3
"""Soak: thousands of random steps over the real Hermes CLI object (issue 24).

Runs the generative test's walks (tests/walkkit.py, driving ``cli.HermesCLI``
through tests/clikit.py against a fake model on 127.0.0.1, 65,536-token
window, default trove settings) until ``--steps`` steps are done, each walk in a
fresh HERMES_HOME, and prints per walk and in total: walks, steps, duplicates,
losses, misfiled and phantom rows, starved tails, tail sizes after compactions
(min / median), requests over the host's threshold or the window after a
compaction. Every check runs after every step (see walkkit); unlike the test a
soak walk does not stop at its first failure.

    .venv/bin/python bench/soak.py --steps 2000 --seed 1          # ~13 min
    .venv/bin/python bench/soak.py --steps 300 --seed 1           # ~2 min
    .venv/bin/python bench/soak.py --seed 2400 --steps 40 --walk-steps 40   # replay a test walk
    .venv/bin/python bench/soak.py --steps 600 --weight branch=10 --weight restart=10  # rare flows
    PG_TROVE_TEST_URL=postgresql://... .venv/bin/python bench/soak.py --postgres --steps 300
    .venv/bin/python bench/soak.py --reviews --steps 300 --weight tool=8   # review forks on
    .venv/bin/python bench/soak.py --reviews in-turn --in-process --steps 300

``--postgres``: trove stores on PostgreSQL (``TROVE_DATABASE_URL``), each walk in a
fresh schema of the server ``PG_TROVE_TEST_URL`` names (tests/pgkit.py, dropped after
the walk), and the oracle reads the rows there.

``--reviews``: the host's background review forks on, often (tests/reviewkit.py: a
memory review every 3 user turns, a skill review after every 2 tool iterations), each
run between two steps and checked: nothing of it stored, no session row, the user's
rows unchanged. ``--reviews in-turn``: each fork runs inside the next model request
of a turn instead (a compaction's summary call or a turn's request, the parent
waiting), in this process's CLIs. Off, every seed walks as before.

Writes bench/results/soak.json. Exit status 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"


def _isolate() -> None:
    """Default settings and a throw-away home, as the tests have them."""
    for key in [k for k in os.environ if k.startswith("TROVE_")]:
        del os.environ[key]
    os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="trove-soak-home-")
    os.environ["HERMES_EXIT_WATCHDOG_S"] = "0"
    os.environ.pop("HERMES_SESSION_ID", None)


def step_weights(defaults: dict, overrides: list, error) -> dict:
    """The walk's step weights: the test's defaults with ``STEP=N`` overrides, so a
    soak can stress the rare flows (a branch, a restart, a second process) that the
    defaults pick a few times per hundred steps. An unknown step or a weight that
    is not a whole number >= 0 is an error, not a silent default."""
    weights = dict(defaults)
    for item in overrides:
        name, _, value = item.partition("=")
        if name not in weights or not value.isdigit():
            error(f"--weight {item!r}: expected STEP=N with STEP one of {sorted(weights)}")
        weights[name] = int(value)
    if not any(weights.values()):
        error("--weight: every step weighs 0")
    return weights


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="total random steps (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first walk (then +1 per walk)")
    parser.add_argument("--walk-steps", type=int, default=60, help="steps per walk (default 60)")
    parser.add_argument("--largest-turn", type=int, default=8000, help="largest user turn in tokens")
    parser.add_argument("--in-process", action="store_true",
                        help="the second CLI is a second HermesCLI object in this process "
                             "(default: a real second OS process)")
    parser.add_argument("--postgres", action="store_true",
                        help="store on PostgreSQL: a fresh schema per walk on PG_TROVE_TEST_URL")
    parser.add_argument("--reviews", nargs="?", const="between", default=False,
                        choices=["between", "in-turn"],
                        help="the host's background review forks on (memory and skill reviews "
                             "every few turns), each checked against the store; run between "
                             "two steps (default) or in-turn: inside the next turn's request")
    parser.add_argument("--show", type=int, default=5, help="failures to print per walk")
    parser.add_argument("--weight", action="append", default=[], metavar="STEP=N",
                        help="this step's weight instead of walkkit.STEP_WEIGHTS' (repeatable;"
                             " e.g. --weight branch=10 --weight restart=8 to stress rare flows)")
    args = parser.parse_args(argv)

    _isolate()
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(HERE))
    import clikit as ck
    import hostkit as hk
    import pgkit
    import walkkit as wk
    from synth import save_results

    if args.postgres and pgkit.pg_unavailable():
        parser.error(f"--postgres: {pgkit.pg_unavailable()}")
    weights = step_weights(wk.STEP_WEIGHTS, args.weight, parser.error)

    total = wk.WalkStats()
    walks = []
    started = time.perf_counter()
    with hk.FakeOpenAIServer(prompt_tokens_fn=ck.real_prompt_tokens) as server:
        seed = args.seed
        while total.steps < args.steps:
            steps = min(args.walk_steps, args.steps - total.steps)
            with tempfile.TemporaryDirectory(prefix="trove-soak-") as tmp, \
                    pgkit.store_env(args.postgres) as store:
                with ck.CliHost(Path(tmp), server=server, responder=wk.ScriptedModel(seed),
                                extra_env=store, reviews=args.reviews) as host:
                    walk = wk.Walk(host, seed, steps=steps, stop_at_first=False,
                                   use_process=not args.in_process,
                                   largest_turn=args.largest_turn, weights=weights)
                    stats = walk.run()
                    server.clear()
            total.add(stats)
            summary = stats.summary()
            walks.append({"seed": seed, **summary, "failures": stats.failures[:20]})
            print(f"walk seed={seed}: " + json.dumps(summary), flush=True)
            for line in stats.failures[:args.show]:
                print("   " + line[:300], flush=True)
            seed += 1
    seconds = time.perf_counter() - started
    figures = total.summary()
    figures["seconds"] = round(seconds, 1)
    figures["steps_per_second"] = round(total.steps / seconds, 2) if seconds else None
    figures["step_counts"] = dict(total.step_counts)
    print("\nTOTAL " + json.dumps(figures, indent=1))
    name = "soak_postgres" if args.postgres else "soak"
    path = save_results(name + ("_reviews" if args.reviews else ""), args=vars(args), totals=figures,
                        walks=walks)
    print(f"wrote {path}")
    return 0 if total.clean else 1


if __name__ == "__main__":
    sys.exit(main())
