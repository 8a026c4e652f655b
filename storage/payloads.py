"""Big payloads kept outside the database rows, in content-addressed files.

Base64 images inline in SQLite bloat it, its FTS tables, its WAL and every
backup; so does a 30K-token log re-sent every turn. Before a message is
encoded, ``guard_message`` moves such payloads into ``<folder of
trove.db>/payloads`` and leaves a placeholder carrying a ref
(``trove-payload:<sha256>``); ``restore_text`` puts the exact original back.

- A ref is an id, never a path (``^trove-payload:[0-9a-f]{64}$``), and the
  file it names must resolve inside the payload root.
- A payload is the exact original string in UTF-8 (lone surrogates kept with
  ``surrogatepass``), named by its SHA-256 and verified on every read.
- Writes go to a temp file in the same folder, fsync, rename, fsync the
  folder: a crash leaves no file or a complete one, never a partial one.
- Placeholders depend only on the payload, so guarding a message twice gives
  the same row (and identity). A failed write keeps the original inline.

Limitation: placeholders are in-band text; a message quoting the exact
placeholder of an existing payload is expanded like a real one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import codec

REF_PREFIX = "trove-payload:"
_REF_RE = re.compile(r"trove-payload:([0-9a-f]{64})")
_SHA_NAME = re.compile(r"[0-9a-f]{64}")
PAYLOAD_DIR_NAME = "payloads"
TEMP_PREFIX = ".tmp-"
SIDECAR_SUFFIX = ".json"

KIND_DATA_URI = "data_uri"        # a whole data:<mime>;base64,... URI
KIND_BASE64 = "base64"            # a bare base64 run (no data: header)
KIND_TOOL_OUTPUT = "tool_output"  # a whole large tool result text
TOOL_OUTPUT_MIME = "text/plain"
UNKNOWN_MIME = "application/octet-stream"

MIN_DATA_URI_CHARS = 1024  # shorter data URIs stay inline: a placeholder would save little
MIN_BASE64_RUN = 4096      # bare base64 runs from this length (see ``_plausible_base64``)
PREVIEW_HEAD, PREVIEW_TAIL = 1000, 500  # what a tool-output placeholder keeps inline
# Shorter tool outputs are never externalized, whatever the threshold: the
# preview would be most of the text.
MIN_TOOL_OUTPUT_CHARS = 2 * (PREVIEW_HEAD + PREVIEW_TAIL)

_MEDIA_RE = re.compile(
    r"data:(?P<mime>[A-Za-z0-9.+-]{1,64}/[A-Za-z0-9.+-]{1,128})"
    r"(?:;[A-Za-z0-9.+-]{1,64}=[A-Za-z0-9.+-]{0,128}){0,8};base64,[A-Za-z0-9+/]*={0,2}"
    r"|(?<![A-Za-z0-9+/=])(?P<run>[A-Za-z0-9+/]{%d,}={0,2})(?![A-Za-z0-9+/=])"
    % MIN_BASE64_RUN)
_RUN_CHARS = re.compile(r"[A-Za-z0-9+/]*")
_HEADER_RE = re.compile(
    r"\[trove externalized (?P<kind>[a-z0-9_]{1,32}) "
    r"(?P<mime>[A-Za-z0-9.+-]{1,64}/[A-Za-z0-9.+-]{1,128}) (?P<size>\d+(?:\.\d)? [KMG]?B)"
    r"(?:, preview (?P<head>\d+)\+(?P<tail>\d+) of (?P<chars>\d+) chars)?"
    r": (?P<ref>trove-payload:[0-9a-f]{64})\]")
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF8", "image/gif"), (b"%PDF-", "application/pdf"))


class PayloadError(Exception):
    """Base class of every payload problem."""


class PayloadRefError(PayloadError, ValueError):
    """A string that is not a valid payload ref, or one that would leave the root."""


class PayloadMissingError(PayloadError, LookupError):
    """A valid ref whose file is not in the payload store."""


class PayloadCorruptError(PayloadError):
    """A payload file whose bytes no longer hash to its name."""


@dataclass(frozen=True)
class PayloadRef:
    """What ``put`` stored: the ref and its metadata; ``created`` is False if it already existed."""

    ref: str
    sha256: str
    kind: str
    mime: str | None
    size: int
    created: bool


@dataclass(frozen=True)
class GuardResult:
    """A guarded message, the refs it now carries, and problems for the caller to log."""

    message: dict
    refs: tuple[str, ...]
    warnings: tuple[str, ...]


def parse_ref(text: Any) -> str:
    """The SHA-256 hex named by a ref; raises ``PayloadRefError`` for anything else.

    Strict on purpose: refs come from the model and from stored text, and only
    this exact shape can never be read as a path.
    """
    match = _REF_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        shown = repr(text)[:80]
        raise PayloadRefError(f"not a trove payload ref: {shown}; expected 'trove-payload:' "
                              "followed by 64 lowercase hex digits")
    return match.group(1)


def ref_for(data: bytes) -> str:
    """The ref ``put`` gives these bytes, computed without storing anything (for dry runs)."""
    return REF_PREFIX + hashlib.sha256(data).hexdigest()


def encode_text(text: str) -> bytes:
    """The payload bytes of a string: UTF-8, keeping lone surrogates so decoding is exact."""
    return text.encode("utf-8", "surrogatepass")


def decode_text(data: bytes) -> str:
    """Inverse of ``encode_text``."""
    return data.decode("utf-8", "surrogatepass")


def human_size(size: int) -> str:
    """A short decimal size for placeholders (``812 B``, ``48.2 KB``, ``5.0 MB``)."""
    if size < 1000:
        return f"{size} B"
    value, unit = size / 1000.0, "KB"
    for bigger in ("MB", "GB"):
        if value < 999.95:
            break
        value, unit = value / 1000.0, bigger
    return f"{value:.1f} {unit}"


class PayloadStore:
    """Content-addressed payload files: ``root/ab/cd/<sha256>`` plus a ``<sha256>.json`` sidecar."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def beside_database(cls, db_path: str | Path) -> "PayloadStore":
        """The store that belongs to a database: ``<folder of the db>/payloads``."""
        return cls(Path(db_path).expanduser().parent / PAYLOAD_DIR_NAME)

    def _data_path(self, sha: str) -> Path:
        path = self.root / sha[:2] / sha[2:4] / sha
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise PayloadRefError(f"payload {REF_PREFIX}{sha} resolves outside {self.root}")
        return path

    def path_of(self, ref: str) -> Path:
        """The file a valid ref names (for scripts and tests; never show it to the model)."""
        return self._data_path(parse_ref(ref))

    def put(self, data: bytes, *, kind: str, mime: str | None) -> PayloadRef:
        """Store ``data`` once, atomically; the same bytes always give the same ref.

        A complete existing file is not rewritten (its sidecar keeps the first
        kind and time). Raises ``OSError`` when the file cannot be written."""
        data = bytes(data)
        ref = ref_for(data)
        sha = ref[len(REF_PREFIX):]
        path = self._data_path(sha)
        created = not _has_size(path, len(data))
        if created:
            _atomic_write(path, data)
        sidecar = _sidecar_path(path)
        if created or not sidecar.exists():
            meta = {"sha256": sha, "kind": kind, "mime": mime, "size": len(data),
                    "created_at": time.time()}
            _atomic_write(sidecar, json.dumps(meta, sort_keys=True).encode("ascii"))
        return PayloadRef(ref, sha, kind, mime, len(data), created)

    def get(self, ref: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes ``[offset, offset+limit)`` of a payload, after checking the whole file's hash."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("offset and limit must not be negative")
        data = self._read_verified(ref)
        return data[offset:] if limit is None else data[offset:offset + limit]

    def get_text(self, ref: str) -> str:
        """The exact original string of a payload stored by ``guard_message``."""
        return decode_text(self._read_verified(ref))

    def _read_bytes(self, ref: str, sha: str) -> bytes:
        """The stored bytes of a payload, unchecked (``PayloadMissingError`` if absent)."""
        try:
            return self._data_path(sha).read_bytes()
        except FileNotFoundError:
            raise PayloadMissingError(f"payload {ref} is not in the payload store") from None

    def _read_verified(self, ref: str) -> bytes:
        sha = parse_ref(ref)
        data = self._read_bytes(ref, sha)
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            raise PayloadCorruptError(f"payload {ref} is corrupt: its bytes hash to "
                                      f"{actual[:16]}..., so it was altered after it was stored")
        return data

    def exists(self, ref: str) -> bool:
        """Whether the file of a (valid) ref is present; does not read or verify it."""
        return self._data_path(parse_ref(ref)).is_file()

    def describe(self, ref: str) -> dict:
        """Metadata of a payload (no content, no path): kind, mime, size, created_at."""
        path = self._data_path(parse_ref(ref))
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise PayloadMissingError(f"payload {ref} is not in the payload store") from None
        meta = _read_sidecar(path)
        return {"ref": ref, "kind": meta.get("kind", "unknown"), "mime": meta.get("mime"),
                "size": size, "size_text": human_size(size),
                "created_at": meta.get("created_at")}

    def delete(self, ref: str) -> bool:
        """Remove a payload and its sidecar (rollback, GC only); True if the file existed."""
        path = self._data_path(parse_ref(ref))
        existed = path.exists()
        path.unlink(missing_ok=True)
        _sidecar_path(path).unlink(missing_ok=True)
        if existed:
            _fsync_dir(path.parent)
        return existed

    def refs(self):
        """Every stored payload's ref (a migration copies them), in no set order."""
        if not self.root.is_dir():
            return
        for path in self.root.glob("??/??/*"):
            if _SHA_NAME.fullmatch(path.name) and path.is_file():
                yield REF_PREFIX + path.name

    def usage(self) -> dict:
        """Files and bytes in the payload folder (retention reports)."""
        files = [p for p in self.root.rglob("*") if p.is_file()] if self.root.is_dir() else []
        return {"path": str(self.root), "files": len(files),
                "bytes": sum(p.stat().st_size for p in files)}

    def sweep_temp_files(self, max_age_seconds: float = 3600.0) -> int:
        """Delete temp files a crash left mid-write (never read, as they have no final name)."""
        cutoff = time.time() - max_age_seconds
        removed = 0
        for path in self.root.rglob(TEMP_PREFIX + "*"):
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and path.stat().st_mtime <= cutoff:
                    path.unlink()
                    removed += 1
        return removed


def store_for(database_target: str, database_path: str | Path,
              database=None) -> PayloadStore:
    """The payload store of a database: a folder beside a SQLite file, the ``payloads``
    table on a PostgreSQL server (so every host that shares the server reads them).
    ``database``: the server connection to use (a migrate dry run's read-only one)
    instead of the shared one, which migrates the schema when it opens."""
    from .database import is_url
    if is_url(str(database_target)):
        from .postgres.payloads import ServerPayloadStore
        return ServerPayloadStore(str(database_target), database)
    return PayloadStore.beside_database(database_path)


def _sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _read_sidecar(path: Path) -> dict:
    try:
        meta = json.loads(_sidecar_path(path).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(folder: Path) -> None:
    """Create ``folder`` and its missing parents, fsyncing the entry of each new one."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        new.mkdir(mode=0o700, exist_ok=True)
        _fsync_dir(new.parent)


def _atomic_write(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename over ``path``, fsync the folder."""
    _ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name[:12]}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


# ---------------------------------------------------------------- placeholders
def inline_placeholder(kind: str, mime: str, size: int, ref: str) -> str:
    """The one-line placeholder of an externalized media payload."""
    return f"[trove externalized {kind} {mime} {human_size(size)}: {ref}]"


def tool_output_placeholder(text: str, ref: str, head: int = PREVIEW_HEAD,
                            tail: int = PREVIEW_TAIL) -> str:
    """An externalized tool output's placeholder: header, head, omission marker, tail.

    The header names the preview lengths, so ``restore_text`` can rebuild and
    check the exact block even if the defaults change later."""
    size = human_size(len(encode_text(text)))
    header = (f"[trove externalized {KIND_TOOL_OUTPUT} {TOOL_OUTPUT_MIME} {size}, "
              f"preview {head}+{tail} of {len(text)} chars: {ref}]")
    omitted = len(text) - head - tail
    marker = (f"[... {omitted} chars omitted; trove_expand with externalized_ref={ref} "
              "returns the exact output ...]")
    return f"{header}\n{text[:head]}\n{marker}\n{text[len(text) - tail:]}"


_IMAGE_LINE = re.compile(rf"^{re.escape(codec.IMAGE_MARKER)}(?: {_REF_RE.pattern})*[ \t]*$",
                         re.MULTILINE)


def without_placeholders(text: str) -> str:
    """``text`` without its payload placeholders, bare refs and image-part lines
    (``codec.flatten_content``): the words a message says, for a text model.

    Why: a placeholder is the same header and a 64-digit hash in every row that has
    one, so embedding it made every image-only turn look alike to the vector search
    (and put a hash among a message's words). Full text keeps finding a row by its
    ref; this is only for what is embedded."""
    text = _IMAGE_LINE.sub("", _HEADER_RE.sub("", text))
    return _REF_RE.sub("", text) if REF_PREFIX in text else text


def refs_in(text: str) -> list[str]:
    """Refs of every placeholder header in ``text``, first occurrence order, no duplicates."""
    return list(dict.fromkeys(m.group("ref") for m in _HEADER_RE.finditer(text)))


def restore_text(text: str, store: PayloadStore, *, strict: bool = True) -> str:
    """``text`` with every placeholder replaced by the exact original payload (for expansion).

    Only exact placeholders of that payload are restored (quoted or cut ones
    stay). Missing or corrupt payloads raise unless ``strict`` is False.
    """
    out, pos = [], 0
    for match in _HEADER_RE.finditer(text):
        if match.start() < pos:
            continue  # a header quoted inside a preview that was just restored
        try:
            original = store.get_text(match.group("ref"))
        except (PayloadMissingError, PayloadCorruptError):
            if strict:
                raise
            continue
        expected = _expected_placeholder(match, original)
        if expected is not None and text.startswith(expected, match.start()):
            out += [text[pos:match.start()], original]
            pos = match.start() + len(expected)
    out.append(text[pos:])
    return "".join(out)


def _expected_placeholder(match: re.Match, original: str) -> str | None:
    ref = match.group("ref")
    if match.group("head") is None:
        return inline_placeholder(match.group("kind"), match.group("mime"),
                                  len(encode_text(original)), ref)
    head, tail = int(match.group("head")), int(match.group("tail"))
    if match.group("kind") != KIND_TOOL_OUTPUT or head + tail >= len(original):
        return None
    return tool_output_placeholder(original, ref, head, tail)


# ---------------------------------------------------------------- the guard
def tool_output_over_threshold(text: str, threshold: int) -> bool:
    """Whether a tool output text is externalized at this threshold (chars)."""
    return len(text) > max(threshold, MIN_TOOL_OUTPUT_CHARS)


def tool_output_texts(message: dict, threshold: int) -> list[str]:
    """The texts ``guard_message`` would externalize as tool outputs (for the backfill)."""
    if message.get("role") != "tool":
        return []
    content = message.get("content")
    parts = content if isinstance(content, list) else [content]
    texts = []
    for part in parts:
        text = part.get("text") if isinstance(part, dict) else part
        if isinstance(text, str) and tool_output_over_threshold(text, threshold):
            texts.append(text)
    return texts


def guard_message(message: dict, store: PayloadStore, *,
                  large_threshold_chars: int | None) -> GuardResult:
    """A new message with big payloads moved into ``store`` (the input is never changed).

    Always: data URIs (>= ``MIN_DATA_URI_CHARS``) and plausible bare base64 runs,
    anywhere (string content, multimodal parts, tool-call argument JSON). With
    ``large_threshold_chars``: tool-result texts longer than it, with a preview.
    Host-internal keys are copied unchanged (they are never stored).
    """
    tool_limit = large_threshold_chars if message.get("role") == "tool" else None
    if tool_limit is None:
        candidate = _may_hold_media
    else:
        floor = min(MIN_DATA_URI_CHARS, tool_limit)
        candidate = lambda text: len(text) >= floor  # noqa: E731
    if not _may_hold_payload(message, candidate):
        return GuardResult(dict(message), (), ())  # the common case: nothing to move
    guard = _Guard(store)
    out = {}
    for key, value in message.items():
        if codec.is_host_internal(str(key)):
            out[key] = value
        elif key == "content" and tool_limit is not None:
            out[key] = guard.tool_content(value, tool_limit)
        else:
            out[key] = guard.walk(value)
    return GuardResult(out, tuple(dict.fromkeys(guard.refs)), tuple(guard.warnings))


def _may_hold_payload(value: Any, candidate: Callable[[str], bool]) -> bool:
    """Whether any string inside ``value`` passes ``candidate`` (could hold a payload):
    most messages have none and skip the rebuilding walk (it is on every ingest's path)."""
    if isinstance(value, str):
        return candidate(value)
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return False
    for item in value:  # plain loops: generators would cost more than the check
        if isinstance(item, str):
            if candidate(item):
                return True
        elif isinstance(item, (dict, list, tuple)) and _may_hold_payload(item, candidate):
            return True
    return False


def _may_hold_media(text: str) -> bool:
    """Whether ``_MEDIA_RE`` could replace anything in ``text``: a data URI needs the
    literal ``data:`` and ``MIN_DATA_URI_CHARS`` characters, a bare run
    ``MIN_BASE64_RUN`` base64 characters in a row; long prose and code have neither
    and skip the regex scan (0.4 ms for 12 KB)."""
    if len(text) < MIN_DATA_URI_CHARS:
        return False
    return "data:" in text or _has_base64_run(text)


def _has_base64_run(text: str) -> bool:
    """Whether ``text`` has ``MIN_BASE64_RUN`` characters of ``[A-Za-z0-9+/]`` in a row.

    Such a run covers a multiple of ``MIN_BASE64_RUN``, so only those positions are
    looked at: for each inside a run, where that run ends, then whether the
    ``MIN_BASE64_RUN`` characters before its end are all in the run."""
    for pos in range(0, len(text), MIN_BASE64_RUN):
        end = _RUN_CHARS.match(text, pos).end()
        if end > pos and end >= MIN_BASE64_RUN and (
                _RUN_CHARS.match(text, end - MIN_BASE64_RUN).end() >= end):
            return True
    return False


class _Guard:
    """One guard pass: walks values, stores payloads, collects refs and warnings."""

    def __init__(self, store: PayloadStore):
        self.store = store
        self.refs: list[str] = []
        self.warnings: list[str] = []

    def walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.media(value)
        if isinstance(value, dict):
            return {k: self.walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v) for v in value]
        return value

    def tool_content(self, value: Any, limit: int) -> Any:
        if isinstance(value, list):
            return [self.tool_part(part, limit) for part in value]
        return self.tool_part(value, limit)

    def tool_part(self, part: Any, limit: int) -> Any:
        if isinstance(part, str):
            return self.tool_text(part, limit)
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            return {k: self.tool_text(v, limit) if k == "text" else self.walk(v)
                    for k, v in part.items()}
        return self.walk(part)

    def tool_text(self, text: str, limit: int) -> str:
        if not tool_output_over_threshold(text, limit):
            return self.media(text)
        ref = self.save(encode_text(text), KIND_TOOL_OUTPUT, TOOL_OUTPUT_MIME)
        return self.media(text) if ref is None else tool_output_placeholder(text, ref)

    def media(self, text: str) -> str:
        if not _may_hold_media(text):
            return text
        return _MEDIA_RE.sub(self._replace_media, text)

    def _replace_media(self, match: re.Match) -> str:
        whole = match.group(0)
        if match.group("run") is not None:
            if not _plausible_base64(whole):
                return whole
            kind, mime = KIND_BASE64, _sniff_mime(whole)
        else:
            if len(whole) < MIN_DATA_URI_CHARS:
                return whole
            kind, mime = KIND_DATA_URI, match.group("mime").lower()
        data = encode_text(whole)
        ref = self.save(data, kind, mime)
        return whole if ref is None else inline_placeholder(kind, mime, len(data), ref)

    def save(self, data: bytes, kind: str, mime: str) -> str | None:
        try:
            ref = self.store.put(data, kind=kind, mime=mime).ref
        except (OSError, PayloadRefError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            self.warnings.append(f"could not externalize a {kind} payload of {len(data)} "
                                 f"bytes ({reason}); it stays inline")
            return None
        self.refs.append(ref)
        return ref


def _plausible_base64(run: str) -> bool:
    """Conservative test that a long ``[A-Za-z0-9+/]`` run is base64 data, not an identifier.

    Required: upper case, lower case and digits (hex hashes lack a case); a
    ``+`` or ``/`` (random base64 this long has them with near certainty, long
    alphanumeric tokens do not); a valid length (not 1 mod 4; padded: 0 mod 4)."""
    body = run.rstrip("=")
    if len(body) % 4 == 1 or (len(body) != len(run) and len(run) % 4):
        return False
    checks = (r"[A-Z]", r"[a-z]", r"[0-9]", r"[+/]")
    return all(re.search(check, body) for check in checks)


def _sniff_mime(run: str) -> str:
    """The media type of a bare base64 run, from its first decoded bytes."""
    start = base64.b64decode(run[:16])  # always valid: the run is pure base64 alphabet
    for magic, mime in _MAGIC:
        if start.startswith(magic):
            return mime
    if start[:4] == b"RIFF" and start[8:12] == b"WEBP":
        return "image/webp"
    return UNKNOWN_MIME
