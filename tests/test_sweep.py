"""The bounded threshold full sweep (issue #17, item 3)."""
from hermes_trove.compaction import sweep
from hermes_trove.compaction.summarize import CircuitBreaker, SourceItem, Summarizer

from enginekit import DEFAULT_OVERHEAD, coding_turn, make_engine


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def llm(calls):
    def call(prompt, model, timeout):
        calls.append(1)
        return "- we decided to keep the handlers [m1]"
    return call


def items(n=5):
    return [SourceItem(f"m{i}", "user", "We decided to set pool_size=4 in src/db/pool.py. " * 30)
            for i in range(n)]


def test_bounded_summarizer_goes_deterministic_after_its_calls_or_deadline():
    calls = []
    inner = Summarizer(llm_call=llm(calls), count_tokens=lambda t: len(t) // 4, models=[None],
                       breaker=CircuitBreaker(3, 60), timeout_s=1)
    clock = Clock()
    bounded = sweep.Sweep(max_calls=2, deadline_seconds=10, clock=clock).bound(inner)
    levels = [bounded.summarize(items(), budget_tokens=100, depth=0).level for _ in range(4)]
    assert levels == [1, 1, 3, 3] and len(calls) == 2
    timed = sweep.Sweep(max_calls=99, deadline_seconds=10, clock=clock)
    bounded = timed.bound(inner)
    assert bounded.summarize(items(), budget_tokens=100, depth=0).level == 1
    clock.now = 11
    assert bounded.summarize(items(), budget_tokens=100, depth=0).level == 3
    assert timed.describe() == {"calls": 1, "max_calls": 99, "capped": 1, "deadline_passed": True}


def run_backlog(tmp_path, **settings):
    calls = []
    engine = make_engine(tmp_path, window=200_000, llm=llm(calls), leaf_chunk_tokens=500,
                         fresh_tail_count=8, **settings)
    messages = [{"role": "system", "content": "sys"}]
    for t in range(60):
        messages += coding_turn(t)
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    out = engine.compress(messages, current_tokens=current, force=True)
    return engine, calls, messages, out


def test_full_sweep_drains_the_backlog_within_twelve_calls(tmp_path):
    engine, calls, messages, out = run_backlog(tmp_path / "on", threshold_full_sweep_enabled=1)
    outcome = engine.get_status()["last_compaction"]
    assert len(calls) <= sweep.MAX_CALLS
    assert outcome["sweep"]["calls"] == len(calls) and outcome["sweep"]["capped"] > 0
    assert 3 in outcome["levels"]  # the rest of the sweep was deterministic
    # the whole backlog is summarized: every stored message is covered or shown raw
    stored = engine.store.session_messages(engine.canonical_id, limit=10_000)
    covered = {s for n in engine.dag.frontier(engine.canonical_id)
               for s in engine.dag.descendant_store_ids(n["node_id"])}
    raw = [r for r in stored if r["store_id"] not in covered]
    assert len(raw) <= 12 and out[-1] == messages[-1]
    # unbounded, the same backlog costs more calls than the sweep may make
    _, unbounded, _, _ = run_backlog(tmp_path / "off")
    assert len(unbounded) > sweep.MAX_CALLS


def test_full_sweep_condenses_only_past_the_prefix_target(tmp_path):
    engine, _, _, _ = run_backlog(tmp_path / "big", threshold_full_sweep_enabled=1,
                                  summary_prefix_target_tokens=1_000_000)
    assert engine.get_status()["last_compaction"]["condensed_nodes"] == []
    engine, _, _, _ = run_backlog(tmp_path / "small", threshold_full_sweep_enabled=1,
                                  summary_prefix_target_tokens=1)
    assert engine.get_status()["last_compaction"]["condensed_nodes"]
