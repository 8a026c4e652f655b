"""noise.py: session globs, message regexes with timeouts, and the no-`regex` fallback."""
import json
import logging
import sys
import time

import pytest

from hermes_trove.ingest import noise
from hermes_trove.ingest.noise import MessageFilter, SessionFilter


# ---------------------------------------------------------------- session globs
@pytest.mark.parametrize("pattern,candidate,matches", [
    ("cron", "cron", True),
    ("cron", "cronjob", False),
    ("cron:*", "cron:nightly", True),
    ("cron:*", "cron:", True),
    ("cron:*", "cron:a:b", False),
    ("cron:**", "cron:a:b", True),
    ("**", "anything:at:all", True),
    ("*", "one-segment", True),
    ("*", "two:segments", False),
    ("*:health", "telegram:health", True),
    ("*:health", "telegram:x:health", False),
    ("**:health", "telegram:x:health", True),
    ("agent-*-tmp", "agent-42-tmp", True),
    ("agent-*-tmp", "agent-4:2-tmp", False),
    ("a.b", "axb", False),  # regex metacharacters are literal
    ("[x]", "[x]", True),
    ("a***b", "a:x:b", True),
    ("sess", "SESS", False),  # case-sensitive, like session ids
])
def test_glob_semantics(pattern, candidate, matches):
    assert bool(noise.glob_regex(pattern).fullmatch(candidate)) is matches


@pytest.mark.parametrize("session_id,platform,expected", [
    ("cron_2026-11-29", "cli", ("ignored", "cron_*")),          # raw session id
    ("abc", "healthcheck", ("ignored", "healthcheck")),         # platform alone
    ("lane-7", "telegram", ("stateless", "telegram:lane-*")),   # platform:session_id
    ("x", "discord", ("stateless", "discord:**")),
    ("cron_1", "discord", ("ignored", "cron_*")),               # ignored wins over stateless
    ("normal-session", "cli", ("normal", None)),
    ("", "cli", ("normal", None)),
    (None, None, ("normal", None)),
    ("", "healthcheck", ("ignored", "healthcheck")),
])
def test_classify(session_id, platform, expected):
    filt = SessionFilter(["cron_*", "healthcheck"], ["telegram:lane-*", "discord:**"])
    assert filt.classify(session_id, platform) == expected


def test_platform_patterns_need_a_platform():
    filt = SessionFilter(["cli:*"], [])
    assert filt.classify("abc", None).kind == "normal"
    assert filt.classify("abc", "cli").kind == "ignored"
    assert filt.classify("cli:abc", None).kind == "ignored"  # the raw id itself matches
    assert filt.classify("cli:a:b", None).kind == "normal"  # '*' stops at ':'
    assert SessionFilter(["cli:**"]).classify("cli:a:b", None).kind == "ignored"


def test_session_filter_accepts_a_comma_string_and_describes_itself():
    filt = SessionFilter(" cron_* , ,healthcheck,cron_*", "")
    assert filt.ignore_patterns == ("cron_*", "healthcheck")
    info = filt.describe()
    assert info["ignore_patterns"] == ["cron_*", "healthcheck"]
    assert info["stateless_patterns"] == []
    assert info["matched_against"] == ["session_id", "platform", "platform:session_id"]
    assert "*" in info["wildcards"] and "**" in info["wildcards"]
    assert "ignored wins" in info["precedence"]
    json.dumps(info)


# ---------------------------------------------------------------- message regexes
def test_text_then_json_matching():
    filt = MessageFilter([r"HEARTBEAT_OK", r'"name": "healthcheck"'])
    assert filt.matches({"role": "assistant", "content": "HEARTBEAT_OK"}) == "HEARTBEAT_OK"
    parts = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}},
                                         {"type": "text", "text": "ping HEARTBEAT_OK"}]}
    assert filt.matches(parts) == "HEARTBEAT_OK"
    tool = {"role": "tool", "tool_call_id": "c", "name": "healthcheck", "content": "fine"}
    assert filt.matches(tool) == '"name": "healthcheck"'
    assert filt.matches({"role": "user", "content": "hello"}) is None


def test_plain_text_wins_over_json():
    filt = MessageFilter([r'"role": "user"', r"secret word"])
    message = {"role": "user", "content": "the secret word"}
    assert filt.matches(message) == "secret word"  # not the earlier JSON-only pattern


def test_json_is_normalized_and_skips_host_keys():
    filt = MessageFilter([r'\{"content": "x", "role": "user"\}'])
    assert filt.matches({"role": "user", "content": "x", "_db_persisted": True,
                         "api_content": "x + injected"})


def test_invalid_patterns_are_dropped_and_reported(caplog):
    with caplog.at_level(logging.WARNING):
        filt = MessageFilter(["(unclosed", "ok+", "[z-a]"])
    assert set(filt.invalid) == {"(unclosed", "[z-a]"}
    assert all(filt.invalid.values())
    assert filt.enabled and filt.describe()["patterns"] == ["ok+"]
    assert "(unclosed" in caplog.text
    assert filt.matches({"role": "user", "content": "okk"}) == "ok+"


def test_catastrophic_pattern_cannot_stall_ingest():
    filt = MessageFilter([r"(a+)+$"])
    message = {"role": "user", "content": "a" * 10_000 + "b"}
    started = time.perf_counter()
    assert filt.matches(message) is None
    assert time.perf_counter() - started < 2.0
    assert filt.timeouts >= 1 and filt.describe()["timeouts"] == filt.timeouts


