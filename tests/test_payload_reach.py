"""Which externalized payloads a caller reaches: exactly those a row it may read refers to,
whatever the row's age (an image part's too) and wherever the row was carried from; the
same set for trove_expand / trove_describe and for trove_grep's payload search."""
import base64
import random

import pytest

from hermes_trove.ingest.policy import policy_for
from hermes_trove.recall import externalized, query_plan
from hermes_trove.storage import codec, database, migrations, payloads
from hermes_trove.storage.owners import Owners
from hermes_trove.storage.postgres import schema as pg_schema
from hermes_trove.store import Store

from test_tool_audit import _dispatch, _page_all
from test_tools import NOW, Env

NEWER = externalized.MAX_REFERRING_ROWS + 1     # more than one search's window of rows


def _image_message(seed: int, text: str = "look") -> dict:
    uri = "data:image/png;base64," + base64.b64encode(random.Random(seed).randbytes(6000)).decode()
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": uri}}]}


def _plain_images(count: int) -> list[dict]:
    """Image messages that stay inline (a URL): each row's search text shows ``[image]``."""
    return [{"role": "user", "content": [{"type": "text", "text": f"shot {i}"},
                                         {"type": "image_url",
                                          "image_url": {"url": f"https://x/{i}.png"}}]}
            for i in range(count)]


def _ingest(env, policy, session, messages, at=NOW):
    return env.store.ingest(session, messages, encoded=[policy.prepare(m) for m in messages],
                            now=at).store_ids


