"""Real multi-session chats with questions derived mechanically, for ``recall_quality.py``.

Source: the ``chitchat-dataset`` package on PyPI (MIT; BYU PCC lab's Chit-Chat
Challenge, 2018): 7,168 conversations between 1,315 people typing to each
other, with a timestamp on every message. The data file ships inside the
wheel and is read from the installed package; nothing is downloaded. Nobody
here wrote a word of it, and nothing in it was written for a question.

A *history* is every conversation of one pair of people (the same two
senders), in time order; each conversation is one dated session. A *turn*
is one run of messages by one sender (joined by newlines). The pairs with
the most conversations of at least ``MIN_TURNS`` turns are taken, up to
``max_sessions`` sessions each.

Questions are derived by rule, never picked by hand or by a ranking. A
*question turn* is a turn whose last message is one self-contained question a
reader could answer from the reply alone: a single sentence ending with ``?``
that starts with a question word (``QUESTION_WORDS``: "what", "do", "have",
...), refers back to nothing said before (none of ``BACK_REFERENCES``: "it",
"that", "there", ...) and has at least ``MIN_QUESTION_TERMS`` content words
(stop words out, plurals folded, as BM25 reads them). The other person's next
turn is its *reply* when it has at least ``MIN_REPLY_TERMS`` content words and
does not open with a question of its own (a counter-question answers nothing).
The first rules (any message ending with ``?``) let in questions nobody could
answer from their evidence ("Besides my chosen super power?", "Noodles? do you
plan on using dynomite?"); these rules keep the questions a person could. The question message is
taken out of the stored history (the rest of its turn stays; a turn left
empty goes), so the question is asked later, at the end of the history, as a
new turn, and only the reply can answer it. Kinds:

- ``single-hop``: a question asked once in the history (no other question's
  content words overlap its own by ``SIMILAR`` or more, Jaccard) whose reply
  shares a content word with it;
- ``open-domain``: the same, but the reply shares no content word with the
  question (only meaning links them: the turn's words are not the question's);
- ``temporal``: the query names the date of the question's session; first
  from questions with alike questions (``SIMILAR``) in other sessions only,
  where the date is what tells them apart (rare in this data), then topped up
  with unique questions, where the date is a cue beside the words
  ("On April 22, 2018: <question>") and only that session's reply is evidence;
- ``multi-hop``: two unique questions from two different sessions, answered by
  the same person, asked as one ("<first> Also, <second>"); both replies are
  evidence (R@5 counts each).

With ``--asked name`` (``ask_by_name``) every question names the people instead
of "you" and "I", as a user asks a memory about people ("Are you dressing up?"
asked of Melanie by Caroline becomes "Is Melanie dressing up?"); the
evidence is unchanged. The names are the rendering's (``chats.NAMES``), which
the chats' own text never writes: in ``named`` turns the name is the sender's
field, in ``plain`` turns it is a name no row holds.

With ``--questions typed`` the kinds are instead what a question asks for (``asks
time`` / ``number`` / ``place``, ``recall.answer_type.expected``), from the unique
questions, up to ``TYPED_PER_KIND`` each: a set to measure the answer-type preference.

Per history at most ``PER_KIND`` questions of each kind, drawn with a seeded
``random.Random`` (the pair's rank), so the set is the same on every run.
Renderings as in ``chats.py``: ``plain`` (first sender = user, the other =
assistant), ``named`` (``[Name] text``, every turn role user, names from
``chats.NAMES``) and ``field``.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

import chats
from hermes_trove.recall import answer_type, query_plan

MIN_TURNS = 8               # a conversation shorter than this is left out
MIN_QUESTION_TERMS = 2
QUESTION_WORDS = frozenset("""what when where who whom whose which why how do does did have has
had are is was were can could would will should ever""".split())
BACK_REFERENCES = frozenset("it that this those these they them he she him her there".split())
_SENTENCE_END = re.compile(r"[.!?]\s")
SIMILAR = 0.4               # two questions are alike when their content words overlap this much
MIN_REPLY_TERMS = 5
PER_KIND = 6
KINDS = ("single-hop", "open-domain", "temporal", "multi-hop")
TYPED_PER_KIND = 10         # --questions typed: at most this many per history and answer kind
ANSWER_KINDS = ("time", "number", "place")


@dataclass
class Question:
    """A derived question: its text, kind and the turn indexes that answer it."""

    text: str
    kind: str
    evidence: list[int]
    overlap: str = "-"


@dataclass
class History:
    """One pair's conversations as turns (index order), with its questions."""

    people: list[str]
    turns: list[dict] = field(default_factory=list)     # speaker, text, timestamp, session
    questions: list[Question] = field(default_factory=list)
    session_starts: list[float] = field(default_factory=list)


def load_dataset() -> dict:
    """The conversations, from the installed ``chitchat_dataset`` package (offline)."""
    try:
        import chitchat_dataset
    except ImportError as exc:
        raise SystemExit("--data chitchat needs the package chitchat-dataset "
                         "(pip install chitchat-dataset; see requirements-dev.txt)") from exc
    return dict(chitchat_dataset.Dataset())