def test_without_the_regex_package_filtering_is_disabled(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "regex", None)  # makes `import regex` raise ImportError
    with caplog.at_level(logging.WARNING):
        filt = MessageFilter(["anything"])
    assert not filt.enabled and filt.warning and "regex" in filt.warning
    assert "disabled" in caplog.text
    assert filt.matches({"role": "user", "content": "anything"}) is None
    assert filt.describe()["warning"] == filt.warning
    assert MessageFilter([]).warning is None  # nothing configured: nothing to warn about


def test_no_patterns_means_no_work():
    filt = MessageFilter(())
    assert not filt.enabled
    assert filt.matches({"role": "user", "content": "x"}) is None


# ---------------------------------------------------------------- whole-session noise
from hypothesis import given, settings, strategies as st  # noqa: E402

from hermes_trove.ingest.noise import NOISE_MAX_MESSAGES, session_noise  # noqa: E402


def chat(*pairs):
    """Alternating user/assistant messages."""
    return [{"role": role, "content": text} for pair in pairs
            for role, text in zip(("user", "assistant"), pair)]


def debugging_session():
    """62 messages of real work whose first user message starts with 'Heartbeat'."""
    messages = chat(("Heartbeat service on prod keeps crashing after the deploy, logs attached",
                     "Let me look at the service logs."))
    for i in range(15):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{i}", "type": "function",
            "function": {"name": "terminal", "arguments": f'{{"command": "journalctl -n {i}"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i}: OOM"})
        messages += chat((f"what about attempt {i}?", f"attempt {i} shows the same OOM"))
    return messages


@pytest.mark.parametrize("messages", [
    debugging_session(),
    chat(("cron: how should we schedule the nightly backups so they avoid the deploy window?",
          "Use a systemd timer at 03:15 UTC with RandomizedDelaySec; " * 12)),
    chat(("HEARTBEAT_OK", "HEARTBEAT_OK"), ("now a real question about deploys", "sure")),
    chat(("Heartbeat", "ok")),                       # a person's word, not the prompt
    chat(*[(f"[Cron delivery: job{i}] variant text {chr(97 + i)}", "ok") for i in range(5)]),
])
def test_real_work_is_never_noise(messages):
    verdict = session_noise(messages)
    assert not verdict.noise and verdict.facts


@pytest.mark.parametrize("messages", [
    chat(("Read HEARTBEAT.md; reply HEARTBEAT_OK", "HEARTBEAT_OK")),
    chat(*[("[Cron delivery: digest] ping 12", "pong")] * 3),
    chat(("HEARTBEAT", "HEARTBEAT_OK"), ("HEARTBEAT", "HEARTBEAT_OK")),
])
def test_heartbeat_and_cron_sessions_are_noise_with_reasons(messages):
    verdict = session_noise(messages)
    assert verdict.noise
    assert "no tool use" in verdict.facts[0] and "user messages are noise" in verdict.facts[1]


def test_configured_message_patterns_count_as_noise():
    messages = chat(("nightly report for the team", "report sent"))
    assert not session_noise(messages).noise
    verdict = session_noise(messages, MessageFilter(["^nightly report"]))
    assert verdict.noise and "pattern '^nightly report'" in verdict.facts[1]


noise_session = st.lists(st.sampled_from(chat(("HEARTBEAT_OK", "HEARTBEAT_OK"),
                                              ("[Cron delivery: x] ping", "pong"))),
                         min_size=1, max_size=3 * NOISE_MAX_MESSAGES)


@settings(max_examples=60, deadline=None)
@given(noise_session, st.integers(min_value=0, max_value=200), st.booleans())
def test_tool_use_or_size_always_protects(messages, at, by_size):
    if by_size:
        messages = (messages * (NOISE_MAX_MESSAGES + 1))[:NOISE_MAX_MESSAGES + 1]
    else:
        messages = list(messages)
        messages.insert(at % (len(messages) + 1), {"role": "tool", "tool_call_id": "c",
                                                   "content": "HEARTBEAT_OK"})
    assert not session_noise(messages).noise


def test_a_chat_about_configuring_heartbeats_is_not_noise():
    """Issue 25: the shapes match whole messages; words inside a real chat do not count."""
    messages = chat(
        ("How do I make the agent answer HEARTBEAT_OK when nothing is due?",
         "Put the checklist in HEARTBEAT.md and end it with 'reply HEARTBEAT_OK'."),
        ("Add to HEARTBEAT.md: the office door code is 4711, check the alarm at 9.",
         "Added. The heartbeat will read HEARTBEAT.md every 30 minutes."))
    verdict = session_noise(messages)
    assert not verdict.noise and "not heartbeat/cron" in verdict.facts[0]


@pytest.mark.parametrize("text", ["HEARTBEAT_OK", " HEARTBEAT ", "HEARTBEAT_OK.",
                                  "Read HEARTBEAT.md if it exists. If nothing needs attention, "
                                  "reply HEARTBEAT_OK.", "[Cron delivery: digest] ping 12"])
def test_machine_prompts_still_match_whole(text):
    from hermes_trove.ingest.noise import _shape_of
    assert _shape_of(text) is not None
    assert _shape_of(text + "\nand also: what is the door code?") is None
