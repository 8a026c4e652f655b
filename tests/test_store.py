"""The message store: schema, migrations, identity, exact round trips, FTS."""

import json
import sqlite3
import threading

import pytest

from hermes_trove.storage import codec, database, migrations
from hermes_trove.store import Store, decode_row, session_tag


@pytest.fixture()
def store(tmp_path):
    db = database.get_database(tmp_path / "trove.db")
    yield Store(db)
    database.forget_database(tmp_path / "trove.db")


def transcript(turns: int) -> list[dict]:
    """A realistic growing transcript with tool calls and repeated short messages."""
    out = []
    for t in range(turns):
        out.append({"role": "user", "content": "ok" if t % 3 == 0 else f"question {t}"})
        out.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{t}", "type": "function",
             "function": {"name": "terminal", "arguments": json.dumps({"cmd": "ls"})}}]})
        out.append({"role": "tool", "tool_call_id": f"call_{t}", "name": "terminal",
                    "content": "README.md"})
        out.append({"role": "assistant", "content": "done" if t % 2 else f"answer {t}"})
    return out


# ---------------------------------------------------------------- schema
def test_new_database_has_latest_schema_and_ledger(store):
    conn = store.db.conn
    assert migrations.schema_version(conn) == migrations.latest_version()
    versions = [r[0] for r in conn.execute("SELECT version FROM trove_migrations ORDER BY version")]
    assert versions == list(range(1, migrations.latest_version() + 1))
    assert database.structural_check(conn) == []
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_reopen_applies_nothing_twice(tmp_path):
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrations.migrate(conn) == list(range(1, migrations.latest_version() + 1))
    assert migrations.migrate(conn) == []
    conn.close()


def test_newer_schema_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {migrations.latest_version() + 5}")
    conn.close()
    with pytest.raises(migrations.SchemaTooNewError, match="newer than this hermes-trove"):
        database.get_database(path)


def test_failed_migration_rolls_back_and_records_nothing(tmp_path, monkeypatch):
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrations.migrate(conn)
    before = migrations.schema_version(conn)

    def broken(c):
        c.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS",
                        migrations.MIGRATIONS + [(before + 1, "broken", broken)])
    with pytest.raises(RuntimeError):
        migrations.migrate(conn)
    assert migrations.schema_version(conn) == before
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "half_done" not in names
    conn.close()


def test_one_shared_connection_per_file(tmp_path):
    a = database.get_database(tmp_path / "x.db")
    b = database.get_database(str(tmp_path / "." / "x.db"))
    assert a is b
    database.forget_database(tmp_path / "x.db")


# ---------------------------------------------------------------- identity
def test_growing_transcript_replayed_50_times_stores_each_message_once(store):
    full = transcript(50)
    store.ensure_session("s")
    for n in range(1, 51):
        shown = full[: n * 4]
        first = store.ingest("s", shown)
        again = store.ingest("s", shown)
        assert again.inserted == 0
        assert again.store_ids == first.store_ids
        assert store.count_messages("s") == n * 4
    assert store.count_messages("s") == len(full)


def test_tail_after_compaction_with_new_repeated_message_is_not_lost(store):
    full = transcript(10)
    store.ingest("s", full)
    # After a compaction the host shows only the tail, then the user says "ok" again.
    tail = full[-6:] + [{"role": "user", "content": "ok"}]
    result = store.ingest("s", tail)
    assert result.inserted == 1
    assert store.count_messages("s") == len(full) + 1
    # Shown again (also with the engine's own summary block skipped) it adds nothing.
    block = {"role": "user", "content": "[summary block]"}
    again = store.ingest("s", [block] + tail, skip=[True] + [False] * len(tail))
    assert again.inserted == 0 and again.store_ids[0] is None


def test_host_sidecars_are_not_part_of_identity(store):
    plain = [{"role": "user", "content": "hello"}]
    store.ingest("s", plain)
    decorated = [{"role": "user", "content": "hello", "api_content": "hello\n\n[policy]",
                  "_db_persisted": True}]
    assert store.ingest("s", decorated).inserted == 0
    row = store.get_message(1)
    assert decode_row(row) == {"role": "user", "content": "hello"}


def test_identical_messages_in_one_batch_are_all_kept(store):
    shown = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "ok"}, {"role": "user", "content": "ok"}]
    assert store.ingest("s", shown).inserted == 4
    assert store.ingest("s", shown).inserted == 0


def test_stale_prefix_replay_adds_nothing(store):
    full = transcript(30)
    store.ingest("s", full)
    assert store.ingest("s", full[:40]).inserted == 0
    assert store.ingest("s", full[20:70]).inserted == 0


def test_concurrent_ingest_of_the_same_transcript(store):
    full = transcript(40)
    errors = []

    def work():
        try:
            for n in range(1, 41):
                store.ingest("s", full[: n * 4])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.count_messages("s") == len(full)


def counter_breaking_at(call: int):
    """A token counter that raises on its ``call``-th call."""
    calls = {"n": 0}

    def count(msg):
        calls["n"] += 1
        if calls["n"] == call:
            raise RuntimeError("counter broke")
        return 1
    return count


def test_a_failed_ingest_stores_nothing(store, monkeypatch):
    with pytest.raises(RuntimeError):
        store.ingest("s", transcript(2), count_tokens=counter_breaking_at(3))
    assert store.count_messages("s") == 0


