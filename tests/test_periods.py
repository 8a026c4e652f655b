"""recall/periods.py and storage/timekeys.py: natural periods resolve to the right window."""
from datetime import date, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings, strategies as st

from hermes_trove.recall import periods
from hermes_trove.storage import timekeys

UTC = timezone.utc
PARIS = timekeys.zone("Europe/Paris")
# Wednesday 2026-03-18 15:30 UTC
NOW = datetime(2026, 3, 18, 15, 30, tzinfo=UTC).timestamp()


def ts(*parts, tz=UTC) -> float:
    return datetime(*parts, tzinfo=tz).timestamp()


def window(text, now=NOW, tz=UTC):
    found = periods.resolve(text, now, tz)
    return found.start, found.end


@pytest.mark.parametrize("text, start, end", [
    ("today", ts(2026, 3, 18), ts(2026, 3, 19)),
    ("", ts(2026, 3, 18), ts(2026, 3, 19)),
    ("yesterday", ts(2026, 3, 17), ts(2026, 3, 18)),
    ("this week", ts(2026, 3, 16), ts(2026, 3, 23)),
    ("last week", ts(2026, 3, 9), ts(2026, 3, 16)),
    ("This   Month", ts(2026, 3, 1), ts(2026, 4, 1)),
    ("last month", ts(2026, 2, 1), ts(2026, 3, 1)),
    ("last year", ts(2025, 1, 1), ts(2026, 1, 1)),
    ("monday", ts(2026, 3, 16), ts(2026, 3, 17)),
    ("wednesday", ts(2026, 3, 18), ts(2026, 3, 19)),        # today is a Wednesday
    ("last wednesday", ts(2026, 3, 11), ts(2026, 3, 12)),
    ("last friday", ts(2026, 3, 13), ts(2026, 3, 14)),
    ("this friday", ts(2026, 3, 20), ts(2026, 3, 21)),
    ("march", ts(2026, 3, 1), ts(2026, 4, 1)),
    ("last march", ts(2025, 3, 1), ts(2025, 4, 1)),
    ("april", ts(2025, 4, 1), ts(2025, 5, 1)),                # not yet this year
    ("March 2026", ts(2026, 3, 1), ts(2026, 4, 1)),
    ("dec 2025", ts(2025, 12, 1), ts(2026, 1, 1)),
    ("2026-03-14", ts(2026, 3, 14), ts(2026, 3, 15)),
    ("2026-03", ts(2026, 3, 1), ts(2026, 4, 1)),
    ("2025", ts(2025, 1, 1), ts(2026, 1, 1)),
    ("2026-W11", ts(2026, 3, 9), ts(2026, 3, 16)),
    ("2026-03-01..2026-03-15", ts(2026, 3, 1), ts(2026, 3, 16)),
    ("monday..yesterday", ts(2026, 3, 16), ts(2026, 3, 18)),
    ("last 3 days", NOW - 3 * 86400, NOW + 1),
    ("past 2 weeks", NOW - 14 * 86400, NOW + 1),
    ("last 6h", NOW - 6 * 3600, NOW + 1),
    ("last 24h", NOW - 86400, NOW + 1),
    ("last 2 months", ts(2026, 1, 18, 15, 30), NOW + 1),
    ("2026-03-18T09:00", ts(2026, 3, 18, 9), NOW + 1),
])
def test_examples_in_utc(text, start, end):
    assert window(text) == (start, end)


def test_calendar_periods_carry_their_rollup_key():
    assert periods.resolve("yesterday", NOW, UTC).key == "2026-03-17"
    assert periods.resolve("last week", NOW, UTC).key == "2026-W11"
    assert periods.resolve("march", NOW, UTC).key == "2026-03"
    assert periods.resolve("last 3 days", NOW, UTC).key is None


def test_time_zone_moves_the_day_and_follows_dst():
    # 2026-03-29 is the spring DST change in Paris: the day has 23 hours
    start, end = window("2026-03-29", tz=PARIS)
    assert start == ts(2026, 3, 28, 23) and end - start == 23 * 3600
    late = datetime(2026, 3, 18, 23, 30, tzinfo=UTC).timestamp()   # already the 19th in Paris
    assert window("today", now=late, tz=PARIS)[0] == ts(2026, 3, 19, tz=PARIS)
    assert window("2026-03-18T09:00", tz=PARIS)[0] == ts(2026, 3, 18, 9, tz=PARIS)


