"""The opt-in evidence state: assertions extracted at compaction time (trove_query_state)
and stored evidence views (trove_retrieve)."""
import json
from datetime import datetime, timezone

import pytest

from enginekit import coding_turn, make_engine
from hermes_trove import tools
from hermes_trove.evidence import assertions, refs

# Query-state runs on SQLite and on PostgreSQL (tests/pgkit.py).
pytestmark = pytest.mark.usefixtures("engines_on_backend")

JAN = datetime(2026, 1, 10, tzinfo=timezone.utc).timestamp()
DAY = 86400.0
STATEMENTS = [
    (JAN, "My address is 12 Rua Augusta. I prefer window seats on trains."),
    (JAN + 30 * DAY, "Remind me to renew the passport. We decided to fly on Friday."),
    (JAN + 60 * DAY, "My address is now 7 Avenida da Liberdade, since 2026-03-08."),
]


def run(engine, statements=STATEMENTS, turns=60):
    """Tell the engine the statements (with their times), then enough turns to compact them."""
    messages = []
    for at, text in statements:
        messages.append({"role": "user", "content": text, "timestamp": at})
        messages.append({"role": "assistant", "content": "Noted."})
    for t in range(turns):
        messages.extend(coding_turn(t))
        current = 1000 + engine.counter.count_messages(messages)
        if engine.should_compress(current):
            messages = engine.compress(messages, current_tokens=current)
    assert engine.compression_count >= 1
    return messages


def tool(engine, name, **args):
    return json.loads(tools.dispatch(name, args, engine.tool_context()))


def test_query_state_is_off_by_default_and_stores_nothing(tmp_path):
    engine = make_engine(tmp_path)
    run(engine)
    out = tool(engine, "trove_query_state", subject="address")
    assert out["enabled"] is False and out["assertions"] == []
    with engine.store.db.reading() as conn:
        assert conn.execute("SELECT count(*) FROM evidence_assertions").fetchone()[0] == 0


def test_deterministic_extraction_at_compaction_keeps_conflicts_and_answers_as_of(tmp_path):
    engine = make_engine(tmp_path, assertions_enabled="true")
    run(engine)
    out = tool(engine, "trove_query_state", subject="address")
    [address] = out["assertions"]
    assert address["current"]["value"] == "7 Avenida da Liberdade, since 2026-03-08"
    assert address["current"]["valid_from"] == "2026-03-08T00:00:00Z"   # the date it states
    assert address["conflict"] and address["earlier"][0]["value"] == "12 Rua Augusta"
    for shown in (address["current"], *address["earlier"]):
        row = engine.store.get_message(shown["ref"]["store_id"])
        assert refs.ref_text(row)[shown["ref"]["start"]:shown["ref"]["end"]] == shown["ref"]["quote"]
    then = tool(engine, "trove_query_state", subject="address", as_of="2026-02-01")
    assert then["assertions"][0]["current"]["value"] == "12 Rua Augusta"
    assert "conflict" not in then["assertions"][0]
    kinds = {a["kind"]: a for a in tool(engine, "trove_query_state")["assertions"]}
    assert kinds["commitment"]["current"]["value"] == "renew the passport"
    assert kinds["action"]["current"]["value"] == "fly on Friday"
    assert kinds["preference"]["current"]["value"] == "prefer window seats on trains"
    only = tool(engine, "trove_query_state", kind="commitment")["assertions"]
    assert [a["kind"] for a in only] == ["commitment"]


def stated(engine, texts):
    """Store ``texts`` a minute apart and extract their assertions with the patterns."""
    ids = engine.store.ingest(engine.canonical_id, [
        {"role": "user", "content": t, "timestamp": JAN + 60 * i}
        for i, t in enumerate(texts)]).store_ids
    assert assertions.extract_pending(engine.store, engine.canonical_id, ids[-1]) == len(texts)


