"""Generated two-person, multi-session chats whose questions paraphrase their answers.

Used by ``bench/recall_quality.py``. Nothing here is written to match a search
method: each *event* is a thing one person (the owner) tells the other, in the
owner's own words, and its question is what someone who remembers it would
ask later, with other words, the owner's name and often "when". Lexical
overlap between question and answer is deliberately mixed, as in real chats:

- ``shared``: the question reuses one or two content words of the answer;
- ``morph``: it reuses them only in another form (plural, -ing, -ed);
- ``none``: no content word in common (only meaning, and the owner's name).

Kinds of question: ``single`` (one turn answers it), ``temporal`` ("when did
<name> ...": the turn's date answers it) and ``multi`` (the answer spans two
turns of the owner, with the partner's reply between them). The partner's
replies address the owner by name ("That's great, Caroline!"), which is the
trap for ranking by name: a question naming a person should find that
person's turn, not the turns said *to* that person. Distractor lines share
the questions' words but answer none of them; each is said at most twice in
a chat (small talk repeats freely).

Conversations are seeded and fully deterministic. A conversation has
``sessions`` dated sessions (a week apart) of small talk with the events
spread over them. Three renderings of the same turns:

- ``plain``: ``user`` / ``assistant`` roles, text only (no names anywhere but
  where people address each other);
- ``named``: every turn ``role=user`` with ``[Name] text``, as Hermes's
  gateway shows shared chats;
- ``field``: every turn ``role=user`` with the speaker in the message's
  ``name`` field.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NAMES = ["Caroline", "Melanie", "Jonathan", "Gina", "Audrey", "Andrew", "Nathan", "Joanna",
         "Timothy", "Maria", "Deborah", "Evan", "Samuel", "Calvin", "Priya", "Jolene",
         "Tobias", "Harriet", "Oskar", "Leila"]

# (kind, overlap, owner turns, question). In owner turns "|" separates the two
# evidence turns of a multi-hop event. {P} is the partner's name, {O} the owner's.
EVENTS = [
    ("temporal", "none", "I signed up for a ceramics workshop downtown, my first bowl came out "
     "lopsided but I love it.", "When did {O} start taking pottery classes?"),
    ("temporal", "none", "We brought home a little rescue pup from the shelter yesterday, he "
     "chews everything.", "When did {O} adopt a dog?"),
    ("single", "shared", "My sister just had her baby, a tiny boy called Theo!",
     "What is the name of {O}'s sister's baby?"),
    ("temporal", "morph", "I ran my very first half marathon this morning, my legs are jelly.",
     "When did {O} run a marathon?"),
    ("single", "shared", "The novel I keep rereading is The Remains of the Day, it gets me every "
     "time.", "Which novel does {O} keep rereading?"),
    ("single", "none", "I finally quit the bank. Starting Monday I'm the new head baker at "
     "Crumb & Co.", "What new job did {O} take?"),
    ("temporal", "shared", "We got back from Lisbon last night, the tiles and the custard tarts "
     "were unreal.", "When did {O} travel to Lisbon?"),
    ("single", "morph", "I've been painting sunsets over the lake, mostly in watercolour.",
     "What does {O} paint?"),
    ("multi", "shared", "Guess what, I'm volunteering at the animal shelter now.|"
     "Mostly I walk the older dogs and clean the cat room on Saturdays.",
     "What does {O} do as a volunteer at the shelter?"),
    ("temporal", "none", "Dad had his hip operation today and the surgeon says it went well.",
     "When did {O}'s father have surgery?"),
    ("single", "shared", "My favourite band is Fleetwood Mac, I know every word of Rumours.",
     "Which band is {O}'s favourite?"),
    ("single", "none", "I picked up the cello again after ten years, my fingers remember "
     "more than I thought.", "Which instrument did {O} go back to playing?"),
    ("temporal", "morph", "We moved into the new flat on Elm Street, boxes everywhere.",
     "When did {O} move to a new apartment?"),
    ("multi", "morph", "I've started learning Japanese with an app.|Next spring I want to "
     "order ramen in Osaka without pointing at pictures.",
     "Why is {O} learning Japanese, and where does {O} plan to go?"),
    ("single", "shared", "For my birthday my kids baked me a lemon cake, lopsided but delicious.",
     "What cake did {O}'s kids bake for the birthday?"),
    ("temporal", "none", "I passed my driving test on the second try, no more buses for me!",
     "When did {O} get a driver's license?"),
    ("single", "none", "We're expecting in March, it's a girl!",
     "Is {O} pregnant, and when is the due date?"),
    ("single", "shared", "I'm reading a biography of Marie Curie, she was fearless.",
     "Whose biography is {O} reading?"),
    ("temporal", "shared", "The community garden gave us a plot, I planted tomatoes and basil.",
     "When did {O} get a plot in the community garden?"),
    ("multi", "none", "I went to a support group for parents of autistic kids.|"
     "Talking to people who get it made me feel so much less alone.",
     "How did {O} feel after meeting other parents in a similar situation?"),
    ("single", "morph", "Our team won the regional chess tournament, I played board two.",
     "Which tournament did {O}'s team win?"),
    ("temporal", "none", "Today I handed in my thesis, four years of work in one pdf.",
     "When did {O} finish the dissertation?"),
    ("single", "shared", "My grandmother taught me to knit scarves when I was nine.",
     "Who taught {O} to knit?"),
    ("single", "none", "I've been camping in the redwoods with my brother, no phone signal "
     "for five days.", "Where did {O} go on the outdoor trip with a sibling?"),
    ("temporal", "morph", "I adopted two kittens from my neighbour, Salt and Pepper.",
     "When did {O} adopt the cats?"),
    ("multi", "shared", "I entered a photography contest with a shot of the harbour.|"
     "It came second, they're printing it in the local paper.",
     "How did {O} do in the photography contest?"),
    ("single", "morph", "I'm organizing a charity run for the children's hospital.",
     "What charity event is {O} organising?"),
    ("temporal", "none", "We got engaged on the beach at sunset, I said yes before he finished.",
     "When did {O} get a marriage proposal?"),
    ("single", "shared", "My therapist suggested journaling every night, it helps me sleep.",
     "What did {O}'s therapist suggest?"),
    ("single", "none", "I've been teaching myself to fix old motorbikes in the garage.",
     "What mechanical hobby has {O} picked up?"),
]

DISTRACTOR_SHARE = 0.15      # share of small-talk slots that take a distractor line
DISTRACTOR_USES = 2           # real people rarely repeat a sentence word for word

# Lines that share a question's words but do not answer it (by either person).
DISTRACTORS = [
    "Classes at the gym are packed in January, I can never get a spot.",
    "The neighbour's dog barked all night again.",
    "Her name is on the list for the school play.",
    "Watching the marathon on TV always makes me want to start running.",
    "The book club picked a novel nobody finished.",
    "My job has been so stressful lately, meetings all day.",
    "I'd love to travel somewhere warm this winter.",
    "The kids painted the fence and got more paint on themselves.",
    "The shelter down the road is looking for donations.",
    "My father keeps asking me to call more often.",
    "That band played at the festival but I missed them.",
    "I used to play piano as a kid, I barely remember any of it.",
    "The apartment above us has new tenants, very loud.",
    "Learning anything new at our age takes patience.",
    "We had cake at the office for someone's birthday.",
    "The bus was late again, I should really learn to drive.",
    "My cousin is due any day now, the whole family is waiting.",
    "I love reading about history before bed.",
    "The garden needs weeding, the tomatoes are drowning.",
    "Feeling anxious lately, work and everything.",
    "Chess is hard, I lose every game against my nephew.",
    "Writing anything long makes my head spin.",
    "Winter means scarves and hot chocolate.",
    "We went to the beach with my sister's kids.",
    "Cats are easier than dogs, honestly.",
    "The photography exhibit at the museum was stunning.",
    "Running for charity sounds lovely but I'm not fit enough.",
    "My friend just got married in a tiny chapel.",
    "I keep meaning to suggest a weekly game night.",
    "Fixing anything in this house takes three trips to the hardware store.",
]

SMALL_TALK = [
    "Hey {P}! How has your week been?",
    "Pretty good, thanks for asking. Busy but good.",
    "Haha that's so true, {P}.",
    "I know right? Same here.",
    "Thanks {P}, you always know what to say.",
    "Anyway, what's new with you?",
    "Not much, mostly work and sleep honestly.",
    "Let's catch up properly soon, {P}.",
    "Sounds like a plan!",
    "The weather has been awful, rain every day.",
    "I made soup tonight, nothing fancy.",
    "Did you watch the game on Sunday?",
    "I need a holiday so badly.",
    "That made me laugh out loud, {P}.",
    "Take care of yourself, ok?",
    "Talk soon!",
    "Wow, time flies.",
    "I'm so tired today, {P}.",
    "Coffee is the only thing keeping me going.",
    "Tell me everything next time!",
]

REPLIES = [
    "Wow {O}, that's amazing!",
    "That's so great to hear, {O}.",
    "I'm so happy for you, {O}! Tell me more.",
    "No way, {O}! How did that happen?",
    "Oh {O}, that sounds wonderful.",
    "Good for you, {O}. You deserve it.",
]


@dataclass
class Turn:
    """One chat line: who said it and what."""

    speaker: str
    text: str
    session: int
    evidence_of: list[int] = field(default_factory=list)   # question ids it answers


@dataclass
class Question:
    """A question, the turns that answer it, and how it relates to them."""

    qid: int
    text: str
    kind: str
    overlap: str
    evidence: list[int] = field(default_factory=list)      # indexes into the turn list


@dataclass
class Chat:
    """One generated conversation: two people, dated sessions, questions."""

    people: tuple[str, str]
    turns: list[Turn]
    questions: list[Question]
    session_starts: list[float]


def make_chat(seed: int, *, sessions: int = 20, turns_per_session: int = 30,
              start: float = 1_700_000_000.0) -> Chat:
    """A deterministic two-person chat with every event told once and asked about once."""
    rng = random.Random(seed)
    people = tuple(rng.sample(NAMES, 2))
    events = list(enumerate(EVENTS))
    rng.shuffle(events)
    per_session: dict[int, list] = {}
    for i, event in enumerate(events):
        per_session.setdefault(rng.randrange(sessions), []).append(event)
    turns: list[Turn] = []
    questions: list[Question] = []
    deck = DISTRACTORS * DISTRACTOR_USES        # each distractor said at most this many times
    rng.shuffle(deck)
    for session in range(sessions):
        script: list[tuple[int, str, int | None]] = []     # (speaker index, text, question id)
        for _ in range(turns_per_session):
            line = deck.pop() if deck and rng.random() < DISTRACTOR_SHARE else rng.choice(SMALL_TALK)
            script.append((len(script) % 2, line, None))
        for _, (kind, overlap, said, question) in per_session.get(session, []):
            owner = rng.randrange(2)
            qid = len(questions)
            parts = said.split("|")
            block = [(owner, parts[0], qid), (1 - owner, rng.choice(REPLIES), None)]
            if len(parts) > 1:
                block += [(owner, parts[1], qid), (1 - owner, rng.choice(REPLIES), None)]
            at = rng.randrange(len(script) + 1)
            script[at:at] = block
            questions.append(Question(qid, question.format(O=people[owner]), kind, overlap))
            questions[-1].owner = owner  # type: ignore[attr-defined]
        for speaker, text, qid in script:
            other = people[1 - speaker]
            turn = Turn(people[speaker], text.format(P=other, O=other), session)
            if qid is not None:
                turn.evidence_of.append(qid)
                questions[qid].evidence.append(len(turns))
            turns.append(turn)
    starts = [start + session * 7 * 86400 for session in range(sessions)]
    return Chat(people, turns, questions, starts)


def render(chat: Chat, style: str) -> list[dict]:
    """The chat's turns as host messages in one of the styles (plain, named, field)."""
    messages = []
    position: dict[int, int] = {}
    for turn in chat.turns:
        position[turn.session] = position.get(turn.session, 0) + 1
        when = chat.session_starts[turn.session] + 60 * position[turn.session]
        if style == "plain":
            role = "user" if turn.speaker == chat.people[0] else "assistant"
            message = {"role": role, "content": turn.text}
        elif style == "named":
            message = {"role": "user", "content": f"[{turn.speaker}] {turn.text}"}
        elif style == "field":
            message = {"role": "user", "content": turn.text, "name": turn.speaker}
        else:
            raise ValueError(f"unknown style {style!r}")
        message["timestamp"] = when
        messages.append(message)
    return messages
