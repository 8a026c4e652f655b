"""Shared helpers for engine-level tests: an offline engine and realistic transcripts."""

from __future__ import annotations

import json

from hermes_trove import config as trove_config
from hermes_trove.engine import TroveEngine

DEFAULT_OVERHEAD = 1_000


# Set by a test module's backend fixture: the engines it makes use this PostgreSQL
# schema instead of a SQLite file under tmp_path (see tests/pgkit.py).
DATABASE_URL: str | None = None


def make_engine(tmp_path, *, window=16_000, llm=None, session="sess", **settings) -> TroveEngine:
    """An engine on a fresh database under ``tmp_path``, deterministic summaries by default
    (``TROVE_MIN_TRIGGER_TOKENS=0`` unless given: the trigger is the share of ``window``)."""
    env = {"HERMES_HOME": str(tmp_path)}
    # Mechanics tests size their windows by the share alone; the floor has its own tests.
    settings.setdefault("min_trigger_tokens", 0)
    if DATABASE_URL:
        settings.setdefault("database_url", DATABASE_URL)
    env.update({f"TROVE_{k.upper()}": str(v) for k, v in settings.items()})
    engine = TroveEngine(trove_config.load_config(env))
    engine.use_llm(llm)
    engine.update_model("fake-model", window)
    if session is not None:
        engine.on_session_start(session, platform="cli")
    return engine


def coding_turn(t: int, *, filler: int = 40) -> list[dict]:
    """One coding-agent turn: a question, a tool call, its result, an answer."""
    return [
        {"role": "user", "content": f"turn {t}: check src/module_{t}.py " + "detail " * filler},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": f"call_{t}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{t}.py"})}}]},
        {"role": "tool", "tool_call_id": f"call_{t}", "name": "read_file",
         "content": f"def handler_{t}():\n    return {t}\n" * 10},
        {"role": "assistant", "content": f"Module {t} returns {t}; we decided to keep handler_{t}."},
    ]


def drive(engine: TroveEngine, turns: int, *, overhead: int = DEFAULT_OVERHEAD, start: int = 0,
          messages: list | None = None, filler: int = 40):
    """Run turns the way the host does: grow the list, compress when the engine asks.

    Returns (final message list, every original message in order, compress outputs).
    """
    messages = list(messages or [])
    originals: list[dict] = []
    outputs = []
    for t in range(start, start + turns):
        turn = coding_turn(t, filler=filler)
        originals.extend(turn)
        messages.extend(turn)
        current = host_tokens(messages, overhead)
        if engine.should_compress(current):
            messages = engine.compress(messages, current_tokens=current)
            outputs.append(list(messages))
    return messages, originals, outputs


def host_tokens(messages: list, overhead: int = DEFAULT_OVERHEAD) -> int:
    """What the host passes as ``current_tokens``: its own rough estimate of the
    messages (chars/4 of each dict, agent.model_metadata) plus its fixed overhead."""
    from hermes_trove.compaction.budget import host_estimator
    return overhead + host_estimator()(list(messages))

def operator_home(monkeypatch, home, session: str | None = None) -> None:
    """A test as an operator in ``home``: no TROVE_* settings inherited, HERMES_HOME set,
    ``HERMES_SESSION_ID`` set to ``session`` or removed."""
    import os
    for key in [k for k in os.environ if k.startswith("TROVE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HERMES_HOME", str(home))
    if session:
        monkeypatch.setenv("HERMES_SESSION_ID", session)
    else:
        monkeypatch.delenv("HERMES_SESSION_ID", raising=False)


def close_databases() -> None:
    """Close every shared connection (the next open reads the files afresh)."""
    from hermes_trove.storage import database
    for key in list(database._registry):
        database.forget_database(key)


def stored_chat(target, messages, session: str = "s"):
    """A fixture body: ``messages`` ingested into ``session`` of a private database at
    ``target`` (a path, or a server URL from tests/pgkit.py's ``backend``); yields
    ``(db, store, dag, store_ids)`` and closes the database after the test."""
    from hermes_trove.dag import Dag
    from hermes_trove.storage import database
    from hermes_trove.store import Store
    db = database.open_private(target)
    store, dag = Store(db), Dag(db)
    store.ensure_session(session)
    ids = store.ingest(session, messages).store_ids
    try:
        yield db, store, dag, ids
    finally:
        db.close()
