"""Temporal memory across sessions: natural periods in trove_recent, day/week/month
rollups with exact lineage and staleness (issue #18).

Five sessions on a frozen clock (UTC, now = Thursday 2026-03-19 15:00): one in
the previous ISO week (Thursday 12th), three on Monday, Tuesday and Wednesday
of this week, and the current one today. Every message carries its own
timestamp and is stored later (``now=STORED_AT``), so the tools must use the
message's time, not the wall clock of storage.
"""
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_trove import tools
from hermes_trove.compaction import rollups, tokens
from hermes_trove.compaction.summarize import CircuitBreaker, Summarizer
from hermes_trove.config import load_config
from hermes_trove.dag import Dag, NewNode
from hermes_trove.ingest.policy import policy_for
from hermes_trove.storage import database
from hermes_trove.storage.database import Database
from hermes_trove.storage.owners import Owners
from hermes_trove.storage.timeline import Timeline
from hermes_trove.store import Store

COUNTER = tokens.get_counter()
OWNER = "telegram:user:7"


def at(day, hour=10, minute=0, month=3) -> float:
    return datetime(2026, month, day, hour, minute, tzinfo=timezone.utc).timestamp()


NOW = at(19, 15)
STORED_AT = at(19, 14, 59)     # every row is written "late": only message times may count

SESSIONS = {   # session -> (day, words only that session says)
    "prev": (12, "lighthouse migration plan"),
    "mon": (16, "kiwi deployment decided"),
    "tue": (17, "mango cache chosen"),
    "wed": (18, "papaya rollback agreed"),
    "thu": (19, "quince question today"),
}


class World:
    """A database with the five sessions; ``ctx`` is a tool context of one of them."""

    def __init__(self, tmp_path: Path, target: str | None = None, **env):
        environ = {"TROVE_ROLLUPS_ENABLED": "1", **{f"TROVE_{k.upper()}": str(v)
                                                   for k, v in env.items()}}
        if target and target.startswith("postgresql://"):   # operators open what config names
            environ["TROVE_DATABASE_URL"] = target
        self.target = target or str(tmp_path / "trove.db")
        self.config = load_config(environ=environ, hermes_home=tmp_path)
        self.db = database.get_database(target or str(tmp_path / "trove.db"))
        self.store, self.dag, self.timeline = Store(self.db), Dag(self.db), Timeline(self.db)
        self.tmp = tmp_path
        self.now = NOW
        self.ids: dict[str, list[int]] = {}
        for session, (day, words) in SESSIONS.items():
            self.store.ensure_session(session, source="telegram")
            Owners(self.db).record(session, OWNER, platform="telegram")   # one person's
            self.ids[session] = self.say(session, day, words)
        # Tuesday's and last week's turns are summarized into leaves; the others stay raw
        self.leaves = {s: self.leaf(s, f"Summary: {SESSIONS[s][1]} (leaf)")
                       for s in ("prev", "tue")}

    def say(self, session, day, words, hour=10, month=3, source="telegram"):
        messages = [{"role": "user", "content": f"On day {day}: {words}?",
                     "timestamp": at(day, hour, 0, month)},
                    {"role": "assistant", "content": f"Yes: {words}.",
                     "timestamp": at(day, hour, 1, month)}]
        return self.store.ingest(session, messages, now=STORED_AT, source=source).store_ids

    def leaf(self, session, text):
        return self.dag.add_node(NewNode(session_id=session, depth=0, text=text,
                                         token_count=COUNTER.count_text(text),
                                         source_token_count=100, level=3, model="deterministic",
                                         child_store_ids=self.ids[session]))

    def ctx(self, session="thu") -> tools.ToolContext:
        return tools.ToolContext(
            store=self.store, dag=self.dag, config=self.config,
            count_tokens=COUNTER.count_text, session_id=session, conversation_id=None,
            current_turn_store_id=None, status=lambda: {}, llm_call=None, data_dir=self.tmp,
            now=lambda: self.now)

    def build(self, llm_call=None, **overrides):
        llm_call = llm_call or digest_llm
        summarizer = Summarizer(llm_call=llm_call, count_tokens=COUNTER.count_text, models=[None],
                                breaker=CircuitBreaker(2, 60), timeout_s=1.0)
        settings = rollups.settings_of(self.config)
        if overrides:
            settings = rollups.Settings(**{**settings.__dict__, **overrides})
        return rollups.build_pass(self.store, self.dag, self.timeline, summarizer,
                                  COUNTER.count_text, settings,
                                  policy_for(self.config).feeds_rollups, self.now)

    def status(self):
        return {(r["kind"], r["key"]): r["state"] for r in rollups.status(
            self.timeline, rollups.settings_of(self.config),
            policy_for(self.config).feeds_rollups, self.now)}


def digest_llm(prompt, model, timeout):
    """A stand-in model that keeps exactly the sessions' key words it was shown, so a
    rollup's text proves which material reached it."""
    data = prompt          # the instructions around the data hold none of these words
    keys = [w for _, words in SESSIONS.values() for w in words.split()[:1]]
    found = [w for w in keys + ["zucchini", "durian", "feijoa"] if w in data]
    return "Digest: " + (", ".join(found) or "nothing notable")


