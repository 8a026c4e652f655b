"""Summary nodes and lineage on a 3-level DAG."""

import pytest

from hermes_trove.storage import database
from hermes_trove.dag import Dag, NewNode
from hermes_trove.store import Store


@pytest.fixture()
def parts(tmp_path):
    db = database.get_database(tmp_path / "trove.db")
    yield Store(db), Dag(db)
    database.forget_database(tmp_path / "trove.db")


def leaf(session, ids, text="leaf"):
    return NewNode(session_id=session, depth=0, text=text, token_count=3, source_token_count=30,
                   level=3, model="deterministic", child_store_ids=ids)


def build_three_levels(store, dag):
    """12 messages -> 6 leaves (2 each) -> 2 depth-1 nodes (3 leaves each) -> 1 depth-2 root."""
    store.ingest("s", [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                       for i in range(12)])
    leaves = [dag.add_node(leaf("s", [2 * i + 1, 2 * i + 2], f"leaf {i}")) for i in range(6)]
    mids = [dag.add_node(NewNode("s", 1, f"mid {j}", 3, 9, 3, "deterministic",
                                 child_node_ids=leaves[3 * j:3 * j + 3])) for j in range(2)]
    root = dag.add_node(NewNode("s", 2, "root", 3, 6, 3, "deterministic", child_node_ids=mids))
    return leaves, mids, root


def test_descendants_reach_exactly_the_raw_messages_in_order(parts):
    store, dag = parts
    leaves, mids, root = build_three_levels(store, dag)
    assert dag.descendant_store_ids(root) == list(range(1, 13))
    assert dag.descendant_store_ids(mids[1]) == list(range(7, 13))
    assert dag.descendant_store_ids(leaves[2]) == [5, 6]


def test_children_frontier_and_coverage(parts):
    store, dag = parts
    leaves, mids, root = build_three_levels(store, dag)
    assert [c["id"] for c in dag.children(root)] == mids
    assert [c["kind"] for c in dag.children(leaves[0])] == ["message", "message"]
    assert [c["id"] for c in dag.children(mids[0], offset=1, limit=1)] == [leaves[1]]
    assert [n["node_id"] for n in dag.frontier("s")] == [root]
    assert dag.covering_nodes(7) == [leaves[3]]
    assert dag.covered_store_ids([1, 2, 99]) == {1, 2}
    node = dag.get_node(root)
    assert (node["message_count"], node["first_store_id"], node["last_store_id"]) == (12, 1, 12)
    assert dag.parents(mids[0]) == [root]
    assert dag.stats("s")["by_depth"][0]["nodes"] == 6


def test_frontier_lists_parentless_nodes_oldest_first(parts):
    store, dag = parts
    store.ingest("s", [{"role": "user", "content": f"x{i}"} for i in range(4)])
    a = dag.add_node(leaf("s", [1, 2]))
    b = dag.add_node(leaf("s", [3, 4]))
    assert [n["node_id"] for n in dag.frontier("s")] == [a, b]


def test_invalid_lineage_is_refused(parts):
    store, dag = parts
    store.ingest("s", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError):
        dag.add_node(leaf("s", [1, 999]))
    a = dag.add_node(leaf("s", [1]))
    with pytest.raises(ValueError):
        dag.add_node(NewNode("s", 2, "skip a level", 1, 1, 3, "d", child_node_ids=[a]))
    with pytest.raises(ValueError):
        dag.add_node(NewNode("s", 1, "both", 1, 1, 3, "d", child_node_ids=[a], child_store_ids=[1]))
    with pytest.raises(ValueError):
        dag.add_node(NewNode("s", 1, "ghost child", 1, 1, 3, "d", child_node_ids=[a, 999]))


def test_a_fold_may_merge_nodes_of_mixed_depths(parts):
    """The deepest child sets the depth; shallower siblings are allowed (a fold of the
    oldest frontier nodes), and coverage still comes from the lineage."""
    store, dag = parts
    store.ingest("s", [{"role": "user", "content": f"m{i}"} for i in range(4)])
    leaves = [dag.add_node(leaf("s", [i])) for i in (1, 2, 3)]
    mid = dag.add_node(NewNode("s", 1, "mid", 1, 1, 3, "d", child_node_ids=leaves[:2]))
    fold = dag.add_node(NewNode("s", 2, "fold", 1, 1, 3, "d", child_node_ids=[mid, leaves[2]]))
    assert dag.descendant_store_ids(fold) == [1, 2, 3]
    assert dag.get_nodes([fold])[fold]["message_count"] == 3
    with pytest.raises(ValueError):
        dag.add_node(NewNode("s", 3, "skips", 1, 1, 3, "d", child_node_ids=[fold - 1]))


