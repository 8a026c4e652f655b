"""Tests for the OpenClaw importer (openclaw_import.py, openclaw_sources.py and
scripts/import_lossless_claw.py).

Builds lossless-claw databases of two schema generations and JSONL transcripts,
imports them and checks every rule of docs/import.md: exact stored content,
provenance, lineage, idempotent reruns, dry runs that write nothing, backups,
all-or-nothing failure and clear errors for malformed input.
"""
import json
import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from hermes_trove.openclaw import importer as oc
from hermes_trove.openclaw import sources as sources
from hermes_trove.dag import Dag
from hermes_trove.storage import database
from hermes_trove.storage.database import Database
from hermes_trove.store import Store, decode_row

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_lossless_claw.py"
KEY = "agent:main:telegram:42"


def utc(*parts) -> float:
    return datetime(*parts, tzinfo=timezone.utc).timestamp()


# ---------------------------------------------------------------------------- source builders
SCHEMA_V1 = """
CREATE TABLE conversations (conversation_id INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
    title TEXT, created_at TEXT, updated_at TEXT);
CREATE TABLE messages (message_id INTEGER PRIMARY KEY, conversation_id INTEGER, seq INTEGER,
    role TEXT, content TEXT, token_count INTEGER, identity_hash TEXT, transcript_entry_id TEXT,
    created_at TEXT, UNIQUE (conversation_id, seq));
CREATE TABLE message_parts (part_id TEXT PRIMARY KEY, message_id INTEGER, session_id TEXT,
    part_type TEXT, ordinal INTEGER, text_content TEXT, tool_call_id TEXT, tool_name TEXT,
    tool_status TEXT, tool_input TEXT, tool_output TEXT, tool_error TEXT, metadata TEXT);
CREATE TABLE summaries (summary_id TEXT PRIMARY KEY, conversation_id INTEGER, kind TEXT,
    depth INTEGER, content TEXT, token_count INTEGER, descendant_count INTEGER,
    created_at TEXT, file_ids TEXT);
CREATE TABLE summary_messages (summary_id TEXT, message_id INTEGER, ordinal INTEGER);
CREATE TABLE summary_parents (summary_id TEXT, parent_summary_id TEXT, ordinal INTEGER);
CREATE TABLE context_items (conversation_id INTEGER, ordinal INTEGER, item_type TEXT,
    message_id INTEGER, summary_id TEXT);
"""
SCHEMA_V2_ADDITIONS = """
ALTER TABLE conversations ADD COLUMN session_key TEXT;
ALTER TABLE conversations ADD COLUMN active INTEGER DEFAULT 1;
ALTER TABLE conversations ADD COLUMN archived_at TEXT;
ALTER TABLE messages ADD COLUMN large_content TEXT;
ALTER TABLE summaries ADD COLUMN earliest_at TEXT;
ALTER TABLE summaries ADD COLUMN latest_at TEXT;
ALTER TABLE summaries ADD COLUMN model TEXT;
"""