def call(ctx, name, **args) -> dict:
    text = tools.dispatch(name, args, ctx)
    assert COUNTER.count_text(text) <= ctx.config.tool_response_max_tokens
    return json.loads(text)


def words_in(answer: dict) -> set[str]:
    """Which sessions' words an answer shows."""
    text = json.dumps(answer)
    return {s for s, (_, words) in SESSIONS.items() if words.split()[0] in text}


@pytest.fixture
def world(tmp_path, backend):
    """The five sessions, once on SQLite and once on PostgreSQL (tests/pgkit.py)."""
    return World(tmp_path, backend[1])     # forgotten with the backend (tests/pgkit.py)


# ---------------------------------------------------------------- periods, no rollups yet
def test_periods_return_the_right_sessions_and_nothing_else(world):
    ctx = world.ctx()
    yesterday = call(ctx, "trove_recent", period="yesterday", session_scope="all")
    assert words_in(yesterday) == {"wed"} and yesterday["used"] == ["messages"]
    last_week = call(ctx, "trove_recent", period="last week", session_scope="all")
    assert words_in(last_week) == {"prev"} and last_week["used"] == ["summaries"]
    this_week = call(ctx, "trove_recent", period="this week", session_scope="all")
    assert words_in(this_week) == {"mon", "tue", "wed", "thu"}
    assert this_week["used"] == ["summaries", "messages"]
    times = [i.get("time") or i.get("time_to") for i in this_week["items"]]
    assert times == sorted(times, reverse=True)          # newest first
    assert words_in(call(ctx, "trove_recent", period="monday", session_scope="all")) == {"mon"}
    assert words_in(call(ctx, "trove_recent", period="2026-W11", session_scope="all")) == {"prev"}


def test_default_scope_is_this_session_only(world):
    assert words_in(call(world.ctx(), "trove_recent", period="this week")) == {"thu"}
    empty = call(world.ctx(), "trove_recent", period="yesterday")
    assert empty["items"] == [] and "session_scope" in empty["note"]


def test_recent_pages_with_offset(world):
    ctx = world.ctx()
    first = call(ctx, "trove_recent", period="this week", session_scope="all", limit=2)
    assert first["has_more"] and first["next_offset"] == 2 and first["total"] == 7
    rest = call(ctx, "trove_recent", period="this week", session_scope="all", limit=50, offset=2)
    assert not rest["has_more"] and len(rest["items"]) == 5
    assert words_in(first) | words_in(rest) == {"mon", "tue", "wed", "thu"}


@pytest.mark.parametrize("period", ["someday", "last 999999999999 days", "99999-01-01",
                                    "2026-03-15..2026-03-01", "x" * 300])
def test_bad_periods_are_clear_errors(world, period):
    out = call(world.ctx(), "trove_recent", period=period)
    assert out["error"].startswith("period:") and "OSError" not in out["error"]


def test_grep_and_recall_take_natural_periods(world):
    ctx = world.ctx()
    hits = call(ctx, "trove_grep", query="decided agreed chosen plan", session_scope="all",
                period="last week")["results"]
    assert {h["session_id"] for h in hits} == {"prev"}
    hits = call(ctx, "trove_recall", query="kiwi papaya lighthouse", time_from="monday",
                time_to="yesterday")["results"]
    assert {h["session_id"] for h in hits} == {"mon", "wed"}
    hits = call(ctx, "trove_recall", query="papaya", period="last friday")["results"]
    assert hits == []


def test_time_zone_moves_the_day(tmp_path):
    # Tokyo is UTC+9: now (15:00 UTC on the 19th) is already the 20th there, and
    # 23:00 UTC on the 18th belongs to Tokyo's 19th with Thursday's turn, not Wednesday's
    world = World(tmp_path, timezone="Asia/Tokyo")
    world.say("wed", 18, "plum late night", hour=23)
    out = call(world.ctx(), "trove_recent", period="yesterday", session_scope="all")
    assert out["time_zone"] == "Asia/Tokyo" and out["from"] == "2026-03-18T15:00:00Z"
    assert "plum" in json.dumps(out) and words_in(out) == {"thu"}
    world.db.close()


# ---------------------------------------------------------------- rollups
def test_rollups_build_finished_periods_and_are_preferred(world):
    before = world.status()
    assert before[("day", "2026-03-12")] == "pending" and before[("day", "2026-03-19")] == "open"
    report = world.build()
    assert not report.errors
    built = {(b["kind"], b["key"]) for b in report.built}
    assert built == {("day", "2026-03-12"), ("day", "2026-03-16"), ("day", "2026-03-17"),
                     ("day", "2026-03-18"), ("week", "2026-W11")}
    after = world.status()
    assert after[("week", "2026-W12")] == "open" and after[("month", "2026-03")] == "open"
    assert all(after[key] == "ready" for key in built)

    ctx = world.ctx()
    last_week = call(ctx, "trove_recent", period="last week", session_scope="all")
    assert last_week["used"] == ["rollups"] and words_in(last_week) == {"prev"}
    assert [(i["kind"], i["period"], i["key"]) for i in last_week["items"]] == [
        ("rollup", "week", "2026-W11")]
    yesterday = call(ctx, "trove_recent", period="yesterday", session_scope="all")
    assert yesterday["used"] == ["rollups"] and words_in(yesterday) == {"wed"}
    # this week: three day rollups, then today's raw turn; nothing of last week
    this_week = call(ctx, "trove_recent", period="this week", session_scope="all")
    assert this_week["used"] == ["rollups", "messages"]
    assert words_in(this_week) == {"mon", "tue", "wed", "thu"}
    assert [i["key"] for i in this_week["items"] if i["kind"] == "rollup"] == [
        "2026-03-18", "2026-03-17", "2026-03-16"]
    # a rollup of this session alone is this session's to read
    mine = call(world.ctx("wed"), "trove_recent", period="this week")
    assert mine["used"] == ["rollups"] and words_in(mine) == {"wed"}