def test_carried_nodes_join_the_new_sessions_frontier_with_lineage_intact(parts):
    store, dag = parts
    leaves, mids, root = build_three_levels(store, dag)
    dag.carry_nodes("new", [root])
    assert [n["node_id"] for n in dag.frontier("new")] == [root]
    assert dag.descendant_store_ids(root) == list(range(1, 13))
    # A node of the new session condensing the carried one takes it off the new frontier only.
    store.ingest("new", [{"role": "user", "content": "fresh"}])
    new_leaf = dag.add_node(leaf("new", [13]))
    assert {n["node_id"] for n in dag.frontier("new")} == {root, new_leaf}
    assert [n["node_id"] for n in dag.frontier("s")] == [root]


def test_footer_is_written_with_the_node_id_and_summary_fts_finds_it(parts):
    store, dag = parts
    store.ingest("s", [{"role": "user", "content": "x"}])
    node_id = dag.add_node(leaf("s", [1], "retry backoff decided"),
                           footer=lambda nid, cov: f" [node {nid}, {cov['message_count']} msgs]")
    assert dag.get_node(node_id)["text"] == f"retry backoff decided [node {node_id}, 1 msgs]"
    assert [r[0] for r in dag.fts_candidates('"backoff"', limit=5)] == [node_id]


def test_fold_reads_a_bounded_source_and_repeats_until_the_frontier_fits(parts):
    """A long frontier (an upgraded database, a small window) is folded oldest-first in
    bounded steps, never in one huge summarizer call, until it fits its budget."""
    from hermes_trove.compaction.compactor import Compactor, PassReport
    from hermes_trove.compaction.summarize import CircuitBreaker, Summarizer

    store, dag = parts
    store.ingest("s", [{"role": "user", "content": f"fact {i}: port {6000 + i}"} for i in range(24)])
    for i in range(1, 25, 2):
        dag.add_node(leaf("s", [i, i + 1], text=f"leaf about ports {6000 + i} " * 12))
    seen = []
    summarizer = Summarizer(llm_call=None, count_tokens=lambda t: len(t) // 4, models=[],
                            breaker=CircuitBreaker(2, 60), timeout_s=1.0)
    real = summarizer.summarize

    def recording(items, **kw):
        seen.append(sum(len(i.text) // 4 for i in items))
        return real(items, **kw)

    summarizer.summarize = recording
    compactor = Compactor(dag, summarizer, lambda t: len(t) // 4, leaf_budget=200,
                          condensed_budget=250)
    cost = lambda n: len(n["text"]) // 4 + 8  # noqa: E731
    folds = 0
    while compactor.fold_to_fit("s", budget_tokens=400, cost=cost, max_source_tokens=300,
                                focus=None, deterministic_only=True, report=PassReport()):
        folds += 1
        assert folds < 20
    frontier = dag.frontier("s")
    assert folds >= 2 and sum(cost(n) for n in frontier) <= 400
    assert max(seen) <= 300 + max(cost(n) for n in frontier)  # bounded, two nodes at least
    assert [s for n in frontier for s in dag.descendant_store_ids(n["node_id"])] == list(range(1, 25))


def test_substring_scan_of_summaries_goes_page_by_page(tmp_path):
    from hermes_trove.dag import Dag, NewNode
    from hermes_trove.storage.database import Database
    from hermes_trove.store import Store

    db = Database(str(tmp_path / "t.db"))
    store, dag = Store(db), Dag(db)
    ids = store.ingest("s", [{"role": "user", "content": f"m{i}"} for i in range(30)]).store_ids
    nodes = []
    for i in range(30):
        text = f"会議 {i}" + (" 東京駅" if i % 3 == 0 else "")
        nodes.append(dag.add_node(NewNode(
            session_id="s" if i % 2 else "t", depth=0, text=text, token_count=3,
            source_token_count=3, level=3, model="", child_store_ids=[ids[i]],
            child_node_ids=[])))
    want = [n for i, n in enumerate(nodes) if i % 3 == 0][::-1]
    assert dag.substring_scan(None, ["東京駅"], limit=50, max_rows=100, page_rows=4) == want
    assert dag.substring_scan(None, ["東京駅"], limit=50, max_rows=100) == want
    assert dag.substring_scan(None, ["東京駅"], limit=3, max_rows=100, page_rows=4) == want[:3]
    assert dag.substring_scan(["s"], ["東京駅"], limit=50, max_rows=100, page_rows=4) == [
        n for i, n in enumerate(nodes) if i % 3 == 0 and i % 2][::-1]
    # at most max_rows of the newest nodes are read
    assert dag.substring_scan(None, ["東京駅"], limit=50, max_rows=6, page_rows=4) == [
        n for n in want if n in nodes[-6:]]
    db.close()
