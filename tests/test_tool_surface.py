"""What trove adds to every request: the tool schemas as sent (a pinned token budget, the
same parameters as before they were shortened), which tools a config exposes, the answer
of a hidden tool, and when the recall policy is appended (issue 27)."""
import json
from pathlib import Path

import pytest

import hermes_trove
from hermes_trove import config, schemas
from hermes_trove.compaction import tokens
from hermes_trove.config import load_config

import enginekit

# Every trove schema as the host sends it, all fifteen (the families on), in cl100k tokens.
# It was 2,613 before the descriptions were cut to what decides the choice of tool.
SCHEMA_TOKEN_BUDGET = 1500
POLICY_TOKEN_BUDGET = 120

# Each tool's parameters as they were before the descriptions were shortened: name, type,
# enum and item type (what ``schemas.validate`` checks a call against), and the required
# ones. Written out so that a shortened schema can never drop or retype an argument.
PARAMETERS = {
    'trove_grep': ('query:string limit:integer session_scope:string[current|session|all] session_id:string source:string role:string[user|assistant|tool|system] time_from:string time_to:string period:string content_scope:string[messages|externalized|both] explain:boolean include_current_turn:boolean include_exact_ref:boolean mode:string[full_text|semantic|hybrid]', ('query',)),
    'trove_expand': ('node_id:integer store_id:integer externalized_ref:string source_offset:integer source_limit:integer content_offset:integer tool_calls_offset:integer max_tokens:integer include_exact_ref:boolean session_scope:string[current|session|all] session_id:string rollup_id:integer', ()),
    'trove_describe': ('node_id:integer store_id:integer externalized_ref:string session_scope:string[current|session|all] session_id:string', ()),
    'trove_load_session': ('session_id:string after_store_id:integer limit:integer include_exact_ref:boolean', ()),
    'trove_recent': ('period:string session_scope:string[current|all] limit:integer offset:integer snapshot:string', ()),
    'trove_expand_query': ('prompt:string query:string node_ids:array<integer> max_results:integer context_max_tokens:integer', ('prompt',)),
    'trove_recall': ('query:string limit:integer explain:boolean time_from:string time_to:string period:string', ('query',)),
    'trove_status': ('', ()),
    'trove_inspect': ('', ()),
    'trove_doctor': ('full:boolean', ()),
    'trove_evidence_pack': ('refs:array<object> offset:integer limit:integer computation:object session_scope:string[current|session|all] session_id:string', ('refs',)),
    'trove_compute': ('operation:string[date_diff|count_distinct|sum|difference|order|latest] inputs:array<object> unit:string absolute:boolean session_scope:string[current|session|all] session_id:string', ('operation', 'inputs')),
    'trove_compile_evidence': ('proposal:object session_scope:string[current|session|all] session_id:string', ('proposal',)),
    'trove_query_state': ('subject:string kind:string[fact|preference|recommendation|commitment|action|status] as_of:string offset:integer limit:integer snapshot:string session_scope:string[current|session|all] session_id:string', ()),
    'trove_retrieve': ('question:string slots:array<object> computation:object view_id:integer', ()),
}


def signature(spec: dict) -> str:
    kind = spec["type"]
    if "enum" in spec:
        kind += "[" + "|".join(spec["enum"]) + "]"
    if kind == "array":
        kind += "<" + spec["items"]["type"] + ">"
    return kind


def wire_tokens(schema_list) -> int:
    counter = tokens.get_counter("cl100k_base")
    assert counter.exact, counter.reason     # the budget is in real tokens, not an estimate
    return counter.count_text(schemas.wire_json(schema_list))


def test_every_schema_as_sent_fits_the_token_budget(tmp_path):
    every = schemas.get_tool_schemas()
    assert [s["name"] for s in every] == list(config.KNOWN_TOOLS)
    total = wire_tokens(every)
    assert total <= SCHEMA_TOKEN_BUDGET, f"{total} tokens; shorten a description"
    defaults = schemas.get_tool_schemas(load_config({}, tmp_path))
    assert wire_tokens(defaults) < total and len(defaults) == len(every) - 2


def test_shortened_schemas_keep_every_parameter_and_what_validate_checks():
    for schema in schemas.get_tool_schemas():
        params = schema["parameters"]
        expected, required = PARAMETERS[schema["name"]]
        assert " ".join(f"{k}:{signature(v)}" for k, v in params["properties"].items()) \
            == expected, schema["name"]
        assert tuple(params.get("required", ())) == required, schema["name"]


def test_wire_json_is_what_the_host_wraps_and_the_client_sends():
    client_json = pytest.importorskip("openai._utils._json")
    every = schemas.get_tool_schemas()
    wrapped = [{"type": "function", "function": s} for s in every]   # agent_init's wrapping
    assert schemas.wire_json(every).encode() == client_json.openapi_dumps(wrapped)


def test_a_missing_required_argument_is_still_an_error(tmp_path):
    with pytest.raises(schemas.ArgumentError, match="query is required"):
        schemas.validate("trove_grep", {"limit": 3})
    assert schemas.validate("trove_status", {"x": 1}) == ({}, ["x"])


