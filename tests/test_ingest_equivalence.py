"""The host's ingest path stores exactly what the straightforward path stores.

The host feeds the engine bounded windows (already-seen messages + new ones) through
``on_session_end``; the engine writes them with multi-row statements on a helper
thread while it counts tokens. This test feeds varied messages (repetition, tool
calls, payloads to externalize, secrets, unicode, odd shapes, noise) that way and
compares the database with one written the straightforward way: each message
prepared and counted in turn and inserted one row per statement with the SQL the
store used before, identities and JSON columns recomputed with the formulas the
codec used before. Rows, token counts, FTS hits and ranks must be identical.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import sqlite3

from hermes_trove.compaction import tokens
from hermes_trove.ingest import policy as ingest_policy
from hermes_trove.storage import codec, database
from hermes_trove.store import Store, role_tag, session_tag

from enginekit import make_engine

SESSION = "sess"
OLD_INSERT = (
    "INSERT INTO messages(session_id, conversation_id, source, role, content,"
    " content_format, tool_calls, tool_call_id, tool_name, extra, search_text,"
    " content_hash, ordinal, message_at, created_at, token_count)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
SETTINGS = dict(sensitive_patterns_enabled="true", large_output_externalization_enabled="true",
                large_output_externalization_threshold_chars=12000,
                ignore_message_patterns="^HEARTBEAT_OK$")
WORDS = ("retry backoff proxy config deploy staging database token refresh worker migration "
         "handler request timeout commit branch fixture schema cache latency café naïve "
         "日本語 テスト 한국어 emoji😀 Straße ΑΘΗΝΑ").split()
OPENAI = "sk-proj-Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789"


def varied_messages(n: int, seed: int = 7) -> list[dict]:
    """Coding-agent messages with every shape the store must keep exactly."""
    rng = random.Random(seed)
    prose = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))  # noqa: E731
    out: list[dict] = []
    for i in range(n):
        kind = i % 17
        if kind == 0:
            out.append({"role": "user", "content": "ok"})  # repeated many times
        elif kind == 1:
            out.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": f"call_{i}", "type": "function", "function": {
                    "name": rng.choice(["read_file", "terminal"]),
                    "arguments": json.dumps({"path": f"src/m{i % 7}.py", "q": prose(3)})}}]})
        elif kind == 2:
            out.append({"role": "tool", "tool_call_id": f"call_{i - 1}", "name": "read_file",
                        "content": "\n".join(f"    {rng.choice(WORDS)}_{j} = {j}"
                                             for j in range(rng.randint(3, 400)))})
        elif kind == 3:
            out.append({"role": "user", "content": f"deploy with OPENAI_API_KEY={OPENAI} and "
                        f"postgres://app:hunter{i}x@db/prod, password=s3cr3t{i}"})
        elif kind == 4:
            out.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": f"c{i}", "type": "function",
                "function": {"name": "db", "arguments": {"dsn": f"mysql -u root -pPw{i}"}}}]})
        elif kind == 5:
            image = base64.b64encode(rng.randbytes(1200)).decode()
            out.append({"role": "user", "content": [
                {"type": "text", "text": prose(8)},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]})
        elif kind == 6:
            out.append({"role": "tool", "tool_call_id": f"t{i}", "name": "terminal",
                        "content": "".join(f"line {k}: {prose(4)}\n" for k in range(500))})
        elif kind == 7:
            out.append({"role": "user", "content": "blob " + base64.b64encode(
                rng.randbytes(4000)).decode().replace("=", "") + " end"})
        elif kind == 8:
            out.append({"role": "user", "content": f"lone \ud800 surrogate {i}",
                        "_db_persisted": True, "api_content": "sidecar"})
        elif kind == 9:
            out.append({"content": f"no role {prose(3)}"})
        elif kind == 10:
            out.append({"role": "assistant", "content": prose(30), "reasoning": prose(5),
                        "finish_reason": "stop", "timestamp": 1_790_000_000_000 + i})
        elif kind == 11:
            out.append({"role": "user", "content": "HEARTBEAT_OK"})  # noise: never stored
        elif kind == 12:
            out.append({"role": "tool", "tool_call_id": 42, "content": {"odd": prose(2)}})
        else:
            out.append({"role": rng.choice(["user", "assistant"]), "content": prose(
                rng.randint(1, 300)) + f" ident_{i % 50}"})
    return out


def old_identity(message: dict) -> str:
    basis = [message.get("role"), message.get("content"), message.get("tool_calls"),
             message.get("tool_call_id"), codec.tool_name_of(message)]
    text = json.dumps(basis, ensure_ascii=True, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


def old_dump_json(value) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, default=str)


def reference_database(path, policy, counter, messages: list[dict]) -> sqlite3.Connection:
    """Each message prepared and counted in turn, one row per statement, old formulas."""
    Store(database.get_database(path)).ensure_session(SESSION, source="cli")
    database.forget_database(path)
    conn = sqlite3.connect(path, isolation_level=None)
    ordinals: dict[str, int] = {}
    rows = []
    for message in messages:
        enc = policy.prepare(message)
        if enc is None:
            continue
        base = policy._restored(codec.clean_message(message))
        base = policy.redactor.redact_message(base)[0]
        assert enc.content_hash == old_identity(base)
        stored = codec.decode_encoded(enc)
        if "tool_calls" in stored:
            assert enc.tool_calls == old_dump_json(stored["tool_calls"])
        ordinal = ordinals.get(enc.content_hash, 0)
        ordinals[enc.content_hash] = ordinal + 1
        rows.append((SESSION, None, "cli", enc.role, enc.content, enc.content_format,
                     enc.tool_calls, enc.tool_call_id, enc.tool_name, enc.extra,
                     enc.search_text, enc.content_hash, ordinal, enc.message_at, 0.0,
                     counter.count_message(message)))
    conn.execute("BEGIN")
    conn.executemany(OLD_INSERT, rows)
    conn.execute("COMMIT")
    return conn


def rows_of(conn) -> list[tuple]:
    return conn.execute(
        "SELECT store_id, session_id, conversation_id, source, role, content, content_format,"
        " tool_calls, tool_call_id, tool_name, extra, search_text, content_hash, ordinal,"
        " message_at, token_count, pinned FROM messages ORDER BY store_id").fetchall()


def fts_hits(conn, queries: list[str]) -> dict:
    return {q: conn.execute("SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ?"
                            " ORDER BY rowid", (q,)).fetchall() for q in queries}


def test_host_windows_store_what_the_straightforward_path_stores(tmp_path):
    messages = varied_messages(1200)
    engine = make_engine(tmp_path / "host", **SETTINGS)
    for start in range(0, len(messages), 250):  # 40 already seen + 250 new, like the host
        engine.on_session_end(SESSION, messages[max(0, start - 40):start + 250])
    assert engine.store.ingest(SESSION, messages, encoded=[
        engine.policy.prepare(m) for m in messages]).inserted == 0  # all of it, once
    host = sqlite3.connect(engine.config.resolved_database_path)

    fresh_policy = ingest_policy._build(engine.config)  # same settings, its own state
    counter = tokens.TokenCounter(engine.config.token_encoding)
    reference = reference_database(tmp_path / "reference.db", fresh_policy, counter, messages)

    got, expected = rows_of(host), rows_of(reference)
    assert len(expected) == len(messages) - sum(m.get("content") == "HEARTBEAT_OK"
                                                for m in messages)
    assert got == expected
    assert all(row[15] > 0 for row in got)  # every row carries its count
    redacted = [r for r in got if r[5] and "[REDACTED:" in r[5]]
    externalized = [r for r in got if "trove-payload:" in (r[5] or "")]
    assert redacted and externalized and not any(OPENAI in (r[5] or "") for r in got)

    words = sorted({w for w in WORDS if w.isalpha()})
    queries = words + ["ok", "HEARTBEAT_OK", "handler", "REDACTED", "surrogate", "ident_7",
                       f'"{session_tag(SESSION)}"', f'"{role_tag("tool")}"',
                       f'"{role_tag("unknown")}" AND role']
    assert fts_hits(host, queries) == fts_hits(reference, queries)
    for conn in (host, reference):
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
