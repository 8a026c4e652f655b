"""Generated conversations with planted dates, amounts and changing facts, and a scripted
answerer that uses only the trove tools (grep -> evidence pack -> compute).

Shared by tests/test_evidence_host.py (through the real host) and bench/evidence.py
(through the dispatcher, at scale). Ground truth comes from the generator's own
dates and numbers, never from the parsers under test.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Callable

DAY = 86400.0
CITIES = ["Lisbon", "Porto", "Ghent", "Bergen", "Tartu", "Graz", "Lyon", "Cork", "Turku", "Bilbao"]
FIRMS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark", "Wayne"]
ITEMS = ["hotel", "flights", "museum pass", "rental car", "dinner", "ferry", "concert tickets"]
FOODS = ["Cervejaria Ramiro", "Taberna Sal", "Casa Nova", "Le Petit Zinc", "Osteria Blu",
         "Kafe Bryggen", "Tasca Verde", "Bistro Nord", "Maison Rouge", "Trattoria Sole"]
STREETS = ["Rua Augusta", "Elm Street", "Harbour Road", "Mill Lane", "Kings Way", "Park Row"]
WEEKDAY_NAMES = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NUMBER_NAMES = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
CURRENCIES = [("USD", "${:,.2f}", "{:,.2f} USD"), ("EUR", "€{:,.2f}", "{:,.2f} EUR"),
              ("GBP", "£{:,.2f}", "GBP {:,.2f}")]
OPERATIONS = ("date_diff", "sum", "count_distinct", "difference", "order", "latest")


@dataclass
class Planted:
    """One message to store: session, text, and when it was said (Unix seconds)."""

    session: str
    text: str
    at: float


@dataclass
class Question:
    """A question, the greps a careful agent would run, how it picks refs, and the truth."""

    operation: str
    text: str
    queries: list[str]
    pick: str                           # a regex a hit's quote must match to be used
    expected: object
    value_of: str | None = None         # regex group 1 = the value the agent read
    unit: str | None = None
    options: dict = field(default_factory=dict)


@dataclass
class World:
    """A generated multi-session conversation and its questions."""

    messages: list[Planted]
    questions: list[Question]


def _day(ts: float) -> date:
    return datetime.fromtimestamp(ts, timezone.utc).date()


def say_date(rng: random.Random, when: date, said: float | None) -> str:
    """``when`` written as a person would, relative to the said time when that is exact."""
    forms = [when.isoformat(), f"{when:%B} {when.day}, {when.year}",
             f"{when.day} {when:%B} {when.year}"]
    if said is not None:
        base = _day(said)
        back = (base - when).days
        if back == 1:
            forms.append("yesterday")
        if 1 <= back <= 7 and (base.weekday() - when.weekday()) % 7 == back % 7:
            forms.append(f"last {WEEKDAY_NAMES[when.weekday()]}")
        if 2 <= back <= 6:
            forms.append(f"{NUMBER_NAMES.get(back, back)} days ago")
        if back in (7, 14, 21):
            forms.append(f"{NUMBER_NAMES[back // 7]} weeks ago")
        if 0 < back and when.month == base.month and when.year == base.year:
            suffix = {1: "st", 2: "nd", 3: "rd"}.get(when.day % 10 if when.day not in (11, 12, 13)
                                                     else 0, "th")
            forms.append(f"on the {when.day}{suffix}")
    return rng.choice(forms)


def make_world(seed: int, *, sessions: int = 3, relative: bool = True,
               start: float = 1_767_225_600.0) -> World:
    """One user's history over ``sessions`` sessions with one question per operation."""
    rng = random.Random(seed)
    tag = "q" + "".join(chr(97 + int(d)) for d in str(seed))   # letters only: not a number
    messages: list[Planted] = []
    questions: list[Question] = []
    clock = [start + rng.randint(0, 200) * DAY]

    def plant(text: str, *, gap_days: float = 1.0) -> float:
        clock[0] += gap_days * DAY * rng.uniform(0.5, 1.5)
        messages.append(Planted(f"s{rng.randrange(sessions)}", text, clock[0]))
        return clock[0]

    def filler() -> None:
        plant(rng.choice(["Remind me to water the plants.", "Work was busy today.",
                          "I read a good book on the train.", "The weather turned cold."]),
              gap_days=0.3)

    def dated(words: str, when: date, after: str, gap: int) -> None:
        """A statement said ``gap`` days after ``when`` at 09:00, naming that day."""
        clock[0] = datetime(when.year, when.month, when.day, 9, tzinfo=timezone.utc).timestamp()
        at = plant("", gap_days=gap)
        messages[-1].text = f"{words} {say_date(rng, when, at if relative else None)}{after}"

    # date_diff: a move and a first day at work
    city, firm = rng.choice(CITIES), rng.choice(FIRMS)
    moved = _day(clock[0]) + timedelta(days=rng.randint(1, 20))
    dated(f"Finally settled: I moved to {city} {tag} on", moved, ".", rng.randint(1, 6))
    filler()
    started = _day(clock[0]) + timedelta(days=rng.randint(1, 30))
    dated(f"My first day at {firm} {tag} was", started, ", went well.", rng.randint(1, 7))
    questions.append(Question("date_diff", f"How many days between my move to {city} and my "
                              f"first day at {firm}?", [f"moved {city} {tag}", f"first day {firm} {tag}"],
                              rf"(moved to {city}|first day at {firm}) {tag}",
                              (started - moved).days))
    # sum: expenses of one trip in one currency, another trip's in another
    trip, other = rng.sample(CITIES, 2)
    code, *formats = rng.choice(CURRENCIES)
    other_code, *other_formats = rng.choice([c for c in CURRENCIES if c[0] != code])
    costs = [round(rng.uniform(10, 900), rng.choice([0, 2])) for _ in range(rng.randint(2, 5))]
    for item, cost in zip(rng.sample(ITEMS, len(costs)), costs):
        plant(f"For the {trip} {tag} trip the {item} cost {rng.choice(formats).format(cost)}.")
        if rng.random() < 0.5:
            plant(f"For the {other} {tag}x trip the {item} cost "
                  f"{rng.choice(other_formats).format(rng.uniform(10, 500))}.")
    questions.append(Question("sum", f"How much did I spend on the {trip} trip in total?",
                              [f"{trip} {tag} trip cost"], rf"the {trip} {tag} trip",
                              (round(sum(costs), 2), code)))
    # count_distinct: restaurants, some visited twice, names in varied case
    foods = rng.sample(FOODS, rng.randint(2, 5))
    visits = foods + rng.choices(foods, k=rng.randint(0, 3))
    rng.shuffle(visits)
    for name in visits:
        shown = name if rng.random() < 0.7 else name.lower()
        plant(f"Dinner {tag} tonight at {shown} - lovely.", gap_days=0.5)
    questions.append(Question("count_distinct", "How many different restaurants did I mention?",
                              [f"dinner {tag} tonight"], rf"Dinner {tag} tonight at",
                              len(set(foods)), value_of=r"tonight at (.+?) - lovely"))
    # difference: a budget and what was spent
    budget, spent = rng.randint(200, 2000), rng.randint(150, 2500)
    plant(f"The renovation {tag} budget is {formats[0].format(budget)}.")
    filler()
    plant(f"In the end the renovation {tag} cost {formats[0].format(spent)}.")
    questions.append(Question("difference", "How far over budget was the renovation?",
                              [f"renovation {tag} budget cost"], rf"renovation {tag}",
                              (spent - budget, code)))
    # order: events with dates, planted in shuffled order
    events = rng.sample(["passport renewed", "car serviced", "dentist visit", "tax filed"],
                        rng.randint(2, 4))
    days = rng.sample(range(1, 90), len(events))
    base = _day(clock[0])
    for name, back in zip(events, days):
        when = base - timedelta(days=back)
        plant(f"Logbook {tag}: {name} on {when:%B} {when.day}, {when.year}.", gap_days=0.2)
    truth = [name for _, name in sorted(zip(days, events), reverse=True)]
    questions.append(Question("order", "In what order did these things happen?",
                              [f"logbook {tag}"], rf"Logbook {tag}:", truth,
                              value_of=rf"Logbook {tag}: (.+?) on "))
    # latest: an address that changes
    streets = rng.sample(STREETS, rng.randint(2, 4))
    for street in streets:
        plant(f"My address {tag} is now {rng.randint(1, 99)} {street}.", gap_days=3)
        filler()
    questions.append(Question("latest", "What is my current address?", [f"address {tag}"],
                              rf"My address {tag} is", streets[-1]))
    return World(messages, questions)


