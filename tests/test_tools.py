"""Tests for tools.py / schemas.py / health.py: every trove_* tool, scope, bounds, hostile input."""
import json
from pathlib import Path

import pytest
import yaml

from hermes_trove.diagnostics import health
from hermes_trove import schemas, tools
from hermes_trove.compaction import tokens
from hermes_trove.storage.owners import LOCAL_OWNER, Owners
from hermes_trove.config import load_config
from hermes_trove.dag import Dag, NewNode
from hermes_trove.storage import database
from hermes_trove.store import Store

DAY = 86400.0
NOW = 1_795_000_000.0          # 2026-11-18 UTC, a fixed "now" for period tests
COUNTER = tokens.get_counter()


class Env:
    """A fresh database with sessions A and B and a context factory."""

    def __init__(self, tmp_path: Path, target: str | None = None, **config_env):
        self.db = database.get_database(target or str(tmp_path / "trove.db"))
        self.store, self.dag = Store(self.db), Dag(self.db)
        environ = {f"TROVE_{k.upper()}": str(v) for k, v in config_env.items()}
        self.config = load_config(environ=environ, hermes_home=tmp_path)
        self.tmp = tmp_path
        for sid in ("A", "B"):   # two CLI sessions of the profile: one owner, as bound
            self.store.ensure_session(sid, source="cli")
            Owners(self.db).record(sid, LOCAL_OWNER, platform="cli")

    def ctx(self, session_id="A", **overrides) -> tools.ToolContext:
        fields = dict(store=self.store, dag=self.dag, config=self.config,
                      count_tokens=COUNTER.count_text, session_id=session_id,
                      conversation_id=None, current_turn_store_id=None,
                      status=lambda: {"session_id": session_id, "context_length": 64000,
                                      "last_prompt_tokens": 9000, "compaction_count": 0},
                      llm_call=None, data_dir=self.tmp, now=lambda: NOW)
        fields.update(overrides)
        return tools.ToolContext(**fields)

    def ingest(self, session, messages, at=NOW - 3600):
        return self.store.ingest(session, messages, now=at).store_ids

    def node(self, session, text, *, store_ids=(), node_ids=(), depth=0):
        return self.dag.add_node(NewNode(session_id=session, depth=depth, text=text,
                                         token_count=COUNTER.count_text(text),
                                         source_token_count=1000, level=3, model="deterministic",
                                         child_store_ids=list(store_ids),
                                         child_node_ids=list(node_ids)))


def sqlite_only(env) -> None:
    """A check of the SQLite file itself (quick_check, FTS5 shadow tables): the server
    keeps its files and computes its tsvector columns itself."""
    if env.db.dialect != "sqlite":
        pytest.skip("SQLite file check; PostgreSQL has no quick_check or FTS5 shadow table")


def call(ctx, name, **args) -> dict:
    """Dispatch and check the two promises every answer keeps: JSON, within the cap."""
    text = tools.dispatch(name, args, ctx)
    assert COUNTER.count_text(text) <= ctx.config.tool_response_max_tokens
    return json.loads(text)


@pytest.fixture
def env(tmp_path, backend):
    env = Env(tmp_path, backend[1])
    yield env
    database.forget_database(backend[1])


@pytest.fixture
def planted(env):
    """Session A with a planted fact and a summary over it; session B with a secret."""
    a = env.ingest("A", [
        {"role": "user", "content": "Let's configure the staging environment."},
        {"role": "assistant", "content": "The staging database port is 6543 and "
                                         "retry_backoff_ms stays at 250."},
        {"role": "user", "content": "Also remember the cache TTL is ninety seconds."},
        {"role": "assistant", "content": "Noted: cache TTL ninety seconds."},
    ])
    b = env.ingest("B", [{"role": "user", "content": "zebra secret: the vault password "
                                                     "hint is marmalade"}])
    leaf = env.node("A", "Summary: staging database port 6543 chosen; cache TTL ninety "
                         "seconds.", store_ids=a)
    b_leaf = env.node("B", "Summary: zebra vault hint marmalade.", store_ids=b)
    return {"a": a, "b": b, "leaf": leaf, "b_leaf": b_leaf}