def test_a_rollup_spanning_other_sessions_stays_out_of_the_default_scope(world):
    world.say("tue", 18, "mango follow-up", hour=12)
    world.build()
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert world.timeline.sessions_of(day["rollup_id"]) == ["tue", "wed"]
    mine = call(world.ctx("wed"), "trove_recent", period="yesterday")
    assert mine["used"] == ["messages"] and words_in(mine) == {"wed"}
    everyone = call(world.ctx("wed"), "trove_recent", period="yesterday", session_scope="all")
    assert everyone["used"] == ["rollups"] and words_in(everyone) == {"tue", "wed"}


def test_rollup_text_comes_from_the_escalating_summarizer(world):
    prompts = []

    def llm(prompt, model, timeout):
        prompts.append(prompt)
        return "LLM rollup: the team settled things."

    world.build(llm_call=llm)
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert day["level"] == 1 and "LLM rollup" in day["text"]
    assert any("papaya rollback agreed" in p for p in prompts)
    assert world.timeline.get_rollup("day", "2026-03-16", "UTC", OWNER)["model"] == "default"


def test_without_a_model_rollups_fall_back_to_the_deterministic_digest(world):
    def down(prompt, model, timeout):
        raise TimeoutError("provider down")

    world.build(llm_call=down)
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert day["level"] == 3 and day["model"] == "deterministic"
    assert world.timeline.descendant_store_ids(day["rollup_id"]) == world.ids["wed"]


def test_a_late_message_makes_its_day_and_week_stale_and_the_rebuild_includes_it(world):
    world.build()
    day = world.timeline.get_rollup("day", "2026-03-12", "UTC", OWNER)
    week = world.timeline.get_rollup("week", "2026-W11", "UTC", OWNER)
    late = world.say("prev", 12, "zucchini late addendum", hour=21)
    status = world.status()
    assert status[("day", "2026-03-12")] == "stale" and status[("week", "2026-W11")] == "stale"
    stale = call(world.ctx(), "trove_recent", period="last week", session_scope="all")
    assert stale["stale_rollups_skipped"] >= 1 and "rollups" not in stale["used"]
    assert "zucchini" in json.dumps(stale)                  # the fallback shows it at once

    report = world.build()
    assert {(b["kind"], b["key"]) for b in report.built} == {("day", "2026-03-12"),
                                                             ("week", "2026-W11")}
    rebuilt = world.timeline.get_rollup("day", "2026-03-12", "UTC", OWNER)
    assert rebuilt["rollup_id"] == day["rollup_id"] and rebuilt["built_at"] == NOW
    assert set(late) <= set(world.timeline.descendant_store_ids(week["rollup_id"]))
    assert "zucchini" in rebuilt["text"]
    assert world.status()[("week", "2026-W11")] == "ready"
    fresh = call(world.ctx(), "trove_recent", period="last week", session_scope="all")
    assert fresh["used"] == ["rollups"] and "zucchini" in json.dumps(fresh)


@pytest.mark.parametrize("stamp", [0, "0", "1970-01-01T00:00:00Z", at(19, 14, 59) + 400 * 86400,
                                   int((at(19, 14, 59) + 3 * 3600) * 1000),
                                   # a clock never set (a device booting at the epoch,
                                   # a counter read as seconds): 1970, not "zero"
                                   15_000_000, "1970-06-23T10:00:00Z", 1, 86_400_000,
                                   "1999-12-31T23:59:59Z"])
def test_a_message_time_of_zero_or_after_its_storage_is_no_time(world, stamp):
    """A message cannot have been written at the epoch's zero (an unset field) nor
    after trove stored it (a clock far ahead, a misread zone). Such a time used to
    be kept: the message fell outside every day, so no rollup and no trove_recent
    period ever showed it. The storage time stands in, as for a message without one."""
    stored = at(18, 12)
    [odd] = world.store.ingest("wed", [{"role": "user", "content": "durian odd clock",
                                        "timestamp": stamp}], now=stored).store_ids
    assert world.store.get_messages([odd])[odd]["message_at"] is None
    shown = call(world.ctx(), "trove_recent", period="yesterday", session_scope="all")
    assert "durian" in json.dumps(shown)
    world.build()
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert odd in world.timeline.descendant_store_ids(day["rollup_id"])
    [kept] = world.store.ingest("wed", [{"role": "user", "content": "feijoa small skew",
                                         "timestamp": stored + 600}], now=stored).store_ids
    assert world.store.get_messages([kept])[kept]["message_at"] == stored + 600