Tool = Callable[[str, dict], dict]


def answer(question: Question, tool: Tool, scope: dict) -> object:
    """What a careful agent answers using only the tools: grep, pack, compute.

    ``scope`` holds the scope arguments (e.g. ``{"session_scope": "all"}``).
    Returns the computed answer in the generator's shape, or the error dict.
    """
    refs, seen = [], set()
    for query in question.queries:
        found = tool("trove_grep", {"query": query, "include_exact_ref": True, "limit": 20,
                                    **scope})
        for hit in found.get("results", []):
            ref = hit.get("exact_ref")
            if ref and re.search(question.pick, ref["quote"]) and ref["store_id"] not in seen:
                seen.add(ref["store_id"])
                if question.value_of:
                    ref = {**ref, "value": re.search(question.value_of, ref["quote"]).group(1)}
                refs.append(ref)
    refs.sort(key=lambda r: r["store_id"])
    pack = tool("trove_evidence_pack", {"refs": refs, "limit": 50, **scope})
    if "error" in pack or pack.get("failed"):
        return {"error": pack.get("error") or "a ref failed"}
    args = {"operation": question.operation, "inputs": refs, **scope}
    if question.operation == "date_diff":
        args["absolute"] = True
    out = tool("trove_compute", args)
    if "error" in out:
        return out
    result = out["result"]
    if question.operation in ("date_diff", "count_distinct"):
        return result["value"]
    if question.operation in ("sum", "difference"):
        return (result["value"], result["unit"])
    if question.operation == "order":
        return [step["text"] for step in result["order"]]
    return re.search(r"\d+ (.+)\.$", result["value"]).group(1)


def correct(question: Question, got: object) -> bool:
    """Exact match with the ground truth (money to the cent)."""
    if isinstance(question.expected, tuple) and isinstance(got, tuple):
        return abs(got[0] - question.expected[0]) < 0.005 and got[1] == question.expected[1]
    return got == question.expected
