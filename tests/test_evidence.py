"""Evidence tools: exact refs, evidence packs, verified computation, compiled briefs."""
import json
from datetime import date, datetime, timezone

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from hermes_trove.evidence import compute, refs, values
from hermes_trove.recall import query_plan
from hermes_trove.storage import database
from hermes_trove.storage.owners import LOCAL_OWNER, Owners
from test_tools import Env, call

DAY = 86400.0
MAR5 = datetime(2026, 3, 5, 12, tzinfo=timezone.utc).timestamp()    # a Thursday


@pytest.fixture
def env(tmp_path, backend):
    """A fresh store, once on SQLite and once on PostgreSQL (tests/pgkit.py)."""
    env = Env(tmp_path, backend[1])
    yield env
    database.forget_database(backend[1])


def said(env, session, text, at, role="user"):
    """Store one message said at ``at``; its store_id."""
    return env.ingest(session, [{"role": role, "content": text}], at=at)[0]


def ref_to(env, store_id, quote, **extra):
    text = env.store.get_message(store_id)["content"]
    start = text.index(quote)
    return {"store_id": store_id, "start": start, "end": start + len(quote), "quote": quote,
            **extra}


@pytest.fixture
def life(env):
    """Session A: a move, a first day, trip expenses, restaurants and a changing address."""
    ids = {
        "move": said(env, "A", "Big news: I moved to Lisbon on 2026-01-10. Boxes everywhere.",
                     MAR5 - 50 * DAY),
        "job": said(env, "A", "Started the new job last Tuesday, the team is nice.", MAR5),
        "hotel": said(env, "A", "The hotel for the trip cost $420 for three nights.",
                      MAR5 + DAY),
        "train": said(env, "A", "Train tickets were $85.50 each way, so fine.", MAR5 + DAY),
        "euro": said(env, "A", "The museum pass was 30 EUR.", MAR5 + 2 * DAY),
        "two": said(env, "A", "I flew on 2026-02-01 and came back on 2026-02-09.",
                    MAR5 + 2 * DAY),
        "addr1": said(env, "A", "My address is 12 Rua Augusta.", MAR5 - 40 * DAY),
        "addr2": said(env, "A", "My address is now 7 Avenida da Liberdade.", MAR5 + 3 * DAY),
        "food1": said(env, "A", "We ate at Cervejaria Ramiro, amazing seafood.", MAR5 + DAY),
        "food2": said(env, "A", "Lunch at Time Out Market again.", MAR5 + 2 * DAY),
        "food3": said(env, "A", "Back at cervejaria ramiro for dinner.", MAR5 + 3 * DAY),
        "other": said(env, "B", "Session B note: I paid $999 on 2026-02-02.", MAR5),
    }
    return ids


# ---------------------------------------------------------------- exact refs
def test_expand_and_load_session_refs_quote_the_exact_text(env, life):
    out = call(env.ctx(), "trove_expand", store_id=life["job"], include_exact_ref=True)
    ref = out["message"]["exact_ref"]
    text = env.store.get_message(life["job"])["content"]
    assert ref["quote"] == text[ref["start"]:ref["end"]] == out["message"]["content"]
    page = call(env.ctx(), "trove_load_session", include_exact_ref=True)
    for item in page["messages"]:
        r = item["exact_ref"]
        assert r["quote"] == env.store.get_message(r["store_id"])["content"][r["start"]:r["end"]]


def test_a_paged_message_ref_covers_the_shown_piece(env):
    sid = said(env, "A", "word " * 5000, MAR5)
    out = call(env.ctx(), "trove_expand", store_id=sid, include_exact_ref=True,
               content_offset=7)
    ref, message = out["message"]["exact_ref"], out["message"]
    assert ref["start"] == 7 and ref["quote"] == message["content"]
    assert ref["quote"] == ("word " * 5000)[ref["start"]:ref["end"]]


def test_grep_refs_quote_the_matching_sentence(env, life):
    out = call(env.ctx(), "trove_grep", query="hotel trip cost", include_exact_ref=True)
    hit = next(r for r in out["results"] if r.get("store_id") == life["hotel"])
    assert hit["exact_ref"] == {"store_id": life["hotel"], "start": 0, "end": 50,
                                "quote": "The hotel for the trip cost $420 for three nights."}
    move = call(env.ctx(), "trove_grep", query="moved Lisbon", include_exact_ref=True)
    ref = next(r["exact_ref"] for r in move["results"] if r.get("store_id") == life["move"])
    assert ref["quote"] == "Big news: I moved to Lisbon on 2026-01-10."


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=300), data=st.data())
def test_any_span_verifies_and_a_shifted_unique_quote_is_repaired(text, data):
    row = {"store_id": 1, "content": text, "content_format": "text", "role": "user",
           "session_id": "A", "created_at": MAR5, "message_at": None}
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    made = refs.make_ref(row, start, end)
    assert made["quote"] == text[start:end]
    ok = refs.verify(made, lambda i: row)
    assert (ok.start, ok.end, ok.status) == (start, end, "verified")
    shift = data.draw(st.integers(-20, 20).filter(bool))
    moved = {**made, "start": max(0, start + shift), "end": max(0, end + shift)}
    if text[moved["start"]:moved["end"]] == made["quote"]:
        return
    occurrences = sum(1 for i in range(len(text)) if text.startswith(made["quote"], i))
    if occurrences == 1:
        fixed = refs.verify(moved, lambda i: row)
        assert fixed.status == "repaired" and text[fixed.start:fixed.end] == made["quote"]
    else:
        with pytest.raises(refs.RefError):
            refs.verify(moved, lambda i: row)


_NO_BREAK = st.characters(blacklist_categories=("Cs",), blacklist_characters=".!?\n")


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                  HealthCheck.too_slow])
@given(before=st.text(_NO_BREAK, min_size=0, max_size=700),
       after=st.text(_NO_BREAK, min_size=0, max_size=300),
       filler=st.sampled_from(["a", "\u2026", "\uac00", "\ufb01", "e\u0301", "\u00df",
                               "\U0001f600", "\u65e5"]))