def test_a_clock_reset_never_builds_a_1970_rollup(tmp_path):
    """With a lookback reaching back to the epoch, a message stamped in June 1970 (a
    clock never set) built day, week and month rollups of 1970 and sat in no rollup
    of the day it was stored; it now counts on that day, and no period before the
    first possible message time is ever built."""
    world = World(tmp_path, rollups_lookback_days=36600)
    [odd] = world.store.ingest("wed", [{"role": "user", "content": "durian clock reset",
                                        "timestamp": 15_000_000}], now=at(18, 12)).store_ids
    report = world.build(max_builds=500)
    assert not report.errors
    assert all(b["key"].startswith("2026") for b in report.built), report.built
    assert {r["period_key"][:4] for r in world.timeline.all_rollups()} == {"2026"}
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert odd in world.timeline.descendant_store_ids(day["rollup_id"])
    assert "durian" in day["text"]


def test_a_new_leaf_over_raw_rollup_sources_makes_the_day_stale(world):
    world.build()
    world.leaves["wed"] = world.leaf("wed", "Summary: papaya (leaf)")
    assert world.status()[("day", "2026-03-18")] == "stale"
    world.build()
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert world.timeline.sources(day["rollup_id"]) == [
        {"ordinal": 0, "kind": "node", "id": world.leaves["wed"]}]


def test_month_lineage_expands_down_to_the_exact_raw_text(world):
    world.now = at(2, 9, month=4)                         # March is over
    report = world.build(max_builds=50)
    assert not report.errors and not report.waiting
    month = world.timeline.get_rollup("month", "2026-03", "UTC", OWNER)
    assert month is not None and month["session_count"] == 5 and month["message_count"] == 10
    everything = {i for ids in world.ids.values() for i in ids}
    assert set(world.timeline.descendant_store_ids(month["rollup_id"])) == everything

    ctx = world.ctx()
    handle = call(ctx, "trove_recent", period="march", session_scope="all")["items"][0]["expand"]
    assert handle == {"tool": "trove_expand",
                      "args": {"rollup_id": month["rollup_id"], "session_scope": "all"}}
    target = world.ids["mon"][0]           # Monday's raw user turn, drilled by handles only
    args, path = handle["args"], []
    for _ in range(6):
        page = call(ctx, "trove_expand", **args, source_limit=100)
        if "message" in page:
            break
        path.append(page.get("key") or page.get("node_id"))
        nxt = next(s for s in page["sources"]
                   if (s["kind"] == "message" and s["store_id"] == target)
                   or (s["kind"] == "rollup" and s["key"] in ("2026-W12", "2026-03-16")))
        args = nxt["expand"]["args"] if nxt["kind"] != "message" else {
            "store_id": target, "session_scope": "all"}
    assert path == ["2026-03", "2026-W12", "2026-03-16"]
    assert page["message"]["content"] == "On day 16: kiwi deployment decided?"
    assert page["message"]["content"] == world.store.get_message(target)["content"]


def test_reading_a_rollup_needs_the_scope_of_all_its_sessions(world):
    world.build()
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    refused = call(world.ctx(), "trove_expand", rollup_id=day["rollup_id"])
    assert "session_scope='all'" in refused["error"]
    assert "not found" in call(world.ctx(), "trove_expand", rollup_id=999)["error"]


def test_ignored_and_stateless_sessions_never_feed_rollups(tmp_path):
    world = World(tmp_path, ignore_session_patterns="cron-*",
                  stateless_session_patterns="telegram:scratch-*")
    world.store.ensure_session("cron-7", source="cron")
    world.store.ensure_session("scratch-1", source="telegram")
    world.say("cron-7", 18, "durian nightly job", source="cron")
    world.say("scratch-1", 18, "feijoa scratchpad")
    world.build()
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert world.timeline.sessions_of(day["rollup_id"]) == ["wed"]
    assert "papaya" in day["text"]
    assert "durian" not in day["text"] and "feijoa" not in day["text"]
    lineage = world.timeline.descendant_store_ids(day["rollup_id"])
    assert lineage == world.ids["wed"]
    world.db.close()


def test_builds_are_bounded_per_pass_and_weeks_wait_for_their_days(world):
    report = world.build(max_builds=2)
    assert len(report.built) == 2
    waiting = {(w["kind"], w["key"]): w for w in report.waiting}
    assert ("week", "2026-W11") in waiting
    world.build(max_builds=2)
    world.build(max_builds=2)
    assert world.status()[("week", "2026-W11")] == "ready"


def test_doctor_lineage_check_reports_dangling_sources(world):
    world.build()
    assert world.timeline.lineage_problems() == []
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    with world.db.transaction() as conn:
        conn.execute("DELETE FROM messages WHERE store_id = ?", (world.ids["wed"][0],))
    problems = world.timeline.lineage_problems()
    assert problems == [{"rollup_id": day["rollup_id"], "ordinal": 0,
                         "missing": f"message {world.ids['wed'][0]}"}]