@pytest.mark.parametrize("zone", ["UTC", "America/Los_Angeles", "Asia/Tokyo"])
def test_as_of_a_day_counts_that_whole_day_in_the_users_zone(tmp_path, zone):
    """valid_from of a stated date is its midnight in TROVE_TIMEZONE; as_of names days in
    that zone too, and a day counts whole (what became valid that day is included)."""
    from hermes_trove.storage.timekeys import zone_or_utc
    from test_tools import Env
    env = Env(tmp_path, assertions_enabled="true", timezone=zone)
    sid = env.ingest("A", [{"role": "user", "content": "My address is now 7 Avenida da "
                            "Liberdade, since 2026-03-08."}], at=JAN + 62 * DAY)[0]
    found = assertions.deterministic(env.store.get_message(sid), zone_or_utc(zone))
    assertions.save(env.db, "A", found, sid)

    def values(as_of):
        out = json.loads(tools.dispatch("trove_query_state", {"as_of": as_of}, env.ctx()))
        return [a["current"]["value"] for a in out["assertions"]]
    assert values("2026-03-08") == ["7 Avenida da Liberdade, since 2026-03-08"]
    assert values("2026-03-08T00:00:00") == ["7 Avenida da Liberdade, since 2026-03-08"]
    assert values("2026-03-07T23:59:59") == [] and values("2026-03-07") == []
    assert "error" in json.loads(tools.dispatch("trove_query_state", {"as_of": "someday"},
                                                env.ctx()))


def test_query_state_reads_the_newest_assertions(tmp_path):
    """Only the oldest 200 matching assertions were read: a subject stated more often than
    that kept a stale current value."""
    engine = make_engine(tmp_path, assertions_enabled="true")
    stated(engine, [f"Note {i}: my desk is in room 1." for i in range(210)]
           + ["My desk is now in room 42."])
    for args in ({}, {"subject": "desk"}, {"subject": "desk", "kind": "fact"}):
        [desk] = tool(engine, "trove_query_state", **args)["assertions"]
        assert desk["current"]["value"] == "in room 42", args
        assert desk["earlier"][0]["value"] == "in room 1"


def test_query_state_lists_the_newest_earlier_values_and_counts_the_rest(tmp_path):
    """Every earlier value was listed: 80 commitments share the subject "todo", and the
    answer was an error that did not fit the response cap."""
    engine = make_engine(tmp_path, assertions_enabled="true")
    stated(engine, [f"Remind me to call supplier number {i} about the invoice."
                    for i in range(80)])
    out = tool(engine, "trove_query_state", kind="commitment")
    assert "error" not in out, out
    [todo] = out["assertions"]
    assert todo["current"]["value"] == "call supplier number 79 about the invoice"
    assert [e["value"] for e in todo["earlier"]] == [          # the newest earlier ones
        f"call supplier number {i} about the invoice" for i in range(78, 68, -1)]
    assert todo["earlier_omitted"] == 79 - assertions.EARLIER_MAX


@pytest.mark.parametrize("text, expected", [
    ("Do you think my car is broken?", []),
    ("I don't think my flight is cancelled.", []),
    ("Is it true that I prefer tea?", []),
    ("If I prefer tea, we stay in.", []),
    ("Maybe we decided to move, not sure.", []),
    ("Should I promise to call mom?", []),
    ("Don't remind me to call Bob.", []),
    ("My name is not Bob.", [("fact", "name", "not Bob")]),
    ("No, my address is 5 Elm Street.", [("fact", "address", "5 Elm Street")]),
    ("Could you remind me to call Bob?", [("commitment", "todo", "call Bob")]),
    ("Is it late? My address is 5 Elm Street.", [("fact", "address", "5 Elm Street")]),
])
def test_the_patterns_never_read_a_denial_a_hedge_or_a_question_as_an_assertion(text,
                                                                                 expected):
    row = {"store_id": 1, "content": text, "content_format": "text", "role": "user",
           "session_id": "A", "created_at": JAN, "message_at": None}
    assert [(a.kind, a.subject, a.value) for a in assertions.deterministic(row)] == expected


def test_the_model_extracts_when_reachable_and_unverifiable_quotes_are_dropped(tmp_path):
    prompts = []

    def llm(prompt, model, timeout):
        if "Extract assertions" not in prompt:
            return "- summary: notes"
        prompts.append(prompt)
        ids = [int(line[1:].split()[0]) for line in prompt.splitlines()
               if line.startswith("[") and " user]" in line]
        return json.dumps([
            {"id": ids[0], "kind": "fact", "subject": "home address",
             "value": "12 Rua Augusta", "quote": "My address is 12 Rua Augusta."},
            {"id": ids[0], "kind": "fact", "subject": "car", "value": "red",
             "quote": "My car is red."},            # not in the message: dropped
        ])
    engine = make_engine(tmp_path, llm=llm, assertions_enabled="true")
    run(engine)
    assert prompts
    out = tool(engine, "trove_query_state")["assertions"]
    assert [(a["subject"], a["current"]["extractor"]) for a in out] == [("home address", "model")]