# ---------------------------------------------------------------- schemas
def test_schemas_match_tool_names_and_manifest():
    manifest = yaml.safe_load((Path(tools.__file__).parent / "plugin.yaml").read_text())
    assert set(manifest["provides_tools"]) == set(tools.TOOL_NAMES) == set(tools.HANDLERS)
    for schema in schemas.get_tool_schemas():
        assert set(schema) == {"name", "description", "parameters"}
        assert schema["parameters"]["type"] == "object"
        assert len(schema["description"]) < 400


def test_get_tool_schemas_returns_deep_copies():
    first = schemas.get_tool_schemas()
    first[0]["parameters"]["properties"].clear()
    assert schemas.get_tool_schemas()[0]["parameters"]["properties"]


# ---------------------------------------------------------------- trove_grep
def test_grep_finds_fact_and_summary_with_expand_handles(env, planted):
    out = call(env.ctx(), "trove_grep", query="which port does the staging database use?")
    kinds = {(r["kind"], r.get("store_id") or r.get("node_id")) for r in out["results"]}
    assert ("message", planted["a"][1]) in kinds and ("summary", planted["leaf"]) in kinds
    top = out["results"][0]
    assert top["expand"]["tool"] == "trove_expand"
    assert "6543" in top["snippet"]


def test_grep_shows_the_most_specific_of_nested_matching_summaries(env, planted):
    # folded overviews nest (each holds the previous one); a chain of them all
    # matching must not crowd the raw hits out of the results
    chain = [planted["leaf"]]
    for depth in range(1, 6):
        chain.append(env.node("A", f"Overview {depth}: staging database port 6543 chosen.",
                              node_ids=[chain[-1]], depth=depth))
    out = call(env.ctx(), "trove_grep", query="staging database port", limit=3)
    summaries = [r["node_id"] for r in out["results"] if r["kind"] == "summary"]
    assert len(summaries) == 1 and summaries[0] in chain
    assert ("message", planted["a"][1]) in {(r["kind"], r.get("store_id")) for r in out["results"]}
    assert sorted(env.dag.edges_among(chain)) == list(zip(chain[1:], chain))


def test_grep_explain_adds_score_parts(env, planted):
    out = call(env.ctx(), "trove_grep", query="staging port", explain=True)
    parts = out["results"][0]["score_parts"]
    assert {"bm25", "coverage", "matched", "score", "fused", "ranks"} <= set(parts)
    assert "stages" in out


def test_grep_limit_is_clamped_and_reported(env, planted):
    assert call(env.ctx(), "trove_grep", query="staging", limit=500)["limit_clamped_from"] == 500
    out = call(env.ctx(), "trove_grep", query="staging", limit=0)
    assert out["limit_clamped_from"] == 0 and len(out["results"]) == 1 and out["has_more"]


def test_grep_excludes_the_current_turn_unless_asked(env, planted):
    asking = env.ingest("A", [{"role": "user", "content": "what was the zanzibar threshold?"}])
    ctx = env.ctx(current_turn_store_id=asking[0])
    assert call(ctx, "trove_grep", query="zanzibar threshold")["results"] == []
    again = call(ctx, "trove_grep", query="zanzibar threshold", include_current_turn=True)
    assert [r["store_id"] for r in again["results"]] == asking


def test_grep_current_turn_exclusion_also_applies_to_scope_all(env, planted):
    asking = env.ingest("A", [{"role": "user", "content": "where is the zanzibar note?"}])
    out = call(env.ctx(current_turn_store_id=asking[0]), "trove_grep", query="zanzibar",
               session_scope="all")
    assert out["results"] == []


def test_grep_role_and_time_filters_return_raw_rows_only(env, planted):
    out = call(env.ctx(), "trove_grep", query="staging", role="assistant")
    assert out["summary_results_omitted"] is True
    assert {r["kind"] for r in out["results"]} == {"message"}
    assert {r["role"] for r in out["results"]} == {"assistant"}
    later = call(env.ctx(), "trove_grep", query="staging", time_from=NOW - 60)
    assert later["results"] == [] and later["summary_results_omitted"]
    iso_window = call(env.ctx(), "trove_grep", query="staging",
                      time_from="2026-11-18T00:00:00Z", time_to=NOW)
    assert len(iso_window["results"]) == 2


