"""Tests for config.py: parsing, validation, layering, describe() and reachability."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from hermes_trove import config
from hermes_trove.config import TroveConfig, check_reachability, load_config

# env name, default, a valid raw value, what it parses to, invalid raw values.
# Written out by hand from the specification so the code is checked against it.
SETTINGS_TABLE = [
    ("TROVE_CONTEXT_THRESHOLD", 0.35, "1", 1.0, ["0", "1.01", "-0.1", "abc", "nan", ""]),
    ("TROVE_MIN_TRIGGER_TOKENS", 32000, "0", 0, ["-1", "lots"]),
    ("TROVE_FRESH_TAIL_COUNT", 32, " 7 ", 7, ["0", "2.5", "many"]),
    ("TROVE_FRESH_TAIL_MAX_TOKENS", 0, "0", 0, ["-1", "x"]),
    ("TROVE_INCREMENTAL_MAX_DEPTH", 3, "8", 8, ["0", "9"]),
    ("TROVE_LEAF_CHUNK_TOKENS", 20000, "500", 500, ["499", ""]),
    ("TROVE_DYNAMIC_LEAF_CHUNK_ENABLED", False, "YES", True, ["maybe", "2", ""]),
    ("TROVE_DYNAMIC_LEAF_CHUNK_MAX", 40000, "60000", 60000, ["499", "big"]),
    ("TROVE_CONDENSE_FANOUT", 4, "32", 32, ["1", "33"]),
    ("TROVE_LEAF_SUMMARY_TOKENS", 1200, "100", 100, ["99", "20001"]),
    ("TROVE_CONDENSED_SUMMARY_TOKENS", 2000, "20000", 20000, ["99", "20001"]),
    ("TROVE_NEW_SESSION_RETAIN_DEPTH", 2, "-1", -1, ["-2", "9"]),
    ("TROVE_DATABASE_PATH", "", "/data/t.db", "/data/t.db", []),
    ("TROVE_DATABASE_URL", "", "postgresql://u@db.example/trove", "postgresql://u@db.example/trove", []),
    ("TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS", 24.0, "0", 0.0, ["-1", "inf", "soon"]),
    ("TROVE_ENABLE_SLASH_COMMAND", False, "on", True, ["enable"]),
    ("TROVE_IGNORE_SESSION_PATTERNS", (), " cron-*, ,test ", ("cron-*", "test"), []),
    ("TROVE_STATELESS_SESSION_PATTERNS", (), "sub-*", ("sub-*",), []),
    ("TROVE_IGNORE_MESSAGE_PATTERNS", (), r"^ping$,\d+", ("^ping$", r"\d+"), []),
    ("TROVE_SUMMARY_MODEL", "", " gpt-4o-mini ", "gpt-4o-mini", []),
    ("TROVE_SUMMARY_FALLBACK_MODELS", (), "a,b", ("a", "b"), []),
    ("TROVE_SUMMARY_TIMEOUT_MS", 60000, "1000", 1000, ["999"]),
    ("TROVE_SUMMARY_CIRCUIT_BREAKER_FAILURE_THRESHOLD", 2, "1", 1, ["0"]),
    ("TROVE_SUMMARY_CIRCUIT_BREAKER_COOLDOWN_SECONDS", 300, "0", 0, ["-5"]),
    ("TROVE_EXPANSION_MODEL", "", "claude-haiku", "claude-haiku", []),
    ("TROVE_EXPANSION_CONTEXT_TOKENS", 32000, "1000", 1000, ["999"]),
    ("TROVE_EXPANSION_TIMEOUT_MS", 120000, "5000", 5000, ["10.5"]),
    ("TROVE_CRITICAL_BUDGET_PRESSURE_RATIO", 0.0, "0.9", 0.9, ["1.5", "-0.1"]),
    ("TROVE_TOOL_RESPONSE_MAX_TOKENS", 4000, "256", 256, ["255", "64001"]),
    ("TROVE_RECALL_POLICY_ENABLED", True, "Off", False, ["nope"]),
    ("TROVE_EXPOSED_TOOLS", ("all",), " trove_grep, Expand ", ("trove_grep", "trove_expand"),
     []),
    ("TROVE_TOKEN_ENCODING", "cl100k_base", "o200k_base", "o200k_base", ["", "   "]),
    ("TROVE_TOKEN_COUNT_ACCELERATOR", True, "false", False, ["maybe"]),
    ("TROVE_DOCTOR_CLEAN_APPLY_ENABLED", False, "1", True, ["10"]),
    ("TROVE_LARGE_OUTPUT_EXTERNALIZATION_ENABLED", False, "true", True, ["t"]),
    ("TROVE_LARGE_OUTPUT_EXTERNALIZATION_THRESHOLD_CHARS", 12000, "1000", 1000, ["999"]),
    ("TROVE_LARGE_OUTPUT_ACTIVE_REPLAY_STUBBING_ENABLED", False, "FALSE", False, ["y"]),
    ("TROVE_LARGE_OUTPUT_ACTIVE_REPLAY_STUB_THRESHOLD_TOKENS", 25000, "500", 500, ["499"]),
    ("TROVE_LARGE_OUTPUT_TRANSCRIPT_GC_ENABLED", False, "no", False, ["n0"]),
    ("TROVE_SENSITIVE_PATTERNS_ENABLED", False, "ON", True, ["enabled"]),
    ("TROVE_SENSITIVE_PATTERNS",
     ("api_key", "bearer_token", "password_assignment", "private_key", "secret_assignment",
      "webhook_url"),
     "api_key, private_key", ("api_key", "private_key"), []),
    ("TROVE_CROSS_OWNER_RECALL", False, "true", True, ["everyone"]),
    ("TROVE_CONTEXT_THRESHOLD_OVERRIDES", "", '{"gpt-5*": 0.6, "claude-*": 0.4}',
     '{"gpt-5*": 0.6, "claude-*": 0.4}', ['{"gpt-5*": 0}', '{"a": 1.5}', "[0.5]", "{bad",
                                          '{"a": true}', '{"": 0.5}']),
    ("TROVE_SUMMARY_INSTRUCTIONS", "", " Keep ticket ids. ", "Keep ticket ids.", []),
    ("TROVE_SUMMARY_MAX_CALLS_PER_HOUR", 0, "30", 30, ["-1", "many"]),
    ("TROVE_SUMMARY_MAX_TOKENS_PER_HOUR", 0, "200000", 200000, ["-5", "1e3x"]),
    ("TROVE_EMPTY_LIFECYCLE_GC_ENABLED", True, "off", False, ["maybe"]),
    ("TROVE_EMPTY_LIFECYCLE_GC_THRESHOLD", 50, "5", 5, ["0", "x"]),
    ("TROVE_EMPTY_LIFECYCLE_GC_MAX_AGE_HOURS", 24.0, "0.5", 0.5, ["-1", "nan"]),
    ("TROVE_BACKGROUND_PREPARE_SHARE", 0.0, "0.8", 0.8, ["1.5", "-0.1", "most"]),
    ("TROVE_THRESHOLD_FULL_SWEEP_ENABLED", False, "yes", True, ["sometimes"]),
    ("TROVE_SUMMARY_PREFIX_TARGET_TOKENS", 0, "8000", 8000, ["-1", "big"]),
    ("TROVE_ASSERTIONS_ENABLED", False, "on", True, ["maybe"]),
    ("TROVE_RETRIEVE_ENABLED", False, "yes", True, ["2"]),
    ("TROVE_TIMEZONE", "UTC", "Europe/Paris", "Europe/Paris", [""]),
    ("TROVE_ROLLUPS_ENABLED", False, "yes", True, ["maybe"]),
    ("TROVE_ROLLUP_SUMMARY_TOKENS", 1500, "100", 100, ["99", "20001"]),
    ("TROVE_ROLLUPS_MAX_BUILDS_PER_PASS", 8, "1", 1, ["0"]),
    ("TROVE_ROLLUPS_LOOKBACK_DAYS", 93, "400", 400, ["0", "36601"]),
    ("TROVE_EMBEDDINGS_ENABLED", False, "yes", True, ["maybe"]),
    ("TROVE_EMBEDDING_PROVIDER", "local", "openai", "openai", ["", "  "]),
    ("TROVE_EMBEDDING_MODEL", "", "nomic-embed-text", "nomic-embed-text", []),
    ("TROVE_EMBEDDING_BASE_URL", "", "http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1",
     []),
    ("TROVE_EMBEDDING_API_KEY_ENV", "", "OPENAI_API_KEY", "OPENAI_API_KEY", []),
    ("TROVE_EMBEDDING_QUERY_TIMEOUT_MS", 2000, "100", 100, ["99"]),
    ("TROVE_EMBEDDING_BATCH_TIMEOUT_MS", 30000, "1000", 1000, ["999"]),
    ("TROVE_EMBEDDING_BATCH_SIZE", 32, "512", 512, ["0", "513"]),
    ("TROVE_EMBEDDING_THREADS", 2, "1", 1, ["0", "65", "two"]),
]
INVALID_CASES = [(env, default, bad) for env, default, _, _, bads in SETTINGS_TABLE
                 for bad in bads]


def field_name(env):
    return env[len("TROVE_"):].lower()


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "hermes"
    path.mkdir()
    return path


def write_yaml(home, text):
    (home / "config.yaml").write_text(text, encoding="utf-8")


def test_table_covers_every_setting_in_declaration_order():
    declared = [config.env_name(f.name) for f in config.setting_fields()]
    assert declared == [row[0] for row in SETTINGS_TABLE]


def test_defaults_match_specification(home):
    cfg = load_config({}, home)
    for env, default, *_ in SETTINGS_TABLE:
        value = getattr(cfg, field_name(env))
        assert value == default and type(value) is type(default), env
        assert cfg.sources[field_name(env)] == "default"
    assert cfg.warnings == ()
    assert cfg == TroveConfig(hermes_home=home)


@pytest.mark.parametrize("env,default,raw,expected,bads", SETTINGS_TABLE,
                         ids=[row[0] for row in SETTINGS_TABLE])
def test_valid_value_is_parsed_to_its_type(home, env, default, raw, expected, bads):
    cfg = load_config({env: raw}, home)
    value = getattr(cfg, field_name(env))
    assert value == expected and type(value) is type(default)
    assert cfg.sources[field_name(env)] == "env"
    assert not [w for w in cfg.warnings if env + "=" in w]


@pytest.mark.parametrize("env,default,bad", INVALID_CASES,
                         ids=[f"{env}={bad!r}" for env, _, bad in INVALID_CASES])
def test_invalid_value_warns_and_uses_default(home, env, default, bad):
    cfg = load_config({env: bad}, home)
    assert getattr(cfg, field_name(env)) == default
    assert cfg.sources[field_name(env)] == "default"
    [warning] = [w for w in cfg.warnings if w.startswith(env + "=")]
    assert repr(bad) in warning
    assert "expected " in warning and f"default {default!r}" in warning


def test_warning_names_the_accepted_range(home):
    cfg = load_config({"TROVE_INCREMENTAL_MAX_DEPTH": "12"}, home)
    assert cfg.warnings == ("TROVE_INCREMENTAL_MAX_DEPTH='12' (from env) is invalid: "
                            "expected an integer with 1 <= value <= 8; using the default 3",)
    cfg = load_config({"TROVE_CONTEXT_THRESHOLD": "0"}, home)
    assert "a number with 0 < value <= 1" in cfg.warnings[0]


@pytest.mark.parametrize("raw", ["1", "TRUE", "Yes", "on", " true "])
def test_bool_true_words(home, raw):
    assert load_config({"TROVE_ENABLE_SLASH_COMMAND": raw}, home).enable_slash_command is True


@pytest.mark.parametrize("raw", ["0", "False", "NO", "off"])
def test_bool_false_words(home, raw):
    cfg = load_config({"TROVE_RECALL_POLICY_ENABLED": raw}, home)
    assert cfg.recall_policy_enabled is False


def test_yaml_values_accept_both_key_styles_and_native_types(home):
    write_yaml(home, """