def _epoch(stamp: str) -> float:
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def _terms(text: str) -> set[str]:
    return {query_plan.singular(t) for t in query_plan.fts_tokens(text)
            if t not in query_plan.STOP_WORDS}


def _conversation_turns(conv: dict) -> list[tuple[str, list[str], float]]:
    """(sender, messages, time of the first) per run of one sender."""
    turns: list[tuple[str, list[str], float]] = []
    for group in conv["messages"]:
        for message in group:
            text = (message.get("text") or "").strip()
            if not text:
                continue
            sender = message["sender"]
            if turns and turns[-1][0] == sender:
                turns[-1][1].append(text)
            else:
                turns.append((sender, [text], _epoch(message["timestamp"])))
    return turns


def histories(n_histories: int, max_sessions: int, questions: str = "kinds") -> list[History]:
    """The ``n_histories`` pairs with most usable conversations, questions derived
    (``questions="typed"``: only questions asking for a time, number or place, see
    ``_derive``)."""
    data = load_dataset()
    by_pair: dict[frozenset, list] = defaultdict(list)
    for key in sorted(data):
        turns = _conversation_turns(data[key])
        senders = frozenset(t[0] for t in turns)
        if len(senders) == 2 and len(turns) >= MIN_TURNS:
            by_pair[senders].append(turns)
    pairs = sorted(by_pair, key=lambda p: (-len(by_pair[p]), sorted(p)))
    result = []
    for rank, pair in enumerate(pairs[:n_histories]):
        sessions = sorted(by_pair[pair], key=lambda turns: turns[0][2])[:max_sessions]
        result.append(_derive(rank, sessions, typed=questions == "typed"))
    return result


_AGREE = {"are": "is", "were": "was", "do": "does", "have": "has", "am": "is"}
_CONTRACTED = {"re": "is", "ve": "has", "ll": "will", "d": "would", "m": "is"}


def named_question(text: str, asked: str, asker: str) -> str:
    """A derived question as a third person would ask it, naming the people instead of
    "you" and "I" ("Are you dressing up?" -> "Is Melanie dressing up?"), by rule:
    second person becomes the person asked (``asked``: the one who replied), first
    person the one who asked, and the verb next to the pronoun agrees ("do you" ->
    "does Melanie", "you're" -> "Melanie is", "am I" -> "is Caroline").

    Why: the questions a user puts to a memory name people ("What did Caroline
    research?"), and over ``[Name] text`` turns the name is a field to match; asked
    with "you", a real chat's questions cannot measure that (``--asked name``)."""
    def person(pronoun: str) -> str | None:
        word = pronoun.lower()
        if word in ("you", "yourself"):
            return asked
        if word in ("i", "me", "myself"):
            return asker
        return None

    def aux_before(match: re.Match) -> str:
        aux, pronoun = match.group(1), match.group(2)
        verb = _AGREE[aux.lower()]
        return (verb.capitalize() if aux[0].isupper() else verb) + " " + person(pronoun)

    def pronoun_aux(match: re.Match) -> str:
        return person(match.group(1)) + " " + _AGREE[match.group(2).lower()]

    def contracted(match: re.Match) -> str:
        return person(match.group(1)) + " " + _CONTRACTED[match.group(2).lower()]

    text = re.sub(r"\b(are|were|do|have|am)\s+(you|I)\b", aux_before, text, flags=re.I)
    text = re.sub(r"\b(you|I)\s+(are|were|have|am)\b", pronoun_aux, text, flags=re.I)
    text = re.sub(r"\b(you|I)['\u2019](re|ve|ll|d|m)\b", contracted, text, flags=re.I)
    text = re.sub(r"\b(your|yours)\b", asked + "'s", text, flags=re.I)
    text = re.sub(r"\b(my|mine)\b", asker + "'s", text, flags=re.I)
    return re.sub(r"\b(you|yourself|I|me|myself)\b", lambda m: person(m.group(1)), text,
                  flags=re.I)


def ask_by_name(history: History) -> None:
    """Every question of the history as ``named_question`` words it (in place)."""
    for question in history.questions:
        replier = history.turns[question.evidence[0]]["speaker"]
        question.text = named_question(question.text, history.people[replier],
                                       history.people[1 - replier])


def self_contained(question: str) -> bool:
    """True for one question sentence that opens with a question word and points back
    at nothing said before (the rules of the module docstring)."""
    words = re.findall(r"[a-z']+", question.lower())
    return (question.endswith("?") and bool(words) and words[0] in QUESTION_WORDS
            and not _SENTENCE_END.search(question[:-1])
            and not BACK_REFERENCES.intersection(words))


