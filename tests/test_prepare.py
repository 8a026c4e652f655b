"""Background preparation of leaf summaries (issue #17, item 1)."""
import threading
import time

from hermes_trove.compaction import prepare
from hermes_trove.compaction.compactor import PassReport
from hermes_trove.storage import locks, prepared
from hermes_trove.storage.database import Database

from enginekit import DEFAULT_OVERHEAD, coding_turn, drive, make_engine


class CountingLLM:
    """A model that answers a short bullet list and counts who called it from where."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, prompt, model, timeout):
        with self.lock:
            self.calls.append(threading.current_thread().name)
        return "- the user asked to check modules; we decided to keep the handlers [m1]"


def stored_engine(tmp_path, llm, turns=40, **settings):
    settings.setdefault("leaf_chunk_tokens", 1000)
    settings.setdefault("fresh_tail_count", 8)
    engine = make_engine(tmp_path, window=200_000, llm=llm, **settings)
    messages = [{"role": "system", "content": "sys"}]
    for t in range(turns):
        messages += coding_turn(t)
    engine.ingest(messages[1:])
    return engine, messages


def job_for(engine, llm_summarizer=None):
    cfg = engine.config
    return prepare.Job(db_path=engine.store.db.path, session_id=engine.canonical_id,
                       fresh_tail_count=cfg.fresh_tail_count, chunk_tokens=cfg.leaf_chunk_tokens,
                       leaf_budget=300, summarizer=llm_summarizer or engine.summarizer(),
                       lease_seconds=60)


def test_worker_prepares_full_chunks_outside_the_tail_once(tmp_path):
    llm = CountingLLM()
    engine, _ = stored_engine(tmp_path, llm)
    job = job_for(engine)
    chunks = prepare.candidate_chunks(engine.store.db, job)
    assert chunks and all(len(c) > 1 for c in chunks)
    newest = max(r["store_id"] for c in chunks for r in c)
    assert newest <= engine.store.count_messages(engine.canonical_id) - job.fresh_tail_count
    other = Database(engine.store.db.path)  # a second process: its own connection
    try:
        first = prepare.prepare_chunks(engine.store.db, job, owner="proc-a")
        assert first == min(len(chunks), prepare.MAX_CHUNKS_PER_RUN)
        # other processes only ever take chunks nobody prepared: no store_id twice
        for owner in ("proc-b", "proc-c", "proc-d", "proc-e"):
            prepare.prepare_chunks(other, job, owner=owner)
        ready = prepared.ready(engine.store.db.conn, engine.canonical_id)
        ids = [s for entry in ready for s in entry["store_ids"]]
        assert len(ids) == len(set(ids)) and ids == sorted(ids)
        assert len(ready) == len(llm.calls)  # one call per prepared chunk, none wasted
        calls = len(llm.calls)
        assert prepare.prepare_chunks(other, job, owner="proc-f") == 0
        assert len(llm.calls) == calls
    finally:
        other.close()


def test_a_live_claim_is_respected_and_an_expired_one_taken_over(tmp_path):
    engine, _ = stored_engine(tmp_path, CountingLLM())
    db = engine.store.db
    chunk = prepare.candidate_chunks(db, job_for(engine))[0]
    ids = [r["store_id"] for r in chunk]
    digest = prepared.source_hash((r["store_id"], r["content_hash"]) for r in chunk)
    with db.transaction() as conn:
        assert prepared.claim(conn, engine.canonical_id, ids, digest, "a", 60, now=1000.0)
        assert not prepared.claim(conn, engine.canonical_id, ids, digest, "b", 60, now=1030.0)
        assert prepared.claim(conn, engine.canonical_id, ids, digest, "b", 60, now=1061.0)
        assert not prepared.fill(conn, engine.canonical_id, ids[0], "a", {"text": "late"})
        assert prepared.fill(conn, engine.canonical_id, ids[0], "b", {"text": "x"})
        assert not prepared.claim(conn, engine.canonical_id, ids, digest, "c", 60, now=5000.0)


def test_compress_uses_ready_summaries_and_calls_the_model_less(tmp_path):
    llm = CountingLLM()
    engine, messages = stored_engine(tmp_path, llm)
    assert prepare.prepare_chunks(engine.store.db, job_for(engine), owner="w") >= 1
    ready_before = prepared.states(engine.store.db.conn, engine.canonical_id)["ready"]
    calls_before = len(llm.calls)
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    out = engine.compress(messages, current_tokens=current, force=True)
    outcome = engine.get_status()["last_compaction"]
    assert outcome["prepared_used"] == ready_before
    assert out[-1] == messages[-1]
    # every raw message the compaction took is covered exactly once
    leaves = outcome["leaf_nodes"]
    children = [c for n in leaves for c in engine.dag.descendant_store_ids(n)]
    assert len(children) == len(set(children))
    assert len(llm.calls) - calls_before < len(leaves)
    assert prepared.states(engine.store.db.conn, engine.canonical_id)["ready"] == 0


def test_a_prepared_summary_whose_sources_changed_is_discarded(tmp_path):
    llm = CountingLLM()
    engine, messages = stored_engine(tmp_path, llm)
    prepare.prepare_chunks(engine.store.db, job_for(engine), owner="w")
    ready = prepared.ready(engine.store.db.conn, engine.canonical_id)
    first = ready[0]
    with engine.store.db.transaction() as conn:  # an edit of a summarized source
        conn.execute("UPDATE messages SET content_hash = 'edited' WHERE store_id = ?",
                     (first["store_ids"][1],))
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    engine.compress(messages, current_tokens=current, force=True)
    texts = [engine.dag.get_node(n)["text"] for n in
             engine.get_status()["last_compaction"]["leaf_nodes"]]
    first_leaf = [n for n in engine.get_status()["last_compaction"]["leaf_nodes"]
                  if first["store_ids"][0] in engine.dag.descendant_store_ids(n)]
    assert first_leaf and texts  # the chunk was summarized again, not taken as prepared
    assert engine.dag.get_node(first_leaf[0])["text"] != first["summary"]["text"]
    # The edited row no longer matches what the host shows, so it and every shown message
    # after it are new rows (stored order follows the transcript): chunks after the edit
    # no longer line up with the backlog either, and at most the others are used.
    assert engine.get_status()["last_compaction"]["prepared_used"] <= len(ready) - 1
    assert prepared.ready(engine.store.db.conn, engine.canonical_id) == []


def test_engine_starts_the_worker_between_share_and_trigger_and_reports_it(tmp_path):
    llm = CountingLLM()
    engine = make_engine(tmp_path, window=64_000, llm=llm, background_prepare_share=0.5,
                         leaf_chunk_tokens=1000, fresh_tail_count=8)
    messages, _, outputs = [], [], []
    for t in range(200):
        messages += coding_turn(t)
        engine.ingest(messages)
        current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
        if current >= 0.5 * engine.threshold_tokens:
            break
    assert not engine.should_compress(current)  # under the trigger: no compaction...
    assert prepare.wait(engine.store.db.path, engine.canonical_id, timeout=30)
    assert any(name.startswith("trove-prepare") for name in llm.calls)  # ...but prepared
    status = engine.get_status()["background_prepare"]
    assert status["share"] == 0.5 and status["runs"] == 1 and status["prepared"] >= 1
    assert status["chunks"]["ready"] == status["prepared"] and not status["running"]


def test_off_by_default_and_compaction_unchanged(tmp_path):
    llm = CountingLLM()
    engine = make_engine(tmp_path, window=64_000, llm=llm, leaf_chunk_tokens=1000)
    drive(engine, 120)
    assert not any(name.startswith("trove-prepare") for name in llm.calls)
    assert engine.get_status()["background_prepare"]["runs"] == 0


def test_a_small_unprepared_remainder_stays_raw_instead_of_costing_a_call(tmp_path):
    llm = CountingLLM()
    engine, messages = stored_engine(tmp_path, llm, leaf_chunk_tokens=20_000)
    assert prepare.prepare_chunks(engine.store.db, job_for(engine), owner="w") == 1
    for t in range(40, 42):  # two more turns push a few messages out of the tail
        messages += coding_turn(t)
    engine.ingest(messages[1:])
    calls_before = len(llm.calls)
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    out = engine.compress(messages, current_tokens=current, force=True)
    outcome = engine.get_status()["last_compaction"]
    assert outcome["prepared_used"] == 1 and len(outcome["leaf_nodes"]) == 1
    assert len(llm.calls) == calls_before  # no model call inside compress()
    covered = set(engine.dag.descendant_store_ids(outcome["leaf_nodes"][0]))
    shown = [m for m in out if m.get("role") != "system"]
    # every message is either summarized by the prepared leaf or shown raw, in order
    rows = engine.store.session_messages(engine.canonical_id, limit=1000)
    raw = [r for r in rows if r["store_id"] not in covered]
    assert [m.get("content") for m in shown[-len(raw):]] == [r["content"] for r in raw]


def test_trove_status_text_shows_the_worker_and_the_spend_guard():
    from hermes_trove import command

    lines = command._summary_work_lines({
        "background_prepare": {"share": 0.8, "running": True, "runs": 3, "prepared": 5,
                               "chunks": {"ready": 2, "claimed": 1}, "errors": ["Boom: x"]},
        "summary_spend": {"max_calls_per_hour": 10, "calls_last_hour": 10,
                          "tokens_last_hour": 1234, "exhausted": True, "reason": "10 calls"}})
    assert lines[0] == ("background preparation: from 0.8 of the trigger; running, 3 runs, "
                        "5 chunks prepared, 2 ready, 1 claimed; last error: Boom: x")
    assert "EXHAUSTED" in lines[1] and "10 calls" in lines[1]
    assert command._summary_work_lines({"background_prepare": {"share": 0.0}}) == [
        "background preparation: off (TROVE_BACKGROUND_PREPARE_SHARE=0)"]
    assert command._summary_work_lines(None) == []


class NumberedLLM(CountingLLM):
    """Each answer differs, so a node's text tells which call wrote it."""

    def __call__(self, prompt, model, timeout):
        super().__call__(prompt, model, timeout)
        kind = "merge" if "<summaries>" in prompt else "leaf"
        return f"- {kind} answer {len(self.calls)}: the user asked to check modules [m1]"