trove:
  TROVE_CONTEXT_THRESHOLD: 0.5
  fresh_tail_count: 10
  Trove_Enable_Slash_Command: yes
  ignore_message_patterns: ['a{1,3}', ' b ', '']
  summary_fallback_models: "x, y"
  fts_integrity_check_interval_hours: 1
  summary_model:
other_plugin: {context_threshold: 0.9}
""")
    cfg = load_config({}, home)
    assert cfg.context_threshold == 0.5
    assert cfg.fresh_tail_count == 10
    assert cfg.enable_slash_command is True
    assert cfg.ignore_message_patterns == ("a{1,3}", "b")
    assert cfg.summary_fallback_models == ("x", "y")
    assert cfg.fts_integrity_check_interval_hours == 1.0
    assert isinstance(cfg.fts_integrity_check_interval_hours, float)
    assert cfg.summary_model == ""
    assert cfg.sources["context_threshold"] == "config.yaml"
    assert cfg.sources["summary_model"] == "default"
    assert cfg.warnings == ()


def test_env_wins_over_yaml_and_yaml_over_defaults(home):
    write_yaml(home, "trove:\n  context_threshold: 0.5\n  fresh_tail_count: 10\n")
    cfg = load_config({"TROVE_CONTEXT_THRESHOLD": "0.7"}, home)
    assert cfg.context_threshold == 0.7 and cfg.sources["context_threshold"] == "env"
    assert cfg.fresh_tail_count == 10 and cfg.sources["fresh_tail_count"] == "config.yaml"
    assert cfg.leaf_chunk_tokens == 20000 and cfg.sources["leaf_chunk_tokens"] == "default"


def test_invalid_env_falls_back_to_yaml_value(home):
    write_yaml(home, "trove:\n  fresh_tail_count: 10\n")
    cfg = load_config({"TROVE_FRESH_TAIL_COUNT": "lots"}, home)
    assert cfg.fresh_tail_count == 10 and cfg.sources["fresh_tail_count"] == "config.yaml"
    assert "using the value from config.yaml instead" in cfg.warnings[0]


@pytest.mark.parametrize("text", ["trove:\n  fresh_tail_count: true\n",
                                  "trove:\n  fresh_tail_count: 3.5\n",
                                  "trove:\n  fresh_tail_count: [1]\n",
                                  "trove:\n  summary_model: 5\n"])
def test_yaml_values_of_the_wrong_type_are_rejected(home, text):
    write_yaml(home, text)
    cfg = load_config({}, home)
    assert cfg == TroveConfig(hermes_home=home)
    assert len(cfg.warnings) == 1 and "(from config.yaml) is invalid" in cfg.warnings[0]


@pytest.mark.parametrize("text", ["trove: [unclosed\n", "- a\n- b\n", "trove: 3\n",
                                  "\tkey: : :\n"])
def test_broken_yaml_file_warns_and_continues(home, text):
    write_yaml(home, text)
    cfg = load_config({"TROVE_FRESH_TAIL_COUNT": "5"}, home)
    assert cfg.fresh_tail_count == 5
    assert len(cfg.warnings) == 1 and "config.yaml" in cfg.warnings[0]


def test_undecodable_yaml_file_warns(home):
    (home / "config.yaml").write_bytes(b"trove:\n  summary_model: \xff\xfe\n")
    cfg = load_config({}, home)
    assert len(cfg.warnings) == 1 and "cannot be read" in cfg.warnings[0]


def test_missing_or_empty_yaml_is_silent(home):
    assert load_config({}, home).warnings == ()
    write_yaml(home, "")
    assert load_config({}, home).warnings == ()
    write_yaml(home, "model: foo\n")
    assert load_config({}, home).warnings == ()


def test_yaml_without_pyyaml_warns(home, monkeypatch):
    write_yaml(home, "trove:\n  fresh_tail_count: 10\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    cfg = load_config({}, home)
    assert cfg.fresh_tail_count == 32
    assert "PyYAML is not installed" in cfg.warnings[0]


def test_unknown_names_are_reported(home):
    write_yaml(home, "trove:\n  fresh_tail_cuont: 3\n")
    cfg = load_config({"TROVE_CONTEXT_TRESHOLD": "0.5", "OTHER": "1"}, home)
    assert len(cfg.warnings) == 2
    assert any("TROVE_CONTEXT_TRESHOLD" in w for w in cfg.warnings)
    assert any("trove.fresh_tail_cuont" in w for w in cfg.warnings)


def test_setting_given_twice_in_yaml_warns(home):
    write_yaml(home, "trove:\n  TROVE_FRESH_TAIL_COUNT: 3\n  fresh_tail_count: 4\n")
    cfg = load_config({}, home)
    assert cfg.fresh_tail_count == 4
    assert "given twice" in cfg.warnings[0]


def test_hermes_home_comes_from_argument_then_environ_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config({}).hermes_home == tmp_path / ".hermes"
    assert load_config({"HERMES_HOME": str(tmp_path / "h")}).hermes_home == tmp_path / "h"
    assert load_config({"HERMES_HOME": "/x"}, hermes_home="~/y").hermes_home == tmp_path / "y"


def test_reads_os_environ_by_default(home, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TROVE_CONDENSE_FANOUT", "8")
    cfg = load_config()
    assert cfg.hermes_home == home and cfg.condense_fanout == 8


def test_yaml_is_read_from_hermes_home_in_environ(home):
    write_yaml(home, "trove:\n  condense_fanout: 6\n")
    assert load_config({"HERMES_HOME": str(home)}).condense_fanout == 6


def test_database_path_resolution(home, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config({}, home).resolved_database_path == home / "trove.db"
    cfg = load_config({"TROVE_DATABASE_PATH": "~/dbs/t.db"}, home)
    assert cfg.resolved_database_path == tmp_path / "dbs" / "t.db"
    cfg = load_config({"TROVE_DATABASE_PATH": "/abs/t.db"}, home)
    assert cfg.resolved_database_path == Path("/abs/t.db")
    cfg = load_config({"TROVE_DATABASE_PATH": "sub/t.db"}, home)
    assert cfg.resolved_database_path == home / "sub" / "t.db"
    assert cfg.database_path == "sub/t.db"


def test_config_is_immutable(home):
    cfg = load_config({}, home)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.context_threshold = 0.9
    with pytest.raises(TypeError):
        cfg.sources["context_threshold"] = "env"
    assert isinstance(cfg.ignore_session_patterns, tuple)
    hash(cfg)


def test_sources_and_warnings_do_not_affect_equality(home):
    clean = load_config({}, home)
    noisy = load_config({"TROVE_FRESH_TAIL_COUNT": "bad"}, home)
    assert noisy.warnings and clean == noisy


def test_describe_lists_every_setting(home):
    cfg = load_config({"TROVE_CONTEXT_THRESHOLD": "0.5", "TROVE_IGNORE_SESSION_PATTERNS": "a,b",
                       "TROVE_FRESH_TAIL_COUNT": "zero"}, home)
    info = cfg.describe()
    json.dumps(info)
    assert info["hermes_home"] == str(home)
    assert info["database_path"] == str(home / "trove.db")
    assert list(info["settings"]) == [row[0] for row in SETTINGS_TABLE]
    assert info["settings"]["TROVE_CONTEXT_THRESHOLD"] == {"value": 0.5, "source": "env"}
    assert info["settings"]["TROVE_IGNORE_SESSION_PATTERNS"]["value"] == ["a", "b"]
    assert info["settings"]["TROVE_LEAF_CHUNK_TOKENS"] == {"value": 20000, "source": "default"}
    assert info["warnings"] == list(cfg.warnings) and len(info["warnings"]) == 1


def test_dynamic_leaf_chunk_max_is_raised_to_leaf_chunk(home):
    cfg = load_config({"TROVE_LEAF_CHUNK_TOKENS": "30000",
                       "TROVE_DYNAMIC_LEAF_CHUNK_MAX": "25000"}, home)
    assert cfg.dynamic_leaf_chunk_max == 30000
    assert "TROVE_DYNAMIC_LEAF_CHUNK_MAX=25000" in cfg.warnings[0]


def test_replay_stubbing_without_externalization_is_kept_but_not_effective(home):
    env = {"TROVE_LARGE_OUTPUT_ACTIVE_REPLAY_STUBBING_ENABLED": "true"}
    cfg = load_config(env, home)
    assert cfg.large_output_active_replay_stubbing_enabled is True
    assert cfg.large_output_active_replay_stubbing_effective is False
    assert "effectively off" in cfg.warnings[0]
    entry = cfg.describe()["settings"]["TROVE_LARGE_OUTPUT_ACTIVE_REPLAY_STUBBING_ENABLED"]
    assert entry["effective"] is False
    env["TROVE_LARGE_OUTPUT_EXTERNALIZATION_ENABLED"] = "1"
    cfg = load_config(env, home)
    assert cfg.large_output_active_replay_stubbing_effective is True and cfg.warnings == ()


def test_unknown_sensitive_pattern_names_are_kept_and_reported(home):
    cfg = load_config({"TROVE_SENSITIVE_PATTERNS": "api_key,aws_secret"}, home)
    assert cfg.sensitive_patterns == ("api_key", "aws_secret")
    assert "aws_secret" in cfg.warnings[0] and "api_key" not in cfg.warnings[0].split("[")[1]
    assert config.KNOWN_SENSITIVE_PATTERNS == {
        "api_key", "bearer_token", "password_assignment", "private_key", "secret_assignment",
        "webhook_url"}


def test_reachability_fine_for_defaults_on_a_large_window():
    assert check_reachability(TroveConfig(), 200_000) == []


def test_reachability_trigger_below_overhead():
    share_only = TroveConfig(min_trigger_tokens=0)
    [problem] = check_reachability(share_only, 32_000)  # trigger 11200 < 12500
    assert "at or below the fixed overhead" in problem
    assert check_reachability(share_only, 32_000, fixed_overhead_tokens=5000) == []
    assert check_reachability(TroveConfig(), 32_000) == []  # the floor: trigger 24000


@pytest.mark.parametrize("window, share_only, floored", [
    (16_000, 5_600, 12_000), (32_768, 11_468, 24_576), (65_536, 22_937, 32_000),
    (91_428, 31_999, 32_000), (131_072, 45_875, 45_875), (1_000_000, 350_000, 350_000)])
def test_trigger_is_the_share_raised_to_the_floor_within_three_quarters(window, share_only,
                                                                        floored):
    assert config.trigger_tokens(TroveConfig(min_trigger_tokens=0), window) == share_only
    assert config.trigger_tokens(TroveConfig(), window) == floored
    assert config.trigger_tokens(TroveConfig(context_threshold=0.9), window) == int(window * 0.9)


def test_reachability_budgets_larger_than_room():
    cfg = TroveConfig(leaf_summary_tokens=5000, condensed_summary_tokens=6000,
                      fresh_tail_max_tokens=8000, min_trigger_tokens=0)
    problems = check_reachability(cfg, 50_000)  # trigger 17500, room 5000
    assert len(problems) == 2  # the leaf budget of 5000 fits exactly
    assert "TROVE_CONDENSED_SUMMARY_TOKENS=6000" in problems[0]
    assert "TROVE_FRESH_TAIL_MAX_TOKENS=8000" in problems[1]
    assert "5000 tokens left under the trigger" in problems[0]


def test_reachability_pressure_ratio_at_or_below_threshold():
    [problem] = check_reachability(TroveConfig(critical_budget_pressure_ratio=0.3), 200_000)
    assert "TROVE_CRITICAL_BUDGET_PRESSURE_RATIO=0.3" in problem
    assert check_reachability(TroveConfig(critical_budget_pressure_ratio=0.8), 200_000) == []


def test_reachability_rejects_non_positive_window():
    assert check_reachability(TroveConfig(), 0)


def _doc_rows():
    text = (Path(config.__file__).parent / "docs" / "configuration.md").read_text()
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| `TROVE_")]


def _doc_default(value):
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value in ("", ()):
        return "(empty)"
    return f"`{','.join(value) if isinstance(value, tuple) else value}`"


def test_readme_lists_every_setting_with_its_default():
    text = (Path(config.__file__).parent / "README.md").read_text()
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| `TROVE_")]
    specs = config.setting_fields()
    assert [row[0] for row in rows] == [f"`{config.env_name(f.name)}`" for f in specs]
    for row, f in zip(rows, specs):
        assert row[1] == _doc_default(f.default), row[0]


def test_docs_table_matches_code():
    rows = _doc_rows()
    specs = config.setting_fields()
    assert [row[0] for row in rows] == [f"`{config.env_name(f.name)}`" for f in specs]
    for row, f in zip(rows, specs):
        env, kind, default, value_range, doc = row
        assert kind == f.metadata["kind"], env
        assert default == _doc_default(f.default), env
        assert doc == f.metadata["doc"], env
        if kind in ("int", "float"):
            expected = config.accepted_values(f).split(" with ", 1)[1]
            assert re.sub(r"\bx\b", "value", value_range) == expected, env


def test_threshold_overrides_pick_the_most_specific_glob():
    cfg = TroveConfig(context_threshold=0.35, min_trigger_tokens=0,
                      context_threshold_overrides='{"gpt-*": 0.5, "gpt-5*": 0.6, "claude-*": 0.4}')
    assert config.threshold_for_model(cfg, "GPT-5.1-mini")[0] == 0.6
    assert config.threshold_for_model(cfg, "gpt-4o")[0] == 0.5
    assert config.threshold_for_model(cfg, "claude-sonnet-4")[0] == 0.4
    assert config.threshold_for_model(cfg, "llama-3")[0] == 0.35
    assert config.threshold_for_model(cfg, "")[0] == 0.35
    trigger, rule = config.trigger_and_rule(cfg, 200_000, "gpt-5")
    assert trigger == 120_000 and "gpt-5*" in rule
    # the floor still applies to an override
    floored = TroveConfig(min_trigger_tokens=32000, context_threshold_overrides='{"tiny*": 0.1}')
    assert config.trigger_tokens(floored, 64_000, "tiny-1") == 32000


def test_threshold_overrides_from_yaml_mapping(home):
    (home / "config.yaml").write_text("trove:\n  context_threshold_overrides:\n"
                                      "    'gpt-5*': 0.6\n")
    cfg = load_config({}, home)
    assert json.loads(cfg.context_threshold_overrides) == {"gpt-5*": 0.6}
    assert not cfg.warnings


def test_unknown_time_zone_falls_back_to_utc(home):
    cfg = load_config({"TROVE_TIMEZONE": "Mars/Olympus_Mons"}, home)
    assert cfg.timezone == "UTC"
    assert any("TROVE_TIMEZONE" in w and "UTC" in w for w in cfg.warnings)
    assert load_config({"TROVE_TIMEZONE": "Asia/Tokyo"}, home).timezone == "Asia/Tokyo"


# ---------------------------------------------------------------- TROVE_EXPOSED_TOOLS
def test_exposed_tools_default_leaves_out_the_families_that_are_off(home):
    cfg = load_config({}, home)
    assert cfg.exposed_tools == ("all",)
    assert cfg.hidden_tools == {"trove_query_state": "TROVE_ASSERTIONS_ENABLED is off",
                                "trove_retrieve": "TROVE_RETRIEVE_ENABLED is off"}
    assert len(cfg.exposed_tool_names) == len(config.KNOWN_TOOLS) - 2
    on = load_config({"TROVE_ASSERTIONS_ENABLED": "1", "TROVE_RETRIEVE_ENABLED": "1"}, home)
    assert on.exposed_tool_names == config.KNOWN_TOOLS and on.hidden_tools == {}


def test_exposed_tools_list_keeps_known_order_and_reports_unknown_names(home):
    cfg = load_config({"TROVE_EXPOSED_TOOLS": "recall, trove_grep, trove_grpe, TROVE_EXPAND"},
                      home)
    assert cfg.exposed_tool_names == ("trove_grep", "trove_expand", "trove_recall")
    assert cfg.hidden_tools["trove_status"] == "not in TROVE_EXPOSED_TOOLS"
    [warning] = cfg.warnings
    assert "TROVE_EXPOSED_TOOLS" in warning and "'trove_grpe'" in warning
    assert "ignored" in warning and "trove_doctor" in warning   # lists what is known


@pytest.mark.parametrize("raw", ["trove_nothing, bogus", "", " , "])
def test_exposed_tools_without_a_known_name_falls_back_to_every_tool(home, raw):
    cfg = load_config({"TROVE_EXPOSED_TOOLS": raw}, home)
    assert cfg.exposed_tools == ("all",)
    assert len(cfg.exposed_tool_names) == len(config.KNOWN_TOOLS) - 2
    assert any("TROVE_EXPOSED_TOOLS" in w and "'all'" in w for w in cfg.warnings)


def test_exposed_tools_none_and_a_listed_family_tool_that_is_off(home):
    assert load_config({"TROVE_EXPOSED_TOOLS": "none"}, home).exposed_tool_names == ()
    cfg = load_config({"TROVE_EXPOSED_TOOLS": "trove_grep,trove_retrieve"}, home)
    assert cfg.exposed_tool_names == ("trove_grep",)
    assert cfg.hidden_tools["trove_retrieve"] == "TROVE_RETRIEVE_ENABLED is off"
    assert any("trove_retrieve" in w and "TROVE_RETRIEVE_ENABLED" in w for w in cfg.warnings)


def test_exposed_tools_from_a_yaml_list(home):
    write_yaml(home, "trove:\n  exposed_tools: [trove_grep, trove_status]\n")
    cfg = load_config({}, home)
    assert cfg.exposed_tool_names == ("trove_grep", "trove_status") and not cfg.warnings


def test_exposed_tools_all_beside_an_unknown_name_still_reports_it(home):
    cfg = load_config({"TROVE_EXPOSED_TOOLS": "all, trove_grpe"}, home)
    assert cfg.exposed_tools == ("all",)
    assert any("'trove_grpe'" in w and "ignored" in w for w in cfg.warnings)


def test_database_url_selects_postgresql_and_is_redacted_wherever_shown(home):
    """The URL is what the engine opens; status, describe and warnings never print
    its password (in the authority or as a password= option)."""
    secret = "postgresql://trove:s3cr3t@db.example:5432/trove?password=s3cr3t&sslmode=require"
    cfg = load_config({"TROVE_DATABASE_URL": secret}, home)
    assert cfg.database_target == secret
    shown = json.dumps(cfg.describe())
    assert "s3cr3t" not in shown and "postgresql://trove:***@db.example:5432/trove" in shown
    assert "s3cr3t" not in cfg.database_display
    assert load_config({}, home).database_target == str(home / "trove.db")  # the default
    bad = load_config({"TROVE_DATABASE_URL": "mysql://x:pw@h/db"}, home)
    assert bad.database_url == "" and "pw" not in " ".join(bad.warnings)


@pytest.mark.parametrize("typed, canonical", [
    ("utc", "UTC"), ("UTC", "UTC"), ("Etc/UTC", "UTC"), (" zulu ", "UTC"), ("GMT", "UTC"),
    ("europe/paris", "Europe/Paris"), ("Europe/Paris", "Europe/Paris"),
    # links are the zone they link to (the rollups' key was the name as typed)
    ("US/Eastern", "America/New_York"), ("asia/calcutta", "Asia/Kolkata"),
    ("Asia/Kolkata", "Asia/Kolkata"), ("Etc/GMT", "UTC"), ("Zulu", "UTC"),
    ("Etc/Universal", "UTC"), ("US/Pacific", "America/Los_Angeles")])
def test_one_time_zone_is_one_setting_whatever_its_spelling(home, typed, canonical):
    """The zone is the rollups' key: ``utc`` and ``UTC`` were stored as typed, so each
    spelling built and listed its own set of day/week/month rollups."""
    cfg = load_config({"TROVE_TIMEZONE": typed}, home)
    assert cfg.timezone == canonical and not cfg.warnings
    from hermes_trove.compaction import rollups
    assert rollups.settings_of(cfg).time_zone == canonical


@pytest.mark.parametrize("odd", [None, 123, "", "  ", "Mars/Olympus_Mons", "../../etc/passwd",
                                 "/usr/share/zoneinfo/UTC", "Europe/\0Paris", "x" * 5000,
                                 "US/Eastern/", "\ud800"])
def test_an_odd_time_zone_value_never_raises(odd):
    """Whatever a config file holds, the zone is a zone or None (then UTC, reported)."""
    assert config.canonical_zone(odd) is None


def test_a_link_is_folded_only_when_both_zone_files_are_the_same(tmp_path, monkeypatch):
    """Links come from the installed ``tzdata.zi``; one folds only when the zone files
    ``zoneinfo`` loads are byte-identical, so a ``tzdata.zi`` of another build (the
    ``tzdata`` package links zones a system build keeps apart) never merges two zones
    whose rules differ on this machine."""
    import zoneinfo
    from importlib import resources
    source = resources.files("tzdata.zoneinfo")
    tree = tmp_path / "zoneinfo"
    for name in ("Europe/Paris", "Europe/Berlin"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(source.joinpath(*name.split("/")).read_bytes())
    (tree / "Europe" / "Lutetia").write_bytes((tree / "Europe" / "Paris").read_bytes())
    (tree / "tzdata.zi").write_text("# test\nL Europe/Paris Europe/Lutetia\n"
                                    "L Europe/Paris Europe/Berlin\n")
    for cached in (config._zone_names, config._zone_link, config._zone_links):
        monkeypatch.setattr(config, cached.__name__, cached.__wrapped__)
    system = zoneinfo.TZPATH
    zoneinfo.reset_tzpath([str(tree)])
    try:
        assert config.canonical_zone("Europe/Lutetia") == "Europe/Paris"
        assert config.canonical_zone("europe/berlin") == "Europe/Berlin"  # other bytes: kept
    finally:
        zoneinfo.reset_tzpath(system)