def test_a_short_lookback_still_covers_whole_weeks_and_months(world):
    # one day back from Thursday the 19th reaches into March: the scan starts on the Monday
    # before March 1st, so last week's Thursday and its week are still rolled up
    report = world.build(lookback_days=1)
    assert {("day", "2026-03-12"), ("week", "2026-W11")} <= {
        (b["kind"], b["key"]) for b in report.built}
    world.now = at(2, 9, month=5)                 # May 2nd, one day back: March is out of reach
    assert world.build(lookback_days=1).built == []


def test_a_month_rollup_is_not_repeated_by_its_last_day(world):
    world.say("wed", 31, "papaya month-end check")    # the day ends where the month ends
    world.now = at(2, 9, month=4)
    world.build(max_builds=50)
    march = call(world.ctx(), "trove_recent", period="march", session_scope="all")
    assert [(i["period"], i["key"]) for i in march["items"]] == [("month", "2026-03")]


def test_a_day_whose_only_turn_is_just_before_midnight_is_rolled_up(world):
    # activity is found in 15-minute buckets floored on both engines: PostgreSQL's CAST
    # rounds, which put 23:59 into the next day's first bucket and lost Saturday
    world.store.ensure_session("sat", source="telegram")
    Owners(world.db).record("sat", OWNER, platform="telegram")
    world.store.ingest("sat", [{"role": "user", "content": "fig harvest at midnight?",
                                "timestamp": at(14, 23, 59)}], now=STORED_AT, source="telegram")
    assert world.status()[("day", "2026-03-14")] == "pending"
    built = {(b["kind"], b["key"]) for b in world.build(max_builds=50).built}
    assert ("day", "2026-03-14") in built and ("day", "2026-03-15") not in built


def test_a_big_day_is_summarized_in_chunks_then_merged(world):
    for hour in range(11, 21):
        world.say("wed", 18, f"papaya detail {hour}", hour=hour)
    prompts = []

    def llm(prompt, model, timeout):
        prompts.append(prompt)
        return digest_llm(prompt, model, timeout)

    world.build(llm_call=llm, chunk_tokens=60)
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    day_prompts = [p for p in prompts if "papaya" in p]
    assert len(day_prompts) > 2 and any("part1" in p for p in day_prompts)
    assert day["level"] == 1 and "papaya" in day["text"] and day["message_count"] == 22
    assert world.timeline.source_count(day["rollup_id"]) == 22      # lineage stays whole


def test_merging_chunk_summaries_halves_the_parts_every_round(world):
    """A rollup budget above half of TROVE_LEAF_CHUNK_TOKENS (both are settings) made
    every chunk of the merge hold one part: each round re-summarized every part alone,
    one model call each, round after round (1,182 calls for one 24-turn day). A chunk
    takes at least two parts, so the calls stay within a few per source."""
    for hour in range(24):
        world.say("wed", 18, " ".join(f"papaya{hour}w{i}" for i in range(300)), hour=hour)
    calls = []

    def llm(prompt, model, timeout):       # a summary half as long as what it was shown
        calls.append(prompt)
        return "Summary: " + prompt[-len(prompt) // 2:]

    report = world.build(llm_call=llm, chunk_tokens=500, budget_tokens=1500)
    assert not report.errors
    day = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    assert day["level"] == 1 and world.timeline.source_count(day["rollup_id"]) == 50
    assert len([p for p in calls if "papaya" in p]) <= 3 * 50


# ---------------------------------------------------------------- property: complete and scoped
PERIODS = ["today", "yesterday", "this week", "last week", "monday", "last friday",
           "last 3 days", "2026-03-10..2026-03-17", "this month", "2026-W11"]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_recent_lists_everything_of_the_period_and_nothing_out_of_scope(tmp_path_factory, data):
    """Random sessions, times, leaves and (maybe) rollups: every message of the period in
    scope lies under some listed item, and no listed item reaches outside the scope."""
    home = tmp_path_factory.mktemp("prop")
    world = World(home)
    for name in ("p1", "p2", "p3"):
        world.store.ensure_session(name, source="cli")
        Owners(world.db).record(name, OWNER, platform="cli")
        times = sorted(data.draw(st.lists(st.floats(at(2), at(19, 14)), min_size=1,
                                          max_size=12), label=f"{name} times"))
        ids = world.store.ingest(name, [{"role": "user", "content": f"{name} note {i}",
                                         "timestamp": t} for i, t in enumerate(times)],
                                 now=STORED_AT).store_ids
        cut = data.draw(st.integers(0, len(ids)), label=f"{name} summarized prefix")
        start = 0
        while start < cut:
            size = data.draw(st.integers(1, cut - start), label="leaf size")
            world.ids[name] = ids[start:start + size]
            world.leaf(name, f"leaf of {name}")
            start += size
    if data.draw(st.booleans(), label="rollups built"):
        world.build(max_builds=200)
    period = data.draw(st.sampled_from(PERIODS), label="period")
    caller = data.draw(st.sampled_from(["p1", "thu"]), label="caller")
    scope = data.draw(st.sampled_from(["current", "all"]), label="scope")
    ctx = world.ctx(caller)
    answer = call(ctx, "trove_recent", period=period, session_scope=scope, limit=50)
    items = answer["items"]
    while answer["next_offset"] is not None:
        answer = call(ctx, "trove_recent", period=period, session_scope=scope, limit=50,
                      offset=answer["next_offset"])
        items += answer["items"]
    reached: set[int] = set()
    sessions = {i["session_id"] for i in items if i["kind"] == "session"}
    for item in items:
        if item["kind"] == "session":
            continue                      # a digest; its raw messages are listed after
        if item["kind"] == "message":
            reached.add(item["store_id"])
        elif item["kind"] == "summary":
            reached.update(world.dag.descendant_store_ids(item["node_id"]))
        else:
            reached.update(world.timeline.descendant_store_ids(item["rollup_id"]))
    rows = world.store.get_messages(reached)
    assert scope == "all" or {r["session_id"] for r in rows.values()} <= {caller}
    start, end = (datetime.fromisoformat(answer[k].replace("Z", "+00:00")).timestamp()
                  for k in ("from", "to"))
    with world.db.reading() as conn:
        expected = {r[0] for r in conn.execute(
            "SELECT store_id, session_id FROM messages WHERE"
            " COALESCE(message_at, created_at) >= ? AND COALESCE(message_at, created_at) < ?",
            (start, end)) if scope == "all" or r[1] == caller}
    assert expected <= reached
    world.db.close()


# ---------------------------------------------------------------- leaves spanning days
def late_session(world, session, turns):
    """A session of the owner whose ``turns`` are ``(text, time)`` pairs."""
    world.store.ensure_session(session, source="telegram")
    Owners(world.db).record(session, OWNER, platform="telegram")
    world.ids[session] = world.store.ingest(session, [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text, "timestamp": when}
        for i, (text, when) in enumerate(turns)], now=STORED_AT).store_ids
    return world.ids[session]


