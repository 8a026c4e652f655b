"""Calendar periods in a time zone: the day / week / month keys the rollup tables store.

A period is named by a key (``2026-03-14``, ``2026-W11``, ``2026-03``) and is
the half-open window ``[start, end)`` of Unix seconds between two local
midnights of the configured zone (DST-aware through ``zoneinfo``). Weeks are
ISO weeks (Monday first). This is the one place that turns local dates into
instants, so rollups, ``trove_recent`` and the time filters of the search tools
agree on where a day begins. Pure: no database, no clock.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, timedelta, timezone, tzinfo

MIN_YEAR, MAX_YEAR = 1970, 9998          # outside this a period is absurd, not a timestamp
# No message trove stores was written before 2000: an earlier time is a clock never set
# (a device booting at the epoch, a counter read as seconds), like the epoch's zero.
CLOCK_FLOOR = datetime(2000, 1, 1, tzinfo=timezone.utc).timestamp()
KINDS = ("day", "week", "month")
_WEEK_KEY = re.compile(r"(\d{4})-w(\d{1,2})")
_MONTH_KEY = re.compile(r"(\d{4})-(\d{1,2})")
_DAY_KEY = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})")


def zone(name: str | None) -> tzinfo:
    """The ``tzinfo`` of an IANA zone name (empty or ``UTC`` = UTC); ValueError if unknown."""
    text = (name or "").strip()
    if not text or text.upper() in ("UTC", "Z", "GMT"):
        return timezone.utc
    try:
        from zoneinfo import ZoneInfo
        return ZoneInfo(text)
    except Exception:
        raise ValueError(f"unknown time zone {text[:60]!r} (use an IANA name like "
                         "Europe/Paris, or UTC)") from None


def zone_or_utc(name: str | None) -> tzinfo:
    """The zone of a validated setting; UTC should the name stop being known."""
    try:
        return zone(name)
    except ValueError:
        return timezone.utc


def iso(ts: float | None) -> str | None:
    """Unix seconds as an ISO-8601 UTC string (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def check_date(day: date) -> date:
    """A date inside the supported years, else a ValueError the model can act on."""
    if not MIN_YEAR <= day.year <= MAX_YEAR:
        raise ValueError(f"year {day.year} is outside {MIN_YEAR}..{MAX_YEAR}")
    return day


def midnight(day: date, tz: tzinfo) -> float:
    """Unix seconds of the local midnight that starts ``day`` in ``tz``."""
    check_date(day)
    return datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()


def local_date(ts: float, tz: tzinfo) -> date:
    """The local calendar date of an instant (ValueError outside the supported years)."""
    try:   # floored to the second: fromtimestamp rounds, and day edges are whole seconds
        moment = datetime.fromtimestamp(math.floor(ts), tz)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"time {ts!r} is outside the supported range") from None
    return check_date(moment.date())


def week_monday(day: date) -> date:
    """The Monday of the ISO week holding ``day``."""
    return day - timedelta(days=day.weekday())


