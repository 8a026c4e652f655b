"""Tests for compaction/salience.py and the salient deterministic digest built on it."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_trove.compaction import salience
from hermes_trove.compaction.summarize import SourceItem, deterministic_summary


def count(text: str) -> int:
    return len(text) // 4


def pytest_output(passed: int, failed: list[str]) -> str:
    lines = [f"tests/test_refund.py::test_case_{n} PASSED" for n in range(passed)]
    lines += [f"tests/test_refund.py::{name} FAILED" for name in failed]
    lines.append(f"==== {len(failed)} failed, {passed} passed in 0.37s ====")
    return "\n".join(lines)


def test_test_run_becomes_counts_and_failures():
    out = salience.condense_tool_output(
        "\n".join([f"tests/test_refund.py::test_case_{n} PASSED" for n in range(6)]
                  + ["tests/test_refund.py::test_refund_after_timeout FAILED"]))
    assert out == ["tests: 6 passed, 1 failed; failing: test_refund_after_timeout"]


def test_reported_summary_line_wins_and_failure_with_error_stays():
    out = salience.condense_tool_output(
        "FAILED tests/test_retry.py::test_burst - ConnectionResetError: reset by peer\n"
        "tests/test_retry.py::test_ok PASSED\n1 failed, 12 passed in 0.84s")
    assert out[0].startswith("FAILED tests/test_retry.py::test_burst - ConnectionResetError")
    assert out[-1] == "tests: 1 failed, 12 passed in 0.84s; failing: test_burst"


def test_many_failures_are_named_up_to_a_cap():
    out = salience.condense_tool_output(pytest_output(3, [f"test_f{n}" for n in range(9)]))
    assert out == ["tests: 9 failed, 3 passed in 0.37s; failing: test_f0, test_f1, test_f2, "
                   "test_f3 (+5 more)"]


def test_code_listing_becomes_one_line_but_settings_and_errors_stay():
    listing = "# src/payments/client.py\ndef handler(request):\n" + "\n".join(
        f"    value_{n} = compute_call({n})" for n in range(30)) + "\n    return value_0\n"
    out = salience.condense_tool_output(listing)
    assert out == ["code: src/payments/client.py (32 lines)"]
    out = salience.condense_tool_output("pool_size=14  # db pool\nTraceback: KeyError 'x'\n"
                                        + listing)
    assert "pool_size=14 # db pool" in out[1] and "KeyError" in out[2]


def test_repeated_lines_collapse_with_a_count():
    text = "\n".join(f"src/a{n}.py:{n}: retry = configure()" for n in range(7)) + "\ndone"
    out = salience.condense_tool_output(text)
    assert out == ["src/a0.py:0: retry = configure() (×7 similar)", "done"]


def test_state_key_and_value_score():
    assert salience.state_key("pool_size=14  # pool") == "pool_size"
    assert salience.state_key("tests: 3 passed") == salience.TEST_OUTCOME_LABEL
    assert salience.state_key("We talked about it") is None
    assert salience.value_score("The port is 6543 and timeout 8.5 seconds") >= 2
    assert salience.value_score("we talked about the change") == 0
    for text in ("v2.14.3", "cache-02.internal", "OPS-4471", "commit a3f9c1e",
                 "#deploy-watch", "Priya Raman", "cust_8812x", "WORKER_CONCURRENCY=6"):
        assert salience.value_score(f"see {text} here") >= 1, text


def test_parse_digest_keeps_refs_and_meta():
    text = ("[m1-m9: 9 messages, 500 tokens]\nFiles: a/b.py, c/d.py\nTools used: terminal\n"
            "[m3 user] Use port 6543. · Also v2.\n[m7 tool:terminal] tests: 3 passed\n"
            "- an LLM bullet")
    meta, lines = salience.parse_digest(text, "n4")
    assert meta["Files"] == ["a/b.py", "c/d.py"]
    assert [(x.ref, x.role, x.tool_name, x.text) for x in lines] == [
        ("m3", "user", None, "Use port 6543."), ("m3", "user", None, "Also v2."),
        ("m7", "tool", "terminal", "tests: 3 passed"), ("n4", "summary", None, "an LLM bullet")]


def test_digest_collapses_tool_output_and_keeps_facts():
    items = [SourceItem("m1", "user", "Please fix the refund flow. The refund timeout is 8.5 "
                                      "seconds and we decided to keep it."),
             SourceItem("m2", "assistant", "terminal({\"command\": \"pytest -q\"})"),
             SourceItem("m3", "tool", pytest_output(100, ["test_refund_after_timeout"]),
                        "terminal")]
    text = deterministic_summary(items, budget_tokens=150, count_tokens=count)
    assert "8.5 seconds" in text
    assert "failing: test_refund_after_timeout" in text
    assert "test_case_1 PASSED" not in text
    assert count(text) <= 150


def test_digest_keeps_only_the_last_state_of_a_setting():
    items = [SourceItem("m1", "tool", "pool_size=10  # db pool", "read_file"),
             SourceItem("m2", "user", "The queue must ack after commit, decided."),
             SourceItem("m3", "tool", "pool_size=14  # db pool", "read_file"),
             SourceItem("m4", "assistant", "unrelated filler words without specifics " * 20)]
    text = deterministic_summary(items, budget_tokens=200, count_tokens=count)
    assert "pool_size=14" in text and "pool_size=10" not in text


def test_routine_repeats_give_way_to_one_off_facts():
    items = [SourceItem(f"m{n}", "user", f"Can you fix the failing test in src/a{n}.py?")
             for n in range(1, 30)]
    items.insert(15, SourceItem("m99", "assistant", "Redis for sessions lives on cache-02.internal."))
    text = deterministic_summary(items, budget_tokens=100, count_tokens=count)
    assert "cache-02.internal" in text  # undamped, 29 requests scoring 9.5 would crowd it out
    assert text.count("Can you fix") <= 5


def test_merging_digests_keeps_original_message_refs():
    child = deterministic_summary(
        [SourceItem("m1", "user", "The staging database port is 6543, decided."),
         SourceItem("m2", "tool", pytest_output(20, []), "terminal")] * 1,
        budget_tokens=100, count_tokens=count)
    merged = deterministic_summary(
        [SourceItem("n1", "summary", child), SourceItem("n2", "summary", child.replace("[m1 user] The staging database port is 6543",
                                                  "[m5 user] The prod database port is 7654"))],
        budget_tokens=80, count_tokens=count)
    assert "[m5 user]" in merged and "6543" in merged and "7654" in merged
    assert "[n1 summary]" not in merged


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([
    "tests/x.py::test_a PASSED", "tests/x.py::test_b FAILED", "3 passed in 1.0s", "def f():",
    "    return 1", "# src/a.py", "x = call(1)", "KEY=value", "Error: boom", "", "   ",
    "plain words here", "\x00", "é"]) | st.text(max_size=60), max_size=40))
def test_condense_never_raises_and_never_grows(lines):
    text = "\n".join(lines)
    out = salience.condense_tool_output(text)
    assert len(out) <= max(1, len([x for x in text.splitlines() if x.strip()]) + 1)
    assert all(isinstance(x, str) and x for x in out)