def under(world, kind, key):
    rollup = world.timeline.get_rollup(kind, key, "UTC", OWNER)
    assert rollup is not None, (kind, key)
    return rollup, world.timeline.descendant_store_ids(rollup["rollup_id"])


def test_a_leaf_spanning_midnight_feeds_each_day_what_was_said_that_day(world):
    """Saturday 23:50 and Sunday 00:10 sit in one leaf: Saturday's rollup holds the
    Saturday turn, Sunday's the Sunday turn (it used to have none: the whole leaf went to
    Saturday, and "what did I do on Sunday" never saw its own words), each exactly once
    in the week, which counts every message once."""
    ids = late_session(world, "late", [("Saturday night: persimmon idea", at(14, 23, 50)),
                                       ("Sunday: durian answer", at(15, 0, 10))])
    world.leaf("late", "Summary: persimmon idea and durian answer over midnight (leaf)")
    report = world.build(max_builds=50)
    assert not report.errors, report.errors
    status = world.status()
    assert status[("day", "2026-03-14")] == status[("day", "2026-03-15")] == "ready"
    assert status[("week", "2026-W11")] == "ready"
    saturday, sat_ids = under(world, "day", "2026-03-14")
    sunday, sun_ids = under(world, "day", "2026-03-15")
    assert sat_ids == [ids[0]] and sun_ids == [ids[1]]
    assert "durian" in sunday["text"] and "durian" not in saturday["text"]
    assert saturday["message_count"] == sunday["message_count"] == 1
    assert sunday["time_from"] == sunday["time_to"] == at(15, 0, 10)
    # each day's text says what it covers: its zone, the local times, the counts
    assert sunday["text"].startswith(
        "[day 2026-03-15 (UTC), said 00:10-00:10, 1 session(s), 1 message(s)]\n")
    assert saturday["text"].startswith("[day 2026-03-14 (UTC), said 23:50-23:50,")
    week, week_ids = under(world, "week", "2026-W11")
    assert sorted(week_ids) == sorted(set(week_ids)) and set(ids) <= set(week_ids)
    assert week["message_count"] == len(week_ids)
    # "yesterday" seen from Monday is Sunday: its own turn, from its rollup
    world.now = at(16, 9)
    sunday_view = call(world.ctx("mon"), "trove_recent", period="yesterday",
                       session_scope="all")
    assert "durian" in json.dumps(sunday_view)
    # the leaf's part of the window is in the day rollups, which together hold it: it is
    # not listed again (it was, beside them, for both days and for Sunday alone)
    assert sunday_view["used"] == ["rollups"]
    assert [(i["kind"], i["key"]) for i in sunday_view["items"]] == [("rollup", "2026-03-15")]
    weekend = call(world.ctx("mon"), "trove_recent", period="2026-03-14..2026-03-15",
                   session_scope="all")
    assert weekend["used"] == ["rollups"]
    assert [(i["kind"], i["key"]) for i in weekend["items"]] == [
        ("rollup", "2026-03-15"), ("rollup", "2026-03-14")]


