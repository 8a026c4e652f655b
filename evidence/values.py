"""Values read from exact quotes: event dates (absolute or relative) and amounts with units.

Everything here is deterministic and fails closed: a quote with no date, two
different dates, an ambiguous numeric date (03/04), an unknown or ambiguous
unit ("pounds") gives a ValueError with the reason rather than a guess. Each
date carries the rule that produced it, so a reader can check it.

Relative dates resolve against the local day (``TROVE_TIMEZONE``, passed as
``tz``; UTC when none is given) on which the message was said:
"yesterday" = said day - 1; "N days/weeks ago" = said day - N days/weeks;
"N months/years ago" = same day N calendar months/years earlier (clamped to
the month's end); "last <weekday>" = the latest such weekday strictly before
the said day; "next <weekday>" = the first one strictly after it; "on the
14th" = the 14th of the said month if not after the said day, else of the
month before; "March 14" without a year = the latest March 14 not after the
said day (a 29 February: the latest leap day). An ISO timestamp states its
date as written ("2026-01-10T09:30:00Z" = 2026-01-10).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from decimal import Decimal

MONTHS = {name: i + 1 for i, names in enumerate([
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
    ("october", "oct"), ("november", "nov"), ("december", "dec")]) for name in names}
WEEKDAYS = {name: i for i, names in enumerate([
    ("monday", "mon"), ("tuesday", "tue", "tues"), ("wednesday", "wed"),
    ("thursday", "thu", "thur", "thurs"), ("friday", "fri"), ("saturday", "sat"),
    ("sunday", "sun")]) for name in names}
NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11,
                "twelve": 12, "a couple of": 2, "couple of": 2}

_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_WEEKDAY = "|".join(sorted(WEEKDAYS, key=len, reverse=True))
_COUNT = r"\d{1,3}|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True))
_ORD = r"(\d{1,2})(?:st|nd|rd|th)?"
_B, _E = r"(?<![\w])", r"(?![\w])"

DATE_PATTERNS: list[tuple[str, re.Pattern]] = [
    # an ISO timestamp's date counts too: "2026-01-10T09:30:00Z" states 2026-01-10
    ("iso", re.compile(_B + r"(\d{4})-(\d{2})-(\d{2})" + rf"(?=T\d|{_E})")),
    ("numeric", re.compile(_B + r"(\d{1,2})/(\d{1,2})/(\d{4})" + _E)),
    ("month_day_year", re.compile(_B + rf"({_MONTH})\.?\s+{_ORD},?\s+(\d{{4}})" + _E, re.I)),
    ("day_month_year", re.compile(_B + rf"{_ORD}\s+(?:of\s+)?({_MONTH})\.?,?\s+(\d{{4}})" + _E, re.I)),
    ("month_day", re.compile(_B + rf"({_MONTH})\.?\s+{_ORD}" + _E, re.I)),
    ("day_month", re.compile(_B + rf"(?:the\s+)?{_ORD}\s+(?:of\s+)?({_MONTH})" + _E, re.I)),
    ("ago", re.compile(_B + rf"({_COUNT})\s+(day|week|month|year)s?\s+ago" + _E, re.I)),
    ("in", re.compile(_B + rf"in\s+({_COUNT})\s+(day|week|month|year)s?" + _E, re.I)),
    ("weekday", re.compile(_B + rf"(last|next|this\s+past|this\s+coming)\s+({_WEEKDAY})" + _E, re.I)),
    ("the_nth", re.compile(_B + r"on\s+the\s+(\d{1,2})(?:st|nd|rd|th)" + _E, re.I)),
    ("day_word", re.compile(_B + r"(today|yesterday|tomorrow|the\s+day\s+before\s+yesterday)" + _E, re.I)),
    ("week_word", re.compile(_B + r"(last|next)\s+(week|month|year)" + _E, re.I)),
]


@dataclass(frozen=True)
class EventDate:
    """A date a quote states, resolved, with the text it came from and the rule applied."""

    day: date
    text: str
    rule: str
    start: int            # offset of the text inside the quote

    def as_dict(self) -> dict:
        """JSON shape: the ISO date, the words, the rule."""
        return {"date": self.day.isoformat(), "text": self.text, "rule": self.rule}


def said_day(ts: float, tz: tzinfo | None = None) -> date:
    """The calendar day of a Unix time in ``tz`` (the user's zone; UTC when None): the
    day "yesterday" and "3 days ago" count from, as the user saw the calendar."""
    return datetime.fromtimestamp(ts, tz or timezone.utc).date()


def add_months(day: date, months: int) -> date:
    """The same day ``months`` calendar months later (earlier if negative), clamped to month end."""
    index = day.year * 12 + day.month - 1 + months
    year, month = divmod(index, 12)
    month += 1
    last = (date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)).day
    return date(year, month, min(day.day, last))


def _count(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else NUMBER_WORDS[word]


def find_dates(quote: str, said: float | None, tz: tzinfo | None = None) -> list[EventDate]:
    """Every date the quote states, resolved against the said day in ``tz`` (relative
    ones need it).

    Overlapping matches keep the earliest, most specific pattern. Raises
    ValueError for a numeric date whose day and month could be swapped.
    """
    taken: list[tuple[int, int]] = []
    found: list[EventDate] = []
    for kind, pattern in DATE_PATTERNS:
        for match in pattern.finditer(quote):
            if any(match.start() < e and s < match.end() for s, e in taken):
                continue
            event = _resolve(kind, match, said, tz)
            taken.append((match.start(), match.end()))
            if event is not None:
                found.append(event)
    return sorted(found, key=lambda e: e.start)


def _resolve(kind: str, m: re.Match, said: float | None, tz: tzinfo | None) -> EventDate | None:
    text = m.group(0)
    g = m.groups()
    if kind == "iso":
        return _absolute(int(g[0]), int(g[1]), int(g[2]), text, "ISO date", m.start())
    if kind == "numeric":
        first, second = int(g[0]), int(g[1])
        if first <= 12 and second <= 12 and first != second:
            raise ValueError(f"date {text!r} is ambiguous (month/day or day/month); "
                             "cite a quote with the month in words")
        month, day = (first, second) if second > 12 else (second, first)
        return _absolute(int(g[2]), month, day, text, "numeric date, unambiguous order",
                         m.start())
    if kind == "month_day_year":
        return _absolute(int(g[2]), MONTHS[g[0].lower()], int(g[1]), text, "calendar date",
                         m.start())
    if kind == "day_month_year":
        return _absolute(int(g[2]), MONTHS[g[1].lower()], int(g[0]), text, "calendar date",
                         m.start())
    if said is None:
        raise ValueError(f"relative date {text!r} needs the message time, which is unknown")
    base = said_day(said, tz)
    if kind in ("month_day", "day_month"):
        word = g[0] if kind == "month_day" else g[1]
        if word.lower() == "may" and not re.search(r"\d(?:st|nd|rd|th)|\bthe\b|^May", text):
            return None   # "option 4 may help": the verb, not the month
        month, day = (MONTHS[word.lower()], int(g[1])) if kind == "month_day" \
            else (MONTHS[word.lower()], int(g[0]))
        candidate = _latest_not_after(base, month, day)
        if candidate is None:
            return None
        return EventDate(candidate, text, "no year stated: the latest such date not after "
                         "the message day", m.start())
    if kind in ("ago", "in"):
        n, unit = _count(g[0]), g[1].lower()
        sign = -1 if kind == "ago" else 1
        if unit in ("day", "week"):
            day = base + timedelta(days=sign * n * (7 if unit == "week" else 1))
        else:
            day = add_months(base, sign * n * (12 if unit == "year" else 1))
        return EventDate(day, text, f"message day {'-' if sign < 0 else '+'} {n} {unit}(s)",
                         m.start())
    if kind == "weekday":
        which, target = " ".join(g[0].lower().split()), WEEKDAYS[g[1].lower()]
        if which in ("last", "this past"):
            delta = (base.weekday() - target) % 7 or 7
            return EventDate(base - timedelta(days=delta), text,
                             "the latest such weekday strictly before the message day", m.start())
        delta = (target - base.weekday()) % 7 or 7
        return EventDate(base + timedelta(days=delta), text,
                         "the first such weekday strictly after the message day", m.start())
    if kind == "the_nth":
        day_number = int(g[0])
        for months_back in (0, 1, 2):
            month_start = add_months(base.replace(day=1), -months_back)
            try:
                candidate = month_start.replace(day=day_number)
            except ValueError:
                continue
            if candidate <= base:
                return EventDate(candidate, text, "day of the message's month if not after "
                                 "the message day, else of the month before", m.start())
        return None
    if kind == "day_word":
        word = " ".join(g[0].lower().split())
        offset = {"today": 0, "yesterday": -1, "tomorrow": 1,
                  "the day before yesterday": -2}[word]
        return EventDate(base + timedelta(days=offset), text, f"message day {offset:+d} day(s)",
                         m.start())
    if kind == "week_word":
        # a week/month/year is a period, not a day: too vague for day arithmetic
        raise ValueError(f"{text!r} names a period, not a day; cite a quote with a date")
    return None


def _latest_not_after(base: date, month: int, day: int) -> date | None:
    """The latest ``month``/``day`` not after ``base``: a 29 February may lie up to eight
    years back (2026-03-05: 2024-02-29); None when no year has that day (31 April)."""
    for year in range(base.year, base.year - 9, -1):
        try:
            candidate = date(year, month, day)
        except ValueError:
            continue
        if candidate <= base:
            return candidate
    return None


def _absolute(year: int, month: int, day: int, text: str, rule: str, at: int) -> EventDate | None:
    try:
        return EventDate(date(year, month, day), text, rule, at)
    except ValueError:
        raise ValueError(f"{text!r} is not a real calendar date") from None


def one_date(quote: str, said: float | None, hint: str | None = None,
             tz: tzinfo | None = None) -> EventDate:
    """The single date a quote states; ``hint`` (the text the model read) picks among several.

    Fails closed: no date, or several distinct dates without a hint that
    matches exactly one of them, raise ValueError.
    """
    dates = find_dates(quote, said, tz)
    if hint:
        picked = [d for d in dates if d.text.lower() == hint.strip().lower()
                  or d.day.isoformat() == hint.strip()]
        if len(picked) >= 1 and len({d.day for d in picked}) == 1:
            return picked[0]
        if dates:
            raise ValueError(f"value {hint!r} matches none (or several) of the dates the quote "
                             f"states: {', '.join(d.text for d in dates)}")
    if not dates:
        raise ValueError("the quote states no date")
    if len({d.day for d in dates}) > 1:
        raise ValueError("the quote states more than one date ("
                         + ", ".join(f"{d.text!r}={d.day}" for d in dates)
                         + "); cite a narrower quote or pass the one you mean as value")
    return dates[0]


# ---------------------------------------------------------------- amounts
@dataclass(frozen=True)
class Unit:
    """A unit: its dimension, how many base units it is, and its canonical name."""

    dimension: str      # currency:USD, length, mass, time, count, month, year
    factor: float       # how many base units one of this unit is
    name: str           # the unit's short name (km, lb, h, USD)
    base: str = ""      # the dimension's base unit (m, g, s; the code for currencies)


CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "₩": "KRW"}
CURRENCY_CODES = {"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "CNY", "INR", "SEK", "NOK",
                  "DKK", "PLN", "MXN", "BRL", "NZD", "SGD", "HKD", "KRW", "ZAR"}
CURRENCY_WORDS = {"dollar": "USD", "dollars": "USD", "usd": "USD", "euro": "EUR", "euros": "EUR",
                  "yen": "JPY", "francs": "CHF", "rupees": "INR"}
UNITS: dict[str, Unit] = {}
for _names, _dim, _factor, _canon in [
    (("mm", "millimeter", "millimeters", "millimetre", "millimetres"), "length", 0.001, "m"),
    (("cm", "centimeter", "centimeters", "centimetre", "centimetres"), "length", 0.01, "m"),
    (("m", "meter", "meters", "metre", "metres"), "length", 1.0, "m"),
    (("km", "kilometer", "kilometers", "kilometre", "kilometres"), "length", 1000.0, "m"),
    (("inch", "inches"), "length", 0.0254, "m"),
    (("ft", "foot", "feet"), "length", 0.3048, "m"),
    (("mi", "mile", "miles"), "length", 1609.344, "m"),
    (("mg", "milligram", "milligrams"), "mass", 0.001, "g"),
    (("g", "gram", "grams"), "mass", 1.0, "g"),
    (("kg", "kilo", "kilos", "kilogram", "kilograms"), "mass", 1000.0, "g"),
    (("lb", "lbs"), "mass", 453.59237, "g"),
    (("oz", "ounce", "ounces"), "mass", 28.349523125, "g"),
    (("s", "sec", "secs", "second", "seconds"), "time", 1.0, "s"),
    (("min", "mins", "minute", "minutes"), "time", 60.0, "s"),
    (("h", "hr", "hrs", "hour", "hours"), "time", 3600.0, "s"),
    (("day", "days"), "time", 86400.0, "s"),
    (("week", "weeks"), "time", 604800.0, "s"),
    (("month", "months"), "month", 1.0, "month"),
    (("year", "years"), "year", 1.0, "year"),
]:
    for _n in _names:
        UNITS[_n] = Unit(_dim, _factor, _names[0], _canon)
AMBIGUOUS_UNITS = {"pound": "pounds may be money (GBP) or weight (lb)",
                   "pounds": "pounds may be money (GBP) or weight (lb)",
                   "ton": "ton may be short, long or metric", "tons": "ton may be short, "
                   "long or metric", "quid": "use £ or GBP", "bucks": "use $ or a currency code"}

_NUMBER = r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
# A minus sign (ASCII, U+2212 or an en dash U+2013) counts only where it cannot be a
# hyphen or a range dash: at the start of a word ("-3 kg", "-$40", "$-40", "-USD 40",
# "–$5"), never after a digit ("3-5", "3–5"); "- $5" (a list bullet) is no sign.
# The word "minus" before an amount is a sign too ("minus $5"; not "plus or minus 5 kg").
_MINUS = "[-\u2212\u2013]"
_LEAD_SIGN = rf"(?<![\w.,])({_MINUS}|(?i:(?<!plus or )minus)\s+)"
_SIGN = rf"(?:{_LEAD_SIGN})?"
_INNER_SIGN = rf"({_MINUS})?"
# A number never continues with another separator and digit: "$10.5.3" is no amount.
_NUMBER_END = r"(?![\d]|[.,]\d)"
_SYMBOLS = "".join(re.escape(s) for s in CURRENCY_SYMBOLS)
_WORD_UNIT = r"([A-Za-z]{1,12})"
# A scale is part of the amount: "$50K", "$1.2M", "$3bn" (after a currency only: "3m" may
# be metres), "$3 million", "3 million euros", "1.5 billion".
SCALES = {"k": 10**3, "thousand": 10**3, "m": 10**6, "mn": 10**6, "million": 10**6,
          "b": 10**9, "bn": 10**9, "billion": 10**9, "trillion": 10**12}
_SCALE_WORD = r"\s((?i:thousand|million|billion|trillion))(?![\w])"
_SCALE = rf"(?:(bn|mn|[kKmMbB])(?![\w])|{_SCALE_WORD})?"
AMOUNT_PATTERNS = [
    ("symbol", re.compile(rf"{_SIGN}(?<![\w.])([{_SYMBOLS}])\s?{_INNER_SIGN}{_NUMBER}{_SCALE}"
                          rf"{_NUMBER_END}")),
    ("code_first", re.compile(rf"{_SIGN}(?<![\w])([A-Z]{{3}})\s?{_INNER_SIGN}{_NUMBER}{_SCALE}"
                              rf"{_NUMBER_END}")),
    ("number_unit", re.compile(rf"(?:{_LEAD_SIGN}|(?<![\w.,$€£¥₹₩])){_NUMBER}"
                               rf"(?:{_SCALE_WORD})?\s?{_WORD_UNIT}(?![\w])")),
    # A bare number may end a sentence or a clause ("we were 40.", "40, then"); a
    # separator followed by a letter or digit ("1.2.3", "3,4", "2.x") is no number.
    ("number", re.compile(rf"(?:{_LEAD_SIGN}|(?<![\w.,$€£¥₹₩:/-])){_NUMBER}"
                          rf"(?:{_SCALE_WORD}|(?![\w:/-]|[.,]\w))")),
]
# "1. Buy milk", "2) Call Ana": a number opening a line before "." or ")" numbers a list.
_LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*$")
_LIST_ITEM = re.compile(r"[.)][ \t]+\S")


@dataclass(frozen=True)
class Amount:
    """A number with its unit as the quote wrote it, and its value in the dimension's base."""

    value: float
    unit: Unit
    text: str
    start: int

    def as_dict(self) -> dict:
        """JSON shape of the parsed amount."""
        return {"value": _plain(self.value), "unit": self.unit.name,
                "dimension": self.unit.dimension, "text": self.text}

    @property
    def base(self) -> float:
        """The amount in the base unit of its dimension (metres, grams, seconds...)."""
        return self.value * self.unit.factor


def _plain(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 10)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _scaled(text: str, scale: str | None) -> float:
    """The number times its scale word or letter ("1.2" "M" = 1200000), exactly."""
    if not scale:
        return _number(text)
    return float(Decimal(text.replace(",", "")) * SCALES[scale.lower()])


def find_amounts(quote: str) -> list[Amount]:
    """Every number of the quote with its unit (unitless numbers are ``count``).

    Raises ValueError when a number carries an ambiguous unit word. Numbers
    that are part of a date or a time of day are not amounts.
    """
    blocked = [(m.start(), m.end()) for _, p in DATE_PATTERNS for m in p.finditer(quote)]
    blocked += [(m.start(), m.end()) for m in re.finditer(r"\d{1,2}:\d{2}", quote)]
    taken = list(blocked)
    found: list[Amount] = []
    for kind, pattern in AMOUNT_PATTERNS:
        for m in pattern.finditer(quote):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            amount = _amount(kind, m)
            if amount is None:
                continue
            taken.append((m.start(), m.end()))
            found.append(amount)
    return sorted(found, key=lambda a: a.start)


def _amount(kind: str, m: re.Match) -> Amount | None:
    """The amount one match states, its sign kept ("-$40" is minus forty dollars)."""
    g = m.groups()
    if kind == "symbol":
        lead, symbol, inner, number, letter, word = g
        value = _scaled(number, letter or word)
        code = CURRENCY_SYMBOLS[symbol]
        return Amount(_signed(value, lead, inner), Unit(f"currency:{code}", 1.0, code, code),
                      m.group(0), m.start())
    if kind == "code_first":
        lead, code, inner, number, letter, word = g
        if code not in CURRENCY_CODES:
            return None
        return Amount(_signed(_scaled(number, letter or word), lead, inner),
                      Unit(f"currency:{code}", 1.0, code, code), m.group(0), m.start())
    if kind == "number_unit":
        sign, number, scale, word = g
        value = _signed(_scaled(number, scale), sign)
        if word.upper() in CURRENCY_CODES and (word.isupper() or word.lower() == "usd"):
            code = word.upper()
            return Amount(value, Unit(f"currency:{code}", 1.0, code, code), m.group(0),
                          m.start())
        if word == "M":   # "5M users" is a million, "a 5M cable" metres: no guess
            raise ValueError(f"{m.group(0)!r}: M may be million or metres; write million or m")
        lower = word.lower()
        if lower in AMBIGUOUS_UNITS:
            raise ValueError(f"{m.group(0)!r}: {AMBIGUOUS_UNITS[lower]}")
        if lower in CURRENCY_WORDS:
            code = CURRENCY_WORDS[lower]
            return Amount(value, Unit(f"currency:{code}", 1.0, code, code), m.group(0),
                          m.start())
        unit = UNITS.get(word) or UNITS.get(lower)
        if unit is None:
            return None   # "3 people": the number alone is read by the next pattern
        return Amount(value, unit, m.group(0), m.start())
    sign, number, scale = g
    if _LIST_ITEM.match(m.string, m.end()) and not sign and not scale \
            and number.isdigit() and len(number) <= 3 \
            and _LIST_MARKER.search(m.string, 0, m.start()):
        return None
    return Amount(_signed(_scaled(number, scale), sign), Unit("count", 1.0, ""), m.group(0),
                  m.start())


def _signed(value: float, *signs: str | None) -> float:
    """``value`` negated once per minus sign written before it ("-$-5" is a typo: +5
    would be a guess, so two signs fail closed)."""
    given = [s for s in signs if s]
    if len(given) > 1:
        raise ValueError("an amount with two minus signs is malformed")
    return -value if given else value


def one_amount(quote: str, hint: str | None = None, *, dimension: str | None = None) -> Amount:
    """The single amount a quote states (of ``dimension`` if given); ``hint`` picks among several.

    The hint is read as an amount too and must equal exactly one amount of
    the quote (same number, same unit), so the model cannot bring a number
    the quote does not hold. Fails closed with the reason.
    """
    amounts = find_amounts(quote)
    if dimension:
        amounts = [a for a in amounts if a.unit.dimension == dimension]
    if hint is not None and str(hint).strip():
        wanted = find_amounts(str(hint))
        if len(wanted) != 1:
            raise ValueError(f"value {str(hint)[:60]!r} is not one amount")
        want = wanted[0]
        picked = [a for a in amounts if abs(a.value - want.value) < 1e-9 and (
            want.unit.dimension == "count" or a.unit == want.unit)]
        if len(picked) != 1:
            raise ValueError(f"value {str(hint)[:60]!r} does not match exactly one amount in the "
                             f"quote ({', '.join(a.text for a in amounts) or 'none'})")
        return picked[0]
    if not amounts:
        raise ValueError("the quote states no amount" + (f" of {dimension}" if dimension else ""))
    if len(amounts) > 1:
        raise ValueError("the quote states more than one amount ("
                         + ", ".join(repr(a.text) for a in amounts)
                         + "); cite a narrower quote or pass the one you mean as value")
    return amounts[0]
