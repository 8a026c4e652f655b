"""trove_compute: arithmetic over exact refs, done by code, with an immutable trace.

Every input is an exact ref (verified against the store) plus, optionally,
``value``: the text the model read there, used only to pick among several
candidates in the quote. Values are parsed from the quote itself; anything
missing, ambiguous or incompatible fails closed with the reason. The result
carries a trace (operation, inputs, parsed values, steps, result) and the
SHA-256 of its canonical JSON, so a later turn can check it was not altered.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from datetime import date, tzinfo
from typing import Any, Callable

from . import refs as refs_mod
from .polarity import cues, cues_around
from .values import UNITS, Amount, EventDate, add_months, one_amount, one_date, said_day

OPERATIONS = ("date_diff", "count_distinct", "sum", "difference", "order", "latest")
MAX_INPUTS = 50


class ComputeError(ValueError):
    """The computation cannot be done exactly; the message says why."""


@dataclass(frozen=True)
class Input:
    """One verified input: the ref and the model's optional reading of it."""

    ref: refs_mod.Ref
    value: str | None


def load_inputs(raw_inputs: Any, load: Callable[[int], dict]) -> list[Input]:
    """Verify every input ref; any bad ref fails the whole computation (fail closed).
    (Each operation then checks that the words stating its value assert it:
    ``_asserted``.)"""
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ComputeError("inputs must be a non-empty list of refs")
    if len(raw_inputs) > MAX_INPUTS:
        raise ComputeError(f"at most {MAX_INPUTS} inputs")
    out = []
    for index, raw in enumerate(raw_inputs):
        try:
            ref = refs_mod.verify(raw, load)
        except refs_mod.RefError as exc:
            raise ComputeError(f"input {index}: {exc}") from None
        value = raw.get("value") if isinstance(raw, dict) else None
        out.append(Input(ref, None if value is None else str(value)[:200]))
    return out


def compute(operation: str, raw_inputs: Any, load: Callable[[int], dict], *,
            unit: str | None = None, absolute: bool = False, tz: tzinfo | None = None) -> dict:
    """Run one operation over verified refs and return ``{result, trace, trace_hash}``;
    relative dates count from the day the message was said in ``tz`` (TROVE_TIMEZONE).

    Raises ComputeError (with the reason) instead of returning a doubtful number.
    """
    if operation not in OPERATIONS:
        raise ComputeError(f"operation must be one of {', '.join(OPERATIONS)}")
    inputs = load_inputs(raw_inputs, load)
    steps: list[str] = []
    parsed: list[dict] = []
    result = RUNNERS[operation](inputs, parsed, steps, unit=unit, absolute=absolute, tz=tz)
    trace = {"operation": operation,
             "options": {k: v for k, v in (("unit", unit), ("absolute", absolute)) if v},
             "inputs": [{**i.ref.as_dict(), "status": i.ref.status,
                         **({"value": i.value} if i.value is not None else {})} for i in inputs],
             "parsed": parsed, "steps": steps, "result": result}
    return {"result": result, "trace": trace, "trace_hash": trace_hash(trace)}