def test_a_secret_in_the_models_answer_is_redacted_before_it_is_stored(tmp_path):
    secret = "sk-proj-" + "A1b2C3d4E5f6G7h8J9k0L1m2N3p4"

    def llm(prompt, model, timeout):
        if "Extract assertions" not in prompt:
            return "- summary: notes"
        ids = [int(line[1:].split()[0]) for line in prompt.splitlines()
               if line.startswith("[") and " user]" in line]
        return json.dumps([{"id": ids[0], "kind": "fact", "subject": f"api key {secret}",
                            "value": secret, "quote": "My address is 12 Rua Augusta."}])
    engine = make_engine(tmp_path, llm=llm, assertions_enabled="true",
                         sensitive_patterns_enabled="true")
    run(engine)
    out = tool(engine, "trove_query_state")
    assert out["assertions"] and secret not in json.dumps(out)
    assert "[REDACTED:" in out["assertions"][0]["current"]["value"]
    with engine.store.db.reading() as conn:
        stored = conn.execute("SELECT subject, value FROM evidence_assertions").fetchall()
    assert secret not in json.dumps([list(r) for r in stored])


def test_a_model_assertion_whose_quote_denies_or_hedges_its_value_is_dropped():
    row = {"store_id": 7, "content": "We did NOT choose Postgres. Maybe we will pick MySQL. "
           "We chose SQLite.", "content_format": "text", "role": "user", "session_id": "A",
           "created_at": JAN, "message_at": None}
    answer = json.dumps([
        {"id": 7, "kind": "action", "subject": "database", "value": "Postgres",
         "quote": "We did NOT choose Postgres."},
        {"id": 7, "kind": "action", "subject": "database", "value": "not Postgres",
         "quote": "We did NOT choose Postgres."},
        {"id": 7, "kind": "action", "subject": "database", "value": "MySQL",
         "quote": "Maybe we will pick MySQL."},
        {"id": 7, "kind": "action", "subject": "database", "value": "SQLite",
         "quote": "We chose SQLite."}])
    found = assertions.from_model([row], lambda *a: answer, None, 1.0)
    assert [a.value for a in found] == ["not Postgres", "SQLite"]


def test_a_failing_model_falls_back_to_the_deterministic_extractor(tmp_path):
    def llm(prompt, model, timeout):
        if "Extract assertions" in prompt:
            raise TimeoutError("no model")
        return "- summary: notes"
    engine = make_engine(tmp_path, llm=llm, assertions_enabled="true")
    run(engine)
    out = tool(engine, "trove_query_state", subject="address")["assertions"]
    assert out[0]["current"]["extractor"] == "deterministic"


def test_other_sessions_assertions_need_scope(tmp_path):
    engine = make_engine(tmp_path, assertions_enabled="true")
    run(engine)
    engine.on_session_start("other", platform="cli")
    assert tool(engine, "trove_query_state", subject="address")["assertions"] == []
    found = tool(engine, "trove_query_state", subject="address", session_scope="all")
    assert found["assertions"][0]["current"]["value"].startswith("7 Avenida")


def test_retrieve_fills_slots_computes_and_stores_a_view(tmp_path):
    engine = make_engine(tmp_path, retrieve_enabled="true")
    engine.ingest([{"role": "user", "content": "The hotel cost $420 for the Porto trip."},
                   {"role": "user", "content": "The Porto trip train was $85.50."},
                   {"role": "user", "content": "What did the Porto trip cost?"}])
    out = tool(engine, "trove_retrieve", question="Porto trip total?", slots=[
        {"name": "hotel", "type": "amount", "query": "hotel Porto"},
        {"name": "train", "type": "amount", "query": "Porto train"}],
        computation={"operation": "sum"})
    assert [s["filled"] for s in out["slots"]] == [True, True]
    assert len(out["calls"]) <= 3 and out["computation"]["result"]["value"] == 505.5
    again = tool(engine, "trove_retrieve", view_id=out["view_id"])
    assert again["trace_hash_ok"] and again["trace_hash"] == out["trace_hash"]
    assert again["computation"]["result"]["value"] == 505.5


