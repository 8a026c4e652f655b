"""/undo and /retry in a repetitive session, through the real hermes-agent 0.19.0 host:
its own ``HermesCLI.undo_last`` / ``retry_last`` rewrite the history, the real
``AIAgent`` runs the turns against the fake model on 127.0.0.1."""

import sqlite3
import types

import pytest

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)

pytestmark = pytest.mark.host


def heartbeat(body: dict) -> hk.Reply:
    """The same long reply every turn (a heartbeat session), short summaries."""
    if not hk.is_main_request(body):
        return hk.Reply(text="- summary: heartbeat turns, nothing new.")
    return hk.Reply(text="HEARTBEAT_OK " + "all systems nominal. " * 220)


def cli_shell(history: list):
    """Just what ``HermesCLI.undo_last`` / ``retry_last`` touch besides the history
    (no session DB rewind, no agent surgery, no input buffer)."""
    from cli import HermesCLI
    return HermesCLI, types.SimpleNamespace(
        conversation_history=list(history), _session_db=None, session_id=None, agent=None,
        _undo_content_to_text=HermesCLI._undo_content_to_text,
        _prefill_input_buffer=lambda text: None)


def shown_twice(engine, history: list) -> None:
    """The host showing the same list again (a hook, a tool call) stores nothing."""
    engine.ingest(history)
    count = engine.store.count_messages(engine.canonical_id)
    engine.ingest(history)
    engine.ingest(history)
    assert engine.store.count_messages(engine.canonical_id) == count


def last_user_sent(server) -> str:
    """The newest user turn of the last main request (without the recall policy the
    plugin's ``pre_llm_call`` appends)."""
    text = [m for m in server.main_bodies[-1]["messages"] if m.get("role") == "user"][-1][
        "content"]
    return text.split("\n\n")[0]


def test_undo_and_retry_after_compaction_through_the_real_host(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"trove": {"fresh_tail_count": 6}})
    with hk.host_env(home) as env:
        fake_llm.responder = heartbeat
        _undo_and_retry(fake_llm, home)
    assert not env.blocked


def _undo_and_retry(server, home):
    agent = hk.make_agent(session_db=False)
    engine = hk.live_engine(agent)
    history = hk.run_turns(agent, ["continue"] * 30)[-1]["messages"]
    assert engine.compression_count >= 1
    cli, shell = cli_shell(history)
    cli.undo_last(shell, prefill=False)
    history = hk.run_turns(agent, ["something else: deploy to staging instead", "continue"],
                           history=shell.conversation_history)[-1]["messages"]
    assert last_user_sent(server) == "continue"
    shown_twice(engine, history)
    # The CLI's /compress of that history keeps the newest turns, in order.
    compressed = hk.manual_compress(agent, history)
    assert [m.get("content") for m in compressed[-4:]] == [
        m.get("content") for m in history[-4:]]
    history = hk.run_turns(agent, ["continue"], history=compressed)[-1]["messages"]
    cli, shell = cli_shell(history)
    again = cli.retry_last(shell)
    assert again == "continue"
    history = hk.run_turns(agent, [again], history=shell.conversation_history)[-1]["messages"]
    assert last_user_sent(server) == "continue"
    engine.ingest(history)
    engine.ingest(history)
    db = sqlite3.connect(home / "trove.db")
    rows = [r[0] for r in db.execute(
        "SELECT content FROM messages WHERE role = 'user' ORDER BY store_id")]
    # Every user turn the host ran is stored once, in order: the 30 (the undone one
    # stays stored), the two after the /undo, and the /retry's re-send, which the user
    # sent again: a row of its own (storage/identity, rule 2).
    assert rows == ["continue"] * 30 + ["something else: deploy to staging instead",
                                        "continue", "continue", "continue"]
    covered = [r[0] for r in db.execute(
        "SELECT child_store_id FROM node_edges WHERE child_store_id IS NOT NULL")]
    assert len(covered) == len(set(covered))
    db.close()