def test_grep_source_filters_raw_rows_and_summary_lineage(env):
    tg = env.store.ingest("A", [{"role": "user", "content": "kumquat from telegram"}],
                          source="telegram").store_ids
    un = env.ingest("A", [{"role": "user", "content": "kumquat from nowhere"}])
    env.node("A", "kumquat summary over telegram", store_ids=tg)
    env.node("A", "kumquat summary over unknown", store_ids=un)
    by_tg = call(env.ctx(), "trove_grep", query="kumquat", source="telegram")["results"]
    assert [r.get("store_id") for r in by_tg if r["kind"] == "message"] == tg
    assert [r["snippet"] for r in by_tg if r["kind"] == "summary"] == ["kumquat summary over telegram"]
    by_unknown = call(env.ctx(), "trove_grep", query="kumquat", source="unknown")["results"]
    assert {r.get("store_id") for r in by_unknown if r["kind"] == "message"} == set(un)
    assert [r["snippet"] for r in by_unknown if r["kind"] == "summary"] == ["kumquat summary over unknown"]


def test_grep_scope_all_and_named_session_return_raw_hits_with_scoped_handles(env, planted):
    ctx = env.ctx()
    out = call(ctx, "trove_grep", query="zebra marmalade", session_scope="all")
    assert out["summary_results_omitted"] and [r["kind"] for r in out["results"]] == ["message"]
    hit = out["results"][0]
    assert hit["session_id"] == "B"
    assert hit["expand"]["args"] == {"store_id": planted["b"][0], "session_scope": "all"}
    opened = call(ctx, hit["expand"]["tool"], **hit["expand"]["args"])
    assert "marmalade" in opened["message"]["content"]
    named = call(ctx, "trove_grep", query="marmalade", session_scope="session", session_id="B")
    assert named["results"][0]["expand"]["args"] == {"store_id": planted["b"][0], "session_id": "B"}
    assert "error" in call(ctx, "trove_grep", query="x", session_scope="session")


def test_grep_content_scope_without_payloads(env, planted):
    out = call(env.ctx(), "trove_grep", query="staging", content_scope="externalized")
    assert out["results"] == []
    both = call(env.ctx(), "trove_grep", query="staging", content_scope="both")
    assert both["results"] and both["externalized_results"] == []


HOSTILE_QUERIES = [
    '"', '""', '"unbalanced', '*', 'NEAR(', 'NEAR(a b, 3)', 'AND OR', 'AND', 'OR NOT AND',
    'a:b', 'body:secret', 'tags:s41', '{body}: x', '^start', 'x' * 10_000,
    ('staging ' * 2000), '.*[(?<=\\', '\\d+$', "'; DROP TABLE messages; --",
    "1 OR 1=1", "\x00", "staging\x00port", json.loads('"\\ud800 lone \\udfff"'), "🦀🦀", "   ",
    "数据库", "-", "--", "-staging", '"staging port"', "()", ")(", "staging*", "col:",
]


@pytest.mark.parametrize("query", HOSTILE_QUERIES)
def test_hostile_queries_never_raise(env, planted, query):
    for name in ("trove_grep", "trove_recall"):
        out = call(env.ctx(), name, query=query)
        assert isinstance(out.get("results", []), list)
        assert "error" not in out or "required" in out["error"]
    assert env.store.count_messages() == 5  # nothing was injected


def test_long_query_is_truncated_and_reported(env, planted):
    out = call(env.ctx(), "trove_grep", query="staging " * 5000)
    assert out["query_truncated"] is True and out["results"]


def test_quoted_phrase_and_exclusion(env, planted):
    out = call(env.ctx(), "trove_grep", query='"cache TTL" -noted')
    ids = [r.get("store_id") for r in out["results"] if r["kind"] == "message"]
    assert ids == [planted["a"][2]]


# ---------------------------------------------------------------- trove_expand
def test_expand_node_pages_through_sources(env):
    ids = env.ingest("A", [{"role": "user", "content": f"line {i}"} for i in range(30)])
    leaf = env.node("A", "thirty lines", store_ids=ids)
    ctx, seen, offset = env.ctx(), [], 0
    while offset is not None:
        page = call(ctx, "trove_expand", node_id=leaf, source_offset=offset, source_limit=7)
        seen += [s["store_id"] for s in page["sources"]]
        offset = page["next_source_offset"]
        assert page["has_more"] == (offset is not None)
    assert seen == ids


