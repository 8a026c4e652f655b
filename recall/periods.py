"""Natural time periods ("yesterday", "last week", "March", "2026-W11") as time windows.

``resolve(text, now, tz)`` turns what a user or model says into a half-open
``[start, end)`` window of Unix seconds, computed in the configured zone
(``TROVE_TIMEZONE``, default UTC) from an injected ``now`` (never the wall
clock, so tests can freeze time). ``window(...)`` does the same for the
``period`` / ``time_from`` / ``time_to`` arguments of the search tools.
Bad or absurd input raises ``ValueError`` with a message that says what is
accepted; an ``OSError`` or ``OverflowError`` never escapes.

Grammar (case and spacing free):

- ``today``, ``yesterday``; ``this|last week|month|year`` (weeks start Monday)
- ``last|past N minutes|hours|days|weeks|months`` (rolling, up to now), ``last 24h``
- weekday names: ``monday`` (the latest Monday, today included), ``last friday``
  (the latest Friday before today), ``this monday`` (Monday of this week)
- month names: ``march`` (the latest March not in the future), ``last march``,
  ``march 2026`` (also ``2026 march``, ``in march 2026``, ``last march 2025``)
- ISO forms: ``2026-03-14``, ``2026-03``, ``2026``, ``2026-W11``, a time
  (``2026-03-14T09:00``, ``...Z`` or an offset; naive = the zone) meaning
  from then until now, Unix seconds likewise
- a range ``A..B`` of any two of these: from the start of A to the end of B
  (a time as B ends it at that time, as ``time_to`` does)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

from ..storage import timekeys

MAX_SPAN_DAYS = 366 * 100        # a longer window is absurd, not a question about time
_UNITS = {"m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
          "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
          "d": 86400.0, "day": 86400.0, "days": 86400.0,
          "w": 604800.0, "wk": 604800.0, "wks": 604800.0, "week": 604800.0, "weeks": 604800.0}
_MONTH_UNITS = {"mo", "mon", "month", "months"}
_ROLLING = re.compile(r"(?:last|past)\s+(\d{1,12})\s*([a-z]+)")
_WEEKDAYS = {name: i for i, names in enumerate((
    ("monday", "mon"), ("tuesday", "tue", "tues"), ("wednesday", "wed"),
    ("thursday", "thu", "thur", "thurs"), ("friday", "fri"), ("saturday", "sat"),
    ("sunday", "sun"))) for name in names}
_MONTHS = {name: i + 1 for i, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
    ("october", "oct"), ("november", "nov"), ("december", "dec"))) for name in names}
_YEAR = re.compile(r"\d{4}")
_MONTH_KEY = re.compile(r"\d{4}-\d{1,2}")
_DAY_KEY = re.compile(r"\d{4}-\d{1,2}-\d{1,2}")
_WEEK_KEY = re.compile(r"\d{4}-w\d{1,2}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
HELP = ("use today, yesterday, this/last week|month|year, last N hours|days|weeks|months, "
        "a weekday (monday, last friday), a month (march, march 2026), 2026-03-14, 2026-03, "
        "2026-W11, an ISO time, or a range A..B")


@dataclass(frozen=True)
class Period:
    """A resolved window; ``kind``/``key`` name it when it is exactly one calendar
    day, ISO week or month (so a ready rollup can answer it whole)."""

    start: float
    end: float
    label: str
    kind: str | None = None
    key: str | None = None


def resolve(text: object, now: float, tz: tzinfo) -> Period:
    """The ``[start, end)`` window of a natural period; ValueError if unreadable or absurd."""
    label = " ".join(str("today" if text is None else text).strip().lower().split())
    if not label:
        label = "today"
    if len(label) > 80:
        raise ValueError(f"period is too long ({len(label)} characters); {HELP}")
    if not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError("the clock gave no usable time")
    if ".." in label:
        first, _, last = label.partition("..")
        if not first.strip() or not last.strip():
            raise ValueError(f"range {label!r} needs both ends (A..B); {HELP}")
        start = _edge(_single(first.strip(), now, tz), at_end=False)
        end = _edge(_single(last.strip(), now, tz), at_end=True)
        if end <= start:
            raise ValueError(f"period {label!r} ends before it starts")
        return _checked(Period(start, end, label))
    found = _single(label, now, tz)
    return _checked(Period(found.start, found.end, label, found.kind, found.key))


MONTH_WORDS = "|".join(sorted(_MONTHS, key=len, reverse=True))   # (also answer_type's)
_ORDINAL = r"(\d{1,2})(?:st|nd|rd|th)?"
_MENTIONS = (       # date phrases inside a question, most specific first
    ("md", re.compile(rf"\b({MONTH_WORDS})\.?\s+{_ORDINAL}(?:,?\s+(\d{{4}}))?\b", re.I)),
    ("dm", re.compile(rf"\b{_ORDINAL}\s+(?:of\s+)?({MONTH_WORDS})\.?(?:,?\s+(\d{{4}}))?\b",
                      re.I)),
    ("iso", re.compile(r"\b\d{4}-\d{2}-\d{2}\b")),
    ("plain", re.compile(r"\b(?:yesterday|(?:last|this)\s+(?:week|month|year)|"
                         r"(?:last|past)\s+\d{1,3}\s+(?:days|weeks|months)|"
                         rf"(?:in|last)\s+(?:{MONTH_WORDS})(?:\s+\d{{4}})?|"
                         rf"(?:{MONTH_WORDS})\s+\d{{4}}|"
                         r"last\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday))\b",
                         re.I)),
)


def mentioned(text: str, now: float, tz: tzinfo) -> tuple[Period, str] | None:
    """The first date phrase in free text ("on May 5, 2018", "last week", "in March")
    as a window, with the text that remains without it; None when there is none or it
    does not resolve. A month word alone ("may") is never taken for a date."""
    for kind, pattern in _MENTIONS:
        for match in pattern.finditer(text):
            phrase = match.group(0)
            if kind == "md":
                label = _day_label(match[1], match[2], match[3], now, tz)
            elif kind == "dm":
                label = _day_label(match[2], match[1], match[3], now, tz)
            else:
                label = phrase.lower()
            try:
                found = resolve(label, now, tz) if label else None
            except ValueError:
                found = None
            if found is not None:
                rest = (text[:match.start()] + " " + text[match.end():]).strip()
                return found, re.sub(r"^(?:on|in|during)\s+|\s+(?:on|in|during)\s*$", "",
                                     rest, flags=re.I)
    return None


def _day_label(month: str, day: str, year: str | None, now: float, tz: tzinfo) -> str | None:
    """``YYYY-MM-DD`` of a named day; without a year the latest such day not after today."""
    number = _MONTHS[month.lower()]
    today = timekeys.local_date(now, tz)
    try:
        if year:
            return date(int(year), number, int(day)).isoformat()
        found = date(today.year, number, int(day))
        return (found if found <= today else date(today.year - 1, number, int(day))).isoformat()
    except ValueError:
        return None


def window(period: object, time_from: object, time_to: object, now: float,
           tz: tzinfo) -> tuple[float | None, float | None]:
    """The time filter of a search: ``period`` narrowed by ``time_from``/``time_to``.

    ``time_from`` takes the start of what it names and ``time_to`` its end, so
    ``time_from="last monday", time_to="yesterday"`` covers both whole days.
    """
    start = end = None
    if period not in (None, ""):
        found = resolve(period, now, tz)
        start, end = found.start, found.end
    if time_from not in (None, ""):
        value = bound(time_from, now, tz, at_end=False)
        start = value if start is None else max(start, value)
    if time_to not in (None, ""):
        value = bound(time_to, now, tz, at_end=True)
        end = value if end is None else min(end, value)
    if start is not None and end is not None and end <= start:
        raise ValueError("the time filter is empty: it ends before it starts")
    return start, end


def bound(value: object, now: float, tz: tzinfo, *, at_end: bool) -> float:
    """One end of a time filter: an instant as given, or the start/end of a period."""
    if isinstance(value, bool):
        raise ValueError("a time must be text or Unix seconds, not a boolean")
    if isinstance(value, (int, float)):
        return _instant(float(value))
    return _edge(resolve(value, now, tz), at_end=at_end)


def _edge(found: Period, *, at_end: bool) -> float:
    """Where a period bounds a window (a ``time_from``/``time_to``, either end of a
    range ``A..B``): its start or end, but an instant at itself. Alone, an instant
    means "from then until now"; as an end, "until now" would drop the bound given."""
    if found.kind == "instant":
        return found.start
    return found.end if at_end else found.start


def _single(text: str, now: float, tz: tzinfo) -> Period:
    today = timekeys.local_date(now, tz)
    if text == "today":
        return _calendar("day", today, tz, text)
    if text == "yesterday":
        return _calendar("day", today - timedelta(days=1), tz, text)
    words = text.split()
    if len(words) == 2 and words[0] in ("this", "last", "past", "previous") \
            and words[1] in ("week", "month", "year"):
        return _relative_calendar(words[0] != "this", words[1], today, tz, text)
    if (match := _ROLLING.fullmatch(text)) or (
            (match := re.fullmatch(r"(\d{1,12})\s*([a-z]+)", text))
            and match[2] not in _MONTHS):          # "2026 march" is a month, not a unit
        return _rolling(int(match[1]), match[2], now, tz, text)
    if found := _weekday(words, today, tz, text):
        return found
    if found := _month_name(words, today, tz, text):
        return found
    return _iso(text, now, tz)


def _calendar(kind: str, day: date, tz: tzinfo, label: str) -> Period:
    key = timekeys.key_of(kind, day)
    start, end = timekeys.bounds(kind, key, tz)
    return Period(start, end, label, kind, key)


def _relative_calendar(previous: bool, unit: str, today: date, tz: tzinfo, label: str) -> Period:
    if unit == "week":
        monday = timekeys.week_monday(today) - timedelta(days=7 if previous else 0)
        return _calendar("week", monday, tz, label)
    if unit == "month":
        first = timekeys.month_first(today.year, today.month, -1 if previous else 0)
        return _calendar("month", first, tz, label)
    year = today.year - (1 if previous else 0)
    return _year(year, tz, label)


def _year(year: int, tz: tzinfo, label: str) -> Period:
    start = timekeys.midnight(timekeys.check_date(date(year, 1, 1)), tz)
    return Period(start, timekeys.midnight(date(year + 1, 1, 1), tz), label)


def _rolling(count: int, unit: str, now: float, tz: tzinfo, label: str) -> Period:
    if count < 1:
        raise ValueError(f"period {label!r} must count at least 1")
    if unit in _MONTH_UNITS:
        if count > 12 * 100:
            raise ValueError(f"period {label!r} is longer than 100 years")
        moment = datetime.fromtimestamp(now, tz)
        first = timekeys.month_first(moment.year, moment.month, -count)
        day = min(moment.day, _month_length(first))
        start = moment.replace(year=first.year, month=first.month, day=day).timestamp()
        return Period(start, now + 1.0, label)
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r} in {label!r}; use minutes, hours, days, "
                         "weeks or months")
    seconds = count * _UNITS[unit]
    if seconds > MAX_SPAN_DAYS * 86400.0:
        raise ValueError(f"period {label!r} is longer than 100 years")
    return Period(now - seconds, now + 1.0, label)


def _month_length(first: date) -> int:
    return (timekeys.month_first(first.year, first.month, 1) - first).days


def _weekday(words: list[str], today: date, tz: tzinfo, label: str) -> Period | None:
    mode = "latest"
    if len(words) == 2 and words[0] in ("last", "previous", "this", "on"):
        mode = {"last": "before", "previous": "before", "this": "this", "on": "latest"}[words[0]]
        words = words[1:]
    if len(words) != 1 or words[0] not in _WEEKDAYS:
        return None
    target = _WEEKDAYS[words[0]]
    if mode == "this":
        day = timekeys.week_monday(today) + timedelta(days=target)
    else:
        back = (today.weekday() - target) % 7
        if back == 0 and mode == "before":
            back = 7
        day = today - timedelta(days=back)
    return _calendar("day", day, tz, label)


def _month_name(words: list[str], today: date, tz: tzinfo, label: str) -> Period | None:
    previous = len(words) in (2, 3) and words[0] in ("last", "previous")
    if previous or (len(words) in (2, 3) and words[0] in ("this", "in")):
        words = words[1:]                  # "in march", "in march 2026", "last march 2025"
    if not words or words[0] not in _MONTHS:
        if len(words) == 2 and _YEAR.fullmatch(words[0]) and words[1] in _MONTHS:
            words = [words[1], words[0]]      # "2026 march"
        else:
            return None
    month = _MONTHS[words[0]]
    if len(words) == 2:
        if not _YEAR.fullmatch(words[1]):
            return None
        year = int(words[1])
    elif len(words) == 1:
        latest = today.month > month or (today.month == month and not previous)
        year = today.year if latest else today.year - 1
    else:
        return None
    return _calendar("month", timekeys.check_date(date(year, month, 1)), tz, label)


def _iso(text: str, now: float, tz: tzinfo) -> Period:
    compact = text.replace(" ", "")
    if _WEEK_KEY.fullmatch(compact):
        first, _ = timekeys.first_and_after("week", compact)
        return _calendar("week", first, tz, text)
    if _DAY_KEY.fullmatch(compact):
        first, _ = timekeys.first_and_after("day", compact)
        return _calendar("day", first, tz, text)
    if _MONTH_KEY.fullmatch(compact):
        first, _ = timekeys.first_and_after("month", compact)
        return _calendar("month", first, tz, text)
    if _YEAR.fullmatch(compact):
        return _year(int(compact), tz, text)
    if _NUMBER.fullmatch(compact):
        return Period(_instant(float(compact)), now + 1.0, text, "instant")
    try:
        moment = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read period {text[:40]!r}; {HELP}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    timekeys.check_date(moment.date())
    return Period(moment.timestamp(), max(now + 1.0, moment.timestamp() + 1.0), text, "instant")


def _instant(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("a time must be a finite number")
    timekeys.local_date(value, timekeys.zone("UTC"))
    return value


def _checked(found: Period) -> Period:
    if found.kind != "instant" and found.end - found.start > MAX_SPAN_DAYS * 86400.0 + 86400.0:
        raise ValueError(f"period {found.label!r} is longer than 100 years")
    return found