def test_a_leaf_spanning_several_days_is_split_across_every_day_it_touches(world):
    """A leaf from Friday the 13th to Sunday: Saturday, which only that leaf holds, has
    its rollup too (it used to have none), and the week holds every turn once."""
    ids = late_session(world, "long", [("Friday: zucchini start", at(13, 22)),
                                       ("Saturday: feijoa middle", at(14, 12)),
                                       ("Sunday: durian end", at(15, 8))])
    world.leaf("long", "Summary: a three-day thread (leaf)")
    assert not world.build(max_builds=50).errors
    for key, store_id, word in (("2026-03-13", ids[0], "zucchini"),
                                ("2026-03-14", ids[1], "feijoa"),
                                ("2026-03-15", ids[2], "durian")):
        rollup, reached = under(world, "day", key)
        assert reached == [store_id] and word in rollup["text"]
    week, week_ids = under(world, "week", "2026-W11")
    assert len(week_ids) == len(set(week_ids)) and set(ids) <= set(week_ids)
    assert week["message_count"] == len(week_ids)


def test_a_late_leaf_spanning_into_built_days_keeps_them_exact(world):
    """Wednesday is rolled up from raw rows; then a late Tuesday-night turn and a leaf
    over it and Wednesday's rows arrive. Tuesday goes stale (a message of its own was
    added) and its rebuild holds that turn only; Wednesday keeps exactly its own rows;
    nothing stays stale and nothing is removed."""
    world.build(max_builds=50)
    wednesday = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    early = world.say("wed", 17, "papaya prelude", hour=23)
    world.ids["wed"] = early + world.ids["wed"]
    world.leaves["wed"] = world.leaf("wed", "Summary: papaya prelude and rollback (leaf)")
    assert world.status()[("day", "2026-03-17")] == "stale"
    report = world.build(max_builds=50)
    assert not report.errors and not report.removed, (report.errors, report.removed)
    assert "stale" not in world.status().values()
    tuesday, tue_ids = under(world, "day", "2026-03-17")
    assert set(early) <= set(tue_ids) and not set(world.ids["wed"][2:]) & set(tue_ids)
    again, wed_ids = under(world, "day", "2026-03-18")
    assert again["rollup_id"] == wednesday["rollup_id"] and wed_ids == world.ids["wed"][2:]
    world.now = at(23, 9)                                  # the week is over
    assert not world.build(max_builds=50).errors
    week, week_ids = under(world, "week", "2026-W12")
    assert len(week_ids) == len(set(week_ids)) and set(world.ids["wed"]) <= set(week_ids)
    assert week["message_count"] == len(week_ids)


def test_rollups_are_per_owner_and_no_prompt_mixes_two_people(world):
    """A shared gateway: Bob chats on Wednesday too. Each person gets a day rollup of
    their own sessions; no summarizer prompt holds both; each reads only their own."""
    bob = "telegram:user:8"
    world.store.ensure_session("bob-wed", source="telegram")
    Owners(world.db).record("bob-wed", bob, platform="telegram")
    world.ids["bob-wed"] = world.say("bob-wed", 18, "durian secret 4711", hour=15)
    world.store.ensure_session("bob-thu", source="telegram")
    Owners(world.db).record("bob-thu", bob, platform="telegram")
    world.say("bob-thu", 19, "feijoa today", hour=9)
    prompts = []

    def llm(prompt, model, timeout):
        prompts.append(prompt)
        return digest_llm(prompt, model, timeout)
    report = world.build(llm_call=llm, max_builds=50)
    assert not report.errors
    assert prompts and not any("durian" in p and ("papaya" in p or "kiwi" in p)
                               for p in prompts)
    mine = world.timeline.get_rollup("day", "2026-03-18", "UTC", OWNER)
    theirs = world.timeline.get_rollup("day", "2026-03-18", "UTC", bob)
    assert world.timeline.sessions_of(mine["rollup_id"]) == ["wed"]
    assert world.timeline.sessions_of(theirs["rollup_id"]) == ["bob-wed"]
    alice = call(world.ctx("thu"), "trove_recent", period="yesterday", session_scope="all")
    assert alice["used"] == ["rollups"] and "durian" not in json.dumps(alice)
    robert = call(world.ctx("bob-thu"), "trove_recent", period="yesterday", session_scope="all")
    assert robert["used"] == ["rollups"] and "durian" in json.dumps(robert)
    assert "papaya" not in json.dumps(robert)
    assert "not found" in call(world.ctx("thu"), "trove_expand", rollup_id=theirs["rollup_id"],
                               session_scope="all")["error"]