def month_first(year: int, month: int, months_ahead: int = 0) -> date:
    """The first day of a month, ``months_ahead`` months after (year, month)."""
    index = year * 12 + month - 1 + months_ahead
    return check_date(date(index // 12, index % 12 + 1, 1))


def key_of(kind: str, day: date) -> str:
    """The key of the period of ``kind`` that holds ``day``."""
    if kind == "day":
        return day.isoformat()
    if kind == "week":
        year, week, _ = day.isocalendar()
        return f"{year:04d}-W{week:02d}"
    if kind == "month":
        return f"{day.year:04d}-{day.month:02d}"
    raise ValueError(f"unknown period kind {kind!r}")


def first_and_after(kind: str, key: str) -> tuple[date, date]:
    """The first local date of a period and the first date after it."""
    text = key.strip().lower()
    try:
        if kind == "day" and (m := _DAY_KEY.fullmatch(text)):
            first = date(int(m[1]), int(m[2]), int(m[3]))
            return check_date(first), first + timedelta(days=1)
        if kind == "week" and (m := _WEEK_KEY.fullmatch(text)):
            first = date.fromisocalendar(int(m[1]), int(m[2]), 1)
            return check_date(first), first + timedelta(days=7)
        if kind == "month" and (m := _MONTH_KEY.fullmatch(text)):
            first = month_first(int(m[1]), int(m[2]))
            return first, month_first(first.year, first.month, 1)
    except ValueError as exc:
        raise ValueError(f"{kind} {key[:40]!r} is not a real date: {exc}") from None
    raise ValueError(f"{key[:40]!r} is not a {kind} key")


def bounds(kind: str, key: str, tz: tzinfo) -> tuple[float, float]:
    """The ``[start, end)`` Unix-second window of a period in ``tz``."""
    first, after = first_and_after(kind, key)
    return midnight(first, tz), midnight(after, tz)


def days_of(kind: str, key: str) -> list[date]:
    """Every local date of a period, in order."""
    first, after = first_and_after(kind, key)
    return [first + timedelta(days=i) for i in range((after - first).days)]


def children_of(kind: str, key: str) -> list[tuple[str, str]]:
    """The periods a rollup of ``kind`` is built from, in order.

    A week is built from its seven days. A month is built from the ISO weeks
    wholly inside it plus, at its edges, the days of weeks it shares with the
    neighbouring month (so its lineage never reaches outside the month).
    """
    if kind == "day":
        return []
    days = days_of(kind, key)
    if kind == "week":
        return [("day", d.isoformat()) for d in days]
    inside = set(days)
    out: list[tuple[str, str]] = []
    for day in days:
        monday = week_monday(day)
        week = [monday + timedelta(days=i) for i in range(7)]
        if all(d in inside for d in week):
            if day == monday:
                out.append(("week", key_of("week", day)))
        else:
            out.append(("day", day.isoformat()))
    return out


EPOCH_MS_FLOOR = 1e11      # larger epoch numbers are milliseconds (1e11 s is the year 5138)


def message_time(value: object, writer_zone: tzinfo | None = None) -> float | None:
    """When a message says it was written, as Unix seconds, or None when it does not
    say (or says something impossible: a bool, NaN, a time before ``CLOCK_FLOOR``
    or after the year 9998).

    Accepted: epoch seconds or milliseconds (a number, or a string of one), ISO-8601
    strings with an offset or ``Z``, or naive, e-mail style strings (RFC 2822) and
    ``datetime`` / ``date`` objects (a harness or an importer building messages in
    Python; a date is its midnight). The one rule for a naive
    time: it is wall-clock time of the zone its writer was in. The host writes them
    with ``datetime.now().isoformat()`` (the gateway mirror, slash-command notes,
    run_agent): the local zone of the host's process (``TZ``, else the machine's),
    which is this process (trove runs inside the host), so a naive time reads in
    this process's local zone; ``writer_zone`` when a caller knows another writer's.
    Never ``TROVE_TIMEZONE``: that zone names the days, weeks and months trove
    shows, not the clock of whoever wrote the message (read in it, a time written
    in Paris by a host whose trove shows Tokyo days moved by eight hours)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, date):   # a datetime or date object (a harness, an importer)
        moment = value if isinstance(value, datetime) else datetime(value.year, value.month,
                                                                    value.day)
        return _moment_seconds(moment, writer_zone)
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > 64:
            return None
        try:
            value = float(text)
        except ValueError:
            moment = _parsed(text)
            return None if moment is None else _moment_seconds(moment, writer_zone)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return _plausible(float(value) / 1000.0 if abs(value) >= EPOCH_MS_FLOOR else float(value))


def _parsed(text: str) -> datetime | None:
    """An ISO-8601 time (``Z`` for UTC), else an e-mail style one (RFC 2822: "Tue, 01
    Dec 2026 09:00:00 +0000", what HTTP headers and mail exports hold), else None."""
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" else text)
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime
    try:
        return parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _moment_seconds(moment: datetime, writer_zone: tzinfo | None) -> float | None:
    """``moment`` as Unix seconds, a naive one in its writer's zone (``message_time``);
    a date is never read as milliseconds."""
    try:
        if moment.tzinfo is None or moment.utcoffset() is None:
            moment = (moment.replace(tzinfo=writer_zone) if writer_zone is not None
                      else moment.astimezone())
        return _plausible(moment.timestamp())
    except (ValueError, OverflowError, OSError):
        return None


FUTURE_SKEW_SECONDS = 3600.0   # a writer's clock may run this far ahead of the store's


def settled_time(message_at: float | None, stored_at: float) -> float | None:
    """The time a message keeps when trove stores it at ``stored_at``: its own, unless
    that lies more than ``FUTURE_SKEW_SECONDS`` later (a clock far ahead, a naive time
    read in a zone east of the writer's): nothing is written after it is stored, and
    such a time put the message in no finished day, so no rollup and no period of
    ``trove_recent`` ever showed it. None then, so the storage time stands in."""
    if message_at is None or message_at > stored_at + FUTURE_SKEW_SECONDS:
        return None
    return message_at


def _plausible(seconds: float) -> float | None:
    """``seconds`` when it lies from ``CLOCK_FLOOR`` to the year MAX_YEAR, else None.
    The epoch's zero is the value of an unset field (a default, a missing column), and
    any other time before 2000 a clock never set: kept, such a message fell in no
    day of the lookback (no rollup, no recent period showed it), or, with a lookback
    reaching back that far, made day, week and month rollups of 1970. The storage
    time stands in, as for a message with no time."""
    if seconds < CLOCK_FLOOR:
        return None
    try:
        year = datetime.fromtimestamp(seconds, timezone.utc).year
    except (OverflowError, OSError, ValueError):
        return None
    return seconds if MIN_YEAR <= year <= MAX_YEAR else None