@example(before="", after="", filler="\uac00")       # Hangul: 1 char folds to 2 jamo
@example(before="", after="", filler="\u2026")       # an ellipsis folds to three dots
def test_a_long_sentence_ref_holds_the_matching_word(before, after, filler):
    """A sentence over 400 characters is cut around its matching word: the word is in the
    cut, whatever folding does to the lengths of the characters before it."""
    text = filler * 450 + before + " zebra " + after
    row = {"store_id": 1, "content": text, "content_format": "text", "role": "user",
           "session_id": "A", "created_at": MAR5, "message_at": None}
    ref = refs.best_sentence_ref(row, query_plan.parse_query("zebra"))
    assert ref["quote"] == text[ref["start"]:ref["end"]]
    assert "zebra" in query_plan.fold(ref["quote"])
    assert 0 < len(ref["quote"]) <= refs.SENTENCE_MAX_CHARS


def test_grep_refs_of_long_hangul_and_ellipsis_sentences_quote_the_hit(env):
    ids = [said(env, "A", "\uac00\ub098\ub2e4\ub77c " * 120 + "postgres \uc120\ud0dd", MAR5),
           said(env, "A", "word\u2026 " * 150 + "postgres at the end", MAR5)]
    out = call(env.ctx(), "trove_grep", query="postgres", include_exact_ref=True)
    found = {r["store_id"]: r["exact_ref"] for r in out["results"]}
    for store_id in ids:
        ref = found[store_id]
        assert "postgres" in ref["quote"]
        assert refs.verify(ref, lambda i: env.store.get_message(i)).status == "verified"


def test_an_ambiguous_quote_is_never_said_to_occur_fewer_times_than_it_does():
    row = {"store_id": 1, "content": "ab " * 50, "content_format": "text", "role": "user",
           "session_id": "A", "created_at": MAR5, "message_at": None}
    with pytest.raises(refs.RefError, match="occurs at least 10 times"):
        refs.verify({"store_id": 1, "quote": "ab"}, lambda i: row)
    with pytest.raises(refs.RefError, match="occurs 3 times"):
        refs.verify({"store_id": 1, "quote": "ab"}, lambda i: {**row, "content": "ab " * 3})


# ---------------------------------------------------------------- evidence pack
def test_pack_keeps_said_and_happened_apart(env, life):
    job = ref_to(env, life["job"], "Started the new job last Tuesday")
    move = ref_to(env, life["move"], "I moved to Lisbon on 2026-01-10.")
    out = call(env.ctx(), "trove_evidence_pack", refs=[move, job])
    first, second = out["items"]
    assert first["happened"]["date"] == "2026-01-10" and first["said_at"].startswith("2026-01-14")
    assert second["said_at"].startswith("2026-03-05")
    assert second["happened"] == {"date": "2026-03-03", "text": "last Tuesday", "rule":
                                  "the latest such weekday strictly before the message day"}
    assert out["verified"] == 2 and out["failed"] == 0


def test_pack_repairs_only_unambiguous_offsets_and_reports_each_bad_ref(env, life):
    good = ref_to(env, life["hotel"], "$420")
    shifted = {**good, "start": good["start"] + 3, "end": good["end"] + 3}
    tampered = {**ref_to(env, life["hotel"], "$420"), "quote": "$240"}
    other = ref_to(env, life["other"], "$999")
    dup = said(env, "A", "ok ok ok", MAR5)
    ambiguous = {"store_id": dup, "start": 1, "end": 3, "quote": "ok"}
    out = call(env.ctx(), "trove_evidence_pack", refs=[shifted, tampered, other, ambiguous])
    fixed, bad, foreign, twice = out["items"]
    assert fixed["ok"] and fixed["status"] == "repaired" and fixed["ref"] == good
    assert not bad["ok"] and "not found" in bad["error"]
    assert not foreign["ok"] and "another session" in foreign["error"]
    assert not twice["ok"] and "3 times" in twice["error"]
    allowed = call(env.ctx(), "trove_evidence_pack", refs=[other], session_id="B")
    assert allowed["items"][0]["ok"] and allowed["items"][0]["amounts"][0]["value"] == 999


def test_pack_pages_and_attaches_a_computation(env, life):
    costs = [ref_to(env, life["hotel"], "$420"), ref_to(env, life["train"], "$85.50")]
    out = call(env.ctx(), "trove_evidence_pack", refs=costs, limit=1,
               computation={"operation": "sum"})
    assert [i["index"] for i in out["items"]] == [0] and out["next_offset"] == 1
    assert out["computation"]["ok"] and out["computation"]["result"]["value"] == 505.5
    rest = call(env.ctx(), "trove_evidence_pack", refs=costs, offset=1)
    assert [i["index"] for i in rest["items"]] == [1] and not rest["has_more"]


def test_a_nested_computation_is_checked_like_trove_compute(env, life):
    """The string "false" for absolute was read as true, and a unit that is no string raised
    a raw AttributeError/TypeError that lost the whole pack or brief."""
    costs = [ref_to(env, life["hotel"], "$420"), ref_to(env, life["train"], "$85.50")]
    out = call(env.ctx(), "trove_evidence_pack", refs=costs,
               computation={"operation": "difference", "absolute": "false"})
    assert out["computation"]["result"]["value"] == -334.5
    for unit in (5, ["USD"], {"x": 1}):
        bad = call(env.ctx(), "trove_evidence_pack", refs=costs,
                   computation={"operation": "sum", "unit": unit})
        assert bad["verified"] == 2 and bad["computation"] == {
            "ok": False, "operation": "sum", "error": "unit must be a string"}
    brief = call(env.ctx(), "trove_compile_evidence", proposal={
        "question": "total", "claims": [{"text": "The hotel cost $420", "refs": [
            ref_to(env, life["hotel"], "The hotel for the trip cost $420")]}],
        "computation": {"operation": "sum", "inputs": costs, "absolute": "yes"}})
    assert brief["claims"][0]["supported"] and brief["sufficiency"] == "insufficient"
    assert brief["computation"]["error"] == "absolute must be true or false"