def test_the_manifest_lists_every_tool_and_states_the_default_count(tmp_path):
    import yaml
    manifest = yaml.safe_load((Path(config.__file__).parent / "plugin.yaml").read_text())
    assert manifest["provides_tools"] == list(config.KNOWN_TOOLS)
    defaults = len(load_config({}, tmp_path).exposed_tool_names)
    every = len(config.KNOWN_TOOLS)
    assert f" {defaults} trove_* tools (" in manifest["description"]
    assert f"({every} with the opt-in" in manifest["description"]


# ---------------------------------------------------------------- exposure in the engine
def test_engine_gives_the_host_only_the_exposed_tools(tmp_path):
    engine = enginekit.make_engine(tmp_path)
    names = [s["name"] for s in engine.get_tool_schemas()]
    assert "trove_query_state" not in names and "trove_retrieve" not in names
    assert names == list(engine.config.exposed_tool_names)
    status = engine.get_status()["tools"]
    assert status["hidden"]["trove_retrieve"] == "TROVE_RETRIEVE_ENABLED is off"
    minimal = enginekit.make_engine(tmp_path / "m", exposed_tools="trove_grep,trove_expand")
    assert [s["name"] for s in minimal.get_tool_schemas()] == ["trove_grep", "trove_expand"]


def test_a_hidden_tool_answers_an_old_call_with_a_clear_error(tmp_path):
    engine = enginekit.make_engine(tmp_path, exposed_tools="trove_grep,trove_expand")
    messages = [{"role": "user", "content": "hello"}]
    answer = json.loads(engine.handle_tool_call("trove_status", {}, messages=messages))
    assert answer["tool"] == "trove_status"
    assert "TROVE_EXPOSED_TOOLS" in answer["error"] and "trove_grep, trove_expand" in answer["error"]
    assert "results" in json.loads(engine.handle_tool_call("trove_grep", {"query": "hello"},
                                                           messages=messages))


def test_a_family_tool_left_out_still_says_how_to_turn_it_on(tmp_path):
    engine = enginekit.make_engine(tmp_path)
    answer = json.loads(engine.handle_tool_call("trove_retrieve", {"question": "q"},
                                                messages=[{"role": "user", "content": "q"}]))
    assert answer["enabled"] is False and "TROVE_RETRIEVE_ENABLED" in answer["note"]


def test_an_evidence_tool_still_greps_when_trove_grep_is_hidden(tmp_path):
    engine = enginekit.make_engine(tmp_path, exposed_tools="trove_retrieve",
                                   retrieve_enabled="true")
    messages = [{"role": "user", "content": "The flight to Lisbon cost $420 on 2026-03-02."},
                {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "What did it cost?"}]
    engine.ingest(messages)
    answer = json.loads(engine.handle_tool_call(
        "trove_retrieve", {"question": "flight cost", "slots": [
            {"name": "cost", "type": "amount", "query": "flight Lisbon cost"}]},
        messages=messages))
    assert "error" not in answer and answer["slots"][0].get("refs"), answer


# ---------------------------------------------------------------- the recall policy
def policy_tokens() -> int:
    return tokens.get_counter("cl100k_base").count_text(hermes_trove.recall_policy())


def test_the_policy_is_short_and_names_only_exposed_tools(tmp_path):
    assert 0 < policy_tokens() <= POLICY_TOKEN_BUDGET
    cfg = load_config({}, tmp_path)
    assert hermes_trove.policy_for_turn(cfg, "normal", []) == hermes_trove.recall_policy()
    for name in hermes_trove._TOOL_NAME.findall(hermes_trove.recall_policy()):
        assert name in cfg.exposed_tool_names
    hidden = load_config({"TROVE_EXPOSED_TOOLS": "trove_grep,trove_expand"}, tmp_path)
    assert hermes_trove.policy_for_turn(hidden, "normal", []) == ""   # names trove_recall
    off = load_config({"TROVE_RECALL_POLICY_ENABLED": "false"}, tmp_path)
    assert hermes_trove.policy_for_turn(off, "normal", []) == ""


def test_the_policy_is_not_appended_where_trove_does_not_serve(tmp_path):
    cfg = load_config({}, tmp_path)
    assert hermes_trove.policy_for_turn(cfg, "ignored", []) == ""
    assert hermes_trove.policy_for_turn(cfg, "stateless", []) != ""   # it still reads


def test_the_policy_goes_once_into_a_prompt(tmp_path):
    cfg, policy = load_config({}, tmp_path), hermes_trove.recall_policy()
    carried = [{"role": "user", "content": "q1", "api_content": "q1\n\n" + policy},
               {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert hermes_trove.policy_for_turn(cfg, "normal", carried) == ""
    # the turn that carried it was compacted away: the next turn carries it again
    compacted = [{"role": "user", "content": "[trove context: summaries of earlier turns]"},
                 {"role": "user", "content": "q2"}]
    assert hermes_trove.policy_for_turn(cfg, "normal", compacted) == policy
    # text quoting the policy in a message the user typed is not the injected copy
    typed = [{"role": "user", "content": policy}, {"role": "user", "content": "q3"}]
    assert hermes_trove.policy_for_turn(cfg, "normal", typed) == policy
