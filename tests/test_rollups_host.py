"""Temporal memory inside the real hermes-agent 0.19.0 host, on a fake clock across two days.

Day one (Monday 2026-03-16): a session decides something. Day two: a NEW session
(a new agent, as a daily gateway or CLI run would start) asks "what did we decide
yesterday?"; the model calls trove_recent with session_scope="all" and gets day
one's material. At the end of day two's session the engine's background pass
rolls Monday up (a finished day), and the same question is then answered from the
day rollup, whose lineage reaches the exact raw turn.

The clock is faked only inside the plugin (the store's stamp and the engine's
``clock``), never for the host; the fake model runs on 127.0.0.1.
"""
import importlib
import json
import sqlite3
import sys
import time
from datetime import datetime, timezone

import pytest

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)

pytestmark = pytest.mark.host

DAY_ONE = datetime(2026, 3, 16, 10, tzinfo=timezone.utc).timestamp()
DAY_TWO = datetime(2026, 3, 17, 11, tzinfo=timezone.utc).timestamp()
DECISION = "We decided to deploy with the kiwi-blue strategy on Fridays."


class FakeClock:
    """Stands in for the ``time`` module inside the plugin's store (``time.time`` only)."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now


def responder(body):
    """Summaries get a short summary; the main model asks trove_recent when asked
    about yesterday and then repeats what the tool returned."""
    if not hk.is_main_request(body):
        text = json.dumps(body.get("messages", []))
        return hk.Reply(text="- rollup: kiwi-blue chosen." if "kiwi-blue" in text
                        else "- summary: earlier talk.")
    last = body["messages"][-1]
    if last.get("role") == "tool":
        result = json.loads(last["content"])
        return hk.Reply(text="From memory (" + ",".join(result.get("used", [])) + "): "
                        + json.dumps(result.get("items", []))[:2000])
    text = last.get("content") if isinstance(last.get("content"), str) else json.dumps(last)
    if "yesterday" in text:
        return hk.ToolCall("trove_recent", {"period": "yesterday", "session_scope": "all"})
    return hk.Reply(text="Noted.")


def rollup_home(tmp_path, fake_llm):
    """A HERMES_HOME with rollups on."""
    return hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"trove": {"rollups_enabled": True}})


def store_clock(monkeypatch, now):
    """Fake the plugin store's clock (the rows' stamp) inside a running host_env."""
    clock = FakeClock(now)
    package = hk.plugin_module("hermes-trove")
    monkeypatch.setattr(sys.modules[package.__name__ + ".store"], "time", clock)
    return clock, package


def wait_for_rollup(db_path, key, seconds=60.0):
    """Poll until the background pass wrote the day rollup (a correctness wait, not a
    timing assertion: the pass runs on its own thread)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        db = sqlite3.connect(db_path)
        try:
            row = db.execute("SELECT rollup_id FROM rollups WHERE kind = 'day' AND period_key = ?",
                             (key,)).fetchone()
        finally:
            db.close()
        if row:
            return row[0]
        time.sleep(0.1)
    raise AssertionError(f"no rollup for {key} after {seconds}s")


def test_a_new_session_recalls_yesterday_and_rolls_it_up(tmp_path, fake_llm, monkeypatch):
    home = rollup_home(tmp_path, fake_llm)
    with hk.host_env(home) as env:
        fake_llm.responder = responder
        clock, package = store_clock(monkeypatch, DAY_ONE)

        monday = hk.make_agent()
        engine_one = hk.live_engine(monday)
        engine_one.clock = clock.time
        day_one = hk.run_turns(monday, [DECISION, "Thanks, that is all for today."])
        hk.end_session(monday, day_one[-1]["messages"])
        first_session = engine_one.canonical_id

        clock.now = DAY_TWO
        tuesday = hk.make_agent()
        engine_two = hk.live_engine(tuesday)
        engine_two.clock = clock.time
        asked = hk.run_turns(tuesday, ["Good morning. What did we decide yesterday?"])[0]
        assert engine_two.canonical_id != first_session
        tool = [m for m in asked["messages"] if m.get("role") == "tool"][-1]
        result = json.loads(tool["content"])
        assert result["period"] == "yesterday" and result["from"] == "2026-03-16T00:00:00Z"
        assert "kiwi-blue" in tool["content"] and "Good morning" not in tool["content"]
        assert {i.get("session_id") for i in result["items"]} == {first_session}
        assert "kiwi-blue" in asked["final_response"]

        hk.end_session(tuesday, asked["messages"])          # starts the background pass
        rollup_id = wait_for_rollup(home / "trove.db", "2026-03-16")
        again = hk.run_turns(tuesday, ["And yesterday, once more?"],
                             history=asked["messages"])[0]
        tool = [m for m in again["messages"] if m.get("role") == "tool"][-1]
        result = json.loads(tool["content"])
        assert result["used"] == ["rollups"] and result["items"][0]["rollup_id"] == rollup_id
        assert "From memory (rollups)" in again["final_response"]

        # the rollup's lineage reaches the exact raw turn of day one
        timeline = importlib.import_module(package.__name__ + ".storage.timeline")
        from_lineage = engine_two.store.get_messages(
            timeline.Timeline(engine_two.store.db).descendant_store_ids(rollup_id))
        texts = [row["content"] for row in from_lineage.values()]
        assert DECISION in texts and all("Good morning" not in (t or "") for t in texts)
    assert not env.blocked


