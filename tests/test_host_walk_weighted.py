"""The replays of host walks with rare flows weighted up (``test_host_walk.WEIGHTED_REPLAYS``:
the seed, weights, steps and the flow each once failed on are documented there).

A file of its own so that the suite's two workers (whole files each) share the walks."""
import pytest

import walkkit as wk
from test_host_walk import (LONG_WEIGHTED, PROCESS_REPLAYS, REPLAY_STEPS,  # noqa: F401
                            WEIGHTED_REPLAYS, run_walk, server)  # server: the fake model

pytestmark = pytest.mark.host


@pytest.mark.parametrize("seed", sorted(WEIGHTED_REPLAYS))
def test_walks_with_rare_flows_weighted_up_keep_every_message_once(tmp_path, server, seed):
    weights, steps, *largest = WEIGHTED_REPLAYS[seed]
    if REPLAY_STEPS and steps > REPLAY_STEPS:
        pytest.skip(f"a {steps}-step replay (HOSTWALK_REPLAY_STEPS=0 runs it); "
                    f"its fault's own test: {LONG_WEIGHTED[seed]}")
    sizes = {"largest_turn": largest[0]} if largest else {}
    w = run_walk(tmp_path, server, seed, steps, use_process=seed in PROCESS_REPLAYS,
                 weights=weights, **sizes)
    assert w.stats.steps == steps
    changed = " ".join(f"--weight {k}={v}" for k, v in weights.items() if v != wk.STEP_WEIGHTS[k])
    changed += f" --largest-turn {largest[0]}" if largest else ""
    assert w.stats.clean, (wk.describe(w.stats) + f"\nsteps: {w.log}\nreplay: python bench/soak.py"
                           f" --seed {seed} --steps {steps} --walk-steps {steps}"
                           f"{'' if seed in PROCESS_REPLAYS else ' --in-process'} {changed}")