# ---------------------------------------------------------------- compute
def test_date_diff_days_weeks_months(env, life):
    move = ref_to(env, life["move"], "I moved to Lisbon on 2026-01-10.")
    job = ref_to(env, life["job"], "Started the new job last Tuesday")
    out = call(env.ctx(), "trove_compute", operation="date_diff", inputs=[move, job])
    assert out["result"]["value"] == 52 and out["trace_hash"].startswith("sha256:")
    weeks = call(env.ctx(), "trove_compute", operation="date_diff", inputs=[move, job],
                 unit="weeks")["result"]
    assert (weeks["whole_weeks"], weeks["remaining_days"]) == (7, 3)
    months = call(env.ctx(), "trove_compute", operation="date_diff", inputs=[job, move],
                  unit="months", absolute=True)["result"]
    assert (months["value"], months["remaining_days"]) == (1, 21)
    backwards = call(env.ctx(), "trove_compute", operation="date_diff", inputs=[job, move])
    assert backwards["result"]["value"] == -52


@pytest.mark.parametrize("case, fragment", [
    ("two_dates", "more than one date"),
    ("mixed_currency", "incompatible units"),
    ("other_session", "another session"),
    ("tampered", "not found"),
    ("no_amount", "no amount"),
])
def test_compute_fails_closed(env, life, case, fragment):
    hotel, euro = ref_to(env, life["hotel"], "$420"), ref_to(env, life["euro"], "30 EUR")
    inputs = {
        "two_dates": ("date_diff", [ref_to(env, life["two"], "I flew on 2026-02-01 and came "
                                           "back on 2026-02-09."),
                                    ref_to(env, life["move"], "2026-01-10")]),
        "mixed_currency": ("sum", [hotel, euro]),
        "other_session": ("sum", [hotel, ref_to(env, life["other"], "$999")]),
        "tampered": ("sum", [hotel, {**euro, "quote": "31 EUR"}]),
        "no_amount": ("sum", [ref_to(env, life["food1"], "Cervejaria Ramiro")]),
    }[case]
    out = call(env.ctx(), "trove_compute", operation=inputs[0], inputs=inputs[1])
    assert "error" in out and fragment in out["error"] and "result" not in out


def test_the_value_the_model_read_picks_one_candidate_and_must_be_in_the_quote(env, life):
    both = ref_to(env, life["two"], "I flew on 2026-02-01 and came back on 2026-02-09.")
    out = call(env.ctx(), "trove_compute", operation="date_diff",
               inputs=[{**both, "value": "2026-02-01"}, {**both, "value": "2026-02-09"}])
    assert out["result"]["value"] == 8
    wrong = call(env.ctx(), "trove_compute", operation="date_diff",
                 inputs=[{**both, "value": "2026-02-03"}, {**both, "value": "2026-02-09"}])
    assert "matches none" in wrong["error"]
    lie = call(env.ctx(), "trove_compute", operation="sum",
               inputs=[{**ref_to(env, life["hotel"], "$420 for three"), "value": "$500"}])
    assert "does not match" in lie["error"]


def test_sum_difference_count_order_latest(env, life):
    hotel, train = ref_to(env, life["hotel"], "$420"), ref_to(env, life["train"], "$85.50")
    total = call(env.ctx(), "trove_compute", operation="sum", inputs=[hotel, train])
    assert total["result"] == {"value": 505.5, "unit": "USD", "count": 2}
    assert total["trace"]["parsed"][1]["value"] == 85.5
    diff = call(env.ctx(), "trove_compute", operation="difference", inputs=[hotel, train])
    assert diff["result"]["value"] == -334.5
    foods = [ref_to(env, life["food1"], "Cervejaria Ramiro", value="Cervejaria Ramiro"),
             ref_to(env, life["food2"], "Time Out Market", value="Time Out Market"),
             ref_to(env, life["food3"], "cervejaria ramiro", value="cervejaria ramiro")]
    count = call(env.ctx(), "trove_compute", operation="count_distinct", inputs=foods)
    assert count["result"]["value"] == 2
    addresses = [ref_to(env, life["addr2"], "My address is now 7 Avenida da Liberdade."),
                 ref_to(env, life["addr1"], "My address is 12 Rua Augusta.")]
    latest = call(env.ctx(), "trove_compute", operation="latest", inputs=addresses)
    assert latest["result"]["value"] == "My address is now 7 Avenida da Liberdade."
    assert latest["result"]["superseded"][0]["value"] == "My address is 12 Rua Augusta."
    order = call(env.ctx(), "trove_compute", operation="order", inputs=[
        ref_to(env, life["job"], "Started the new job last Tuesday"),
        ref_to(env, life["move"], "I moved to Lisbon on 2026-01-10.")])
    assert [o["date"] for o in order["result"]["order"]] == ["2026-01-10", "2026-03-03"]


def test_a_trace_over_the_cap_is_dropped_and_the_result_kept(env):
    inputs = []
    for i in range(40):
        text = f"Item {i}: " + "lorem ipsum " * 30 + f"cost ${i + 1}."
        inputs.append(ref_to(env, said(env, "A", text, MAR5), text))
    out = call(env.ctx(), "trove_compute", operation="sum", inputs=inputs)
    assert out["result"] == {"value": 820, "unit": "USD", "count": 40}
    assert out["omitted_for_size"] == ["trace"] and out["trace_hash"].startswith("sha256:")


def test_lengths_convert_within_a_dimension_and_the_trace_hash_is_stable(env):
    sid = said(env, "A", "Ran 5 km in the morning and 800 m in the evening.", MAR5)
    inputs = [ref_to(env, sid, "5 km"), ref_to(env, sid, "800 m")]
    first = call(env.ctx(), "trove_compute", operation="sum", inputs=inputs)
    assert first["result"] == {"value": 5.8, "unit": "km", "count": 2}
    again = call(env.ctx(), "trove_compute", operation="sum", inputs=inputs)
    assert again["trace_hash"] == first["trace_hash"] == compute.trace_hash(first["trace"])
    other = call(env.ctx(), "trove_compute", operation="sum", inputs=inputs, unit="m")
    assert other["result"]["value"] == 5800 and other["trace_hash"] != first["trace_hash"]