def test_expand_condensed_node_returns_child_summaries(env):
    ids = env.ingest("A", [{"role": "user", "content": f"m{i}"} for i in range(4)])
    leaves = [env.node("A", f"leaf {i}", store_ids=ids[2 * i:2 * i + 2]) for i in range(2)]
    top = env.node("A", "top", node_ids=leaves, depth=1)
    out = call(env.ctx(), "trove_expand", node_id=top)
    assert [(s["kind"], s["node_id"], s["text"]) for s in out["sources"]] == [
        ("summary", leaves[0], "leaf 0"), ("summary", leaves[1], "leaf 1")]
    assert out["sources"][0]["expand"] == {"tool": "trove_expand", "args": {"node_id": leaves[0]}}


EXACT_MESSAGES = [
    {"role": "user", "content": "héllo wörld — 日本語 🦀 \u200b tabs\tand\r\nnewlines"},
    {"role": "user", "content": "nul\x00inside and \x01 control"},
    {"role": "user", "content": json.loads('"lone \\ud800 surrogate"')},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\": \"ls -la\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "total 0\n"},
]


def read_message(ctx, store_id, **scope):
    """Page through one message with content_offset / tool_calls_offset; reassemble it."""
    content, calls, args = "", "", {"store_id": store_id, **scope}
    while True:
        page = call(ctx, "trove_expand", **args)["message"]
        assert page.get("content_offset", 0) == len(content)
        content += page.get("content") or ""
        calls += page.get("tool_calls") or ""
        if not page["has_more"]:
            return page, content, calls
        args = page["expand"]["args"]


@pytest.mark.parametrize("message", EXACT_MESSAGES)
def test_expand_store_id_is_byte_exact(env, message):
    [sid] = env.ingest("A", [message])
    page, content, calls = read_message(env.ctx(), sid)
    if page["content_format"] == "text":
        assert content == message["content"]
    elif page["content_format"] == "json":
        assert json.loads(content) == message["content"]
    else:
        assert message.get("content") is None and content == ""
    if "tool_calls" in message:
        assert json.loads(calls) == message["tool_calls"]
    if "name" in message:
        assert page["fields"]["name"] == message["name"]


def test_one_megabyte_content_pages_back_exactly(env):
    big = "".join(f"{i:07d} ünïcode line with some words\n" for i in range(30_000))[:1_000_000]
    [sid] = env.ingest("A", [{"role": "tool", "tool_call_id": "x", "content": big}])
    _, content, _ = read_message(env.ctx(), sid)
    assert content == big


def test_big_tool_call_arguments_page_back_exactly(env):
    args = json.dumps({"path": "a.py", "content": "x = 1\n" * 20_000})
    message = {"role": "assistant", "content": "writing the file",
               "tool_calls": [{"id": "w", "type": "function",
                               "function": {"name": "write_file", "arguments": args}}]}
    [sid] = env.ingest("A", [message])
    _, content, calls = read_message(env.ctx(), sid)
    assert content == "writing the file" and json.loads(calls) == message["tool_calls"]


def test_expand_exact_ref_and_covering_nodes(env, planted):
    out = call(env.ctx(), "trove_expand", store_id=planted["a"][1], include_exact_ref=True)
    ref = out["message"]["exact_ref"]
    assert ref["store_id"] == planted["a"][1] and len(ref["content_hash"]) == 32
    assert out["covering_nodes"] == [planted["leaf"]]


@pytest.mark.parametrize("args, fragment", [
    ({}, "exactly one"), ({"node_id": 1, "store_id": 1}, "exactly one"),
    ({"store_id": 999_999}, "not found"), ({"node_id": 999_999}, "not found"),
    ({"externalized_ref": "../etc/passwd"}, "never a path"),
    ({"externalized_ref": "/abs/file"}, "never a path"),
    ({"externalized_ref": "a\\b"}, "never a path"), ({"externalized_ref": "x..y"}, "never a path"),
    ({"externalized_ref": "payload_123"}, "trove-payload:"),
    ({"externalized_ref": "trove-payload:" + "0" * 64}, "not found"),
    ({"store_id": 1, "content_offset": -5}, "0 or more"),
])
def test_expand_errors_are_clear_json(env, planted, args, fragment):
    out = call(env.ctx(), "trove_expand", **args)
    assert fragment in out["error"] and out["tool"] == "trove_expand"


def test_expand_max_tokens_bounds_the_page(env):
    [sid] = env.ingest("A", [{"role": "user", "content": "word " * 5000}])
    text = tools.dispatch("trove_expand", {"store_id": sid, "max_tokens": 300}, env.ctx())
    assert COUNTER.count_text(text) <= 300 and json.loads(text)["message"]["has_more"]


