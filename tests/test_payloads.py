"""payloads.py: content-addressed files, strict refs, the media/tool-output guard, exact restore."""
import base64
import copy
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_trove.storage import codec, payloads
from hermes_trove.storage.payloads import (
    PayloadCorruptError,
    PayloadMissingError,
    PayloadRefError,
    PayloadStore,
    guard_message,
    parse_ref,
    refs_in,
    restore_text,
)

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n" + random.Random(1).randbytes(6000)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_uri(data: bytes = PNG, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


@pytest.fixture
def store(tmp_path):
    return PayloadStore.beside_database(tmp_path / "trove.db")


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# ---------------------------------------------------------------- refs
def test_parse_ref_accepts_only_the_exact_shape():
    sha = "ab" * 32
    assert parse_ref(f"trove-payload:{sha}") == sha
    bad = ["../../etc/passwd", "/etc/passwd", "trove-payload:../x", f"trove-payload:{sha}\n",
           f"trove-payload:{sha.upper()}", f"trove-payload:{sha[:-1]}", f" trove-payload:{sha}",
           f"trove-payload:{sha}/../x", f"file:{sha}", sha, "", None, 42]
    for text in bad:
        with pytest.raises(PayloadRefError, match="not a trove payload ref"):
            parse_ref(text)


def test_refs_are_ids_and_never_paths(store):
    with pytest.raises(PayloadRefError):
        store.get("trove-payload:../../etc/passwd")
    with pytest.raises(PayloadRefError):
        store.exists("/etc/passwd")
    with pytest.raises(PayloadRefError):
        store.describe("trove-payload:" + "0" * 63 + "/")


def test_a_symlink_out_of_the_root_is_refused(tmp_path, store):
    ref = store.put(b"hello", kind="t", mime=None).ref
    outside = tmp_path / "outside"
    outside.mkdir()
    sha = parse_ref(ref)
    (store.root / sha[:2] / sha[2:4]).rename(outside / "cd")
    (store.root / sha[:2] / sha[2:4]).symlink_to(outside / "cd")
    with pytest.raises(PayloadRefError, match="outside"):
        store.get(ref)


# ---------------------------------------------------------------- the store
def test_put_get_describe_round_trip(store):
    ref = store.put(b"0123456789", kind="tool_output", mime="text/plain")
    assert ref.ref == "trove-payload:" + hashlib.sha256(b"0123456789").hexdigest()
    assert ref.created and ref.size == 10
    assert store.exists(ref.ref)
    assert store.get(ref.ref) == b"0123456789"
    assert store.get(ref.ref, offset=3, limit=4) == b"3456"
    assert store.get(ref.ref, offset=8) == b"89"
    meta = store.describe(ref.ref)
    assert meta["kind"] == "tool_output" and meta["mime"] == "text/plain"
    assert meta["size"] == 10 and meta["size_text"] == "10 B" and meta["created_at"] > 0
    assert str(store.root) not in json.dumps(meta)
    sha = ref.sha256
    assert store.path_of(ref.ref) == store.root / sha[:2] / sha[2:4] / sha
    with pytest.raises(ValueError):
        store.get(ref.ref, offset=-1)


def test_put_is_idempotent_and_does_not_rewrite(store):
    first = store.put(b"same bytes", kind="a", mime=None)
    path = store.path_of(first.ref)
    before = path.stat().st_mtime_ns, payloads._sidecar_path(path).stat().st_mtime_ns
    time.sleep(0.01)
    second = store.put(b"same bytes", kind="b", mime="x/y")
    assert second.ref == first.ref and not second.created
    assert (path.stat().st_mtime_ns, payloads._sidecar_path(path).stat().st_mtime_ns) == before
    assert store.describe(first.ref)["kind"] == "a"
    assert len(files_under(store.root)) == 2


def test_files_are_private(store):
    ref = store.put(b"secret-ish tool output", kind="t", mime=None)
    assert store.path_of(ref.ref).stat().st_mode & 0o077 == 0


def test_altered_file_is_detected(store):
    ref = store.put(b"original", kind="t", mime=None).ref
    store.path_of(ref).write_bytes(b"0riginal")
    with pytest.raises(PayloadCorruptError, match="corrupt"):
        store.get(ref)


def test_truncated_file_is_repaired_by_the_next_put(store):
    ref = store.put(b"complete payload", kind="t", mime=None).ref
    store.path_of(ref).write_bytes(b"comp")
    assert store.put(b"complete payload", kind="t", mime=None).created
    assert store.get(ref) == b"complete payload"


def test_missing_payload_and_delete(store):
    ref = store.put(b"x" * 20, kind="t", mime=None).ref
    assert store.delete(ref) is True
    assert not store.exists(ref) and store.delete(ref) is False
    with pytest.raises(PayloadMissingError):
        store.get(ref)
    with pytest.raises(PayloadMissingError):
        store.describe(ref)
    assert files_under(store.root) == []