@given(a=st.dates(date(1990, 1, 1), date(2060, 1, 1)), b=st.dates(date(1990, 1, 1),
                                                                  date(2060, 1, 1)))
def test_date_diff_matches_the_calendar(a, b):
    rows = {1: f"It started on {a.isoformat()}.", 2: f"It ended on {b:%B} {b.day}, {b.year}."}

    def load(i):
        return {"store_id": i, "content": rows[i], "content_format": "text", "role": "user",
                "session_id": "A", "created_at": MAR5, "message_at": None}
    inputs = [{"store_id": i, "quote": rows[i]} for i in (1, 2)]
    out = compute.compute("date_diff", inputs, load)
    assert out["result"]["value"] == (b - a).days
    months = compute.compute("date_diff", inputs, load, unit="months")["result"]
    low, high = sorted((a, b))
    assert values.add_months(low, abs(months["value"])) <= high
    assert values.add_months(low, abs(months["value"]) + 1) > high


@pytest.mark.parametrize("quote, expected", [
    ("two weeks ago", "2026-02-19"), ("3 days ago", "2026-03-02"), ("yesterday", "2026-03-04"),
    ("on the 14th", "2026-02-14"), ("on the 2nd", "2026-03-02"), ("March 14", "2025-03-14"),
    ("next Friday", "2026-03-06"), ("last Thursday", "2026-02-26"), ("14 March 2026", "2026-03-14"),
    ("a month ago", "2026-02-05"), ("13/04/2026", "2026-04-13"),
])
def test_relative_and_absolute_dates(quote, expected):
    assert values.one_date(quote, MAR5).day.isoformat() == expected


def test_may_the_verb_is_not_a_date():
    assert values.find_dates("Option 4 may help, and it may 2x the speed.", MAR5) == []
    assert values.one_date("We met on May 4.", MAR5).day.isoformat() == "2025-05-04"
    assert values.one_date("the 4th of may", MAR5).day.isoformat() == "2025-05-04"


def test_a_29_february_without_a_year_is_the_latest_leap_day():
    """No 29 February in 2026 or 2025: the latest one not after the said day is 2024's
    (it was taken as no date at all, since only the said year and the one before were tried)."""
    assert values.one_date("Our anniversary party was on Feb 29", MAR5).day == date(2024, 2, 29)
    leap = datetime(2028, 2, 29, 12, tzinfo=timezone.utc).timestamp()
    assert values.one_date("the 29th of February", leap).day == date(2028, 2, 29)
    later = datetime(2104, 2, 28, 12, tzinfo=timezone.utc).timestamp()   # 2100 is not leap
    assert values.one_date("Feb 29", later).day == date(2096, 2, 29)
    with pytest.raises(ValueError, match="no date"):
        values.one_date("due April 31", MAR5)                          # no year has one


def test_an_iso_timestamp_states_its_date():
    """The "T" of "2026-01-10T09:30:00Z" made the ISO date no date at all."""
    assert values.one_date("The deploy ran at 2026-01-10T09:30:00Z", MAR5).day == \
        date(2026, 1, 10)
    assert values.one_date("at 2026-01-10T23:59+05:00", MAR5).day == date(2026, 1, 10)
    assert values.find_amounts("The deploy ran at 2026-01-10T09:30:00Z") == []


def test_leap_days_and_timestamps_reach_the_pack_and_compute(env):
    party = said(env, "A", "Our anniversary party was on Feb 29.", MAR5)
    moved = said(env, "A", "I moved on 2025-06-01.", MAR5)
    deploy = said(env, "A", "The deploy ran at 2026-01-10T09:30:00Z.", MAR5)
    rollback = said(env, "A", "The rollback ran on 2026-02-01.", MAR5)
    pack = call(env.ctx(), "trove_evidence_pack", refs=[
        ref_to(env, party, "party was on Feb 29"), ref_to(env, deploy, "2026-01-10T09:30:00Z")])
    assert [i["happened"]["date"] for i in pack["items"]] == ["2024-02-29", "2026-01-10"]
    diff = call(env.ctx(), "trove_compute", operation="date_diff", inputs=[
        ref_to(env, party, "party was on Feb 29"), ref_to(env, moved, "2025-06-01")])
    assert diff["result"]["value"] == 458
    latest = call(env.ctx(), "trove_compute", operation="latest", inputs=[
        ref_to(env, deploy, "The deploy ran at 2026-01-10T09:30:00Z."),
        ref_to(env, rollback, "The rollback ran on 2026-02-01.")])
    assert latest["result"]["value"] == "The rollback ran on 2026-02-01."


@pytest.mark.parametrize("quote, fragment", [
    ("03/04/2026", "ambiguous"), ("last week", "period"), ("no date here", "no date"),
    ("2026-02-30", "not a real"), ("on 2026-01-01 and 2026-01-02", "more than one"),
])
def test_dates_fail_closed(quote, fragment):
    with pytest.raises(ValueError, match=fragment):
        values.one_date(quote, MAR5)


@pytest.mark.parametrize("quote, fragment", [
    ("it weighs 3 pounds", "pounds"), ("$5 and $6", "more than one"), ("nothing", "no amount"),
])
def test_amounts_fail_closed(quote, fragment):
    with pytest.raises(ValueError, match=fragment):
        values.one_amount(quote)


