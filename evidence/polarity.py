"""Whether a text negates, hedges or asks what it says: the one rule the evidence family
reads a statement's polarity by.

"We did NOT choose Postgres" holds every content word of "we chose Postgres", and
"Maybe we will pick Postgres" or "Did we pick Postgres?" every word of "we will pick
Postgres"; word overlap alone cited them as support, and the assertion patterns read
"I don't think my flight is cancelled" as the fact "flight: cancelled". The cues are
deliberately plain and fail closed: a quote whose other clause says "not" makes a
positive claim unsupported until a narrower quote is cited (the reason says so),
which is cheap; citing a denial as support is not.

- negation: not, no (a determiner, not "No," as an interjection), never, none,
  nobody, nothing, nowhere, neither, nor, cannot, without, and any "n't";
- hedge: maybe, perhaps, possibly, probably, might, unsure, "not sure", if, whether,
  unless, considering, "thinking about", and "may" written in lower case (the verb;
  the month is capitalized or followed by its day);
- question: the text ends with "?" (closing quotes and brackets aside).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NEGATION = re.compile(
    r"\b(?:not|never|none|nobody|nothing|nowhere|neither|nor|cannot|without)\b"
    r"|\bno\b(?!\s*[,.!?;:]|\s*$)"
    r"|n['\u2019]t\b", re.I)
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|possibly|probably|might|unsure|if|whether|unless|considering)\b"
    r"|\bthinking\s+(?:about|of)\b|\bnot\s+sure\b", re.I)
_MAY_VERB = re.compile(r"\bmay\b(?!\s*\d)")     # case-sensitive: "May 5" is the month
_QUESTION = re.compile(r"\?[\s\"'\u201d\u2019)\]]*$")


@dataclass(frozen=True)
class Polarity:
    """The cues found in one text: the words that negate, hedge, and whether it asks."""

    negations: tuple[str, ...]
    hedges: tuple[str, ...]
    question: bool

    @property
    def uncertain(self) -> bool:
        """Whether the text stops short of asserting: a hedge or a question."""
        return bool(self.hedges) or self.question


def polarity(text: str) -> Polarity:
    """The negation and hedge cues of ``text`` (as written) and whether it is a question."""
    negations = tuple(m.group(0) for m in _NEGATION.finditer(text))
    hedges = tuple(m.group(0) for m in _HEDGE.finditer(text))
    hedges += tuple(m.group(0) for m in _MAY_VERB.finditer(text))
    return Polarity(negations, hedges, bool(_QUESTION.search(text)))


def cues(text: str) -> list[str]:
    """How ``text`` stops short of a plain positive statement, one phrase per kind
    ("negates (not)", "hedges (maybe)", "asks (a question)"); empty when it asserts.

    Why: a pack item or a computed input whose quote denies, hedges or asks was shown, or
    summed, exactly like a plain statement; this is the flag they carry (or refuse on)."""
    return _phrases(polarity(text))


def cues_around(text: str, start: int, end: int) -> list[str]:
    """``cues`` of the words that state the value at ``text[start:end]``: negation cues
    of its clause (up to a comma, colon or sentence end on either side, the value's own
    span never split); hedges and the question mark of its whole sentence ("$40, if I
    remember right" hedges the $40).

    Why: compute refused "We paid $40, not bad" and "No, we paid $300" for a "not" or
    "no" that is not about the amount; "We did not pay $300" or "Did we pay $300?" must
    still never count as $300."""
    sentence_begin = max(text.rfind(c, 0, start) for c in _SENTENCE_ENDS) + 1
    ends = [at for at in (text.find(c, end) for c in _SENTENCE_ENDS) if at >= 0]
    sentence_end = min(ends) + 1 if ends else len(text)
    clause_begin = max([sentence_begin] + [text.rfind(c, sentence_begin, start) + 1
                                           for c in _CLAUSE_ENDS])
    stops = [at for at in (text.find(c, end, sentence_end) for c in _CLAUSE_ENDS) if at >= 0]
    clause = polarity(text[clause_begin:min(stops, default=sentence_end)])
    sentence = polarity(text[sentence_begin:sentence_end])
    return _phrases(Polarity(clause.negations, sentence.hedges, sentence.question))


_SENTENCE_ENDS = ".!?;\n"
_CLAUSE_ENDS = ",:"


def _phrases(said: Polarity) -> list[str]:
    out = []
    if said.negations:
        out.append(f"negates ({', '.join(sorted(set(said.negations)))})")
    if said.hedges:
        out.append(f"hedges ({', '.join(sorted(set(said.hedges)))})")
    if said.question:
        out.append("asks (a question)")
    return out


def mismatch(claim: str, quotes: list[str]) -> list[str]:
    """Why quotes cannot support a claim on polarity: one negates and the claim does not
    (or the reverse), or one hedges or asks while the claim asserts. Empty when they agree."""
    said, shown = polarity(claim), [polarity(q) for q in quotes]
    reasons = []
    negating = [n for p in shown for n in p.negations]
    if negating and not said.negations:
        reasons.append(f"the quotes negate it ({', '.join(sorted(set(negating)))!s}); cite "
                       "the words that state the claim, or state the negation in the claim")
    elif said.negations and not negating:
        reasons.append(f"the claim negates ({', '.join(sorted(set(said.negations)))}) what "
                       "its quotes state")
    if any(p.uncertain for p in shown) and not said.uncertain:
        cues = sorted({h for p in shown for h in p.hedges} | (
            {"a question"} if any(p.question for p in shown) else set()))
        reasons.append(f"the quotes do not assert it ({', '.join(cues)}); the claim states "
                       "it as fact")
    return reasons
