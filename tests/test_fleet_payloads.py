"""Externalized payloads on a shared PostgreSQL server: every host reads them.

A large tool output is stored once as a payload and its row keeps a placeholder.
On SQLite the payload is a file beside ``trove.db``; hosts that share a server share
rows, so a file on the host that wrote it would leave the other hosts unable to
expand or restore the output. On a server the payload is a row of its own
(``storage/postgres/payloads``), and ``scripts/trove.py migrate`` carries payloads
both ways with the rows.
"""

from __future__ import annotations

import json

import pytest

from hermes_trove import tools
from hermes_trove.operators import migrate
from hermes_trove.storage import database, payloads

from enginekit import make_engine
from pgkit import PgSchema, require_pg

SETTINGS = dict(window=200_000, large_output_externalization_enabled="true")


def big_log(marker: str) -> str:
    lines = "".join(f"line {i}: worker processed batch {i * 7} in {i % 97} ms\n"
                    for i in range(1500))
    return lines + f"FATAL: checksum mismatch in shard {marker}\n" + lines


def tool_turn(call_id: str, content: str) -> list[dict]:
    return [{"role": "user", "content": "run the nightly job"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "terminal", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "terminal", "content": content}]


def call(engine, name, **args):
    return json.loads(tools.dispatch(name, args, engine.tool_context()))


def externalized_ref(engine) -> str:
    row = next(r for r in engine.store.session_messages("sess") if r["role"] == "tool")
    refs = payloads.refs_in(row["content"])
    assert refs, "the tool output was not externalized"
    return refs[0]


@pytest.fixture
def server():
    require_pg()
    schema = PgSchema()
    try:
        yield schema.url
    finally:
        schema.drop()


def test_a_payload_one_host_stored_expands_on_another(tmp_path, server):
    writer = make_engine(tmp_path / "host-a", database_url=server, **SETTINGS)
    reader = make_engine(tmp_path / "host-b", database_url=server, **SETTINGS)
    log = big_log("kestrel-42")
    writer.ingest(tool_turn("job", log))
    ref = externalized_ref(writer)
    assert not list((tmp_path / "host-a").rglob("payloads")), "a payload file on one host"
    described = call(reader, "trove_describe", externalized_ref=ref)
    assert described["kind"] == "tool_output" and described["size"] == len(log.encode())
    pages, offset = [], 0
    while True:
        page = call(reader, "trove_expand", externalized_ref=ref, content_offset=offset)
        pages.append(page["content"])
        if not page["has_more"]:
            break
        offset = page["next_content_offset"]
    assert "".join(pages) == log
    found = call(reader, "trove_grep", query="checksum mismatch kestrel",
                 content_scope="externalized")
    assert found["results"][0]["externalized_ref"] == ref
    # the same bytes from the other host are the same payload, stored once
    assert reader.policy.payloads.put(log.encode(), kind="tool_output",
                                      mime="text/plain").created is False
    assert reader.policy.payloads.usage()["files"] == 1


def test_a_payload_altered_on_the_server_is_reported_not_returned(tmp_path, server):
    engine = make_engine(tmp_path, database_url=server, **SETTINGS)
    engine.ingest(tool_turn("job", big_log("osprey-7")))
    ref = externalized_ref(engine)
    with engine.store.db.transaction() as conn:
        conn.execute("UPDATE payloads SET data = ? WHERE sha256 = ?",
                     (b"tampered", payloads.parse_ref(ref)))
    with pytest.raises(payloads.PayloadCorruptError):
        engine.policy.payloads.get_text(ref)


def test_migrate_carries_payloads_both_ways(tmp_path, server):
    local = make_engine(tmp_path / "local", **SETTINGS)
    log = big_log("heron-3")
    local.ingest(tool_turn("job", log))
    ref = externalized_ref(local)
    source = str(local.config.resolved_database_path)
    dry = migrate.migrate(source, server, apply=False)
    assert dry["payloads"] == {"source": 1, "target_before": 0}
    report = migrate.migrate(source, server, apply=True)
    assert report["verified"] and report["payloads"]["copied"] == 1
    shared = make_engine(tmp_path / "shared", database_url=server, **SETTINGS)
    assert shared.policy.payloads.get_text(ref) == log
    assert migrate.migrate(source, server, apply=True)["payloads"]["copied"] == 0  # idempotent
    back = tmp_path / "back" / "trove.db"
    back.parent.mkdir()
    report = migrate.migrate(server, str(back), apply=True)
    assert report["verified"] and report["payloads"]["copied"] == 1
    database.forget_database(str(back))
    assert payloads.PayloadStore.beside_database(back).get_text(ref) == log