@pytest.mark.parametrize("text", [
    "someday", "last 999999999999 days", "last 0 days", "last 5 parsecs", "2026-13-01",
    "2026-02-30", "2026-W60", "0001-01-01", "99999-01-01", "2026-03-15..2026-03-01", "..today",
    "x" * 200, "1e400", "nan", "march 20261",
])
def test_bad_or_absurd_periods_get_a_clear_error(text):
    with pytest.raises(ValueError) as info:
        periods.resolve(text, NOW, UTC)
    assert "OSError" not in str(info.value) and str(info.value)


def test_search_window_combines_period_and_bounds():
    assert periods.window("last week", None, None, NOW, UTC) == (ts(2026, 3, 9), ts(2026, 3, 16))
    assert periods.window(None, "last monday", "yesterday", NOW, UTC) == (
        ts(2026, 3, 16), ts(2026, 3, 18))
    assert periods.window("this month", "2026-03-10T12:00", None, NOW, UTC) == (
        ts(2026, 3, 10, 12), ts(2026, 4, 1))
    assert periods.window(None, 1_000_000_000, None, NOW, UTC) == (1e9, None)
    assert periods.window(None, None, None, NOW, UTC) == (None, None)
    with pytest.raises(ValueError):
        periods.window("yesterday", "today", None, NOW, UTC)


def test_a_range_ending_at_a_time_ends_there():
    # as time_to bounds at an instant: an hour is an hour, not "from 09:00 until now"
    nine, ten = ts(2026, 3, 14, 9), ts(2026, 3, 14, 10)
    assert window("2026-03-14T09:00..2026-03-14T10:00") == (nine, ten)
    assert window(f"{nine:.0f}..{ten:.0f}") == (nine, ten)
    assert periods.window(None, "2026-03-14T09:00", "2026-03-14T10:00", NOW, UTC) == (nine, ten)
    assert window("2026-03-14T09:00..2026-03-14") == (nine, ts(2026, 3, 15))   # a day: its end
    with pytest.raises(ValueError):
        window("2026-03-14T10:00..2026-03-14T09:00")


def test_month_children_stay_inside_the_month():
    children = timekeys.children_of("month", "2026-03")
    # March 2026 starts on a Sunday: day 1, then weeks 10..13, then 30 and 31
    assert children[0] == ("day", "2026-03-01")
    assert [k for kind, k in children if kind == "week"] == [
        "2026-W10", "2026-W11", "2026-W12", "2026-W13"]
    assert children[-2:] == [("day", "2026-03-30"), ("day", "2026-03-31")]
    days = set()
    for kind, key in children:
        days.update(timekeys.days_of(kind, key))
    assert days == set(timekeys.days_of("month", "2026-03"))


ZONES = st.sampled_from([UTC, PARIS, timekeys.zone("America/New_York"),
                         timekeys.zone("Asia/Kathmandu"), timekeys.zone("Pacific/Chatham")])
MOMENTS = st.floats(min_value=86400 * 400, max_value=ts(2090, 1, 1))
NAMES = st.sampled_from(["today", "yesterday", "this week", "last week", "this month",
                         "last month", "monday", "last sunday", "this saturday", "march",
                         "last december", "this year"])


@settings(max_examples=300, deadline=None)
@given(now=MOMENTS, tz=ZONES, name=NAMES)
def test_calendar_names_are_whole_local_periods(now, tz, name):
    found = periods.resolve(name, now, tz)
    for edge in (found.start, found.end):   # each edge is the first instant of a local day
        # (usually midnight; 00:15 where a zone skipped its midnight, as Kathmandu in 1986)
        assert timekeys.local_date(edge, tz) != timekeys.local_date(edge - 1, tz)
    assert found.end > found.start
    if name in ("today", "this week", "this month", "this year"):
        assert found.start <= now < found.end
    else:
        assert found.start <= now or name == "this saturday"
    if found.kind:
        assert (found.start, found.end) == timekeys.bounds(found.kind, found.key, tz)


@settings(max_examples=300, deadline=None)
@given(now=MOMENTS, tz=ZONES, count=st.integers(1, 5000),
       unit=st.sampled_from(["minutes", "hours", "days", "weeks", "months"]))
