"""scripts/backfill_externalized_tool_outputs.py, run as a subprocess on a small real database."""
import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_trove.storage import database, payloads
from hermes_trove.storage.payloads import PayloadStore, guard_message
from hermes_trove.store import Store

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SCRIPT = SCRIPTS / "backfill_externalized_tool_outputs.py"
SECRET = "TOP-SECRET-CONTENT-MARKER"


def log(chars: int, tag: str) -> str:
    line = f"{tag} {SECRET} building module ... ok\n"
    return (line * (chars // len(line) + 1))[:chars]


BIG_A = log(20000, "a")
BIG_B = log(15000, "b")
PART = log(13000, "part")


def build_db(path: Path) -> None:
    store = Store(database.get_database(path))
    store.ensure_session("s1", source="cli")
    store.ingest("s1", [
        {"role": "user", "content": log(30000, "user")},               # not a tool row
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "t", "content": BIG_A},
        {"role": "tool", "tool_call_id": "c2", "name": "t", "content": "small output"},
        {"role": "tool", "tool_call_id": "c3", "name": "t", "content": log(11000, "under")},
        {"role": "tool", "tool_call_id": "c4", "name": "t", "content": [
            {"type": "text", "text": "header"}, {"type": "text", "text": PART}]},
        {"role": "tool", "tool_call_id": "c5", "name": "t", "content": BIG_B},
        {"role": "tool", "tool_call_id": "c6", "name": "t", "content": BIG_A},  # same text again
    ])
    database.forget_database(path)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "trove.db"
    build_db(path)
    return path


def run(*args, check=True):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def run_json(*args):
    return json.loads(run(*args, "--json").stdout)


def db_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def payload_files(db: Path) -> list[Path]:
    root = db.parent / "payloads"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def expected_refs() -> set[str]:
    return {payloads.ref_for(t.encode()) for t in (BIG_A, BIG_B, PART)}


def test_dry_run_reports_and_writes_nothing(db):
    before = db_digest(db)
    report = run_json("--db", db)
    assert report["mode"] == "dry-run"
    assert report["candidates"] == 4 and report["would_create"] == 3
    assert {e["ref"] for e in report["entries"]} == expected_refs()
    assert all(set(e) == {"store_id", "ref", "size", "created"} for e in report["entries"])
    assert payload_files(db) == [] and db_digest(db) == before
    assert not list(db.parent.glob("backfill-manifest-*"))
    text = run("--db", db).stdout
    assert "dry run" in text and "would_create: 3" in text


def test_apply_creates_payloads_matching_the_guard_and_is_idempotent(db):
    before = db_digest(db)
    report = run_json("--db", db, "--apply")
    assert report["mode"] == "apply" and report["created"] == 3
    assert db_digest(db) == before, "the database must never be modified"
    store = PayloadStore.beside_database(db)
    for text in (BIG_A, BIG_B, PART):
        ref = payloads.ref_for(text.encode())
        assert store.get_text(ref) == text
        assert store.describe(ref)["kind"] == "tool_output"
        guarded = guard_message({"role": "tool", "tool_call_id": "x", "content": text},
                                store, large_threshold_chars=12000)
        assert guarded.refs == (ref,)  # the very file the ingest guard would use
    manifest = json.loads(Path(report["manifest"]).read_text())
    assert Path(report["manifest"]).parent == db.parent
    assert Path(report["manifest"]).name.startswith("backfill-manifest-")
    assert sum(e["created"] for e in manifest["entries"]) == 3
    assert SECRET not in Path(report["manifest"]).read_text()
    assert SECRET not in json.dumps(report)
    files = payload_files(db)

    again = run_json("--db", db, "--apply")
    assert again["created"] == 0 and again["candidates"] == 4
    assert again["manifest"] != report["manifest"]
    assert not any(e["created"] for e in json.loads(Path(again["manifest"]).read_text())["entries"])
    assert payload_files(db) == files


def test_threshold_option(db):
    assert run_json("--db", db, "--threshold", 10000)["candidates"] == 5
    assert run_json("--db", db, "--threshold", 16000)["candidates"] == 2
    assert run_json("--db", db, "--threshold", 10)["effective_threshold"] == \
        payloads.MIN_TOOL_OUTPUT_CHARS


def test_rollback_deletes_exactly_what_the_manifest_created(db, tmp_path):
    store = PayloadStore.beside_database(db)
    prior = store.put(BIG_B.encode(), kind="tool_output", mime="text/plain").ref  # pre-existing
    manifest = tmp_path / "m.json"
    report = run_json("--db", db, "--apply", "--manifest", manifest)
    assert report["created"] == 2
    dry = run_json("--db", db, "--rollback", manifest)
    assert dry["would_delete"] == 2 and len(payload_files(db)) == 6
    done = run_json("--db", db, "--rollback", manifest, "--apply")
    assert done["deleted"] == 2 and done["kept_referenced"] == []
    assert [p.name for p in payload_files(db)] == sorted(
        [payloads.parse_ref(prior), payloads.parse_ref(prior) + ".json"])
    assert run_json("--db", db, "--rollback", manifest, "--apply")["already_missing"] == 2


def test_rollback_keeps_files_a_row_refers_to(db, tmp_path):
    manifest = tmp_path / "m.json"
    run("--db", db, "--apply", "--manifest", manifest)
    store = PayloadStore.beside_database(db)
    guarded = guard_message({"role": "tool", "tool_call_id": "n", "content": BIG_A}, store,
                            large_threshold_chars=12000).message
    rows = Store(database.get_database(db))
    rows.ingest("s1", [guarded])
    database.forget_database(db)
    done = run_json("--db", db, "--rollback", manifest, "--apply")
    assert done["kept_referenced"] == [payloads.ref_for(BIG_A.encode())]
    assert done["deleted"] == 2 and store.exists(done["kept_referenced"][0])


@pytest.mark.parametrize("make_args,message", [
    (lambda db, tmp: ["--db", tmp / "missing.db"], "database not found"),
    (lambda db, tmp: ["--db", db, "--rollback", tmp / "nope.json"], "cannot read manifest"),
    (lambda db, tmp: ["--db", db, "--threshold", "0"], "--threshold"),
])
def test_errors_exit_2(db, tmp_path, make_args, message):
    proc = run(*make_args(db, tmp_path), check=False)
    assert proc.returncode == 2 and message in proc.stderr


def test_foreign_or_tampered_manifests_are_refused(db, tmp_path):
    manifest = tmp_path / "m.json"
    run("--db", db, "--apply", "--manifest", manifest)
    assert "already exists" in run("--db", db, "--apply", "--manifest", manifest,
                                   check=False).stderr
    data = json.loads(manifest.read_text())
    other = tmp_path / "other"
    other.mkdir()
    build_db(other / "trove.db")
    proc = run("--db", other / "trove.db", "--rollback", manifest, "--apply", check=False)
    assert proc.returncode == 2 and "pass the matching --db" in proc.stderr
    data["entries"][0]["ref"] = "trove-payload:../../etc/passwd"
    manifest.write_text(json.dumps(data))
    proc = run("--db", db, "--rollback", manifest, "--apply", check=False)
    assert proc.returncode == 2 and "not a trove payload ref" in proc.stderr
    assert len(payload_files(db)) == 6


def test_database_is_opened_read_only(db):
    import backfill_externalized_tool_outputs as backfill  # scripts/ is on sys.path (conftest)
    conn = backfill.open_readonly(db)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM messages")
    finally:
        conn.close()