# ---------------------------------------------------------------- compile
def test_compile_marks_claims_and_sufficiency(env, life):
    hotel, train = ref_to(env, life["hotel"], "$420"), ref_to(env, life["train"], "$85.50")
    hotel_sentence = ref_to(env, life["hotel"], "The hotel for the trip cost $420 for three "
                            "nights.")
    proposal = {"question": "How much did the trip cost?",
                "claims": [{"text": "The hotel cost $420", "refs": [hotel_sentence]},
                           {"text": "Train tickets were $85.50", "refs": [
                               ref_to(env, life["train"], "Train tickets were $85.50")]}],
                "computation": {"operation": "sum", "inputs": [hotel, train]}}
    out = call(env.ctx(), "trove_compile_evidence", proposal=proposal)
    assert out["sufficiency"] == "sufficient" and all(c["supported"] for c in out["claims"])
    assert out["computation"]["result"]["value"] == 505.5

    proposal["claims"][0]["text"] = "The hotel cost $450"
    out = call(env.ctx(), "trove_compile_evidence", proposal=proposal)
    assert out["sufficiency"] == "insufficient" and not out["claims"][0]["supported"]
    assert "450" in out["claims"][0]["reasons"][0]

    unrelated = {"question": "q", "claims": [{"text": "The train was delayed by strikes",
                                             "refs": [hotel_sentence]}]}
    out = call(env.ctx(), "trove_compile_evidence", proposal=unrelated)
    assert out["sufficiency"] == "insufficient"


@pytest.mark.parametrize("quote, claim, supported, fragment", [
    ("We did NOT choose Postgres.", "We chose Postgres", False, "negate"),
    ("We didn't choose Postgres.", "We chose Postgres", False, "negate"),
    ("We never chose Postgres.", "We chose Postgres", False, "negate"),
    ("We chose Postgres.", "We did not choose Postgres", False, "claim negates"),
    ("Maybe we will choose Postgres next year.", "We will choose Postgres next year", False,
     "do not assert"),
    ("Should we choose Postgres?", "We should choose Postgres", False, "a question"),
    ("We did not choose Postgres.", "We did not choose Postgres", True, None),
    ("We chose Postgres.", "We chose Postgres", True, None),
    ("We chose Postgres.", "We probably chose Postgres", True, None),
    ("No, we chose Postgres in May.", "We chose Postgres in May", True, None),
])
def test_a_denial_a_hedge_or_a_question_never_supports_a_statement(env, quote, claim,
                                                                   supported, fragment):
    sid = said(env, "A", quote, MAR5)
    out = call(env.ctx(), "trove_compile_evidence", proposal={"question": "db?", "claims": [
        {"text": claim, "refs": [{"store_id": sid, "quote": quote}]}]})
    checked = out["claims"][0]
    assert checked["supported"] is supported
    assert out["sufficiency"] == ("sufficient" if supported else "insufficient")
    if fragment:
        assert fragment in " ".join(checked["reasons"])


def test_a_narrower_quote_supports_the_clause_it_states(env):
    sid = said(env, "A", "We did not choose Postgres; we chose MySQL.", MAR5)
    whole = {"store_id": sid, "quote": "We did not choose Postgres; we chose MySQL."}
    out = call(env.ctx(), "trove_compile_evidence", proposal={"question": "db?", "claims": [
        {"text": "We chose MySQL", "refs": [whole]},
        {"text": "We chose MySQL", "refs": [{"store_id": sid, "quote": "we chose MySQL"}]}]})
    assert [c["supported"] for c in out["claims"]] == [False, True]


def test_compile_sees_conflicts_and_failed_computations(env, life):
    a = said(env, "A", "My rent is $1200 a month.", MAR5)
    b = said(env, "A", "My rent is $1350 a month.", MAR5 + DAY)
    claims = [{"text": "My rent is $1200 a month", "refs": [ref_to(env, a, "My rent is $1200")]},
              {"text": "My rent is $1350 a month", "refs": [ref_to(env, b, "My rent is $1350")]}]
    out = call(env.ctx(), "trove_compile_evidence", proposal={"question": "rent?",
                                                              "claims": claims})
    assert out["sufficiency"] == "conflicting" and "newer" in out["why"]
    failed = call(env.ctx(), "trove_compile_evidence", proposal={
        "question": "total", "claims": claims[:1],
        "computation": {"operation": "sum", "inputs": [ref_to(env, life["hotel"], "$420"),
                                                       ref_to(env, life["euro"], "30 EUR")]}})
    assert failed["sufficiency"] == "insufficient" and "incompatible" in failed["why"]


def test_claims_compare_every_digit_of_their_numbers(env):
    """Numbers were compared to six significant digits: $1,234,568 was "in" a quote of
    $1,234,567, and claims of $1,234,567 and $1,234,571 did not conflict."""
    first = said(env, "A", "The house sold for $1,234,567 in the end.", MAR5)
    second = said(env, "A", "Sorry: the house sold for $1,234,571.", MAR5 + DAY)
    sold = ref_to(env, first, "The house sold for $1,234,567")
    off = call(env.ctx(), "trove_compile_evidence", proposal={"question": "price?", "claims": [
        {"text": "The house sold for $1,234,568", "refs": [sold]}]})
    assert not off["claims"][0]["supported"] and "1234568" in off["claims"][0]["reasons"][0]
    both = call(env.ctx(), "trove_compile_evidence", proposal={"question": "price?", "claims": [
        {"text": "The house sold for $1,234,567", "refs": [sold]},
        {"text": "The house sold for $1,234,571",
         "refs": [ref_to(env, second, "the house sold for $1,234,571")]}]})
    assert [c["supported"] for c in both["claims"]] == [True, True]
    assert both["sufficiency"] == "conflicting"


def test_unbound_and_bad_arguments_are_clear(env, life):
    assert call(env.ctx(session_id=None), "trove_compute", operation="sum",
                inputs=[{}])["unbound"]
    assert "list of objects" in call(env.ctx(), "trove_evidence_pack", refs=[1, 2])["error"]
    assert "must be one of" in call(env.ctx(), "trove_compute", operation="median",
                                    inputs=[{}])["error"]
    assert "proposal must be" in call(env.ctx(), "trove_compile_evidence",
                                      proposal=json.dumps({"x": 1}))["error"]