def _child_nodes(engine, node_id):
    return [engine.dag.get_node(c["id"]) for c in engine.dag.children(node_id)]


def _prepare_all(engine, job, owner="w"):
    while prepare.prepare_chunks(engine.store.db, job, owner=owner):
        pass
    total = 0
    while done := prepare.prepare_groups(engine.store.db, job, owner=owner):
        total += done
    return total


def test_merges_are_prepared_ahead_and_compress_writes_them_without_a_call(tmp_path):
    llm = NumberedLLM()
    engine, messages = stored_engine(tmp_path, llm, condense_fanout=2)
    job = prepare.Job(**{**job_for(engine).__dict__, "condensed_budget": 400, "fanout": 2})
    groups = _prepare_all(engine, job)
    ready_leaves = prepared.ready(engine.store.db.conn, engine.canonical_id)
    assert len(ready_leaves) >= 4 and groups >= 3  # (L1 L2) (L3 L4) and the pair of those
    ready_groups = prepared.ready_groups(engine.store.db.conn, engine.canonical_id)
    assert all(1 <= g["depth"] <= job.max_depth for g in ready_groups.values())
    # a second worker finds every predicted merge taken: no call is made twice
    calls = len(llm.calls)
    assert prepare.prepare_groups(Database(engine.store.db.path), job, owner="other") == 0
    assert len(llm.calls) == calls
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    engine.compress(messages, current_tokens=current, force=True)
    outcome = engine.get_status()["last_compaction"]
    prepared_merges = [n for n in outcome["condensed_nodes"]
                       if "merge answer" in engine.dag.get_node(n)["text"]
                       and engine.dag.get_node(n)["text"].split(":")[0]
                       in {g["text"].split(":")[0] for g in ready_groups.values()}]
    assert len(prepared_merges) >= 3
    assert outcome["prepared_used"] >= len(ready_leaves) + 3
    in_compress = calls_in_main = sum(1 for name in llm.calls[calls:] if name == "MainThread")
    written_here = len(outcome["leaf_nodes"]) + len(outcome["condensed_nodes"])
    assert in_compress == written_here - outcome["prepared_used"]
    assert calls_in_main < written_here
    # lineage: each prepared merge has exactly the children the group was made of, and
    # its text is the prepared text (plus the footer)
    for node_id in outcome["condensed_nodes"]:
        node = engine.dag.get_node(node_id)
        children = _child_nodes(engine, node_id)
        key = prepare.group_key(children)
        if key in ready_groups:
            assert node["text"].startswith(ready_groups[key]["text"])
            assert node["depth"] == ready_groups[key]["depth"]
    stored = set(engine.dag.descendant_store_ids(outcome["condensed_nodes"][-1]))
    assert stored and len(stored) == len(set(stored))
    assert prepared.ready_groups(engine.store.db.conn, engine.canonical_id).keys().isdisjoint(
        {prepare.group_key(_child_nodes(engine, n))
         for n in outcome["condensed_nodes"]})