# ---------------------------------------------------------------- scope isolation
def test_nothing_of_b_is_reachable_from_a_without_asking(env, planted):
    ctx = env.ctx()
    answers = [
        call(ctx, "trove_grep", query="zebra marmalade vault"),
        call(ctx, "trove_recall", query="nothing-matching-here-at-all"),
        call(ctx, "trove_expand", store_id=planted["b"][0]),
        call(ctx, "trove_expand", node_id=planted["b_leaf"]),
        call(ctx, "trove_describe", node_id=planted["b_leaf"]),
        call(ctx, "trove_describe", store_id=planted["b"][0]),
        call(ctx, "trove_load_session"),
        call(ctx, "trove_recent", period="last 3 days"),
        call(ctx, "trove_inspect"),
        call(ctx, "trove_expand_query", prompt="what is the hint?", query="zebra marmalade"),
        call(ctx, "trove_expand_query", prompt="hint?", node_ids=[planted["b_leaf"]]),
    ]
    for answer in answers:
        text = json.dumps(answer)
        assert "password hint is" not in text and "Summary: zebra" not in text
    assert "another session" in answers[2]["error"] and "another session" in answers[3]["error"]


def test_named_session_opens_b_explicitly(env, planted):
    ctx = env.ctx()
    assert call(ctx, "trove_describe", node_id=planted["b_leaf"], session_id="B")["session_id"] == "B"
    page = call(ctx, "trove_load_session", session_id="B")
    assert [m["store_id"] for m in page["messages"]] == planted["b"]
    assert "not found" in call(ctx, "trove_load_session", session_id="nobody")["error"]


def test_carried_nodes_count_as_this_session(env, planted):
    env.store.ensure_session("C")
    Owners(env.db).record("C", LOCAL_OWNER)
    env.dag.carry_nodes("C", [planted["leaf"]])
    ctx = env.ctx("C")
    out = call(ctx, "trove_expand", node_id=planted["leaf"])
    assert [s["store_id"] for s in out["sources"]] == planted["a"]
    assert "6543" in call(ctx, "trove_expand", store_id=planted["a"][1])["message"]["content"]
    hits = call(ctx, "trove_grep", query="staging port")["results"]
    assert [(h["kind"], h["node_id"]) for h in hits] == [("summary", planted["leaf"])]
    assert "another session" in call(ctx, "trove_expand", node_id=planted["b_leaf"])["error"]
    recent = call(ctx, "trove_recent", period="last 24h")["items"]
    assert [s["node_id"] for s in recent] == [planted["leaf"]]
    assert call(ctx, "trove_inspect")["carried_node_ids"] == [planted["leaf"]]


@pytest.mark.parametrize("session_id", [None, ""])
def test_unbound_engine_returns_nothing(env, planted, session_id):
    ctx = env.ctx(session_id)
    for name, args in [("trove_grep", {"query": "staging"}), ("trove_recall", {"query": "zebra"}),
                       ("trove_expand", {"store_id": planted["a"][1]}),
                       ("trove_describe", {"node_id": planted["leaf"]}),
                       ("trove_load_session", {}), ("trove_recent", {"period": "this week"}),
                       ("trove_expand_query", {"prompt": "p", "query": "staging"}),
                       ("trove_inspect", {})]:
        out = call(ctx, name, **args)
        assert out["unbound"] is True, name
        assert "6543" not in json.dumps(out) and "marmalade" not in json.dumps(out)
    assert call(ctx, "trove_status")["bound"] is False


# ---------------------------------------------------------------- trove_load_session
def test_load_session_pages_to_the_end_of_10000_messages(env):
    ids = env.ingest("A", [{"role": "user" if i % 2 else "assistant", "content": f"msg {i}"}
                           for i in range(10_000)])
    ctx, seen, cursor, pages = env.ctx(), [], 0, 0
    while cursor is not None:
        page = call(ctx, "trove_load_session", after_store_id=cursor, limit=200)
        seen += [m["store_id"] for m in page["messages"]]
        assert [m["content"] for m in page["messages"]][:1] in ([], [f"msg {len(seen) - len(page['messages'])}"])
        cursor, pages = page["next_cursor"], pages + 1
    assert seen == ids and pages >= 50