def test_a_big_batch_fails_whole_when_counting_breaks_mid_way(store):
    """Rows go 100 per statement on a helper thread while the next ones are counted: a
    counter error after several statements rolls all of them back, and no thread is left."""
    with pytest.raises(RuntimeError):
        store.ingest("s", transcript(100), count_tokens=counter_breaking_at(333))
    assert store.count_messages("s") == 0
    assert not [t for t in threading.enumerate() if t.name == "trove-ingest-writer"]
    assert store.ingest("s", transcript(100), count_tokens=len).inserted == 400


def test_a_big_batch_gets_consecutive_ids_in_list_order(store):
    """Multi-row statements of halving sizes: every shown message gets the id of its own
    row, rows are in list order, and each has its own count."""
    messages = transcript(130)  # 520 rows: statements of 100 x 5, then 10 x 2
    result = store.ingest("s", messages, count_tokens=lambda m: len(json.dumps(m)))
    assert result.inserted == len(messages)
    assert result.store_ids == list(range(result.store_ids[0], result.store_ids[0] + 520))
    rows = store.get_messages(result.store_ids)
    for store_id, message in zip(result.store_ids, messages):
        assert decode_row(rows[store_id]) == message
        assert rows[store_id]["token_count"] == len(json.dumps(message))
    assert store.ingest("s", messages).inserted == 0


# ---------------------------------------------------------------- exact round trip
SHAPES = [
    {"role": "user", "content": "plain text"},
    {"role": "user", "content": ""},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, 2]}"}}]},
    {"role": "assistant"},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "f", "tool_name": "f", "content": "result"},
    {"role": "user", "content": "ünïcödé 日本語 😀 \u200b"},
    {"role": "user", "content": "nul\x00inside\x00"},
    {"role": "user", "content": "lone \ud800 surrogate"},
    {"role": "assistant", "content": "x", "reasoning": "because", "finish_reason": "stop"},
    {"role": "user", "content": "a" * 1_000_000},
    {"role": "user", "content": {"odd": "dict content"}},
    {"role": "tool", "tool_call_id": 42, "content": "non-string id"},
]


@pytest.mark.parametrize("message", SHAPES, ids=range(len(SHAPES)))
def test_every_message_shape_round_trips_exactly(store, message):
    result = store.ingest("s", [message])
    back = decode_row(store.get_message(result.store_ids[0]))
    assert back == message
    assert json.dumps(back, sort_keys=True) == json.dumps(message, sort_keys=True)


def test_source_is_never_blank(store):
    store.ensure_session("s", source="")
    store.ingest("s", [{"role": "user", "content": "x"}], source="  ")
    assert store.get_message(1)["source"] == "unknown"
    assert store.get_session("s")["source"] == "unknown"
    with pytest.raises(sqlite3.IntegrityError):
        with store.db.transaction() as conn:
            conn.execute("UPDATE messages SET source = '' WHERE store_id = 1")


# ---------------------------------------------------------------- FTS
def test_fts_indexes_text_tool_calls_and_parts_with_session_tags(store):
    store.ingest("a", [{"role": "user", "content": "configure my-proxy retry_backoff_ms"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "c", "type": "function",
                            "function": {"name": "grep_files", "arguments": "{\"q\": \"zebra\"}"}}]},
                       {"role": "user", "content": [{"type": "text", "text": "penguin part"}]}])
    store.ingest("b", [{"role": "user", "content": "my-proxy in session b"}])
    assert {r[0] for r in store.fts_candidates('"my proxy"', limit=10)} == {1, 4}
    scoped = store.fts_candidates(f'tags:"{session_tag("a")}" AND "my proxy"', limit=10)
    assert [r[0] for r in scoped] == [1]
    assert [r[0] for r in store.fts_candidates('"retry backoff ms"', limit=5)] == [1]
    assert [r[0] for r in store.fts_candidates('"zebra"', limit=5)] == [2]
    assert [r[0] for r in store.fts_candidates('"penguin"', limit=5)] == [3]


def test_substring_fallback_finds_cjk_and_emoji_within_bounds(store):
    store.ingest("a", [{"role": "user", "content": "我们决定使用指数退避算法"},
                       {"role": "user", "content": "deploy 🚀 now"}])
    store.ingest("b", [{"role": "user", "content": "指数退避 elsewhere"}])
    assert store.substring_scan("a", ["指数退避"], limit=5, max_rows=100) == [1]
    assert store.substring_scan("a", ["🚀"], limit=5, max_rows=100) == [2]
    assert store.substring_scan("a", ["指数退避"], limit=5, max_rows=1) == []  # bounded


def test_fts_stays_in_sync_on_update_and_delete(store):
    store.ingest("a", [{"role": "user", "content": "alpha"}])
    with store.db.transaction() as conn:
        conn.execute("UPDATE messages SET content = 'beta' WHERE store_id = 1")
    assert store.fts_candidates('"alpha"', limit=5) == []
    assert [r[0] for r in store.fts_candidates('"beta"', limit=5)] == [1]
    with store.db.transaction() as conn:
        conn.execute("DELETE FROM messages WHERE store_id = 1")
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
    assert store.fts_candidates('"beta"', limit=5) == []


def test_codec_hash_ignores_key_order_of_sidecars_only():
    a = {"role": "user", "content": "x"}
    b = {"content": "x", "role": "user", "_x": 1}
    assert codec.identity_hash(codec.clean_message(a)) == codec.identity_hash(codec.clean_message(b))
    assert codec.identity_hash({"role": "user", "content": "y"}) != codec.identity_hash(a)