def test_retrieve_is_bounded_and_off_by_default(tmp_path):
    off = make_engine(tmp_path / "off")
    assert tool(off, "trove_retrieve", question="q", slots=[{"type": "date"}])["enabled"] is False
    engine = make_engine(tmp_path / "on", retrieve_enabled="true")
    engine.ingest([{"role": "user", "content": "I met Ana on 2026-01-03 and 2026-01-09."}])
    slots = [{"name": f"s{i}", "type": "date", "query": f"query {i}"} for i in range(5)]
    out = tool(engine, "trove_retrieve", question="q", slots=slots)
    assert len(out["calls"]) == 3 and out["slots"][4]["note"] == "over the call budget"
    two = tool(engine, "trove_retrieve", question="q",
               slots=[{"name": "met", "type": "date", "query": "met Ana"}])
    assert two["slots"][0]["filled"] is False     # two dates: cannot fill a date slot
    assert "error" in tool(engine, "trove_retrieve", question="q", slots=[{"type": "mood"}])
    assert "not found" in tool(engine, "trove_retrieve", view_id=999)["error"]


def test_retrieve_stores_a_view_whatever_text_its_slots_carry(tmp_path):
    engine = make_engine(tmp_path, retrieve_enabled="true")
    engine.ingest([{"role": "user", "content": "The hotel cost $420 for the Porto trip."},
                   {"role": "user", "content": "What did the hotel cost?"}])
    out = tool(engine, "trove_retrieve", question="q", slots=[
        {"name": "hotel \ud800", "type": "amount", "query": "hotel \udfff Porto"}],
        computation={"operation": "sum \ud800"})
    assert out["slots"][0]["filled"] and out["computation"]["ok"] is False
    again = tool(engine, "trove_retrieve", view_id=out["view_id"])
    assert again["trace_hash_ok"] and again["slots"][0]["name"] == "hotel \ud800"
    bad = tool(engine, "trove_retrieve", question="q",
               slots=[{"name": ["x"], "type": "amount", "query": "hotel"}])
    assert "must be strings" in bad["error"]


def test_a_denied_or_hedged_quote_never_fills_a_slot(tmp_path):
    engine = make_engine(tmp_path, retrieve_enabled="true")
    engine.ingest([{"role": "user", "content": "We did not fly to Oslo on 2026-01-03."},
                   {"role": "user", "content": "Maybe the Oslo hotel will cost $500."},
                   {"role": "user", "content": "What about Oslo?"}])
    slots = [{"name": "flight", "type": "date", "query": "fly Oslo"},
             {"name": "hotel", "type": "amount", "query": "Oslo hotel cost"}]
    out = tool(engine, "trove_retrieve", question="Oslo?", slots=slots)
    assert [s["filled"] for s in out["slots"]] == [False, False]
    assert all("negate, hedge or ask" in s["note"] for s in out["slots"])
    engine.ingest([{"role": "user", "content": "We flew to Oslo on 2026-01-05."},
                   {"role": "user", "content": "The Oslo hotel did cost $450."},
                   {"role": "user", "content": "And now?"}])
    out = tool(engine, "trove_retrieve", question="Oslo?", slots=slots)
    assert [s["refs"][0]["quote"] for s in out["slots"]] == [
        "We flew to Oslo on 2026-01-05.", "The Oslo hotel did cost $450."]


def test_the_model_reads_bounded_chunks_and_the_patterns_read_the_rest(tmp_path):
    engine = make_engine(tmp_path, assertions_enabled="true")
    texts = [f"My locker code is {i}. " + "padding " * 300 for i in range(30)]
    ids = engine.store.ingest(engine.canonical_id, [{"role": "user", "content": t}
                                                    for t in texts]).store_ids
    calls = []

    def llm(prompt, model, timeout):
        calls.append(prompt)
        return "[]"      # the model finds nothing: that is an answer, not a failure
    stored = assertions.extract_pending(engine.store, engine.canonical_id, ids[-1],
                                        llm_call=llm)
    assert len(calls) == assertions.MODEL_MAX_CALLS
    read = sum(p.count(" user]") for p in calls)
    assert 0 < read < len(texts) and stored == len(texts) - read
    rows, _ = assertions.query(engine.store.db, None, subject=None, kind=None, before=None)
    assert {r["store_id"] for r in rows} == set(ids[read:])
    assert assertions.extract_pending(engine.store, engine.canonical_id, ids[-1],
                                      llm_call=llm) == 0       # the scan mark moved past all