def test_load_session_limit_clamped_and_cursor_kept_under_cap(tmp_path):
    env = Env(tmp_path, tool_response_max_tokens=400)
    ids = env.ingest("A", [{"role": "user", "content": f"message number {i} " * 20} for i in range(30)])
    ctx, seen, cursor = env.ctx(), [], 0
    first = call(ctx, "trove_load_session", limit=1000)
    assert first["limit_clamped_from"] == 1000 and first["has_more"]
    while cursor is not None:
        page = call(ctx, "trove_load_session", after_store_id=cursor)
        assert page["messages"]
        seen += [m["store_id"] for m in page["messages"]]
        cursor = page["next_cursor"]
    assert seen == ids


# ---------------------------------------------------------------- trove_recent / describe
def test_recent_periods_pick_nodes_by_time(env):
    old = env.store.ingest("A", [{"role": "user", "content": "old work"}], now=NOW - 7 * DAY).store_ids
    new = env.store.ingest("A", [{"role": "user", "content": "new work"}], now=NOW - 3600).store_ids
    old_leaf, new_leaf = env.node("A", "old summary", store_ids=old), env.node("A", "new", store_ids=new)
    ctx = env.ctx()
    assert [s["node_id"] for s in call(ctx, "trove_recent")["items"]] == [new_leaf]
    assert [s["node_id"] for s in call(ctx, "trove_recent", period="last week")["items"]] == [old_leaf]
    both = call(ctx, "trove_recent", period="2026-11-01..2026-11-30")["items"]
    assert [s["node_id"] for s in both] == [new_leaf, old_leaf]
    assert call(ctx, "trove_recent", period="yesterday")["items"] == []
    assert "period" in call(ctx, "trove_recent", period="someday")["error"]


def test_recent_prefers_a_covering_node_over_its_children(env):
    ids = env.ingest("A", [{"role": "user", "content": f"m{i}"} for i in range(4)])
    leaves = [env.node("A", f"leaf {i}", store_ids=ids[2 * i:2 * i + 2]) for i in range(2)]
    top = env.node("A", "top", node_ids=leaves, depth=1)
    assert [s["node_id"] for s in call(env.ctx(), "trove_recent")["items"]] == [top]


def test_describe_node_and_message(env, planted):
    ctx = env.ctx()
    node = call(ctx, "trove_describe", node_id=planted["leaf"])
    assert node["child_count"] == 4 and node["descendant_messages"] == 4
    assert node["child_kind"] == "message" and node["parents"] == [] and node["depth"] == 0
    message = call(ctx, "trove_describe", store_id=planted["a"][1])
    assert message["covering_nodes"] == [planted["leaf"]] and "6543" in message["preview"]


# ---------------------------------------------------------------- expand_query / recall
def test_expand_query_without_llm_returns_evidence(env, planted):
    out = call(env.ctx(), "trove_expand_query", prompt="Which port?", query="staging port")
    assert out["answer"] is None and out["llm"].startswith("unavailable")
    assert any("6543" in e["text"] for e in out["evidence"])


def test_expand_query_with_llm_and_budget(env, planted):
    prompts = []

    def llm(prompt, model, timeout):
        prompts.append((prompt, model, timeout))
        return "Port 6543 [m2]."

    out = call(env.ctx(llm_call=llm), "trove_expand_query", prompt="Which port?",
               node_ids=[planted["leaf"]])
    assert out["answer"] == "Port 6543 [m2]." and out["truncated"] is False
    assert "<evidence>" in prompts[0][0] and prompts[0][2] == env.config.expansion_timeout_ms / 1000
    tiny = call(env.ctx(llm_call=llm), "trove_expand_query", prompt="p", node_ids=[planted["leaf"]],
                context_max_tokens=256)
    assert tiny["evidence_tokens"] <= 256


def test_expand_query_llm_failure_falls_back_to_evidence(env, planted):
    def broken(prompt, model, timeout):
        raise TimeoutError("slow")

    out = call(env.ctx(llm_call=broken), "trove_expand_query", prompt="p", query="cache TTL")
    assert out["answer"] is None and "TimeoutError" in out["llm"] and out["evidence"]


def test_recall_searches_all_sessions_with_scoped_handles(env, planted):
    out = call(env.ctx(), "trove_recall", query="vault password hint")
    top = out["results"][0]
    assert top["session_id"] == "B" and top["expand"]["args"]["session_scope"] == "all"
    opened = call(env.ctx(), "trove_expand", **top["expand"]["args"])
    assert "marmalade" in json.dumps(opened)