def _derive(rank: int, sessions: list, typed: bool = False) -> History:
    """Questions of one history by the rules of the module docstring.

    ``typed``: instead of the four kinds, the unique questions that ask for one kind
    of answer (``answer_type.expected``: a time, a number, a place), up to
    ``TYPED_PER_KIND`` of each, kind ``asks <kind>``, their reply the evidence
    whatever it holds. Why: the four kinds hold only 21 such questions, too few to
    measure the answer-type preference (``recall.arms.ANSWER_TYPE``)."""
    first = sessions[0][0][0]
    names = [chats.NAMES[(2 * rank) % len(chats.NAMES)],
             chats.NAMES[(2 * rank + 1) % len(chats.NAMES)]]
    raw = []                  # (session, sender, messages, time)
    for s, turns in enumerate(sessions):
        for sender, messages, when in turns:
            raw.append([s, 0 if sender == first else 1, list(messages), when])
    candidates = []           # (signature, question text, question turn, reply turn)
    for i in range(len(raw) - 1):
        s, speaker, messages, _ = raw[i]
        nxt = raw[i + 1]
        question = messages[-1]
        if nxt[0] != s or nxt[1] == speaker or not self_contained(question):
            continue
        q_terms = _terms(question)
        reply_terms = _terms("\n".join(nxt[2]))
        if len(q_terms) < MIN_QUESTION_TERMS or len(reply_terms) < MIN_REPLY_TERMS \
                or nxt[2][0].rstrip().endswith("?"):
            continue
        candidates.append((frozenset(q_terms), question, i, i + 1, bool(q_terms & reply_terms)))
    alike: dict[int, list] = defaultdict(list)      # question turn -> similar questions
    for a in candidates:
        for b in candidates:
            if a is not b and len(a[0] & b[0]) >= SIMILAR * len(a[0] | b[0]):
                alike[a[2]].append(b)
    rng = random.Random(rank)
    unique = [c for c in candidates if not alike[c[2]]]
    repeated = [c for c in candidates if alike[c[2]]
                and all(raw[b[2]][0] != raw[c[2]][0] for b in alike[c[2]])]
    used: set[int] = set()
    chosen: list[tuple[str, str, list[int], list[int]]] = []   # kind, text, asked, evidence

    def free(*cands) -> bool:
        turns = [t for c in cands for t in (c[2], c[3])]
        return len(set(turns)) == len(turns) and not used & set(turns)

    def shuffled(pool: list) -> list:
        pool = list(pool)
        rng.shuffle(pool)
        return pool

    def take(kind: str, pool: list, make, most: int = PER_KIND) -> None:
        taken = 0
        for item in pool:
            if taken >= most:
                break
            cands = item if isinstance(item, tuple) and isinstance(item[0], tuple) else (item,)
            if not free(*cands):
                continue
            for c in cands:
                used.update((c[2], c[3]))
            chosen.append((kind, make(*cands), [c[2] for c in cands], [c[3] for c in cands]))
            taken += 1

    if typed:
        for kind in ANSWER_KINDS:
            take(f"asks {kind}", shuffled([c for c in unique
                                           if answer_type.expected(c[1]) == {kind}]),
                 lambda c: c[1], TYPED_PER_KIND)
    else:
        take("single-hop", shuffled([c for c in unique if c[4]]), lambda c: c[1])
        take("open-domain", shuffled([c for c in unique if not c[4]]), lambda c: c[1])
        pairs = []
        for replier in (0, 1):
            mine = [c for c in unique if raw[c[3]][1] == replier]
            rng.shuffle(mine)
            pairs += [(a, b) for a, b in zip(mine[::2], mine[1::2])
                      if raw[a[2]][0] != raw[b[2]][0]]
        take("multi-hop", shuffled(pairs), lambda a, b: f"{a[1]} Also, {b[1]}")
        take("temporal", shuffled(repeated) + shuffled(unique),
             lambda c: f"On {_date(raw[c[2]][3])}: {c[1]}")
    asked = {t for _, _, turns, _ in chosen for t in turns}
    for i in asked:
        raw[i][2] = raw[i][2][:-1]
    history = History(names)
    index_of: dict[int, int] = {}
    for i, (s, speaker, messages, when) in enumerate(raw):
        if not messages:
            continue
        index_of[i] = len(history.turns)
        history.turns.append({"speaker": speaker, "text": "\n".join(messages),
                              "timestamp": when, "session": s})
    history.session_starts = [turns[0][2] for turns in sessions]
    for kind, text, _, evidence in chosen:
        history.questions.append(Question(text, kind, [index_of[e] for e in evidence]))
    return history


def _date(when: float) -> str:
    day = datetime.fromtimestamp(when, timezone.utc)
    return f"{day.strftime('%B')} {day.day}, {day.year}"


def render(history: History, style: str) -> list[dict]:
    """The history's turns as host messages in one of ``chats.render``'s styles."""
    messages = []
    for turn in history.turns:
        name = history.people[turn["speaker"]]
        if style == "plain":
            message = {"role": "user" if turn["speaker"] == 0 else "assistant",
                       "content": turn["text"]}
        elif style == "named":
            message = {"role": "user", "content": f"[{name}] {turn['text']}"}
        elif style == "field":
            message = {"role": "user", "content": turn["text"], "name": name}
        else:
            raise ValueError(f"unknown style {style!r}")
        message["timestamp"] = turn["timestamp"]
        messages.append(message)
    return messages