@pytest.mark.parametrize("seed", range(6))
def test_generated_worlds_are_answered_exactly_through_the_dispatcher(tmp_path, seed):
    """The bench's worlds (relative dates on), a few seeds: grep -> pack -> compute."""
    import evidencekit as ek
    world = ek.make_world(seed)
    env = Env(tmp_path)
    try:
        for message in world.messages:
            env.store.ensure_session(message.session, source="cli")
            Owners(env.db).record(message.session, LOCAL_OWNER)   # the profile's CLI user
            env.ingest(message.session, [{"role": "user", "content": message.text}],
                       at=message.at)

        def tool(name, args):
            return call(env.ctx("s0"), name, **args)
        for question in world.questions:
            got = ek.answer(question, tool, {"session_scope": "all"})
            assert ek.correct(question, got), (question.operation, question.expected, got)
    finally:
        env.db.close()


@given(cents=st.integers(0, 10**9), form=st.sampled_from(
    ["${:,.2f}", "{:,.2f} USD", "USD {:,.2f}", "€{:,.2f}", "{:,.2f} euros", "£{:,.2f}"]),
    words=st.sampled_from(["It cost {}.", "{} in total", "paid {} for it"]))
def test_written_amounts_parse_back_exactly(cents, form, words):
    text = form.format(cents / 100)
    amount = values.one_amount(words.format(text))
    assert round(amount.value * 100) == cents and amount.text == text
    code = {"$": "USD", "€": "EUR", "£": "GBP"}.get(form[0]) or ("EUR" if "euro" in form
                                                                  else "USD")
    assert amount.unit.dimension == f"currency:{code}"


# ---------------------------------------------------------------- issue 25: signs, zones
def test_minus_signs_are_kept_through_the_dispatcher(env):
    loss = said(env, "A", "We lost -$40 on the first bet.", MAR5)
    gain = said(env, "A", "Then we won $25 back.", MAR5 + 60)
    diff = call(env.ctx(), "trove_compute", operation="difference",
                inputs=[ref_to(env, loss, "-$40"), ref_to(env, gain, "$25")])
    assert diff["result"]["value"] == 65 and diff["trace"]["parsed"][0]["value"] == -40
    scale = said(env, "A", "The scale was off by -3 kg, then I gained 5 kg.", MAR5)
    total = call(env.ctx(), "trove_compute", operation="sum",
                 inputs=[ref_to(env, scale, "-3 kg"), ref_to(env, scale, "5 kg")])
    assert total["result"] == {"value": 2, "unit": "kg", "count": 2}


@pytest.mark.parametrize("quote, value", [
    ("balance: −12.5 EUR", -12.5), ("USD -7", -7), ("$-3", -3), ("it fell to -4", -4),
    ("pages 3-5 kg", 5), ("room 12-b", None),
])
def test_a_sign_counts_only_where_it_cannot_be_a_hyphen(quote, value):
    found = values.find_amounts(quote)
    assert [a.value for a in found][-1:] == ([] if value is None else [value])


@pytest.mark.parametrize("quote, value, unit", [
    ("minus $5", -5, "USD"), ("Minus 5 kg", -5, "kg"), ("-USD 40", -40, "USD"),
    ("–$5", -5, "USD"), ("–5 kg", -5, "kg"), ("$–40", -40, "USD"),      # en dashes
    ("3–5 kg", 5, "kg"), ("- $5", 5, "USD"), ("plus or minus 5 kg", 5, "kg"),
])
def test_a_minus_word_a_sign_before_a_code_and_an_en_dash_are_signs(quote, value, unit):
    """They read as +5, +40 and +5: the sign was dropped (a range or a bullet has none)."""
    amount = values.find_amounts(quote)[-1]
    assert (amount.value, amount.unit.name) == (value, unit)


@pytest.mark.parametrize("quote, value, unit", [
    ("$3 million", 3_000_000, "USD"), ("$5 Million", 5_000_000, "USD"),
    ("$50K a year", 50_000, "USD"), ("$2.01M", 2_010_000, "USD"), ("£3bn", 3e9, "GBP"),
    ("USD 2.5k", 2_500, "USD"), ("3 million euros", 3e6, "EUR"),
    ("it cost 1.5 million.", 1.5e6, ""), ("1.5 billion users", 1.5e9, ""),
    ("a 3m plank", 3, "m"),
])
def test_a_scale_multiplies_the_amount(quote, value, unit):
    """The scale was dropped ("$3 million" was 3 dollars, "$50K" 50). A scale letter counts
    only after a currency ("3m" is metres); 2.01 M is exactly 2,010,000."""
    [amount] = values.find_amounts(quote)
    assert (amount.value, amount.unit.name) == (value, unit)


def test_an_m_after_a_bare_number_is_refused():
    """It read as five metres; without a currency M may be million or metres."""
    with pytest.raises(ValueError, match="million or metres"):
        values.find_amounts("We have 5M users.")


def test_signs_and_scales_sum_through_the_dispatcher(env):
    fees = said(env, "A", "The fee was -USD 40, the rebate minus $5, the deposit $100.", MAR5)
    deals = said(env, "A", "The grant was $3 million and the loan $500,000.", MAR5)
    deposit = ref_to(env, fees, "$100")
    fee = call(env.ctx(), "trove_compute", operation="sum",
               inputs=[ref_to(env, fees, "-USD 40"), deposit])
    rebate = call(env.ctx(), "trove_compute", operation="sum",
                  inputs=[ref_to(env, fees, "minus $5"), deposit])
    assert (fee["result"]["value"], rebate["result"]["value"]) == (60, 95)
    total = call(env.ctx(), "trove_compute", operation="sum", inputs=[
        ref_to(env, deals, "$3 million"), ref_to(env, deals, "$500,000")])
    assert total["result"] == {"value": 3_500_000, "unit": "USD", "count": 2}


@pytest.mark.parametrize("quote, expected", [
    ("In the end we were 40.", [40]), ("There were 40, then 12 more.", [40, 12]),
    ("We had 1,200.", [1200]), ("It came to 40.5.", [40.5]), ("Pay 40!", [40]),
    ("1. Buy milk", []), ("  2) Call Ana", []), ("notes:\n3. call", []),
    ("version 3.2.1", []), ("a 3,4 b", []),
])
def test_a_bare_number_may_end_a_sentence_but_a_list_marker_is_none(quote, expected):
    assert [a.value for a in values.find_amounts(quote)] == expected