def test_a_merge_over_a_discarded_leaf_is_not_used(tmp_path):
    llm = NumberedLLM()
    engine, messages = stored_engine(tmp_path, llm, condense_fanout=2)
    job = prepare.Job(**{**job_for(engine).__dict__, "condensed_budget": 400, "fanout": 2})
    _prepare_all(engine, job)
    ready_groups = prepared.ready_groups(engine.store.db.conn, engine.canonical_id)
    first = prepared.ready(engine.store.db.conn, engine.canonical_id)[0]
    with engine.store.db.transaction() as conn:  # an edit under the first prepared leaf
        conn.execute("UPDATE messages SET content_hash = 'edited' WHERE store_id = ?",
                     (first["store_ids"][1],))
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    engine.compress(messages, current_tokens=current, force=True)
    outcome = engine.get_status()["last_compaction"]
    for node_id in outcome["condensed_nodes"]:
        children = _child_nodes(engine, node_id)
        covers_edit = first["store_ids"][1] in engine.dag.descendant_store_ids(node_id)
        if covers_edit:  # built over the re-summarized leaf: never the prepared merge
            assert prepare.group_key(children) not in ready_groups
            assert not engine.dag.get_node(node_id)["text"].startswith(
                tuple(g["text"] for g in ready_groups.values()))