def test_describe_survives_a_lost_sidecar(store):
    ref = store.put(b"abc", kind="t", mime=None).ref
    payloads._sidecar_path(store.path_of(ref)).unlink()
    assert store.describe(ref)["kind"] == "unknown"
    store.put(b"abc", kind="t", mime=None)  # a later put restores the sidecar
    assert store.describe(ref)["kind"] == "t"


def test_sweep_removes_only_old_temp_files(store):
    ref = store.put(b"kept", kind="t", mime=None).ref
    folder = store.path_of(ref).parent
    old, new = folder / ".tmp-old-1", folder / ".tmp-new-1"
    old.write_bytes(b"partial")
    new.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert store.sweep_temp_files(3600) == 1
    assert not old.exists() and new.exists() and store.exists(ref)
    assert PayloadStore(store.root / "nowhere").sweep_temp_files() == 0


@pytest.mark.parametrize("size,text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 KB"),
                                       (48_211, "48.2 KB"), (999_949, "999.9 KB"),
                                       (999_950, "1.0 MB"), (5_000_000, "5.0 MB"),
                                       (3 * 10**12, "3000.0 GB")])
def test_human_size(size, text):
    assert payloads.human_size(size) == text


# ---------------------------------------------------------------- crash safety
WRITER = """
import os, sys
sys.path.insert(0, {scripts!r})
import _bootstrap
_bootstrap.load_package()
from hermes_trove.storage.payloads import PayloadStore
store = PayloadStore({root!r})
print("ready", flush=True)
i = 0
while True:
    i += 1
    store.put(os.urandom(3_000_000 + i), kind="tool_output", mime="text/plain")
"""


def test_sigkill_mid_write_leaves_no_partial_file_under_a_final_name(tmp_path):
    root = tmp_path / "payloads"
    code = WRITER.format(scripts=str(ROOT / "scripts"), root=str(root))
    for delay in (0.4, 0.7, 1.0):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                cwd=tmp_path)
        try:
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    finals = 0
    for path in files_under(root):
        name = path.name
        if name.startswith(payloads.TEMP_PREFIX):
            continue  # a crash may leave a temp file; it never has a final name
        if name.endswith(".json"):
            meta = json.loads(path.read_text())
            assert path.with_name(meta["sha256"]).is_file()
            continue
        assert hashlib.sha256(path.read_bytes()).hexdigest() == name
        assert path.parent == root / name[:2] / name[2:4]
        finals += 1
    assert finals >= 1, "the writer never completed a payload; the test proved nothing"
    PayloadStore(root).sweep_temp_files(0)
    assert not any(p.name.startswith(payloads.TEMP_PREFIX) for p in files_under(root))


# ---------------------------------------------------------------- media guard
def guard(message, store, threshold=None):
    before = copy.deepcopy(message)
    result = guard_message(message, store, large_threshold_chars=threshold)
    assert message == before, "guard_message must not mutate its input"
    return result


def test_data_uri_in_string_content_is_externalized_and_restored(store):
    uri = data_uri()
    message = {"role": "user", "content": f"look at this: {uri} thanks"}
    result = guard(message, store)
    text = result.message["content"]
    assert uri not in text and len(text) < 200
    ref = result.refs[0]
    assert text == (f"look at this: [trove externalized data_uri image/png "
                    f"{payloads.human_size(len(uri))}: {ref}] thanks")
    assert refs_in(text) == [ref]
    assert store.describe(ref)["kind"] == "data_uri"
    assert restore_text(text, store) == message["content"]
    assert result.warnings == ()


def test_multimodal_parts_keep_their_structure(store):
    message = {"role": "user", "content": [
        {"type": "text", "text": "what is in the image?"},
        {"type": "image_url", "image_url": {"url": data_uri(), "detail": "high"}}]}
    result = guard(message, store)
    parts = result.message["content"]
    assert parts[0] == message["content"][0]
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["detail"] == "high"
    url = parts[1]["image_url"]["url"]
    assert url.startswith("[trove externalized data_uri image/png")
    assert restore_text(url, store) == message["content"][1]["image_url"]["url"]


def test_tool_call_arguments_stay_valid_json(store):
    args = json.dumps({"path": "/tmp/x.png", "image": data_uri(), "n": 3})
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "upload", "arguments": args}}]}
    result = guard(message, store)
    new_args = result.message["tool_calls"][0]["function"]["arguments"]
    parsed = json.loads(new_args)
    assert parsed["path"] == "/tmp/x.png" and parsed["n"] == 3
    assert parsed["image"].startswith("[trove externalized data_uri image/png")
    assert restore_text(new_args, store) == args