def test_recall_prefers_the_current_session_on_equal_text(env):
    [a] = env.ingest("A", [{"role": "user", "content": "quokka deployment plan"}])
    [b] = env.ingest("B", [{"role": "user", "content": "quokka deployment plan"}], at=NOW - 5)
    ids = [r["store_id"] for r in call(env.ctx(), "trove_recall", query="quokka plan")["results"]]
    assert ids == [a, b]


# ---------------------------------------------------------------- operator tools
def test_status_inspect_doctor(env, planted):
    ctx = env.ctx()
    status = call(ctx, "trove_status")
    assert status["bound"] and status["stored"]["messages"] == 4 and "pressure" in status
    assert "config" not in status and "database" not in status  # the inventory: trove_inspect
    inspect = call(ctx, "trove_inspect")
    full = inspect["status"]
    assert full["database"]["messages"] == 5 and full["database"]["schema_version"] >= 1
    assert full["config"]["settings"]["TROVE_TOOL_RESPONSE_MAX_TOKENS"]["source"] == "default"
    assert full["token_counter"].startswith(("tiktoken", "estimate", "rs-bpe"))
    assert inspect["frontier"][0]["node_id"] == planted["leaf"] and inspect["messages"] == 4
    assert "text" not in json.dumps(inspect["frontier"])
    doctor = call(ctx, "trove_doctor")
    names = {c["name"] for c in doctor["checks"]}
    file_checks = ({"journal_mode", "quick_check"} if env.db.dialect == "sqlite"
                   else {"server", "search_extensions"})
    assert file_checks | {"messages_fts_rows", "nodes_fts_rows", "schema_objects", "space",
                          "fts_integrity", "config_warnings", "session_bound",
                          "context_pressure"} <= names
    assert doctor["overall"] in ("ok", "warn")


def test_doctor_skips_quick_check_on_big_databases_unless_full(env, planted, monkeypatch):
    sqlite_only(env)
    monkeypatch.setattr(health, "QUICK_CHECK_MAX_BYTES", 0)
    checks = {c["name"]: c for c in call(env.ctx(), "trove_doctor")["checks"]}
    assert checks["quick_check"]["status"] == "skipped"
    checks = {c["name"]: c for c in call(env.ctx(), "trove_doctor", full=True)["checks"]}
    assert checks["quick_check"]["status"] == "ok"


def test_doctor_reports_fts_drift_and_missing_check(env, planted):
    sqlite_only(env)
    env.store.set_meta("fts_checked_at", str(NOW - 100 * 3600))
    with env.db.transaction() as conn:
        conn.execute("INSERT INTO messages_fts(messages_fts, rowid, body, tags)"
                     " VALUES ('delete', ?, ?, ?)", (planted["a"][0],
                                                     "Let's configure the staging environment.",
                                                     "s41 r75736572 p636c69"))
    checks = {c["name"]: c for c in health.run_doctor(env.store, env.dag, env.config, {},
                                                       now=NOW)["checks"]}
    assert checks["messages_fts_rows"]["status"] == "fail"
    assert checks["fts_integrity"]["status"] == "warn"


def test_status_survives_a_failing_status_callable(env):
    def broken():
        raise RuntimeError("boom")

    assert "status unavailable: RuntimeError: boom" in \
        call(env.ctx(status=broken), "trove_status")["problems"]


# ---------------------------------------------------------------- bounds and arguments
@pytest.mark.parametrize("name, args", [
    ("trove_grep", {"query": "needle"}), ("trove_recall", {"query": "needle"}),
    ("trove_load_session", {}), ("trove_recent", {"period": "this month"}),
    ("trove_expand_query", {"prompt": "p", "query": "needle"}), ("trove_status", {}),
    ("trove_doctor", {}), ("trove_inspect", {}),
])
def test_every_response_fits_a_tiny_cap(tmp_path, name, args):
    env = Env(tmp_path, tool_response_max_tokens=256)
    huge = "needle " + "haystack ünïcødé 日本 " * 60_000
    ids = env.ingest("A", [{"role": "user", "content": huge}] +
                     [{"role": "user", "content": f"needle {i} " * 100} for i in range(20)])
    env.node("A", "needle summary " * 400, store_ids=ids)
    out = call(env.ctx(), name, **args)
    assert "error" not in out, out