def test_the_worker_forgets_merges_it_no_longer_predicts(tmp_path):
    llm = NumberedLLM()
    engine, _ = stored_engine(tmp_path, llm, condense_fanout=2)
    job = prepare.Job(**{**job_for(engine).__dict__, "condensed_budget": 400, "fanout": 2})
    _prepare_all(engine, job)
    with engine.store.db.transaction() as conn:
        prepared.claim_group(conn, engine.canonical_id, "stale-key", 1, "w", 60)
        prepared.fill_group(conn, engine.canonical_id, "stale-key", "w", {"text": "old"})
    prepare.prepare_groups(engine.store.db, job, owner="w")
    assert "stale-key" not in prepared.ready_groups(engine.store.db.conn, engine.canonical_id)


def test_compress_waits_for_a_chunk_in_flight_instead_of_repeating_it(tmp_path):
    llm = NumberedLLM()
    engine, messages = stored_engine(tmp_path, llm)
    job = job_for(engine)
    rows = prepare.candidate_chunks(engine.store.db, job)[0]
    ids = [r["store_id"] for r in rows]
    digest = prepared.source_hash((r["store_id"], r["content_hash"]) for r in rows)
    worker_db = Database(engine.store.db.path)
    with worker_db.transaction() as conn:
        assert prepared.claim(conn, engine.canonical_id, ids, digest, "w", 60)

    def worker():  # another worker, half-way through its call when compress starts
        time.sleep(0.5)
        summary = prepare.summarize_rows(job, rows)
        with worker_db.transaction() as conn:
            prepared.fill(conn, engine.canonical_id, ids[0], "w", summary)

    thread = threading.Thread(target=worker, name="trove-prepare-test")
    thread.start()
    current = DEFAULT_OVERHEAD + engine.counter.count_messages(messages)
    engine.compress(messages, current_tokens=current, force=True)
    thread.join()
    worker_db.close()
    outcome = engine.get_status()["last_compaction"]
    first = [n for n in outcome["leaf_nodes"] if ids[0] in engine.dag.descendant_store_ids(n)]
    assert engine.dag.descendant_store_ids(first[0]) == ids
    worker_answers = [i + 1 for i, name in enumerate(llm.calls) if name == "trove-prepare-test"]
    assert engine.dag.get_node(first[0])["text"].startswith(
        f"- leaf answer {worker_answers[0]}:")
    assert outcome["prepared_used"] >= 1