def test_rolling_periods_end_now(now, tz, count, unit):
    try:
        found = periods.resolve(f"last {count} {unit}", now, tz)
    except ValueError as exc:       # only for absurd lengths
        assert "100 years" in str(exc) or "outside" in str(exc)
        return
    assert found.end == now + 1.0 and found.start < now


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40), now=MOMENTS, tz=ZONES)
def test_any_text_resolves_or_raises_value_error(text, now, tz):
    try:
        found = periods.resolve(text, now, tz)
    except ValueError:
        return
    assert found.end > found.start


@settings(max_examples=200, deadline=None)
@given(day=st.dates(min_value=datetime(1971, 1, 1).date(),
                    max_value=datetime(2090, 1, 1).date()), tz=ZONES)
def test_days_tile_weeks_and_months(day, tz):
    for kind in ("week", "month"):
        key = timekeys.key_of(kind, day)
        start, end = timekeys.bounds(kind, key, tz)
        days = timekeys.days_of(kind, key)
        assert day in days
        assert timekeys.bounds("day", days[0].isoformat(), tz)[0] == start
        assert timekeys.bounds("day", days[-1].isoformat(), tz)[1] == end
        assert all(timekeys.bounds("day", a.isoformat(), tz)[1]
                   == timekeys.bounds("day", b.isoformat(), tz)[0]
                   for a, b in zip(days, days[1:]))
    assert timekeys.local_date(timekeys.midnight(day, tz) + 1, tz) == day
    assert day - timedelta(days=day.weekday()) == timekeys.week_monday(day)


def test_an_instant_just_before_midnight_belongs_to_its_own_day():
    # fromtimestamp rounds 23:59:59.9999995 up to the next day; the day must not move
    found = periods.resolve("today", 1893455999.9999995, UTC)
    assert found.key == "2029-12-31" and found.start <= 1893455999.9999995 < found.end


@pytest.mark.parametrize("text, key, rest", [
    ("On May 5, 2018: where did we eat?", "2018-05-05", ": where did we eat?"),
    ("what did I say on the 3rd of March 2019", "2019-03-03", "what did I say on the"),
    ("notes from 2026-03-14 please", "2026-03-14", "notes from please"),
    ("what did we decide last week", "last week", "what did we decide"),
    ("the trip in march", "in march", "the trip"),
])
def test_date_phrases_inside_a_question(text, key, rest):
    found = periods.mentioned(text, NOW, UTC)
    assert found is not None
    period, remaining = found
    assert key in (period.key, period.label)
    assert " ".join(remaining.split()) == rest


@pytest.mark.parametrize("text, key, rest", [
    ("what happened in March 2026?", "2026-03", "what happened ?"),
    ("in may 2025 we met", "2025-05", "we met"),
    ("last march 2025 we moved", "2025-03", "we moved"),
])
def test_a_month_with_its_year_inside_a_question(text, key, rest):
    # "in|last <month> <year>" is one phrase: it must resolve whole, not hide "<month> <year>"
    period, remaining = periods.mentioned(text, NOW, UTC)
    assert period.key == key and " ".join(remaining.split()) == rest


@pytest.mark.parametrize("text, key", [("in march 2026", "2026-03"), ("2026 march", "2026-03"),
                                       ("2026 Mar", "2026-03"), ("last march 2025", "2025-03")])
def test_a_month_with_its_year_in_either_order(text, key):
    # a year before a month name is a month, not 2026 of an unknown unit
    assert periods.resolve(text, NOW, UTC).key == key


@pytest.mark.parametrize("text", ["I may go tomorrow", "what did we decide", "on February 30, "
                                  "2018: nothing", "march on"])
def test_no_date_phrase_is_invented(text):
    assert periods.mentioned(text, NOW, UTC) is None


def test_a_day_without_a_year_is_the_latest_one_not_in_the_future():
    period, _ = periods.mentioned("on December 31 we met", NOW, UTC)
    assert period.end <= NOW + 86400 and period.start > NOW - 366 * 86400