def test_counts_ending_sentences_sum_and_support_claims(env):
    a = said(env, "A", "At the first party we were 40.", MAR5)
    b = said(env, "A", "At the second one, 12.", MAR5)
    total = call(env.ctx(), "trove_compute", operation="sum",
                 inputs=[ref_to(env, a, "we were 40."), ref_to(env, b, "12.")])
    assert total["result"] == {"value": 52, "unit": "", "count": 2}
    out = call(env.ctx(), "trove_compile_evidence", proposal={"question": "q", "claims": [
        {"text": "At the first party we were 40", "refs": [ref_to(env, a, "At the first "
                                                              "party we were 40.")]}]})
    assert out["claims"][0]["supported"], out["claims"][0]


@pytest.mark.parametrize("quote", ["it cost $10.5.3", "USD 10.5.3 total", "paid €1,2.3"])
def test_malformed_numbers_fail_closed(quote):
    with pytest.raises(ValueError):
        values.one_amount(quote)


def test_relative_dates_resolve_in_the_configured_zone(tmp_path):
    """08:30 on 03-15 in Tokyo is 23:30 on 03-14 UTC: "yesterday" is 03-14, not 03-13."""
    env = Env(tmp_path, timezone="Asia/Tokyo")
    said_at = datetime(2026, 3, 14, 23, 30, tzinfo=timezone.utc).timestamp()
    yesterday = said(env, "A", "I renewed the passport yesterday.", said_at)
    fixed = said(env, "A", "The visa was granted on 2026-03-20.", said_at)
    pack = call(env.ctx(), "trove_evidence_pack",
                refs=[ref_to(env, yesterday, "I renewed the passport yesterday.")])
    assert pack["items"][0]["happened"]["date"] == "2026-03-14"
    diff = call(env.ctx(), "trove_compute", operation="date_diff",
                inputs=[ref_to(env, yesterday, "I renewed the passport yesterday."),
                        ref_to(env, fixed, "2026-03-20")])
    assert diff["result"]["days"] == 6
    utc = Env(tmp_path / "utc")
    again = said(utc, "A", "I renewed the passport yesterday.", said_at)
    out = call(utc.ctx(), "trove_evidence_pack",
               refs=[ref_to(utc, again, "I renewed the passport yesterday.")])
    assert out["items"][0]["happened"]["date"] == "2026-03-13"   # UTC's own day
    env.db.close()
    utc.db.close()


def test_an_empty_piece_hands_out_no_exact_ref(env):
    """An exact ref with an empty quote supports nothing: an empty message, an offset at the
    end of the text and a tool-calls-only message get no ref, with the reason instead."""
    text = "We moved on 2026-01-10."
    sid = said(env, "A", text, MAR5)
    empty = env.ingest("A", [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}],
        at=MAR5)[0]
    for args in ({"store_id": sid, "content_offset": len(text)},
                 {"store_id": empty}):
        message = call(env.ctx(), "trove_expand", include_exact_ref=True, **args)["message"]
        assert "exact_ref" not in message and "empty" in message["exact_ref_omitted"]
    page = call(env.ctx(), "trove_load_session", include_exact_ref=True)["messages"]
    by_id = {m["store_id"]: m for m in page}
    assert "exact_ref" not in by_id[empty] and by_id[empty]["exact_ref_omitted"]
    assert by_id[sid]["exact_ref"]["quote"] == text
    for item in page:
        if "exact_ref" in item:
            assert item["exact_ref"]["quote"]


def test_a_quote_too_big_for_the_cap_fails_only_its_own_item(tmp_path, backend):
    """A pack item whose quote alone cannot fit the response cap is a per-item error; the
    other refs of the page still verify (it failed the whole call)."""
    env = Env(tmp_path, backend[1], tool_response_max_tokens=300)
    try:
        long_text = " ".join(f"word{i} paid $5." for i in range(200))
        big, small = said(env, "A", long_text, MAR5), said(env, "A", "The fee was $12.", MAR5)
        refs_in = [ref_to(env, big, long_text[:1900]), ref_to(env, small, "The fee was $12.")]
        out = call(env.ctx(), "trove_evidence_pack", refs=refs_in)
        assert "error" not in out, out
        first = out["items"][0]
        assert first["ok"] is False and "response cap" in first["error"]
        assert first["store_id"] == big and out["failed"] >= 1
        assert [i["ok"] for i in out["items"]] == [False, True] and out["verified"] == 1
    finally:
        database.forget_database(backend[1])


def test_a_stored_assertion_quote_too_big_for_the_cap_fails_only_that_value(tmp_path,
                                                                           backend):
    """A model assertion's quote (up to 2,000 characters) that alone cannot fit the response
    cap is reported on that value, offsets kept; the other subjects still come back."""
    from hermes_trove.evidence import assertions
    env = Env(tmp_path, backend[1], tool_response_max_tokens=300, assertions_enabled="true")
    try:
        long_text = "My plan is " + " ".join(f"step{i} then" for i in range(300)) + " rest."
        small = said(env, "A", "My car is red.", MAR5)
        big = said(env, "A", long_text, MAR5 + DAY)     # the newest: listed first
        rows = [env.store.get_message(big), env.store.get_message(small)]
        answer = json.dumps([
            {"id": big, "kind": "fact", "subject": "plan", "value": "many steps",
             "quote": long_text[:1900]},
            {"id": small, "kind": "fact", "subject": "car", "value": "red",
             "quote": "My car is red."}])
        found = assertions.from_model(rows, lambda *a: answer, None, 1.0)
        assert assertions.save(env.db, "A", found, big) == 2
        out = call(env.ctx(), "trove_query_state")
        assert "error" not in out, out
        by_subject = {a["subject"]: a for a in out["assertions"]}
        assert by_subject["car"]["current"]["ref"]["quote"] == "My car is red."
        plan = by_subject["plan"]["current"]
        assert "quote" not in plan["ref"] and "response cap" in plan["ref_error"]
        assert (plan["ref"]["store_id"], plan["ref"]["start"], plan["ref"]["end"]) == (big, 0, 1900)
    finally:
        database.forget_database(backend[1])


