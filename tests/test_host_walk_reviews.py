"""Host walks with the host's background review forks on (tests/reviewkit.py,
``bench/soak.py --reviews``): a short walk each way a fork runs.

A file of its own so that the suite's two workers (whole files each) share the walks."""
import os

import pytest

import walkkit as wk
from test_host_walk import largest_turn, run_walk, server  # noqa: F401 (the fake model)

pytestmark = pytest.mark.host


# With the host's background review forks on (``bench/soak.py --reviews``, tests/reviewkit.py):
# a memory review every 3 user turns and a skill review after every 2 tool iterations, each
# fork (sharing the user's session id, with its own engine copy) run alone and checked:
# nothing of it stored anywhere, no row of a session table changed by it (no session row,
# the user's rows, views, owners and summaries as they were); the oracle's checks as in
# every walk. Tool turns, /compress, /undo, /retry, /branch, restarts and /resume weighted
# up. The first walk's forks run inside the next turn's main request (``--reviews in-turn``,
# its second CLI in this process), the second's between two steps (its second CLI a real
# second OS process, which runs its own forks before each answer).
REVIEW_WEIGHTS = dict(wk.STEP_WEIGHTS, tool=8, compress=6, undo=5, retry=5, branch=4, restart=4,
                      resume=4)
REVIEW_WALKS = int(os.environ.get("HOSTWALK_REVIEW_WALKS", "2"))
REVIEW_STEPS = int(os.environ.get("HOSTWALK_REVIEW_STEPS", "40"))
REVIEW_SEED = int(os.environ.get("HOSTWALK_REVIEW_SEED", "3150000"))


@pytest.mark.parametrize("walk", range(REVIEW_WALKS))
def test_walks_with_review_forks_keep_every_message_once_and_store_nothing_of_a_fork(
        tmp_path, server, walk):
    seed = REVIEW_SEED + walk
    timing = "between" if walk % 2 else "in-turn"
    w = run_walk(tmp_path, server, seed, REVIEW_STEPS, reviews=timing, use_process=bool(walk % 2),
                 weights=REVIEW_WEIGHTS, largest_turn=largest_turn(walk))
    assert w.stats.steps == REVIEW_STEPS
    assert w.stats.forks, "no review fork ran: the walk checked nothing of them"
    changed = " ".join(f"--weight {k}={v}" for k, v in REVIEW_WEIGHTS.items()
                       if v != wk.STEP_WEIGHTS[k])
    assert w.stats.clean, (wk.describe(w.stats) + f"\nsteps: {w.log}\nreplay: python bench/soak.py"
                           f" --reviews {timing} --seed {seed} --steps {REVIEW_STEPS}"
                           f" --walk-steps {REVIEW_STEPS} --largest-turn {largest_turn(walk)}"
                           f"{'' if walk % 2 else ' --in-process'} {changed}")