def test_tiny_cap_expand_node_and_message_still_page(tmp_path):
    env = Env(tmp_path, tool_response_max_tokens=256)
    message = {"role": "user", "content": "\x00" * 500 + "日本語" * 300 + "end"}
    ids = env.ingest("A", [message, {"role": "user", "content": "small"}])
    leaf = env.node("A", "s", store_ids=ids)
    page = call(env.ctx(), "trove_expand", node_id=leaf)
    assert page["sources"] and page["has_more"] in (True, False)
    _, content, _ = read_message(env.ctx(), ids[0])
    assert content == message["content"]


@pytest.mark.parametrize("name, args, fragment", [
    ("trove_grep", {"query": "x", "limit": "many"}, "integer"),
    ("trove_grep", {"query": "x", "explain": "maybe"}, "true or false"),
    ("trove_grep", {"query": 42}, "string"),
    ("trove_grep", {}, "query is required"),
    ("trove_grep", {"query": "x", "session_scope": "galaxy"}, "one of"),
    ("trove_grep", {"query": "x", "time_from": "the other tuesday"}, "ISO time"),
    ("trove_expand", {"node_id": 1.5}, "integer"),
    ("trove_expand", {"node_id": 10**30}, "out of range"),
    ("trove_expand_query", {"prompt": "p", "node_ids": "1,2"}, "list"),
    ("trove_expand_query", {"prompt": "p"}, "exactly one"),
    ("trove_nope", {}, "unknown tool"),
])
def test_invalid_arguments_give_clear_errors(env, planted, name, args, fragment):
    out = call(env.ctx(), name, **args)
    assert fragment in out["error"]


def test_dispatch_accepts_json_string_and_reports_unknown_arguments(env, planted):
    out = json.loads(tools.dispatch("trove_grep", '{"query": "staging", "colour": "red"}', env.ctx()))
    assert out["results"] and out["ignored_arguments"] == ["colour"]
    assert "JSON object" in json.loads(tools.dispatch("trove_grep", "[1]", env.ctx()))["error"]
    assert "JSON object" in json.loads(tools.dispatch("trove_grep", "{bad", env.ctx()))["error"]
    assert json.loads(tools.dispatch("trove_grep", {"query": "staging", "limit": "3"},
                                     env.ctx()))["results"]


def test_an_internal_failure_is_reported_as_json(env, planted, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(env.store, "get_messages", explode)
    out = call(env.ctx(), "trove_grep", query="staging")
    assert out == {"error": "RuntimeError: disk on fire", "tool": "trove_grep"}


# ---------------------------------------------------------------- time arguments
def test_time_arguments_read_times_and_periods(env, planted):
    ctx = env.ctx()
    out = call(ctx, "trove_grep", query="staging", time_from="1970-01-01T01:00:00+01:00",
               time_to=NOW + 10)
    assert out["results"] and out["time_window"]["from"] == "1970-01-01T00:00:00Z"
    assert call(ctx, "trove_grep", query="staging", period="yesterday")["results"] == []
    assert call(ctx, "trove_grep", query="staging", period="today")["results"]
    assert "time filter" in call(ctx, "trove_grep", query="x", period="2026-11-07..2026-11-01")[
        "error"]
    assert "time filter" in call(ctx, "trove_recall", query="x", time_from="someday")["error"]


# ---------------------------------------------------------------- skill
SKILL_DIR = Path(tools.__file__).parent / "skills" / "hermes-trove"


def test_recall_policy_is_short_plain_text_naming_the_tools():
    text = (SKILL_DIR / "references" / "recall-policy.md").read_text(encoding="utf-8")
    policy = text.rstrip("\n")
    assert len(policy) < 600 and not policy.startswith("---") and "\n" not in policy
    for name in ("trove_grep", "trove_expand", "trove_recall"):
        assert name in policy


def test_skill_frontmatter_and_references_exist():
    text = (SKILL_DIR / "SKILL.md").read_text(encoding="utf-8")
    front = yaml.safe_load(text.split("---")[1])
    assert front["name"] == "hermes-trove" and front["description"]
    for ref in ("configuration", "architecture", "diagnostics", "recall-routing",
                "session-lifecycle", "recall-policy"):
        assert (SKILL_DIR / "references" / f"{ref}.md").is_file()
        assert f"references/{ref}.md" in text