def test_every_session_end_leads_to_a_pass_that_sees_it(tmp_path, fake_llm, monkeypatch):
    """Issue 25: three sessions end one after another (eight days ago, yesterday
    morning, yesterday evening) while the pass the first one started is still
    summarizing. The later ends mark the database dirty, the running pass goes again,
    and every day gets its rollup without any later compaction."""
    import threading

    now = datetime(2026, 3, 18, 10, tzinfo=timezone.utc).timestamp()
    days = {"2026-03-10": (datetime(2026, 3, 10, 9, tzinfo=timezone.utc).timestamp(),
                           "Eight days ago we chose the apricot vendor."),
            "2026-03-17": (datetime(2026, 3, 17, 8, tzinfo=timezone.utc).timestamp(),
                           "Yesterday morning: the blueberry budget is approved.")}
    evening = (datetime(2026, 3, 17, 20, tzinfo=timezone.utc).timestamp(),
               "Yesterday evening: the cherry launch moves to May.")
    home = rollup_home(tmp_path, fake_llm)
    release, summarizing = threading.Event(), threading.Event()

    def responder(body):
        if not hk.is_main_request(body):
            if "You are compressing" in json.dumps(body) and not release.is_set():
                summarizing.set()
                release.wait(45)          # the first pass stays busy until all ends are in
            return hk.Reply(text="- rollup of the day's decisions.")
        return hk.Reply(text="Noted.")

    with hk.host_env(home) as env:
        fake_llm.responder = responder
        clock, _ = store_clock(monkeypatch, now)
        for index, (when, text) in enumerate([*days.values(), evening]):
            clock.now = when                       # the rows' own time
            agent = hk.make_agent()
            engine = hk.live_engine(agent)
            engine.clock = lambda: now             # every pass runs "today"
            result = hk.run_turns(agent, [text])[-1]
            hk.end_session(agent, result["messages"])
            if index == 0:
                assert summarizing.wait(30), "the first pass never started summarizing"
        release.set()
        first = wait_for_rollup(home / "trove.db", "2026-03-10", seconds=30)
        second = wait_for_rollup(home / "trove.db", "2026-03-17", seconds=30)
    db = sqlite3.connect(home / "trove.db")
    try:
        def texts_under(rollup_id):
            return [r[0] for r in db.execute(
                "SELECT m.content FROM rollup_sources s JOIN messages m"
                " ON m.store_id = s.child_store_id WHERE s.rollup_id = ?", (rollup_id,))]
        assert days["2026-03-10"][1] in texts_under(first)
        yesterday = texts_under(second)
        assert days["2026-03-17"][1] in yesterday and evening[1] in yesterday
    finally:
        db.close()
    assert not env.blocked


def test_gateway_users_get_rollups_of_their_own_sessions_only(tmp_path, fake_llm, monkeypatch):
    """Issue 25: two people chat with one gateway on the same day. The background pass
    builds one day rollup per person (no summary prompt holds both people's words);
    the next day each person's "what did we do yesterday?" reads only their own."""
    from test_host_sessions import gateway_agent, gateway_turn

    words = {"111": "Alice's locker code is 2931.", "222": "Bob's bike lock is 8642."}
    prompts = []

    def responder(body):
        if not hk.is_main_request(body):
            prompts.append(json.dumps(body))
            return hk.Reply(text="- rollup: " + ("2931" if "2931" in prompts[-1] else "")
                            + ("8642" if "8642" in prompts[-1] else ""))
        last = body["messages"][-1]
        if last.get("role") == "tool":
            return hk.Reply(text="Memory: " + last["content"][:3000])
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        if "yesterday" in text:
            return hk.ToolCall("trove_recent", {"period": "yesterday", "session_scope": "all"})
        return hk.Reply(text="Noted.")

    home = rollup_home(tmp_path, fake_llm)
    with hk.host_env(home) as env:
        fake_llm.responder = responder
        clock, package = store_clock(monkeypatch, DAY_ONE)
        agents = {}
        for user, text in words.items():
            agents[user] = agent = gateway_agent(user)
            hk.live_engine(agent).clock = clock.time
            history = gateway_turn(agent, user, text, None)
            agents[user] = (agent, history)
        clock.now = DAY_TWO
        for user, (agent, history) in agents.items():
            hk.end_session(agent, history)
        wait_for_rollup(home / "trove.db", "2026-03-16")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            db = sqlite3.connect(home / "trove.db")
            owners = {r[0] for r in db.execute("SELECT owner FROM rollups WHERE kind = 'day'")}
            db.close()
            if len(owners) == 2:
                break
            time.sleep(0.1)
        assert len(owners) == 2, owners
        assert not any("2931" in p and "8642" in p for p in prompts)
        for user, other in (("111", "222"), ("222", "111")):
            agent, history = agents[user]
            answer = gateway_turn(agent, user, "What did we do yesterday?", history)
            tool = [m for m in answer if m.get("role") == "tool"][-1]
            result = json.loads(tool["content"])
            assert result["used"] == ["rollups"], result
            assert words[user].split()[-1].rstrip(".") in tool["content"]
            assert words[other].split()[-1].rstrip(".") not in tool["content"]
    assert not env.blocked