# ---------------------------------------------------------------- message timestamps (issue 25)
TOKYO = timekeys.zone("Asia/Tokyo")
NINE_UTC = datetime(2026, 12, 1, 9, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("value, tz, expected", [
    ("2026-12-01T09:00:00Z", None, NINE_UTC),
    ("2026-12-01T09:00:00+00:00", TOKYO, NINE_UTC),
    ("2026-12-01T10:00:00+01:00", None, NINE_UTC),
    ("2026-12-01T09:00:00", None, NINE_UTC),                 # naive: this process's zone (UTC)
    ("2026-12-01T18:00:00.250", TOKYO, NINE_UTC + 0.25),     # naive: the writer's, Tokyo
    ("2026-12-01 18:00:00", TOKYO, NINE_UTC),
    (NINE_UTC, TOKYO, NINE_UTC), (int(NINE_UTC * 1000), None, NINE_UTC),
    (str(int(NINE_UTC)), None, NINE_UTC), (f"{NINE_UTC * 1000:.0f}", None, NINE_UTC),
    ("Tue, 01 Dec 2026 09:00:00 +0000", TOKYO, NINE_UTC),   # RFC 2822 (mail, HTTP)
    ("Tue, 01 Dec 2026 18:00:00", TOKYO, NINE_UTC),         # ... naive: the writer's zone
    (datetime(2026, 12, 1, 9, tzinfo=timezone.utc), TOKYO, NINE_UTC),   # objects
    (datetime(2026, 12, 1, 18), TOKYO, NINE_UTC),
    (date(2026, 12, 1), None, datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()),
    # an ISO date past 5138 is that date, never epoch milliseconds (it read as 1974)
    ("6000-01-01T00:00:00Z", None, datetime(6000, 1, 1, tzinfo=timezone.utc).timestamp()),
])
def test_message_times_in_every_form_the_host_writes(value, tz, expected, process_zone):
    process_zone("UTC")
    assert timekeys.message_time(value, tz) == pytest.approx(expected)


def test_a_naive_time_is_read_in_its_writers_zone_not_trove_timezone(tmp_path, process_zone):
    """The host writes naive times with ``datetime.now().isoformat()``: its process's
    local zone. They were read in ``TROVE_TIMEZONE`` (the zone trove names days in) on
    the engine's path and in UTC on the import/replay path, so one message had two
    times and neither was the writer's: 18:00 written in Tokyo was 17:00Z or 18:00Z."""
    from enginekit import make_engine
    process_zone("Asia/Tokyo")
    engine = make_engine(tmp_path, timezone="Europe/Paris")
    engine.ingest([{"role": "user", "content": "mirror note", "timestamp": "2026-12-01T18:00:00"}])
    engine.store.ingest("imported", [{"role": "user", "content": "replayed note",
                                      "timestamp": "2026-12-01T18:00:00"}])
    times = {r["content"]: r["message_at"] for s in (engine.canonical_id, "imported")
             for r in engine.store.session_messages(s, 0, 10)}
    assert times == {"mirror note": NINE_UTC, "replayed note": NINE_UTC}


def test_datetime_objects_and_mail_style_times_reach_the_stored_row(tmp_path):
    """A harness or importer building messages in Python passes ``datetime`` objects,
    and mail or HTTP exports hold RFC 2822 times; both were stored with no time, so
    every period read the ingest time instead."""
    from enginekit import make_engine
    engine = make_engine(tmp_path)
    engine.ingest([{"role": "user", "content": "dated", "timestamp": datetime(
                       2026, 12, 1, 9, tzinfo=timezone.utc)},
                   {"role": "assistant", "content": "ok",
                    "timestamp": "Tue, 01 Dec 2026 09:00:05 +0000"}])
    rows = engine.store.session_messages(engine.canonical_id, 0, 10)
    assert [r["message_at"] for r in rows] == [NINE_UTC, NINE_UTC + 5]


@pytest.mark.parametrize("value", [None, True, "", "yesterday", "2026-13-01T00:00:00", 0, "0",
                                   0.0, "1970-01-01T00:00:00Z",
                                   float("nan"), float("inf"), -5e12, "9" * 80, [], {},
                                   "9999-12-31T23:59:59+14:00", "Tue, 99 Foo 2026 25:00:00",
                                   datetime(1970, 1, 1, tzinfo=timezone.utc), date(1, 1, 1),
                                   datetime.max, datetime.min])
def test_impossible_message_times_are_no_time(value):
    """An ISO date past 5138 is a date, never epoch milliseconds: year 9999 read as 1978."""
    assert timekeys.message_time(value) is None