class Lcm:
    """A lossless-claw database under construction (generation 1 or 2)."""

    def __init__(self, path: Path, generation: int = 2, wal: bool = False):
        self.path = path
        self.generation = generation
        self.conn = sqlite3.connect(path)
        if wal:
            self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.executescript(SCHEMA_V1 + (SCHEMA_V2_ADDITIONS if generation > 1 else ""))
        self.parts = 0

    @classmethod
    def reopen(cls, path: Path) -> "Lcm":
        """An existing (generation 2) database, to grow it between imports."""
        db = cls.__new__(cls)
        db.path, db.generation, db.conn = path, 2, sqlite3.connect(path)
        db.parts = db.conn.execute("SELECT count(*) FROM message_parts").fetchone()[0]
        return db

    def conversation(self, session_id, session_key=None, created_at="2026-02-25 05:00:00"):
        cols = {"session_id": session_id, "created_at": created_at}
        if self.generation > 1:
            cols["session_key"] = session_key
        return self._insert("conversations", cols)

    def message(self, conversation_id, role, content, created_at, parts=()):
        seq = self.conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages"
                                " WHERE conversation_id = ?", (conversation_id,)).fetchone()[0]
        message_id = self._insert("messages", {
            "conversation_id": conversation_id, "seq": seq, "role": role, "content": content,
            "created_at": created_at, "token_count": len(content or "") // 4})
        for ordinal, part in enumerate(parts):
            self.parts += 1
            self._insert("message_parts", {"part_id": f"p{self.parts}", "message_id": message_id,
                                           "ordinal": ordinal, **part})
        return message_id

    def summary(self, summary_id, conversation_id, kind, depth, content, *, messages=(),
                parents=(), model=None, created_at="2026-02-26T01:00:00Z"):
        cols = {"summary_id": summary_id, "conversation_id": conversation_id, "kind": kind,
                "depth": depth, "content": content, "token_count": 7, "created_at": created_at}
        if self.generation > 1:
            cols["model"] = model
        self._insert("summaries", cols)
        for i, message_id in enumerate(messages):
            self._insert("summary_messages", {"summary_id": summary_id, "message_id": message_id,
                                              "ordinal": i})
        for i, parent in enumerate(parents):
            self._insert("summary_parents", {"summary_id": summary_id,
                                             "parent_summary_id": parent, "ordinal": i})

    def _insert(self, table, cols):
        cur = self.conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES"
                                f" ({', '.join('?' * len(cols))})", list(cols.values()))
        return cur.lastrowid

    def close(self):
        self.conn.commit()
        self.conn.close()


def tool_part(call_id, name, **fields):
    return {"part_type": "tool", "tool_call_id": call_id, "tool_name": name, **fields}


T1, T2, T3 = "2026-02-25 05:18:55", "2026-02-25 05:19:10", "2026-02-25 05:19:30"
TS1, TS2, TS3 = (utc(2026, 2, 25, 5, 18, 55), utc(2026, 2, 25, 5, 19, 10),
                 utc(2026, 2, 25, 5, 19, 30))


def build_sample(path: Path, generation: int = 2, wal: bool = False) -> dict:
    """The sample lossless-claw history; returns the ids the tests refer to."""
    db = Lcm(path, generation, wal)
    a = db.conversation("sess-a", KEY)
    ids = {"a": a}
    ids["m1"] = db.message(a, "user", "Move DE-16 to the top", T1)
    ids["m2"] = db.message(a, "assistant", "", T2, [
        {"part_type": "reasoning", "text_content": "Let me look"},
        tool_part("call_1", "exec", tool_input='{"command":"ls"}'),
        tool_part("call_2", None, tool_input=None, metadata=json.dumps(
            {"type": "toolCall", "id": "call_2", "name": "read", "arguments": {"path": "a.md"}})),
        {"part_type": "step_finish"}])
    ids["m3"] = db.message(a, "tool", "", T2, [
        tool_part("call_1", "exec", tool_output="README.md"),
        tool_part("call_2", "read", tool_output="# A")])
    ids["m4"] = db.message(a, "assistant", "Done: moved.", T3)
    ids["m5"] = db.message(a, "user", "", T3, [
        {"part_type": "text", "text_content": "see this"},
        {"part_type": "file", "metadata": json.dumps(
            {"type": "image", "data": "iVBOR", "mimeType": "image/png"})}])
    ids["m6"] = db.message(a, "assistant", "", T3)
    ids["m7"] = db.message(a, "narrator", "once upon a time", T3)
    ids["m8"] = db.message(a, "tool", "ok", T3, [tool_part("call_3", "exec", tool_input="x")])
    b = db.conversation("sess-b", KEY, created_at="2026-02-26 00:00:00")
    ids["b"] = b
    ids["m9"] = db.message(b, "user", "ok", "2026-02-26 00:00:01")
    ids["m10"] = db.message(b, "assistant", "ok", "2026-02-26 00:00:02")
    c = db.conversation("sess-c", None, created_at="2026-02-27 00:00:00")
    ids["c"] = c
    ids["m11"] = db.message(c, "system", "You are helpful", "2026-02-27 00:00:01")
    ids["m12"] = db.message(c, "user", "ok", "2026-02-27 00:00:02")
    db.summary("sum_leaf1", a, "leaf", 0, "User asked to move DE-16.",
               messages=[ids["m1"], ids["m2"], ids["m3"], ids["m6"]], model="gpt-x")
    db.summary("sum_leaf2", a, "leaf", 0, "Moved; user sent an image.",
               messages=[ids["m4"], ids["m5"]])
    db.summary("sum_cond1", a, "condensed", 1, "DE-16 moved to the top.",
               parents=["sum_leaf1", "sum_leaf2"])
    db.summary("sum_leaf3", b, "leaf", 0, "Story time.", messages=[ids["m9"], ids["m7"]])
    db.summary("sum_cond2", b, "condensed", 1, "Stories.", parents=["sum_leaf3"])
    db.summary("sum_leaf4", c, "leaf", 0, "Ghost.", messages=[999])
    db.close()
    return ids


def expected_session_a() -> list[dict]:
    """What sess-a must decode to, byte for byte."""
    return [
        {"role": "user", "content": "Move DE-16 to the top", "timestamp": TS1},
        {"role": "assistant", "content": "", "reasoning": "Let me look", "timestamp": TS2,
         "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "exec", "arguments": '{"command":"ls"}'}},
             {"id": "call_2", "type": "function",
              "function": {"name": "read", "arguments": '{"path": "a.md"}'}}]},
        {"role": "tool", "content": "README.md", "tool_call_id": "call_1", "name": "exec",
         "timestamp": TS2},
        {"role": "tool", "content": "# A", "tool_call_id": "call_2", "name": "read",
         "timestamp": TS2},
        {"role": "assistant", "content": "Done: moved.", "timestamp": TS3},
        {"role": "user", "timestamp": TS3, "content": [
            {"type": "text", "text": "see this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "call_3", "name": "exec",
         "timestamp": TS3},
    ]


# ---------------------------------------------------------------------------- JSONL builders
def line(obj) -> str:
    return json.dumps(obj) + "\n"


def message_entry(entry_id, parent, message, timestamp="2026-02-25T05:30:00.000Z"):
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": timestamp,
            "message": message}


def build_transcripts(folder: Path) -> Path:
    """A v3 transcript with a branch, compaction and a truncated last line, a v1 file,
    sessions.json and a reset archive (not *.jsonl) in an OpenClaw-like layout."""
    sessions = folder / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    v3 = [
        {"type": "session", "version": 3, "id": "sess-j1", "timestamp": "2026-02-25T05:18:55.852Z",
         "cwd": "/w"},
        message_entry("e1", None, {"role": "user", "timestamp": 1771996735857,
                                   "content": [{"type": "text", "text": "Move DE-16 to the top"}]}),
        {"type": "model_change", "id": "e2", "parentId": "e1", "timestamp": "2026-02-25T05:19:00Z",
         "provider": "x", "modelId": "y"},
        message_entry("e3", "e2", {"role": "assistant", "timestamp": 1771996735858, "content": [
            {"type": "thinking", "thinking": "list files"},
            {"type": "toolCall", "id": "call_1", "name": "exec", "arguments": {"command": "ls"}}],
            "stopReason": "toolUse", "model": "m"}),
        message_entry("e4", "e3", {"role": "toolResult", "toolCallId": "call_1",
                                   "toolName": "exec", "isError": False,
                                   "content": [{"type": "text", "text": "README.md"}],
                                   "timestamp": 1771996752542}),
        message_entry("e5", "e4", {"role": "assistant", "content": [
            {"type": "text", "text": "abandoned answer"}], "timestamp": 1771996760000}),
        {"type": "compaction", "id": "e6", "parentId": "e4", "timestamp": "2026-02-25T05:40:00Z",
         "summary": "earlier stuff", "firstKeptEntryId": "e3", "tokensBefore": 1000},
        message_entry("e7", "e6", {"role": "user", "timestamp": "2026-02-25T05:20:00Z", "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "AAAA", "mimeType": "image/jpeg"}]}),
        message_entry("e8", "e7", {"role": "assistant",
                                   "content": [{"type": "text", "text": "It is a cat."}]},
                      timestamp="2026-02-25T05:21:00.500Z"),
    ]
    text = "".join(line(o) for o in v3) + '{"type":"message","id":"e9","parentId":"e8","mess'
    (sessions / "sess-j1.jsonl").write_text(text)
    v1 = [{"type": "session", "version": 1, "timestamp": "2026-01-01T00:00:00Z"},
          {"type": "message", "message": {"role": "user", "content": "hi",
                                          "timestamp": "2026-01-01T00:00:01Z"}},
          {"type": "message", "message": {"role": "bashExecution", "command": "ls"}},
          {"type": "message", "message": {"role": "assistant", "timestamp": 1767225602000,
                                          "content": [{"type": "text", "text": "hello"}]}}]
    (sessions / "old-linear.jsonl").write_text("".join(line(o) for o in v1))
    (sessions / "sessions.json").write_text(json.dumps(
        {"agent:main:main": {"sessionId": "sess-j1", "updatedAt": 1771996735857}}))
    (sessions / "gone.jsonl.reset.2026-02-01").write_text(line(v1[1]))
    return folder


EXPECTED_J1 = [
    {"role": "user", "content": "Move DE-16 to the top", "timestamp": 1771996735.857},
    {"role": "assistant", "content": "", "reasoning": "list files", "timestamp": 1771996735.858,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "exec", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "content": "README.md", "tool_call_id": "call_1", "name": "exec",
     "timestamp": 1771996752.542},
    {"role": "user", "timestamp": utc(2026, 2, 25, 5, 20), "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]},
    {"role": "assistant", "content": "It is a cat.",
     "timestamp": utc(2026, 2, 25, 5, 21, 0, 500000)},
]
EXPECTED_V1 = [
    {"role": "user", "content": "hi", "timestamp": utc(2026, 1, 1, 0, 0, 1)},
    {"role": "assistant", "content": "hello", "timestamp": 1767225602.0},
]


# ---------------------------------------------------------------------------- helpers
@pytest.fixture
def file_sample(tmp_path):
    """The sample source and a SQLite target path (tests of files and the scripts)."""
    source = tmp_path / "lcm.db"
    return source, build_sample(source), tmp_path / "trove" / "trove.db"


@pytest.fixture
def sample(tmp_path, backend):
    """The sample source and a target on each engine: a SQLite path, or the URL of a
    throw-away PostgreSQL schema (tests/pgkit.py), so the import rules hold on both."""
    source = tmp_path / "lcm.db"
    target = tmp_path / "trove" / "trove.db" if backend[0] == "sqlite" else backend[1]
    yield source, build_sample(source), target
    database.forget_database(str(target))


def on_server(target) -> bool:
    """Whether a test's target is a PostgreSQL URL (a ``str``) rather than a file path."""
    return isinstance(target, str)


def open_target(target, read_only: bool = False):
    """A connection of its own to the target (a file or a server)."""
    return database.open_private(str(target), read_only=read_only)


def run(source=None, target=None, **kwargs) -> oc.ImportReport:
    return oc.run_import(oc.ImportOptions(target_db=str(target), source_db=source and str(source),
                                          **kwargs))


def decoded(target, session_id: str) -> list[dict]:
    db = open_target(target)
    try:
        return [decode_row(r) for r in Store(db).session_messages(session_id, limit=1000)]
    finally:
        db.close()


def snapshot(target: Path) -> dict:
    """Every row the importer may touch, for before/after comparisons."""
    db = open_target(target, read_only=True) if on_server(target) else None
    conn = db.conn if db else sqlite3.connect(target)
    tables = ["sessions", "messages", "nodes", "node_edges"] + [
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name = 'import_ledger'")]
    data = {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2")]
            for t in tables}
    conn.close()
    return data


def folder_state(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def assert_reconciled(report: oc.ImportReport) -> None:
    r = report
    assert r.scanned == (r.eligible + r.skipped_empty + r.invalid_rows + r.skipped_non_message
                         + r.skipped_branch)
    assert r.messages == r.would_import + r.skipped_existing
    if r.mode == "apply":
        assert r.would_import == r.imported + r.deduplicated


# ---------------------------------------------------------------------------- timestamps
@pytest.mark.parametrize("value, expected", [
    ("2026-02-25 05:18:55", TS1),
    ("2026-02-25T05:18:55Z", TS1),
    ("2026-02-25T05:18:55.852Z", TS1 + 0.852),
    ("2026-02-25T07:18:55+02:00", TS1),
    ("2026-02-25T05:18:55", TS1),
    (1771996735857, 1771996735.857),
    ("1771996735857", 1771996735.857),
    (1771996735, 1771996735.0),
    (1771996735.5, 1771996735.5),
    ("yesterday", None), (None, None), (True, None), (float("nan"), None), ({}, None),
])
def test_parse_timestamp_reads_every_openclaw_format_as_utc(value, expected):
    assert sources.parse_timestamp(value) == expected


@pytest.mark.parametrize("block, url", [
    ({"type": "image", "data": "AAAA", "mimeType": "image/jpeg"}, "data:image/jpeg;base64,AAAA"),
    ({"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0"}},
     "data:image/gif;base64,R0"),
    ({"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}, "https://x/a.png"),
    ({"type": "image_url", "image_url": {"url": "https://x/b.png"}}, "https://x/b.png"),
    ({"type": "image", "data": "data:image/png;base64,QQ"}, "data:image/png;base64,QQ"),
    ({"type": "file", "url": "https://x/c.pdf", "mimeType": "application/pdf"}, None),
    ({"type": "text", "text": "hi"}, None),
    ("not a block", None),
])
def test_image_blocks_of_every_shape_become_urls(block, url):
    assert sources.image_url_of(block) == url


@pytest.mark.parametrize("value, expected", [
    ({"command": "ls"}, '{"command": "ls"}'),
    ('{"command":"ls"}', '{"command":"ls"}'),
    ("plain words", '{"input": "plain words"}'),
    (None, "{}"),
    ("", "{}"),
])
def test_tool_arguments_are_always_a_json_string(value, expected):
    assert sources.arguments_json(value) == expected


# ---------------------------------------------------------------------------- SQLite import
def test_sqlite_import_stores_exact_hermes_shaped_messages(sample):
    source, ids, target = sample
    report = run(source, target, apply=True)
    stored = decoded(target, "openclaw-trove:agent:main:sess-a")
    assert stored == expected_session_a()
    assert json.dumps(stored, sort_keys=True) == json.dumps(expected_session_a(), sort_keys=True)
    assert decoded(target, "openclaw-trove:agent:main:sess-b") == [
        {"role": "user", "content": "ok", "timestamp": utc(2026, 2, 26, 0, 0, 1)},
        {"role": "assistant", "content": "ok", "timestamp": utc(2026, 2, 26, 0, 0, 2)}]
    assert [m["role"] for m in decoded(target, "openclaw-trove:agent:main:sess-c")] == \
        ["system", "user"]
    assert (report.scanned, report.eligible, report.skipped_empty, report.invalid_rows) == \
        (12, 10, 1, 1)
    assert (report.messages, report.would_import, report.imported) == (11, 11, 11)
    assert report.sessions == {"scanned": 3, "new": 3, "existing": 0, "without_messages": 0}
    assert report.dropped_parts == {"step_finish": 1}
    assert any("narrator" in w for w in report.warnings)
    assert report.backup_path is None  # the target did not exist
    assert_reconciled(report)


def test_sqlite_provenance_source_conversation_and_message_time(sample):
    source, _, target = sample
    run(source, target, apply=True)
    db = open_target(target)
    store = Store(db)
    session = store.get_session("openclaw-trove:agent:main:sess-a")
    assert session["source"] == "openclaw-trove"
    assert session["conversation_id"] == KEY
    assert store.get_session("openclaw-trove:agent:main:sess-c")["conversation_id"] is None
    rows = store.session_messages("openclaw-trove:agent:main:sess-a")
    assert {r["source"] for r in rows} == {"openclaw-trove"}
    assert {r["conversation_id"] for r in rows} == {KEY}
    assert rows[0]["message_at"] == TS1
    assert all(r["token_count"] > 0 for r in rows)
    db.close()


def test_imported_session_reads_back_page_by_page(sample):
    """What trove_load_session does: page through the raw rows with a store_id cursor."""
    source, _, target = sample
    run(source, target, apply=True)
    db = open_target(target)
    store = Store(db)
    pages, cursor = [], 0
    while True:
        page = store.session_messages("openclaw-trove:agent:main:sess-a", cursor, limit=3)
        if not page:
            break
        pages.append(page)
        cursor = page[-1]["store_id"]
    db.close()
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [decode_row(r) for p in pages for r in p] == expected_session_a()


def test_session_key_identity_groups_conversations_sharing_a_key(sample):
    source, _, target = sample
    report = run(source, target, apply=True, session_identity="session_key")
    grouped = decoded(target, f"openclaw-trove:agent:main:{KEY}")
    assert grouped[:7] == expected_session_a()
    assert [(m["role"], m["content"]) for m in grouped[7:]] == [("user", "ok"), ("assistant", "ok")]
    assert decoded(target, "openclaw-trove:agent:main:sess-c")  # no key: falls back to session_id
    assert report.sessions["new"] == 2


def test_first_schema_generation_imports_and_falls_back(tmp_path):
    source, target = tmp_path / "old.db", tmp_path / "t.db"
    build_sample(source, generation=1)
    report = run(source, target, apply=True, session_identity="session_key",
                 include_summaries=True)
    assert decoded(target, "openclaw-trove:agent:main:sess-a") == expected_session_a()
    assert any("no session_key column" in w for w in report.warnings)
    db = open_target(target)
    store = Store(db)
    assert store.get_session("openclaw-trove:agent:main:sess-a")["conversation_id"] is None
    nodes = Dag(db).session_nodes("openclaw-trove:agent:main:sess-a")
    assert {n["model"] for n in nodes} == {"lossless-claw"}
    db.close()


def test_summaries_become_nodes_with_exact_lineage(sample):
    source, ids, target = sample
    report = run(source, target, apply=True, include_summaries=True)
    assert report.summaries == {"scanned": 6, "would_import": 3, "imported": 3,
                                "skipped_existing": 0, "skipped_missing_sources": 3,
                                "invalid": 0}
    assert sum("sum_leaf3" in w or "sum_cond2" in w or "sum_leaf4" in w
               for w in report.warnings) == 3
    db = open_target(target)
    store, dag = Store(db), Dag(db)
    session = "openclaw-trove:agent:main:sess-a"
    rows = store.session_messages(session)
    leaf1, leaf2 = dag.session_nodes(session, depth=0)
    (cond,) = dag.session_nodes(session, depth=1)
    assert [leaf1["text"], leaf2["text"], cond["text"]] == [
        "User asked to move DE-16.", "Moved; user sent an image.", "DE-16 moved to the top."]
    assert (leaf1["model"], leaf2["model"], cond["model"]) == ("gpt-x", "lossless-claw",
                                                              "lossless-claw")
    assert {leaf1["level"], leaf2["level"], cond["level"]} == {0}
    # m1, m2 and m3 (split in two); the empty m6 has nothing to point at
    assert [c["id"] for c in dag.children(leaf1["node_id"])] == \
        [r["store_id"] for r in rows[:4]]
    assert [c["id"] for c in dag.children(leaf2["node_id"])] == \
        [r["store_id"] for r in rows[4:6]]
    assert [c["id"] for c in dag.children(cond["node_id"])] == [leaf1["node_id"],
                                                                leaf2["node_id"]]
    assert dag.descendant_store_ids(cond["node_id"]) == [r["store_id"] for r in rows[:6]]
    assert (cond["time_from"], cond["time_to"]) == (TS1, TS3)
    assert leaf1["token_count"] == 7
    assert leaf1["source_token_count"] == sum(r["token_count"] for r in rows[:4])
    assert leaf1["created_at"] == utc(2026, 2, 26, 1, 0, 0)
    assert [n["node_id"] for n in dag.frontier(session)] == [cond["node_id"]]
    db.close()


# ---------------------------------------------------------------------------- reruns, import ids
def test_rerun_with_same_import_id_is_idempotent_and_picks_up_new_rows(sample):
    source, ids, target = sample
    first = run(source, target, apply=True, include_summaries=True)
    before = snapshot(target)
    again = run(source, target, apply=True, include_summaries=True)
    assert (again.imported, again.would_import, again.skipped_existing) == (0, 0, first.messages)
    assert again.summaries["skipped_existing"] == 3 and again.summaries["imported"] == 0
    assert again.sessions == {"scanned": 3, "new": 0, "existing": 3, "without_messages": 0}
    after = snapshot(target)
    assert {t: v for t, v in after.items() if t != "import_ledger"} == \
        {t: v for t, v in before.items() if t != "import_ledger"}
    assert after["import_ledger"] == before["import_ledger"]

    db = Lcm.reopen(source)
    db.message(ids["a"], "user", "ok", "2026-02-25 06:00:00")
    db.close()
    grown = run(source, target, apply=True)
    assert (grown.imported, grown.skipped_existing) == (1, first.messages)
    assert decoded(target, "openclaw-trove:agent:main:sess-a") == expected_session_a() + [
        {"role": "user", "content": "ok", "timestamp": utc(2026, 2, 25, 6)}]
    assert_reconciled(grown)


def test_different_import_id_is_a_new_import(sample):
    source, _, target = sample
    first = run(source, target, apply=True)
    second = run(source, target, apply=True, import_id="second-pass")
    assert second.imported == first.imported == 11
    assert second.sessions["new"] == 3
    assert decoded(target, "openclaw-trove:agent:main:sess-a@second-pass") == expected_session_a()
    assert decoded(target, "openclaw-trove:agent:main:sess-a") == expected_session_a()
    third = run(source, target, apply=True, import_id="second-pass")
    assert third.imported == 0 and third.skipped_existing == 11


def test_default_import_id_is_a_stable_hash_of_the_source_path(file_sample, tmp_path):
    source, _, target = file_sample
    first = run(source, target)
    same = oc.ImportOptions(target_db=str(target), source_db=str(tmp_path / "." / "lcm.db"))
    assert first.import_id == oc.default_import_id(same)
    assert first.import_id.startswith("lcm-") and len(first.import_id) == 16


# ---------------------------------------------------------------------------- dry run, backup
def test_dry_run_writes_nothing_and_predicts_the_apply(sample):
    source, _, target = sample
    plan = run(source, target, include_summaries=True)
    if on_server(target):   # not even the schema's tables were created
        db = open_target(target, read_only=True)
        assert db.schema_version() == 0
        db.close()
    else:
        assert not target.parent.exists()
    assert plan.mode == "dry-run" and plan.imported == 0 and plan.would_import == 11
    assert plan.summaries["would_import"] == 3
    assert_reconciled(plan)
    done = run(source, target, apply=True, include_summaries=True)
    assert (done.would_import, done.summaries["imported"]) == (11, 3)

    state = snapshot if on_server(target) else (lambda t: folder_state(t.parent))
    before = state(target)
    replan = run(source, target, include_summaries=True)
    assert state(target) == before  # no -wal/-shm, not one byte (not one row) changed
    assert (replan.would_import, replan.skipped_existing) == (0, 11)
    assert replan.summaries["skipped_existing"] == 3


def test_progress_is_reported_after_each_session(file_sample):
    source, _, target = file_sample
    calls = []
    oc.run_import(oc.ImportOptions(target_db=str(target), source_db=str(source)),
                  progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_dry_run_leaves_the_source_folder_untouched(tmp_path):
    source = tmp_path / "src" / "lcm.db"
    source.parent.mkdir()
    build_sample(source, wal=True)
    before = folder_state(source.parent)
    run(source, tmp_path / "t.db")
    assert folder_state(source.parent) == before


def test_apply_backs_up_an_existing_target_first(sample):
    source, _, target = sample
    run(source, target, apply=True)
    before = snapshot(target)
    report = run(source, target, apply=True, import_id="again")
    backup = Path(report.backup_path)
    assert "-pre-import-" in backup.name
    if on_server(target):   # a pg_dump archive where the operator commands put theirs
        assert backup.parent == Path(os.environ["HERMES_HOME"]) / "backups"
        assert backup.suffix == ".pgdump" and backup.read_bytes().startswith(b"PGDMP")
    else:
        assert backup.parent == target.parent / "backups"
        assert snapshot(backup) == before
    assert snapshot(target) != before


# ---------------------------------------------------------------------------- failures
def failing_after(calls: int, original):
    state = {"n": 0}

    def wrapper(*args, **kwargs):
        state["n"] += 1
        if state["n"] > calls:
            raise RuntimeError("disk on fire")
        return original(*args, **kwargs)
    return wrapper


def test_failure_mid_import_leaves_existing_target_unchanged(sample, monkeypatch):
    source, _, target = sample
    run(source, target, apply=True, import_id="base")
    before = snapshot(target)
    monkeypatch.setattr(Dag, "add_node", failing_after(2, Dag.add_node))
    with pytest.raises(oc.ImportFailure, match="rolled back.*disk on fire"):
        run(source, target, apply=True, import_id="other", include_summaries=True)
    assert snapshot(target) == before


def test_failure_on_a_new_target_leaves_no_file(sample, monkeypatch):
    source, _, target = sample
    monkeypatch.setattr(Store, "ingest", failing_after(1, Store.ingest))
    with pytest.raises(oc.ImportFailure, match="disk on fire"):
        run(source, target, apply=True)
    if on_server(target):   # the schema's tables may exist (opening migrates); no rows
        assert not any(snapshot(target).values())
    else:
        assert not target.exists()
        assert list(target.parent.iterdir()) == []


def test_non_sqlite_and_corrupt_sources_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("this is not a database\n" * 50)
    with pytest.raises(oc.ImportFailure, match="not a SQLite database"):
        run(junk, tmp_path / "t.db")
    corrupt = tmp_path / "corrupt.db"
    build_sample(corrupt)
    data = bytearray(corrupt.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)
    corrupt.write_bytes(bytes(data))
    with pytest.raises(oc.ImportFailure, match="cannot read source database"):
        run(corrupt, tmp_path / "t.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.close()
    with pytest.raises(oc.ImportFailure, match="not a lossless-claw database"):
        run(other, tmp_path / "t.db")
    with pytest.raises(oc.ImportFailure, match="does not exist"):
        run(tmp_path / "missing.db", tmp_path / "t.db")
    assert not (tmp_path / "t.db").exists()


def test_locked_source_is_a_clear_error(file_sample):
    source, _, target = file_sample
    holder = sqlite3.connect(source, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(oc.ImportFailure, match="locked"):
            run(source, target, apply=True, busy_timeout=0.05)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not target.exists()


def test_bad_arguments_are_clear_errors(file_sample, tmp_path):
    source, _, target = file_sample
    with pytest.raises(oc.ImportFailure, match="either"):
        run(None, target)
    with pytest.raises(oc.ImportFailure, match="apply to --source-db"):
        run(None, target, source_jsonl=[str(source)], include_summaries=True)
    with pytest.raises(oc.ImportFailure, match="not a file"):
        run(None, target, source_jsonl=[str(tmp_path / "nope.jsonl")])
    with pytest.raises(oc.ImportFailure, match="must not be the source"):
        run(source, source, apply=True)
    with pytest.raises(oc.ImportFailure, match="must not be empty"):
        run(source, target, agent=" ")


# ---------------------------------------------------------------------------- JSONL import
def test_jsonl_directory_imports_the_live_branch_exactly(tmp_path):
    build_transcripts(tmp_path / "oc")
    target = tmp_path / "t.db"
    report = run(None, target, apply=True, source_jsonl_dirs=[str(tmp_path / "oc")])
    stored = decoded(target, "openclaw-jsonl:agent:main:sess-j1")
    assert json.dumps(stored, sort_keys=True) == json.dumps(EXPECTED_J1, sort_keys=True)
    assert decoded(target, "openclaw-jsonl:agent:main:old-linear") == EXPECTED_V1
    # sess-j1: 8 entry lines + the truncated one; old-linear: 3 lines
    assert report.scanned == 12
    assert (report.eligible, report.invalid_rows, report.skipped_non_message,
            report.skipped_branch) == (7, 2, 2, 1)
    assert report.imported == 7
    assert any("truncated" in w and "sess-j1.jsonl:10" in w for w in report.warnings)
    assert any("bashExecution" in w for w in report.warnings)
    assert_reconciled(report)
    db = open_target(target)
    store = Store(db)
    live = store.get_session("openclaw-jsonl:agent:main:sess-j1")
    assert (live["conversation_id"], live["source"]) == ("agent:main:main", "openclaw-jsonl")
    assert store.get_session("openclaw-jsonl:agent:main:old-linear")["conversation_id"] is None
    assert store.count_messages() == 7
    db.close()


def test_jsonl_rerun_is_idempotent_and_new_branch_appends(tmp_path):
    folder = build_transcripts(tmp_path / "oc")
    target = tmp_path / "t.db"
    options = {"source_jsonl_dirs": [str(folder)], "apply": True}
    run(None, target, **options)
    again = run(None, target, **options)
    assert (again.imported, again.skipped_existing) == (0, 7)
    path = folder / "agents" / "main" / "sessions" / "sess-j1.jsonl"
    text = path.read_text().rsplit("\n", 1)[0] + "\n"  # drop the truncated line
    path.write_text(text + line(message_entry("e9", "e8", {
        "role": "user", "content": "thanks", "timestamp": 1771996900000})))
    grown = run(None, target, **options)
    assert (grown.imported, grown.skipped_existing, grown.invalid_rows) == (1, 7, 1)
    assert decoded(target, "openclaw-jsonl:agent:main:sess-j1")[-1] == {
        "role": "user", "content": "thanks", "timestamp": 1771996900.0}


def test_jsonl_broken_parent_link_starts_the_branch_with_a_warning(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(line({"type": "session", "version": 3, "id": "s"})
                    + line(message_entry("a1", None, {"role": "user", "content": "lost"}))
                    + line(message_entry("b1", "gone", {"role": "user", "content": "kept"}))
                    + line(message_entry("b2", "b1", {"role": "assistant", "content": "yes"})))
    report = run(None, tmp_path / "t.db", apply=True, source_jsonl=[str(path)])
    assert [m["content"] for m in decoded(tmp_path / "t.db", "openclaw-jsonl:agent:main:s")] \
        == ["kept", "yes"]
    assert report.skipped_branch == 1
    assert any("missing parent 'gone'" in w for w in report.warnings)


def test_jsonl_line_without_id_keeps_the_tree_and_reruns_add_nothing(tmp_path):
    """A tree transcript with one line without an id (a record type of a newer OpenClaw,
    a corrupt object) is still a tree: the abandoned branch stays out, and a rerun after
    such a line was appended stores nothing (it re-keyed the file by line number and
    stored the abandoned answer and the live one again)."""
    path = tmp_path / "s.jsonl"
    path.write_text(line({"type": "session", "version": 3, "id": "s"})
                    + line(message_entry("a", None, {"role": "user", "content": "q"}))
                    + line(message_entry("b", "a", {"role": "assistant", "content": "abandoned"}))
                    + line({"type": "custom"})
                    + line(message_entry("c", "a", {"role": "assistant", "content": "live"})))
    target = tmp_path / "t.db"
    first = run(None, target, apply=True, source_jsonl=[str(path)])
    assert [m["content"] for m in decoded(target, "openclaw-jsonl:agent:main:s")] == ["q", "live"]
    assert (first.imported, first.skipped_branch, first.skipped_non_message) == (2, 1, 1)
    assert_reconciled(first)
    with path.open("a") as handle:
        handle.write(line({"type": "future_record", "data": {"x": 1}}))
    again = run(None, target, apply=True, source_jsonl=[str(path)])
    assert (again.imported, again.skipped_existing) == (0, 2)
    with path.open("a") as handle:
        handle.write(line(message_entry("d", "c", {"role": "user", "content": "more"})))
    grown = run(None, target, apply=True, source_jsonl=[str(path)])
    assert (grown.imported, grown.skipped_existing) == (1, 2)
    assert [m["content"] for m in decoded(target, "openclaw-jsonl:agent:main:s")] == [
        "q", "live", "more"]


SECRET_KEY = "sk-proj-Abc123Def456Ghi789Jkl012Mno345"


def test_import_redacts_secrets_when_the_settings_say_so(tmp_path, monkeypatch):
    """With TROVE_SENSITIVE_PATTERNS_ENABLED the import stores what the engine would
    (it stored pasted keys in clear, in rows and the full-text index); reruns line up
    with the redacted rows, also once redaction is switched off again; off, text is exact."""
    path = tmp_path / "s.jsonl"
    path.write_text(line({"type": "session", "version": 3, "id": "s"})
                    + line(message_entry("a", None, {"role": "user",
                                                     "content": f"my key is {SECRET_KEY}"}))
                    + line(message_entry("b", "a", {"role": "assistant", "content": [
                        {"type": "toolCall", "id": "c1", "name": "sh",
                         "arguments": {"cmd": f"export OPENAI_API_KEY={SECRET_KEY}"}}]})))
    target = tmp_path / "t.db"
    monkeypatch.setenv("TROVE_SENSITIVE_PATTERNS_ENABLED", "true")
    dry = run(None, target, source_jsonl=[str(path)])
    assert dry.redactions == 2 and not target.exists()
    first = run(None, target, apply=True, source_jsonl=[str(path)])
    assert (first.imported, first.redactions) == (2, 2)
    stored = decoded(target, "openclaw-jsonl:agent:main:s")
    assert "[REDACTED:api_key:sha256=" in stored[0]["content"]
    assert SECRET_KEY not in json.dumps(stored)
    assert SECRET_KEY.encode() not in target.read_bytes()
    db = open_target(target)
    assert not Store(db).fts_candidates('"Abc123Def456Ghi789Jkl012Mno345"', limit=5)
    db.close()
    again = run(None, target, apply=True, source_jsonl=[str(path)])
    assert (again.imported, again.skipped_existing, again.redactions) == (0, 2, 0)
    monkeypatch.delenv("TROVE_SENSITIVE_PATTERNS_ENABLED")
    with path.open("a") as handle:
        handle.write(line(message_entry("c", "b", {"role": "user", "content": "next"})))
    grown = run(None, target, apply=True, source_jsonl=[str(path)])
    assert (grown.imported, grown.skipped_existing, grown.deduplicated) == (1, 2, 0)
    assert len(decoded(target, "openclaw-jsonl:agent:main:s")) == 3
    plain = run(None, tmp_path / "plain.db", apply=True, source_jsonl=[str(path)])
    assert plain.redactions == 0
    assert decoded(tmp_path / "plain.db", "openclaw-jsonl:agent:main:s")[0]["content"] == \
        f"my key is {SECRET_KEY}"


def test_single_jsonl_file_and_options(tmp_path):
    folder = build_transcripts(tmp_path / "oc")
    path = folder / "agents" / "main" / "sessions" / "sess-j1.jsonl"
    target = tmp_path / "t.db"
    report = run(None, target, apply=True, source_jsonl=[str(path)], agent="ops",
                 namespace="oc-archive")
    assert decoded(target, "oc-archive:agent:ops:sess-j1") == EXPECTED_J1
    assert report.import_id.startswith("jsonl-")


# ---------------------------------------------------------------------------- the script
def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": ""})


def test_script_json_report_round_trip(file_sample):
    source, _, target = file_sample
    dry = run_script("--source-db", source, "--target-db", target, "--include-summaries",
                     "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["mode"], plan["would_import"], plan["imported"]) == ("dry-run", 11, 0)
    assert not target.exists()
    done = run_script("--source-db", source, "--target-db", target, "--include-summaries",
                      "--apply", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert {k: report[k] for k in ("scanned", "eligible", "would_import", "imported",
                                   "skipped_existing", "skipped_empty", "invalid_rows")} == {
        "scanned": 12, "eligible": 10, "would_import": 11, "imported": 11,
        "skipped_existing": 0, "skipped_empty": 1, "invalid_rows": 1}
    assert report["summaries"]["imported"] == 3 and report["warning_count"] == 4
    assert decoded(target, "openclaw-trove:agent:main:sess-a") == expected_session_a()


def test_script_human_output_and_errors(file_sample, tmp_path):
    source, _, target = file_sample
    human = run_script("--source-db", source, "--target-db", target)
    assert human.returncode == 0
    assert "would import 11" in human.stdout and "--apply" in human.stdout
    assert "narrator" in human.stderr
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00garbage" * 100)
    bad = run_script("--source-db", junk, "--target-db", target, "--apply")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error:") and "Traceback" not in bad.stderr
    both = run_script("--source-db", source, "--source-jsonl", junk, "--target-db", target)
    assert both.returncode == 2 and "Traceback" not in both.stderr
    assert not target.exists()


def test_imported_session_reads_through_the_engine_tools(file_sample):
    """trove_load_session of an imported session through a real TroveEngine, exact content."""
    from hermes_trove import config as trove_config
    from hermes_trove.storage import database
    from hermes_trove import tools
    from hermes_trove.engine import TroveEngine
    source, _, target = file_sample
    run(source, target, apply=True)
    engine = TroveEngine(trove_config.load_config({"HERMES_HOME": str(target.parent),
                                                   "TROVE_DATABASE_PATH": str(target)}))
    engine.use_llm(None)
    engine.update_model("m", 64_000)
    engine.on_session_start("operator-cli", platform="cli")
    imported = "openclaw-trove:agent:main:sess-a"
    messages, cursor = [], 0
    while cursor is not None:
        page = json.loads(tools.dispatch("trove_load_session", {
            "session_id": imported, "after_store_id": cursor, "limit": 3}, engine.tool_context()))
        assert "error" not in page, page
        messages += page["messages"]
        cursor = page["next_cursor"]
    rows = decoded(target, imported)
    assert [m["store_id"] for m in messages] == list(range(messages[0]["store_id"],
                                                         messages[0]["store_id"] + len(rows)))
    assert [m.get("content") for m in messages] == [
        r["content"] if isinstance(r.get("content"), str) or r.get("content") is None
        else json.dumps(r["content"], ensure_ascii=False) for r in rows]
    # The current session cannot see it without naming it (scope safety).
    grep = json.loads(tools.dispatch("trove_grep", {"query": "DE-16"}, engine.tool_context()))
    assert grep["results"] == []
    named = json.loads(tools.dispatch("trove_grep", {"query": "DE-16", "session_id": imported},
                                      engine.tool_context()))
    assert named["results"] and "DE-16" in named["results"][0]["snippet"]
    database.forget_database(target)
