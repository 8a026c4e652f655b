"""Background preparation under random steps: turns, worker rounds (leaves, merges),
an edit under a prepared chunk, and compactions in any order. After every step the
lineage stays exact and nothing shown is lost."""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_trove.compaction import assemble, prepare
from hermes_trove.storage import prepared

from enginekit import DEFAULT_OVERHEAD, coding_turn, make_engine

SYSTEM = {"role": "system", "content": "sys"}
STEPS = st.lists(st.sampled_from(["turns", "turns", "leaves", "merges", "compress", "edit"]),
                 min_size=4, max_size=14)


class Numbered:
    """A model whose every answer is different (so texts tell calls apart)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, prompt, model, timeout):
        self.calls += 1
        return f"- answer {self.calls}: the user asked about the modules [m1]"


def check_lineage(engine) -> None:
    conn = engine.store.db.conn
    rows = [r[0] for r in conn.execute("SELECT child_store_id FROM node_edges"
                                       " WHERE child_store_id IS NOT NULL")]
    assert len(rows) == len(set(rows)), "a message under two leaves"
    parents = Counter(r[0] for r in conn.execute("SELECT child_node_id FROM node_edges"
                                                 " WHERE child_node_id IS NOT NULL"))
    assert not parents or max(parents.values()) == 1, "a node under two parents"
    for node_id, depth, first, last in conn.execute(
            "SELECT node_id, depth, first_store_id, last_store_id FROM nodes WHERE depth > 0"):
        kids = conn.execute("SELECT n.depth, n.first_store_id, n.last_store_id FROM node_edges e"
                            " JOIN nodes n ON n.node_id = e.child_node_id WHERE e.parent_id = ?"
                            " ORDER BY e.ordinal", (node_id,)).fetchall()
        assert max(k[0] for k in kids) == depth - 1
        assert [k[1] for k in kids] == sorted(k[1] for k in kids)
        assert (first, last) == (min(k[1] for k in kids), max(k[2] for k in kids))


def check_nothing_lost(engine, shown: list[dict], out: list[dict]) -> None:
    """Every message the host showed is stored, and is summarized or still raw in the
    returned prompt; the newest user message is there. (A row whose source was edited
    under it stays stored as it was: the shown text is stored again.)"""
    session = engine.canonical_id
    stored = engine.store.session_messages(session, limit=100_000)
    covered = engine.dag.covered_store_ids(r["store_id"] for r in stored)
    summarized = {r["content"] for r in stored if r["store_id"] in covered}
    kept = {r["content"] for r in stored}
    raw_out = {m.get("content") for m in out if not assemble.is_trove_message(m)}
    for message in shown:
        assert message["content"] in kept, "a shown message was not stored"
        assert message["content"] in summarized or message["content"] in raw_out, (
            "a shown message is neither summarized nor in the prompt")
    newest_user = next(m for m in reversed(shown) if m["role"] == "user")
    assert newest_user["content"] in raw_out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=STEPS)
def test_random_preparation_steps_keep_lineage_and_lose_nothing(tmp_path_factory, steps):
    tmp = tmp_path_factory.mktemp("prep")
    engine = make_engine(tmp, window=200_000, llm=Numbered(), leaf_chunk_tokens=800,
                         fresh_tail_count=6, condense_fanout=2)
    cfg = engine.config
    job = prepare.Job(db_path=engine.store.db.path, session_id=engine.canonical_id,
                      fresh_tail_count=cfg.fresh_tail_count, chunk_tokens=cfg.leaf_chunk_tokens,
                      leaf_budget=200, summarizer=engine.summarizer(), lease_seconds=60,
                      condensed_budget=300, fanout=2, max_depth=cfg.incremental_max_depth)
    shown: list[dict] = []   # what the host holds (after compactions: the tail)
    every: list[dict] = []   # every message the host ever showed
    t = 0
    for step in ["turns", "turns"] + steps + ["compress"]:
        if step == "turns":
            for _ in range(4):
                turn = [dict(m, content=f"{m['content']} #{t}") for m in coding_turn(t)]
                t += 1
                shown += turn
                every += turn
            engine.ingest(shown)
        elif step == "leaves":
            prepare.prepare_chunks(engine.store.db, job, owner="w")
        elif step == "merges":
            prepare.prepare_groups(engine.store.db, job, owner="w")
        elif step == "edit":  # a prepared chunk's source changes under it
            ready = prepared.ready(engine.store.db.conn, engine.canonical_id)
            if ready:
                edited = ready[-1]["store_ids"][0]
                with engine.store.db.transaction() as conn:  # a unique hash per edited row
                    conn.execute("UPDATE messages SET content_hash = ? WHERE store_id = ?",
                                 (f"edited-{edited}", edited))
        else:
            current = DEFAULT_OVERHEAD + engine.counter.count_messages([SYSTEM] + shown)
            out = engine.compress([SYSTEM] + shown, current_tokens=current, force=True)
            shown = out[1:]
            check_nothing_lost(engine, every, out)
        check_lineage(engine)