def trace_hash(trace: dict) -> str:
    """SHA-256 of the trace's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(trace, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _fail(index: int, exc: Exception) -> ComputeError:
    return ComputeError(f"input {index}: {exc}")


def _asserted(index: int, quote: str, signs: list[str]) -> None:
    """Fail closed on a value its words deny, hedge or ask about (``polarity``): "we did
    not pay $300", "maybe $300" or "did we pay $300?" was summed as $300. The reason names
    the cue; a quote whose other clause says "not" ("We paid $40, not bad") passes."""
    if signs:
        raise ComputeError(f"input {index}: the words stating its value {'; '.join(signs)}, "
                           f"so {quote[:80]!r} states no value as fact; cite a quote that does")


def _date_of(index: int, item: Input, tz: tzinfo | None) -> EventDate:
    try:
        found = one_date(item.ref.quote, item.ref.said_at, item.value, tz)
    except ValueError as exc:
        raise _fail(index, exc) from None
    _asserted(index, item.ref.quote, cues_around(item.ref.quote, found.start,
                                                 found.start + len(found.text)))
    return found


def _amount_of(index: int, item: Input) -> Amount:
    try:
        found = one_amount(item.ref.quote, item.value)
    except ValueError as exc:
        raise _fail(index, exc) from None
    _asserted(index, item.ref.quote, cues_around(item.ref.quote, found.start,
                                                 found.start + len(found.text)))
    return found


def _event_time(index: int, item: Input, parsed: list, steps: list,
                tz: tzinfo | None) -> date:
    """When the input's event happened: the date its quote states, else the day it was said.

    Here ``value`` is the event's label, not a date, so it never picks a date.
    """
    try:
        event = one_date(item.ref.quote, item.ref.said_at, tz=tz)
    except ValueError as exc:
        if "no date" not in str(exc) or item.ref.said_at is None:
            raise _fail(index, exc) from None
        event = None
    if event is not None:
        _asserted(index, item.ref.quote, cues_around(item.ref.quote, event.start,
                                                     event.start + len(event.text)))
        parsed.append({"input": index, **event.as_dict(), "time_source": "stated"})
        return event.day
    _asserted(index, item.ref.quote, cues(item.ref.quote))  # the quote is the event
    day = said_day(item.ref.said_at, tz)
    parsed.append({"input": index, "date": day.isoformat(), "time_source": "said",
                   "rule": "the quote states no date: the day the message was said"})
    steps.append(f"input {index}: no date in the quote, using the message day {day}")
    return day


# ---------------------------------------------------------------- operations
def _date_diff(inputs: list[Input], parsed: list, steps: list, *, unit: str | None,
               absolute: bool, tz: tzinfo | None) -> dict:
    if len(inputs) != 2:
        raise ComputeError("date_diff needs exactly two inputs (from, to)")
    unit = unit or "days"
    if unit not in ("days", "weeks", "months"):
        raise ComputeError("date_diff unit must be days, weeks or months")
    first, second = (_date_of(i, item, tz) for i, item in enumerate(inputs))
    for index, event in enumerate((first, second)):
        parsed.append({"input": index, **event.as_dict()})
    days = (second.day - first.day).days
    steps.append(f"{second.day} - {first.day} = {days} days")
    if absolute and days < 0:
        days = -days
        steps.append(f"absolute: {days} days")
    result: dict = {"days": days, "unit": unit, "from": first.day.isoformat(),
                    "to": second.day.isoformat(), "directed": not absolute}
    if unit == "weeks":
        weeks, rest = divmod(abs(days), 7)
        sign = -1 if days < 0 else 1
        result.update(value=round(days / 7, 4), whole_weeks=sign * weeks, remaining_days=rest)
        steps.append(f"{days} / 7 = {round(days / 7, 4)} weeks ({weeks} whole, {rest} days)")
    elif unit == "months":
        low, high = sorted((first.day, second.day))
        months = (high.year - low.year) * 12 + high.month - low.month
        if add_months(low, months) > high:
            months -= 1
        rest = (high - add_months(low, months)).days
        sign = -1 if days < 0 else 1
        result.update(value=sign * months, whole_months=sign * months, remaining_days=rest)
        steps.append(f"whole calendar months from {low} to {high}: {months}, then {rest} days")
    else:
        result["value"] = days
    return result


def normalize_item(text: str) -> str:
    """How two item names compare: case, accents, articles, punctuation and spacing ignored."""
    text = unicodedata.normalize("NFKD", text.casefold())
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = re.sub(r"[^\w\s]", " ", text)
    words = [w for w in text.split() if w not in ("the", "a", "an")]
    return " ".join(words)


def _count_distinct(inputs: list[Input], parsed: list, steps: list, **_: Any) -> dict:
    seen: dict[str, int] = {}
    for index, item in enumerate(inputs):
        name = item.value if item.value is not None else item.ref.quote
        key = normalize_item(name)
        if not key:
            raise _fail(index, ValueError("empty item name"))
        if item.value is not None and key not in normalize_item(item.ref.quote):
            raise _fail(index, ValueError(f"value {item.value!r} does not occur in the quote"))
        _asserted(index, item.ref.quote, cues(item.ref.quote))
        parsed.append({"input": index, "item": name, "key": key})
        if key in seen:
            steps.append(f"input {index}: {key!r} repeats input {seen[key]}")
        else:
            seen[key] = index
    steps.append(f"{len(seen)} distinct of {len(inputs)}")
    return {"value": len(seen), "distinct": [inputs[i].value or inputs[i].ref.quote
                                             for i in seen.values()]}


def _amounts(inputs: list[Input], parsed: list, steps: list) -> list[Amount]:
    amounts = [_amount_of(i, item) for i, item in enumerate(inputs)]
    for index, amount in enumerate(amounts):
        parsed.append({"input": index, **amount.as_dict()})
    dimensions = {a.unit.dimension for a in amounts}
    if len(dimensions) > 1:
        raise ComputeError("incompatible units: " + ", ".join(sorted(
            d.replace("currency:", "currency ") for d in dimensions))
            + " (no conversion between currencies or dimensions)")
    return amounts


def _in_unit(amounts: list[Amount], steps: list, unit: str | None) -> tuple[float, str]:
    """The factor and name of the unit a sum/difference is given in (asked, else the first)."""
    first = amounts[0].unit
    if unit:
        target = UNITS.get(unit) or UNITS.get(unit.lower())
        if first.dimension.startswith("currency:") and unit.upper() == first.name:
            return 1.0, first.name
        if target is None or target.dimension != first.dimension:
            raise ComputeError(f"unit {unit!r} does not fit {first.dimension}")
        return target.factor, target.name
    names = {a.unit.name for a in amounts}
    if len(names) > 1:
        steps.append(f"mixed units {sorted(names)} converted to {first.name}")
    return first.factor, first.name


def _sum(inputs: list[Input], parsed: list, steps: list, *, unit: str | None, **_: Any) -> dict:
    amounts = _amounts(inputs, parsed, steps)
    factor, name = _in_unit(amounts, steps, unit)
    total = sum(a.base for a in amounts) / factor
    total = _round(total)
    steps.append(" + ".join(a.text for a in amounts) + f" = {total} {name}".rstrip())
    return {"value": total, "unit": name, "count": len(amounts)}


def _difference(inputs: list[Input], parsed: list, steps: list, *, unit: str | None,
                absolute: bool, **_: Any) -> dict:
    if len(inputs) != 2:
        raise ComputeError("difference needs exactly two inputs (a, b): the result is b - a")
    amounts = _amounts(inputs, parsed, steps)
    factor, name = _in_unit(amounts, steps, unit)
    value = _round((amounts[1].base - amounts[0].base) / factor)
    steps.append(f"{amounts[1].text} - {amounts[0].text} = {value} {name}".rstrip())
    if absolute and value < 0:
        value = -value
        steps.append(f"absolute: {value}")
    return {"value": value, "unit": name, "directed": not absolute}


def _round(value: float) -> float | int:
    value = round(value, 6)
    return int(value) if value.is_integer() else value


def _ordered(inputs: list[Input], parsed: list, steps: list,
             tz: tzinfo | None) -> list[tuple[date, float, int]]:
    keyed = [(_event_time(i, item, parsed, steps, tz), item.ref.said_at or 0.0, i)
             for i, item in enumerate(inputs)]
    return sorted(keyed)


def _order(inputs: list[Input], parsed: list, steps: list, *, tz: tzinfo | None = None,
           **_: Any) -> dict:
    keyed = _ordered(inputs, parsed, steps, tz)
    days = [k[0] for k in keyed]
    ties = sorted({d.isoformat() for d in days if days.count(d) > 1})
    if ties:
        steps.append(f"same day for several inputs ({', '.join(ties)}): kept in said order")
    steps.append("ordered by occurrence day, then by the time said")
    return {"order": [{"input": i, "date": d.isoformat(),
                       "text": inputs[i].value or inputs[i].ref.quote} for d, _, i in keyed],
            "ties": ties}


def _latest(inputs: list[Input], parsed: list, steps: list, *, tz: tzinfo | None = None,
            **_: Any) -> dict:
    keyed = _ordered(inputs, parsed, steps, tz)
    day, said, index = keyed[-1]
    rivals = [i for d, s, i in keyed[:-1] if d == day]
    if rivals:
        steps.append(f"inputs {rivals} share the latest day {day}: the one said last wins")
    steps.append(f"latest: input {index} ({day})")
    latest = inputs[index]
    return {"value": latest.value or latest.ref.quote, "input": index, "date": day.isoformat(),
            "superseded": [{"input": i, "date": d.isoformat(),
                            "value": inputs[i].value or inputs[i].ref.quote}
                           for d, _, i in reversed(keyed[:-1])]}


RUNNERS: dict[str, Callable[..., dict]] = {
    "date_diff": _date_diff, "count_distinct": _count_distinct, "sum": _sum,
    "difference": _difference, "order": _order, "latest": _latest,
}