def test_bare_base64_runs_are_externalized_with_a_sniffed_type(store):
    run = b64(PNG)
    message = {"role": "tool", "tool_call_id": "c", "content": f'{{"png": "{run}"}}'}
    result = guard(message, store)
    assert "[trove externalized base64 image/png" in result.message["content"]
    assert restore_text(result.message["content"], store) == message["content"]
    other = b64(random.Random(2).randbytes(5000))
    assert "base64 application/octet-stream" in guard({"role": "user", "content": other},
                                                       store).message["content"]


@pytest.mark.parametrize("text", [
    "ab12" * 3000,                                          # long lower-case hex
    hashlib.sha256(b"x").hexdigest().upper() * 200,         # long upper-case hex
    "".join(random.Random(3).choices("ABCDEFabcdef0123456789", k=8000)),  # no + or /
    "a" * 10000,                                            # one repeated letter
    b64(random.Random(4).randbytes(4998)) + "A",            # impossible length (1 mod 4)
    "\n".join(b64(random.Random(5).randbytes(60000))[i:i + 76] for i in range(0, 80000, 76)),
    "data:image/png;base64," + b64(b"tiny image"),          # a short data URI
    "see data:text/plain,hello world " * 200,               # not base64
])
def test_things_that_are_not_big_media_stay_inline(store, text):
    result = guard({"role": "user", "content": text}, store)
    assert result.message["content"] == text and result.refs == ()
    assert files_under(store.root) == []


def test_guarding_is_deterministic_and_idempotent(tmp_path, store):
    message = {"role": "user", "content": [{"type": "text", "text": f"a {data_uri()} b"}]}
    first = guard(message, store).message
    other_store = PayloadStore(tmp_path / "elsewhere")
    assert guard(message, store).message == first == guard(message, other_store).message
    assert guard(first, store).message == first  # placeholders are not guarded again
    assert codec.identity_hash(first) == codec.identity_hash(guard(message, store).message)


def test_host_internal_keys_are_copied_unchanged(store):
    uri = data_uri()
    message = {"role": "user", "content": uri, "api_content": uri, "_db_persisted": True}
    result = guard(message, store).message
    assert result["api_content"] == uri and result["_db_persisted"] is True
    assert result["content"] != uri