def _tool_turn(n: int, log: str) -> list[dict]:
    return [{"role": "assistant", "content": "", "tool_calls": [{
                "id": f"c{n}", "type": "function",
                "function": {"name": "terminal", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "terminal", "content": log}]


@pytest.fixture
def penv(tmp_path, backend):
    env = Env(tmp_path, backend[1], large_output_externalization_enabled="true",
              large_output_externalization_threshold_chars=2000)
    env.policy = policy_for(env.config)
    yield env
    database.forget_database(backend[1])


def test_an_old_image_payload_opens_from_its_own_session_after_many_newer_images(penv):
    """The first of 202 screenshots: its row's search text showed only ``[image]``, so it
    was looked for among the newest 200 image rows of the scope and answered 'not found
    in this scope' from the session that holds it. Another owner still cannot open it."""
    env, policy = penv, penv.policy
    message = _image_message(3)
    [sid] = _ingest(env, policy, "A", [message])
    _ingest(env, policy, "A", _plain_images(NEWER))
    ctx = env.ctx("A", payloads=policy.payloads)
    cap = env.config.tool_response_max_tokens
    [ref] = _dispatch(ctx, "trove_expand", {"store_id": sid}, cap)["message"]["externalized_refs"]
    assert _page_all(ctx, {"externalized_ref": ref}, cap) == message["content"][1]["image_url"]["url"]
    assert _dispatch(ctx, "trove_describe", {"externalized_ref": ref}, cap)["kind"] == "data_uri"
    env.store.ensure_session("C", source="telegram")
    Owners(env.db).record("C", "someone-else", platform="telegram")
    other = env.ctx("C", payloads=policy.payloads)
    for scope in ({}, {"session_scope": "all"}):
        assert "not found" in _dispatch(other, "trove_expand",
                                        {"externalized_ref": ref, **scope}, cap)["error"]


def test_an_old_carried_image_opens_however_many_rows_of_other_sessions_name_it(penv):
    """An image row under a node carried into A, older than 201 image rows of another
    session and than 201 rows elsewhere that quote its ref: the rows outside A's tags
    were looked at only as the newest 200, so its payload was out of reach from A. A row
    of P that is not carried opens nothing."""
    env, policy = penv, penv.policy
    env.store.ensure_session("P", source="cli")          # an older session, no owner
    carried, kept = _image_message(4, "carried"), _image_message(5, "not carried")
    [old] = _ingest(env, policy, "P", [carried])
    [closed] = _ingest(env, policy, "P", [kept])
    env.dag.carry_nodes("A", [env.node("P", "a screenshot", store_ids=[old])])
    ctx = env.ctx("A", payloads=policy.payloads)
    cap = env.config.tool_response_max_tokens
    ref = payloads.refs_in(env.store.get_message(old)["content"])[0]
    _ingest(env, policy, "B", _plain_images(NEWER))
    env.store.ensure_session("Q", source="cli")
    _ingest(env, policy, "Q", [{"role": "user", "content": f"seen {ref} #{i}"}
                               for i in range(NEWER)])
    assert _page_all(ctx, {"externalized_ref": ref}, cap) == \
        carried["content"][1]["image_url"]["url"]
    other = payloads.refs_in(env.store.get_message(closed)["content"])[0]
    for scope in ({}, {"session_scope": "all"}):
        assert "not found" in _dispatch(ctx, "trove_expand",
                                        {"externalized_ref": other, **scope}, cap)["error"]


def test_grep_finds_the_payloads_of_carried_rows_and_no_others(penv):
    """A /branch's tool output lies under a node carried from its parent: trove_expand
    opens its payload from the branch, but trove_grep's payload search looked only at
    rows tagged with the branch's session and found nothing. The parent's rows that are
    not carried stay out of both."""
    env, policy = penv, penv.policy
    env.store.ensure_session("P", source="cli")          # the parent, no owner
    logs = ["".join(f"{word} kestrel checksum {i}\n" for i in range(200))
            for word in ("carried", "parental")]
    rows = [_ingest(env, policy, "P", _tool_turn(n, log)) for n, log in enumerate(logs)]
    env.dag.carry_nodes("A", [env.node("P", "ran the job", store_ids=rows[0])])
    ctx = env.ctx("A", payloads=policy.payloads)
    cap = env.config.tool_response_max_tokens
    carried_ref = payloads.refs_in(env.store.get_message(rows[0][1])["content"])[0]
    for content_scope, key in (("externalized", "results"), ("both", "externalized_results")):
        found = _dispatch(ctx, "trove_grep", {"query": "kestrel checksum",
                                              "content_scope": content_scope}, cap)[key]
        assert [h["externalized_ref"] for h in found] == [carried_ref]
        assert found[0]["referred_by_store_id"] == rows[0][1]
        assert _page_all(ctx, found[0]["expand"]["args"], cap) == logs[0]


def test_search_payloads_looks_under_the_carried_nodes_only(penv):
    """The payload search itself: the carried closure's rows join the scope's, nothing of
    the parent outside the closure does."""
    env, policy = penv, penv.policy
    env.store.ensure_session("P", source="cli")
    logs = ["".join(f"{word} heron ledger {i}\n" for i in range(200)) for word in ("in", "out")]
    rows = [_ingest(env, policy, "P", _tool_turn(n, log)) for n, log in enumerate(logs)]
    leaf = env.node("P", "ran the job", store_ids=rows[0])
    plan = query_plan.parse_query("heron ledger")
    args = (env.store, policy.payloads, plan, ("A",), 10)
    assert externalized.search_payloads(*args) == []
    hits = externalized.search_payloads(*args, dag=env.dag, carried={leaf})
    assert [(h.store_id, h.session_id) for h in hits] == [(rows[0][1], "P")]


def test_an_image_rows_search_text_holds_its_payload_ref_and_reads_the_same(tmp_path):
    """The search text (not what readers see) names the image's payload ref."""
    store = payloads.PayloadStore(tmp_path / "payloads")
    guarded = payloads.guard_message(_image_message(6), store, large_threshold_chars=None)
    [ref] = guarded.refs
    encoded = codec.encode_message(guarded.message)
    assert encoded.search_text == f"look\n[image] {ref}"
    assert codec.message_text(guarded.message) == "look\n[image]"


def _version(db) -> int:
    with db.reading() as conn:
        return conn.execute("SELECT max(version) FROM trove_migrations").fetchone()[0]


def _search_text(db, store_id: int):
    with db.reading() as conn:
        return conn.execute("SELECT search_text FROM messages WHERE store_id = ?",
                            (store_id,)).fetchone()[0]


def test_the_migration_makes_stored_image_rows_found_by_their_payload_hash(tmp_path, backend,
                                                                          monkeypatch):
    """Rows stored before an image's ref was in their search text (``[image]`` only) get
    it from the migration, on both engines (SQLite's 12, the server's 6); the index
    follows, and nothing else of any row changes."""
    engine, target = backend
    module, last = (migrations, 11) if engine == "sqlite" else (pg_schema, 5)
    message = _image_message(7)
    with monkeypatch.context() as patch:
        patch.setattr(module, "MIGRATIONS", [m for m in module.MIGRATIONS if m[0] <= last])
        env = Env(tmp_path, target)
        policy = policy_for(env.config)
        [sid, plain] = _ingest(env, policy, "A", [message, {"role": "user",
                                                            "content": "no image here"}])
        old_text = codec.message_text(codec.decode_message(env.store.get_message(sid)))
        with env.db.transaction() as conn:   # the row as the code before wrote it
            conn.execute("UPDATE messages SET search_text = ? WHERE store_id = ?",
                         (old_text, sid))
        ref = payloads.refs_in(env.store.get_message(sid)["content"])[0]
        by_hash = query_plan.scoped(query_plan.quote(payloads.parse_ref(ref)), None)
        assert env.store.match_message_ids(by_hash, limit=5, ranked=False) == []
        assert _version(env.db) == last
        before = env.store.get_messages([sid, plain])
        database.forget_database(target)
    store = Store(database.get_database(target))
    assert _version(store.db) == module.latest_version() > last
    assert [i for i, _ in store.match_message_ids(by_hash, limit=5, ranked=False)] == [sid]
    assert _search_text(store.db, sid) == f"look\n[image] {ref}"
    assert _search_text(store.db, plain) is None
    assert store.get_messages([sid, plain]) == before