def test_deleting_sessions_removes_their_assertions_and_views(tmp_path):
    from hermes_trove.evidence import retrieve
    engine = make_engine(tmp_path, assertions_enabled="true", retrieve_enabled="true")
    run(engine)
    tool(engine, "trove_retrieve", question="q", slots=[{"type": "item", "query": "address"}])
    session = engine.canonical_id
    with engine.store.db.reading() as conn:
        assert conn.execute("SELECT count(*) FROM evidence_assertions").fetchone()[0] > 0
    with engine.store.db.transaction() as conn:
        removed = assertions.delete_sessions_in(conn, [session])
        removed.update(retrieve.delete_sessions_in(conn, [session]))
        engine.dag.delete_session_nodes_in(conn, [session])
        engine.store.delete_sessions_in(conn, [session])
    assert removed["evidence_assertions"] >= 4 and removed["evidence_views"] == 1
    with engine.store.db.reading() as conn:
        for table in ("evidence_assertions", "evidence_views", "evidence_scan"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_query_state_pages_every_subject_in_a_stable_order(tmp_path, backend):
    """Subjects past the cap, or stated before the newest 200 assertions, were reachable
    only by naming ``subject``: the answer pages by ``offset`` / ``next_offset`` (as
    trove_recent does), every subject exactly once, rows carried into the session
    included, newest current value first, a page cut by the cap continuing where it
    stopped."""
    from hermes_trove.storage import database
    from hermes_trove.storage.owners import LOCAL_OWNER, Owners
    from test_tools import Env
    env = Env(tmp_path, backend[1], assertions_enabled="true", tool_response_max_tokens=1200)
    try:
        old = env.ingest("A", [{"role": "user", "content": "My passport is blue."}],
                         at=JAN - 5 * DAY)[0]
        leaf = env.node("A", "Summary: the passport.", store_ids=[old])
        lockers = ["locker q" + "".join(chr(97 + int(d)) for d in str(i)) for i in range(40)]
        texts = [f"My {name} is number {i}." for i, name in enumerate(lockers)] + \
            [f"Note {i}: my desk is in room {i % 3}." for i in range(210)]
        ids = env.ingest("C", [{"role": "user", "content": t} for t in texts], at=JAN)
        Owners(env.db).record("C", LOCAL_OWNER, platform="cli")
        env.dag.carry_nodes("C", [leaf])
        for sid in (old, *ids):
            row = env.store.get_message(sid)
            assertions.save(env.db, row["session_id"], assertions.deterministic(row), sid)
        expected = set(lockers) | {"desk", "passport"}

        seen, offset, cut = [], 0, 0
        while offset is not None:
            out = json.loads(tools.dispatch("trove_query_state", {"offset": offset, "limit": 9},
                                            env.ctx("C")))
            assert "error" not in out, out
            assert out["total"] == len(expected) and out["offset"] == offset
            seen += [a["subject"] for a in out["assertions"]]
            assert out["has_more"] == (out["next_offset"] is not None)
            assert out["next_offset"] in (None, offset + len(out["assertions"]))
            cut += out["has_more"] and len(out["assertions"]) < 9
            offset = out["next_offset"]
        assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
        assert cut                                   # the cap cut a page short
        assert seen[-1] == "passport"                # the oldest current value comes last
        again = json.loads(tools.dispatch("trove_query_state", {"limit": 50}, env.ctx("C")))
        assert [a["subject"] for a in again["assertions"]] == seen[:len(again["assertions"])]
    finally:
        database.forget_database(backend[1])


# ---------------------------------------------------------------- pages hold still
def state_env(tmp_path, backend):
    """Session C with five subjects stated a day apart (bike newest, car oldest) and a
    message of session A stating a sixth that no node carries into C yet."""
    from hermes_trove.storage.owners import LOCAL_OWNER, Owners
    from test_tools import Env
    env = Env(tmp_path, backend[1], assertions_enabled="true")
    env.say = lambda session, text, at: _say(env, session, text, at)
    for day, text in enumerate(["My car is blue.", "My desk is oak.", "My lamp is brass.",
                                "My sofa is grey.", "My bike is green."]):
        env.say("C", text, JAN + day * DAY)
    Owners(env.db).record("C", LOCAL_OWNER, platform="cli")
    env.passport = env.say("A", "My passport is blue.", JAN - 5 * DAY)
    return env


def _say(env, session, text, at):
    [sid] = env.ingest(session, [{"role": "user", "content": text}], at=at)
    assertions.save(env.db, session, assertions.deterministic(env.store.get_message(sid)), sid)
    return sid


def state_page(env, **args):
    out = json.loads(tools.dispatch("trove_query_state", args, env.ctx("C")))
    assert "error" not in out, out
    return out


def shown(out):
    return [(a["subject"], a["current"]["value"]) for a in out["assertions"]]


def test_query_state_pages_hold_still_while_assertions_arrive(tmp_path, backend):
    """New assertions arrive between pages (extraction runs at compaction): a newer value
    for a subject of a later page (it jumps to the top: every other subject shifts down,
    page two repeated one), a new subject, and an old assertion of another session that a
    node carried in since makes readable. With the first page's snapshot the pages are
    the first call's list, each subject's value as it was then."""
    from hermes_trove.storage import database
    env = state_env(tmp_path, backend)
    try:
        full = shown(state_page(env, limit=50))
        assert [s for s, _ in full] == ["bike", "sofa", "lamp", "desk", "car"]
        arrivals = iter([
            lambda: env.say("C", "My car is red.", JAN + 10 * DAY),        # car jumps up
            lambda: env.say("C", "My boat is white.", JAN + 11 * DAY),     # a new subject
            lambda: env.dag.carry_nodes("C", [env.node(                     # carried in
                "A", "Summary: the passport.", store_ids=[env.passport])]),
        ])
        first = page = state_page(env, limit=1)
        seen = shown(page)
        while page["next_offset"] is not None:
            next(arrivals, lambda: None)()
            page = state_page(env, limit=1, offset=page["next_offset"],
                              snapshot=first["snapshot"])
            assert page["snapshot"] == first["snapshot"] and page["total"] == len(full)
            seen += shown(page)
        assert next(arrivals, None) is None                  # every arrival came mid-paging
        assert seen == full                                   # no repeat, no skip, old values
        now = shown(state_page(env, limit=50))                # a new first page sees them all
        assert now[:2] == [("boat", "white"), ("car", "red")] and ("passport", "blue") in now
        assert len(now) == len(full) + 2
    finally:
        database.forget_database(backend[1])


def test_query_state_snapshot_pins_one_query(tmp_path, backend):
    """A snapshot names one query (as_of, subject, kind, scope): carried to another, edited,
    cut or of another tool it is a clear error; a blank one is none; one from the future
    reads as now."""
    from hermes_trove.evidence.assertions import StatePin
    from hermes_trove.evidence.handlers import state_about
    from hermes_trove.storage import database
    from hermes_trove.storage.timeline import Pin
    from test_tools import NOW
    env = state_env(tmp_path, backend)
    try:
        args = {"subject": "Car", "kind": "fact", "as_of": "2026-03", "limit": 1}
        first = state_page(env, **args)
        token = first["snapshot"]
        assert state_page(env, **args, snapshot=" ")["snapshot"] == token   # blank: none
        assert shown(state_page(env, **{**args, "subject": " car"}, snapshot=token)) == \
            shown(first)                                   # the subject as compared
        recent = json.loads(tools.dispatch("trove_recent", {}, env.ctx("C")))["snapshot"]
        for other, bad in [({"subject": "desk"}, token), ({"kind": "preference"}, token),
                           ({"as_of": "2026-02"}, token), ({"session_scope": "all"}, token),
                           ({}, token.replace(".", ".1", 1)), ({}, token[:-1]),
                           ({}, "p1.1.2.3.00000000"), ({}, "yesterday"), ({}, recent),
                           ({}, StatePin(2**63, 1, 1).encode("x")),
                           ({}, Pin(1, 1, 1, 1).encode("x"))]:
            out = json.loads(tools.dispatch("trove_query_state",
                                            {**args, **other, "snapshot": bad}, env.ctx("C")))
            assert out["error"].startswith("snapshot:") and "first page" in out["error"], other
        about = state_about(args)                          # what a token for ``args`` pins
        huge = StatePin(2**63, 1, 1).encode(about)
        assert "out of range" in json.loads(tools.dispatch(
            "trove_query_state", {**args, "snapshot": huge}, env.ctx("C")))["error"]
        future = StatePin(2**62, 2**62, int(NOW * 1000) + 10**10).encode(about)
        assert shown(state_page(env, **args, snapshot=future)) == shown(first)
    finally:
        database.forget_database(backend[1])