@pytest.mark.parametrize("quote,cue", [
    ("We did not pay $300 for the hotel.", "negates"),
    ("Maybe the hotel will cost $300.", "hedges"),
    ("Will the hotel cost $300?", "asks"),
])
def test_a_quote_that_negates_hedges_or_asks_is_flagged_and_never_computed(env, quote, cue):
    """The pack says per item when its quote does not assert (evidence/polarity.py), and
    compute never counts such a quote as a plain value (it summed "did not pay $300")."""
    plain = said(env, "A", "The train cost $50.", MAR5)
    other = said(env, "A", quote, MAR5 + DAY)
    refs_in = [ref_to(env, plain, "The train cost $50."), ref_to(env, other, quote)]
    items = call(env.ctx(), "trove_evidence_pack", refs=refs_in)["items"]
    assert "polarity" not in items[0]
    assert items[1]["ok"] and any(c.startswith(cue) for c in items[1]["polarity"])
    out = call(env.ctx(), "trove_compute", operation="sum", inputs=refs_in)
    assert "error" in out and "input 1" in out["error"] and cue in out["error"]
    assert "result" not in out
    assert call(env.ctx(), "trove_compute", operation="sum", inputs=refs_in[:1])["result"][
        "value"] == 50


@pytest.mark.parametrize("quote,value,total", [
    ("We paid $40 for the taxi, not bad.", None, 90),
    ("No, the taxi cost $40.", None, 90),
    ("We did not pay $300 for the taxi, we paid $40.", "$40", 90),
    ("We did not pay $300 for the taxi, we paid $40.", "$300", None),
    ("I don't think the taxi cost $40.", None, None),
    ("The taxi cost $40, if I remember right.", None, None),
    ("Did the taxi cost $40, or more?", None, None),
])
def test_compute_reads_polarity_in_the_clause_that_states_the_value(env, quote, value, total):
    """A "not" or "no" of another clause is not about the amount (compute refused "We paid
    $40, not bad"); a denial in the value's own clause, or a hedge or question anywhere in
    its sentence, still fails closed."""
    plain = said(env, "A", "The train cost $50.", MAR5)
    other = said(env, "A", quote, MAR5 + DAY)
    refs_in = [ref_to(env, plain, "The train cost $50."),
               ref_to(env, other, quote, **({"value": value} if value else {}))]
    out = call(env.ctx(), "trove_compute", operation="sum", inputs=refs_in)
    if total is None:
        assert "result" not in out and "input 1" in out["error"], out
    else:
        assert out.get("result", {}).get("value") == total, out


def test_query_state_covers_the_rows_carried_into_this_session(tmp_path, backend):
    """Rows under nodes carried into a session count as the session's (Access.carried, as
    trove_grep and trove_expand read them): their assertions are in query_state's default
    scope; a row of the old session that was not carried stays out."""
    from hermes_trove.evidence import assertions
    env = Env(tmp_path, backend[1], assertions_enabled="true")
    try:
        carried = said(env, "A", "My address is 12 Rua Augusta.", MAR5)
        left = said(env, "A", "My car is red.", MAR5 + DAY)
        rows = [env.store.get_message(carried), env.store.get_message(left)]
        assertions.save(env.db, "A", [a for r in rows for a in assertions.deterministic(r)],
                        left)
        leaf = env.node("A", "Summary: address 12 Rua Augusta.", store_ids=[carried])
        env.store.ensure_session("C")
        Owners(env.db).record("C", LOCAL_OWNER)
        env.dag.carry_nodes("C", [leaf])
        out = call(env.ctx("C"), "trove_query_state")["assertions"]
        assert [(a["subject"], a["current"]["ref"]["store_id"]) for a in out] == [
            ("address", carried)]
        assert call(env.ctx("C"), "trove_expand", store_id=carried)["message"]["content"]
        assert call(env.ctx("B"), "trove_query_state")["assertions"] == []
    finally:
        database.forget_database(backend[1])


def test_a_ref_into_a_row_rewritten_by_transcript_gc(env):
    """Transcript GC swaps a tool row's text for its payload placeholder (same store_id).
    A ref made before that still resolves while the payload holds the original; once the
    original is gone the answer says the row was rewritten, not a bare 'not found'."""
    from hermes_trove.storage import payloads as pl
    store = pl.PayloadStore(env.tmp / "payloads")
    log = "\n".join(f"line {i}: step {i} ok" for i in range(400)) + "\nTotal cost: $1,234.\n" \
        + "\n".join(f"tail {i}" for i in range(200))
    sid = env.ingest("A", [{"role": "tool", "content": log, "tool_call_id": "c1"}], at=MAR5)[0]
    quote = "Total cost: $1,234."
    ref = ref_to(env, sid, quote)
    ref_plain = {"store_id": sid, "quote": quote}
    put = store.put(pl.encode_text(log), kind=pl.KIND_TOOL_OUTPUT, mime="text/plain")
    assert env.store.replace_with_placeholder(sid, log, pl.tool_output_placeholder(log, put.ref))
    assert quote not in env.store.get_message(sid)["content"]
    ctx = env.ctx(payloads=store)
    item = call(ctx, "trove_evidence_pack", refs=[ref, ref_plain])["items"]
    assert [i["ok"] for i in item] == [True, True], item
    assert item[0]["ref"] == ref and item[0]["after"].startswith("\ntail 0")
    assert "transcript GC" in item[0]["text_source"]
    assert call(ctx, "trove_compute", operation="sum", inputs=[ref])["result"]["value"] == 1234
    store.path_of(put.ref).unlink()
    for raw in (ref, ref_plain):
        failed = call(ctx, "trove_evidence_pack", refs=[raw])["items"][0]
        assert not failed["ok"] and "transcript GC" in failed["error"], failed
        assert put.ref in failed["error"]