def test_expanding_a_week_checks_scope_and_freshness_of_every_child(world):
    """The week's child days are rendered only when the caller may read them whole and
    they are ready: a day rebuilt with material the caller may not read is withheld."""
    world.build(max_builds=50)
    week = world.timeline.get_rollup("week", "2026-W11", "UTC", OWNER)
    day = world.timeline.get_rollup("day", "2026-03-12", "UTC", OWNER)
    shown = call(world.ctx(), "trove_expand", rollup_id=week["rollup_id"], session_scope="all")
    assert [s.get("rollup_id") for s in shown["sources"]] == [day["rollup_id"]]
    assert "lighthouse" in json.dumps(shown)
    # the day now also holds someone else's session (as an older build mixing owners did)
    world.store.ensure_session("eve", source="telegram")
    Owners(world.db).record("eve", "telegram:user:9", platform="telegram")
    with world.db.transaction() as conn:
        conn.execute("UPDATE rollups SET text = text || ' eve-secret-0815' WHERE rollup_id = ?",
                     (day["rollup_id"],))
        conn.execute("INSERT INTO rollup_sessions(rollup_id, session_id) VALUES (?, 'eve')",
                     (day["rollup_id"],))
    out = call(world.ctx(), "trove_expand", rollup_id=week["rollup_id"], session_scope="all")
    assert "eve-secret-0815" not in json.dumps(out)
    assert out["sources"][0]["withheld"] == "out of scope"
    with world.db.transaction() as conn:
        conn.execute("DELETE FROM rollup_sessions WHERE session_id = 'eve'")
    world.say("prev", 12, "zucchini late addendum", hour=21)      # the day is stale now
    out = call(world.ctx(), "trove_expand", rollup_id=week["rollup_id"], session_scope="all")
    assert out["state"] == "stale" and out["sources"][0]["withheld"] == "stale"
    assert "eve-secret-0815" not in json.dumps(out)


def test_recent_without_rollups_shows_every_session_of_the_period_first(tmp_path):
    """Rollups off: two sessions of yesterday, 24 messages each. The first page (10
    items) holds a digest of each (when, how many, first request, key terms, a load
    handle that works), then the raw messages page on."""
    world = World(tmp_path, rollups_enabled="false")
    for name, (topic, hour) in {"morning": ("grapefruit invoices", 8),
                                "evening": ("tangerine deployment", 18)}.items():
        world.store.ensure_session(name, source="telegram")
        Owners(world.db).record(name, OWNER, platform="telegram")
        world.store.ingest(name, [
            {"role": "user" if i % 2 == 0 else "assistant",
             "content": f"{'Please sort the' if i == 0 else 'More on'} {topic} step {i}",
             "timestamp": at(18, hour, i)} for i in range(24)], now=STORED_AT)
    page = call(world.ctx(), "trove_recent", period="yesterday", session_scope="all")
    digests = {i["session_id"]: i for i in page["items"] if i["kind"] == "session"}
    assert set(digests) == {"morning", "evening"}    # Wednesday's 2-message session: raw
    morning = digests["morning"]
    assert morning["message_count"] == 24 and morning["from"] == "2026-03-18T08:00:00Z"
    assert morning["first_request"] == "Please sort the grapefruit invoices step 0"
    assert "grapefruit" in morning["key_terms"] and "invoices" in morning["key_terms"]
    loaded = call(world.ctx(), morning["load"]["tool"], **morning["load"]["args"])
    assert loaded["messages"][0]["content"] == "Please sort the grapefruit invoices step 0"
    assert page["has_more"] and page["total"] > 48
    rest, offset = [], page["next_offset"]
    while offset is not None:
        more = call(world.ctx(), "trove_recent", period="yesterday", session_scope="all",
                    offset=offset, limit=50)
        rest += more["items"]
        offset = more["next_offset"]
    assert sum(1 for i in page["items"] + rest if i["kind"] == "message") == 48 + 2
    world.db.close()


def test_migration_11_keeps_single_owner_rollups_and_drops_mixed_ones(tmp_path, monkeypatch):
    from hermes_trove.storage import migrations
    path = str(tmp_path / "old.db")
    monkeypatch.setattr(migrations, "MIGRATIONS", [m for m in migrations.MIGRATIONS if m[0] <= 9])
    db = Database(path)
    Store(db).ensure_session("a", source="cli")
    Store(db).ensure_session("b", source="cli")
    Owners(db).record("a", "local")
    Owners(db).record("b", "telegram:user:2")
    with db.transaction() as conn:
        def rollup(kind, key, sessions, children=()):
            rid = conn.execute(
                "INSERT INTO rollups(kind, period_key, time_zone, period_start, period_end, text,"
                " token_count, source_token_count, level, model, message_count, session_count,"
                " watermark, built_at) VALUES (?, ?, 'UTC', 0, 1, 't', 1, 1, 3, '', 1, 1, 'w', 0)",
                (kind, key)).lastrowid
            for o, child in enumerate(children):
                conn.execute("INSERT INTO rollup_sources(rollup_id, ordinal, child_rollup_id)"
                             " VALUES (?, ?, ?)", (rid, o, child))
            conn.executemany("INSERT INTO rollup_sessions VALUES (?, ?)",
                             [(rid, s) for s in sessions])
            return rid
        solo = rollup("day", "2026-03-16", ["a"])
        mixed = rollup("day", "2026-03-17", ["a", "b"])
        week = rollup("week", "2026-W12", ["a", "b"], [solo, mixed])
        solo_week = rollup("week", "2026-W11", ["a"], [solo])
    db.close()
    monkeypatch.undo()
    db = Database(path)
    timeline = Timeline(db)
    assert {r["rollup_id"]: r["owner"] for r in timeline.all_rollups()} == {
        solo: "local", solo_week: "local"}
    assert timeline.sources(solo_week) == [{"ordinal": 0, "kind": "rollup", "id": solo}]
    assert timeline.sessions_of(solo) == ["a"] and mixed and week
    with db.reading() as conn:
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    db.close()
