"""What kind of answer a question asks for, and whether a turn holds one.

A question that asks *when*, *how many* or *where* is answered by a turn that tells
a time ("I got back in august"), a number ("two hours a day") or a place ("we moved
to Provo"); the turns that only mention the same event do not. This is answer-type
matching, the classic cue of question answering, used here as a soft preference
(``recall.arms.ANSWER_TYPE``) that re-orders the candidates the arms found; it never
adds or removes one.

The evidence is from real chats nobody here wrote (``bench/answer_types.py``, every
conversation of the chitchat-dataset package): the other person's reply to such a
question holds its kind of answer several times as often as any turn does.

``expected(question)`` names the kinds a question asks for (one per sentence that
opens with a question word of a kind; "what did you do when you were young?" asks
none); ``holds(kind, text)`` reads a turn. Both are plain regular expressions: no
model, no per-language table beyond English question words.
"""

from __future__ import annotations

import re

from .periods import MONTH_WORDS

_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_COUNT_WORDS = "a\\s+(?:few|couple(?:\\s+of)?)|\\d{1,3}|one|two|three|four|five|six|several"

_TELLS = {
    "time": re.compile(       # a time told in passing: "yesterday", "last Friday", "in 2019"
        r"\b(?:yesterday|today|tonight|tomorrow|last\s+night|this\s+(?:morning|afternoon|evening)|"
        r"(?:last|this|next|past)\s+(?:week|weekend|month|year|summer|winter|spring|fall|"
        rf"autumn|{_WEEKDAYS}|{MONTH_WORDS})|"
        rf"(?:{_COUNT_WORDS})\s+(?:minutes?|hours?|days?|weeks?|months?|years?)\s+ago|"
        rf"in\s+(?:{_COUNT_WORDS})\s+(?:minutes|hours|days|weeks|months|years)|"
        rf"(?:on\s+)?(?:{_WEEKDAYS})|"
        r"(?:january|february|march|april|june|july|august|september|october|november|december)|"
        rf"(?:in|on|since|until)\s+(?:{MONTH_WORDS})|"
        r"(?:in|since|until|of|back\s+in)\s+(?:19|20)\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?|"
        r"\d{4}-\d{2}-\d{2})\b", re.I),
    "number": re.compile(     # a count or amount: "3", "two", "a dozen", "a few"
        r"\b(?:\d+(?:[.,]\d+)?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|"
        r"twelve|fifteen|twenty|thirty|forty|fifty|hundred|thousand|million|dozen|"
        r"a\s+few|a\s+couple|several|half)\b", re.I),
    "place": re.compile(      # "in Utah", "at the park", "to school" (a capital or a place noun)
        r"\b(?:in|at|to|from|near|around)\s+(?:the\s+)?(?:[A-Z][a-z]+|"
        r"(?i:home|school|work|church|college|campus|downtown|beach|park|mountains?|gym|"
        r"library|mall|store|city|lake|river|restaurant|house|apartment|office|hospital|"
        r"airport|country|state|town))\b"),
}

_OPENING = r"(?:^|[.?!:;]\s+|,\s*(?:and|but|so|also)\s+)(?:(?:and|but|so|also),?\s+)?"
_ASKS = (                     # (kind, what a sentence asking for it opens with), checked in order
    ("time", re.compile(_OPENING + r"(?:when\b|since\s+when\b|how\s+long\s+ago\b|"
                        r"(?:what|which)\s+(?:year|month|day|date|week|weekend|time\s+of\s+year)"
                        r"\b(?!\s+of\b))", re.I)),
    ("number", re.compile(_OPENING + r"how\s+(?:many|much|old|long|far|often)\b(?!\s+ago\b)",
                          re.I)),
    ("place", re.compile(_OPENING + r"where\b", re.I)),
)


def expected(question: str) -> frozenset[str]:
    """The kinds of answer ``question`` asks for ("time", "number", "place"), empty
    when none: a sentence opening with when / what year / how long ago asks a time,
    with how many / much / old / long / far / often a number, with where a place.

    Why: the search prefers the turns holding such an answer (``holds``); a question
    word inside a clause ("what did you do when you were young?") asks for no kind."""
    text = question.strip()
    return frozenset(kind for kind, pattern in _ASKS if pattern.search(text))


def holds(kind: str, text: str) -> bool:
    """``text`` tells an answer of ``kind``: a time (a relative day or period, a
    weekday, a month other than "may", a year after "in" / "since", a written date), a
    number (digits or a number word), or a place (after in / at / to / from: a
    capitalized name or a common place noun).

    Why: see ``expected``; the patterns are deliberately plain, as the preference
    they feed is soft."""
    pattern = _TELLS.get(kind)
    return bool(pattern and pattern.search(text))