def test_a_merge_in_flight_is_waited_for_within_the_limit(tmp_path):
    engine, _ = stored_engine(tmp_path, CountingLLM())
    db, session = engine.store.db, engine.canonical_id
    with db.transaction() as conn:
        assert prepared.claim_group(conn, session, "k1", 1, "w", 60)
        assert not prepared.claim_group(conn, session, "k1", 1, "other", 60)
    assert prepare.ReadyGroups(db, session, wait_seconds=0.2).get("k1") is None  # gave up

    def fill():
        time.sleep(0.3)
        with Database(db.path).transaction() as conn:
            prepared.fill_group(conn, session, "k1", "w", {"text": "merged", "level": 1})

    thread = threading.Thread(target=fill)
    thread.start()
    found = prepare.ReadyGroups(db, session, wait_seconds=10).get("k1")
    thread.join()
    assert found["text"] == "merged" and found["depth"] == 1
    assert prepare.ReadyGroups(db, session, wait_seconds=10).get("unknown") is None


def test_the_worker_starts_nothing_while_this_process_compacts_the_session(tmp_path):
    llm = NumberedLLM()
    engine, _ = stored_engine(tmp_path, llm)
    job = job_for(engine)
    with locks.session_compaction(engine.store.db.path, engine.canonical_id, 5):
        assert prepare.prepare_chunks(engine.store.db, job, owner="w") == 0
    assert llm.calls == []
    assert prepare.prepare_chunks(engine.store.db, job, owner="w") >= 1


def test_removing_a_session_forgets_its_prepared_work(tmp_path):
    engine, _ = stored_engine(tmp_path, NumberedLLM(), condense_fanout=2)
    job = prepare.Job(**{**job_for(engine).__dict__, "condensed_budget": 400, "fanout": 2})
    _prepare_all(engine, job)
    db, session = engine.store.db, engine.canonical_id
    with db.transaction() as conn:
        removed = prepared.delete_sessions_in(conn, [session, "other"])
    assert removed["prepared_rows"] > 0
    assert prepared.states(db.conn, session) == {"claimed": 0, "ready": 0, "groups_claimed": 0,
                                                 "groups_ready": 0}


def test_a_partial_chunk_waits_while_the_trigger_is_far(tmp_path):
    engine, _ = stored_engine(tmp_path, CountingLLM(), leaf_chunk_tokens=20_000)
    near = job_for(engine)
    chunks = prepare.candidate_chunks(engine.store.db, near)
    assert len(chunks) == 1  # one partial chunk: the session holds less than a chunk
    far = prepare.Job(**{**near.__dict__, "headroom_tokens": 15_000})
    assert prepare.candidate_chunks(engine.store.db, far) == []  # it will still grow
    closer = prepare.Job(**{**near.__dict__, "headroom_tokens": 9_000})
    assert len(prepare.candidate_chunks(engine.store.db, closer)) == 1


def test_the_prepared_chunks_stay_clear_of_the_tail_the_compaction_keeps(tmp_path):
    engine, _ = stored_engine(tmp_path, CountingLLM())
    job = job_for(engine)
    rows = engine.store.session_messages(engine.canonical_id, limit=10_000)
    by_count = prepare.tail_start(rows, job)
    assert by_count <= len(rows) - job.fresh_tail_count - prepare.TAIL_MARGIN
    capped = prepare.Job(**{**job.__dict__, "tail_max_tokens": 50})  # a tiny token cap
    assert prepare.tail_start(rows, capped) > by_count  # fewer rows kept raw
    newest_user = max(i for i, r in enumerate(rows) if r["role"] == "user")
    assert prepare.tail_start(rows, capped) <= newest_user