def test_write_failure_keeps_the_original_inline(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    broken = PayloadStore(blocker / "payloads")
    message = {"role": "tool", "tool_call_id": "c", "content": "x" * 50000 + data_uri()}
    result = guard(message, broken, threshold=12000)
    assert result.message == message and result.refs == ()
    assert result.warnings and all("stays inline" in w for w in result.warnings)
    assert all("xxxx" not in w for w in result.warnings)


# ---------------------------------------------------------------- tool outputs
def tool_log(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines, total = [], 0
    while total < chars:
        line = f"{total:08d} INFO worker-{rng.randint(1, 9)} processed item {rng.random():.6f}"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:chars]


def test_large_tool_output_is_externalized_with_a_preview(store):
    log = tool_log(48000)
    message = {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": log}
    result = guard(message, store, threshold=12000)
    text = result.message["content"]
    ref = result.refs[0]
    assert text.startswith(f"[trove externalized tool_output text/plain 48.0 KB, "
                           f"preview 1000+500 of 48000 chars: {ref}]\n")
    assert log[:1000] in text and text.endswith(log[-500:])
    assert f"[... 46500 chars omitted; trove_expand with externalized_ref={ref}" in text
    assert len(text) < 2000
    assert store.get_text(ref) == log
    assert restore_text(text, store) == log
    assert result.message["name"] == "terminal" and result.message["tool_call_id"] == "c1"


def test_tool_output_threshold_is_opt_in_and_role_bound(store):
    log = tool_log(30000)
    tool = {"role": "tool", "tool_call_id": "c", "content": log}
    assert guard(tool, store, threshold=None).message == tool
    assert guard(tool, store, threshold=30000).message == tool  # not *over* the threshold
    user = {"role": "user", "content": log}
    assert guard(user, store, threshold=1000).message == user
    short = {"role": "tool", "tool_call_id": "c", "content": tool_log(2500)}
    assert guard(short, store, threshold=1000).message == short  # preview would be most of it


def test_multimodal_tool_output_keeps_its_parts(store):
    log = tool_log(20000)
    message = {"role": "tool", "tool_call_id": "c", "content": [
        {"type": "text", "text": "short header"}, {"type": "text", "text": log},
        {"type": "image_url", "image_url": {"url": data_uri()}}]}
    result = guard(message, store, threshold=12000)
    parts = result.message["content"]
    assert parts[0] == message["content"][0]
    assert parts[1]["type"] == "text" and parts[1]["text"].startswith(
        "[trove externalized tool_output")
    assert parts[2]["image_url"]["url"].startswith("[trove externalized data_uri")
    assert len(result.refs) == 2
    assert restore_text(parts[1]["text"], store) == log
    assert payloads.tool_output_texts(message, 12000) == [log]


def test_tool_output_with_lone_surrogates_round_trips(store):
    log = tool_log(20000) + "\ud800 broken utf-16"
    message = {"role": "tool", "tool_call_id": "c", "content": log}
    text = guard(message, store, threshold=12000).message["content"]
    assert restore_text(text, store) == log


# ---------------------------------------------------------------- restore
def test_restore_leaves_quotes_and_cut_previews_alone(store):
    log = tool_log(20000)
    block = guard({"role": "tool", "tool_call_id": "c", "content": log},
                  store, threshold=12000).message["content"]
    header = block.split("\n", 1)[0]
    assert restore_text(f"the model wrote {header} only", store) == f"the model wrote {header} only"
    cut = block[:-10]
    assert restore_text(cut, store) == cut
    assert restore_text(f"before\n{block}\nafter", store) == f"before\n{log}\nafter"


def test_restore_handles_a_tool_output_that_quotes_a_placeholder(store):
    inner = guard({"role": "user", "content": data_uri()}, store).message["content"]
    log = inner + "\n" + tool_log(20000)  # e.g. the output of `cat` on a stored row
    block = guard({"role": "tool", "tool_call_id": "c", "content": log},
                  store, threshold=12000).message["content"]
    assert restore_text(block, store) == log


def test_restore_of_missing_or_corrupt_payloads(store):
    text = guard({"role": "user", "content": f"x {data_uri()} y"}, store).message["content"]
    ref = refs_in(text)[0]
    store.path_of(ref).write_bytes(b"tampered")
    with pytest.raises(PayloadCorruptError):
        restore_text(text, store)
    assert restore_text(text, store, strict=False) == text
    store.delete(ref)
    with pytest.raises(PayloadMissingError):
        restore_text(text, store)
    assert restore_text(text, store, strict=False) == text


def test_refs_in_lists_each_ref_once():
    a, b = "trove-payload:" + "a" * 64, "trove-payload:" + "b" * 64
    text = (f"[trove externalized data_uri image/png 5.0 MB: {a}] and "
            f"[trove externalized base64 image/gif 12 B: {b}] again "
            f"[trove externalized data_uri image/png 5.0 MB: {a}] and a bare {b}")
    assert refs_in(text) == [a, b]
    assert refs_in("no placeholders here") == []


# ---------------------------------------------------------------- the guard's prefilter
_B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_ANY_RUN = __import__("re").compile(r"[A-Za-z0-9+/]{%d}" % payloads.MIN_BASE64_RUN)


def _runs_text(rng: random.Random) -> str:
    """Runs of base64 characters of lengths around MIN_BASE64_RUN, between separators."""
    pieces, total, size = [], 0, rng.choice([900, 4096, 4200, 8192, 12000, 20000])
    while total < size:
        length = rng.choice([1, 7, 300, 4094, 4095, 4096, 4097, 6000, 9000])
        pieces.append("".join(rng.choice(_B64_ALPHABET) for _ in range(64)) * (length // 64 + 1))
        pieces[-1] = pieces[-1][:length]
        pieces.append(rng.choice([" ", "=", "\n", "-", "_", "\u00e9", "data:"]))
        total += length + 1
    text = "".join(pieces)
    return text[rng.randrange(len(text)):] if rng.random() < 0.3 else text


def test_base64_run_check_agrees_with_the_regex():
    """``_has_base64_run`` (a few probes) answers exactly what a regex scan answers."""
    rng = random.Random(17)
    for _ in range(500):
        text = _runs_text(rng)
        assert payloads._has_base64_run(text) == bool(_ANY_RUN.search(text)), len(text)


def test_media_prefilter_never_skips_a_replacement(store):
    """Whatever the prefilter skips, the media regex would have left unchanged; texts it
    lets through are guarded exactly as before (data URIs, bare runs, long prose)."""
    rng = random.Random(5)
    samples = [_runs_text(rng) for _ in range(300)]
    samples += [tool_log(20000), "x" * 5000, "data:" + "A" * 2000, f"see {data_uri()} here",
                "word " * 3000, b64(PNG), "a" * 1023 + "data:", "\u00e9" * 5000]
    for text in samples:
        if not payloads._may_hold_media(text):
            assert payloads._MEDIA_RE.search(text) is None
        expected = payloads._MEDIA_RE.sub(payloads._Guard(store)._replace_media, text) \
            if len(text) >= payloads.MIN_DATA_URI_CHARS else text
        assert payloads._Guard(store).media(text) == expected
