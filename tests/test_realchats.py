"""The real-chat bench's questions are derived by rule and never leak into the history."""
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("chitchat_dataset")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import realchats  # noqa: E402


@pytest.fixture(scope="module")
def histories():
    return realchats.histories(3, 12)


def test_every_kind_is_derived_and_is_deterministic(histories):
    kinds = {q.kind for h in histories for q in h.questions}
    assert kinds == set(realchats.KINDS)
    again = realchats.histories(3, 12)
    assert [[(q.text, q.evidence) for q in h.questions] for h in again] == \
        [[(q.text, q.evidence) for q in h.questions] for h in histories]


def test_an_asked_question_is_not_stored_and_its_evidence_is_the_other_persons_turn(
        histories):
    for history in histories:
        stored = [t["text"] for t in history.turns]
        for q in history.questions:
            asked = q.text.split(": ", 1)[1] if q.kind == "temporal" else q.text
            for part in asked.split(" Also, "):
                assert not any(line == part for text in stored for line in text.split("\n"))
            assert len(q.evidence) == (2 if q.kind == "multi-hop" else 1)
            if q.kind == "multi-hop":
                first, second = (history.turns[e] for e in q.evidence)
                assert first["session"] != second["session"]
                assert first["speaker"] == second["speaker"]


def test_questions_stand_alone_and_replies_answer(histories):
    assert realchats.self_contained("What do you like to do for fun?")
    for unfair in ("Besides my chosen super power?", "Noodles? do you plan on using dynomite?",
                   "what did you do there?", "Is it fun"):
        assert not realchats.self_contained(unfair)
    for history in histories:
        for q in history.questions:
            asked = q.text.split(": ", 1)[1] if q.kind == "temporal" else q.text
            for part in asked.split(" Also, "):
                assert realchats.self_contained(part)
            for e in q.evidence:
                assert not history.turns[e]["text"].split("\n")[0].rstrip().endswith("?")


def test_open_domain_replies_share_no_content_word_with_the_question(histories):
    for history in histories:
        for q in history.questions:
            reply = realchats._terms(history.turns[q.evidence[0]]["text"])
            if q.kind == "open-domain":
                assert not reply & realchats._terms(q.text)
            elif q.kind == "single-hop":
                assert reply & realchats._terms(q.text)


def test_renderings_keep_times_and_speakers(histories):
    history = histories[0]
    plain, named = (realchats.render(history, style) for style in ("plain", "named"))
    assert [m["timestamp"] for m in plain] == [t["timestamp"] for t in history.turns]
    assert {m["role"] for m in plain} == {"user", "assistant"}
    assert all(m["role"] == "user" and m["content"].startswith("[") for m in named)


def test_named_questions_name_the_person_asked_and_the_asker():
    ask = realchats.named_question
    assert ask("Are you dressing up for the Halloween parties?", "Mel", "Jo") == (
        "Is Mel dressing up for the Halloween parties?")
    assert ask("what kind of computer did you get?", "Mel", "Jo") == (
        "what kind of computer did Mel get?")
    assert ask("Did you know I was going to be on? Also, have you made your own ice cream?",
               "Mel", "Jo") == ("Did Mel know Jo was going to be on? Also, has Mel made "
                                "Mel's own ice cream?")
    assert ask("Where're you from? I'm curious", "Mel", "Jo") == "Where're Mel from? Jo is curious"


def test_asking_by_name_keeps_the_evidence_and_names_the_replier():
    history = realchats.histories(1, 12)[0]
    before = [(q.text, q.evidence) for q in history.questions]
    realchats.ask_by_name(history)
    for (text, evidence), question in zip(before, history.questions):
        assert question.evidence == evidence
        replier = history.people[history.turns[evidence[0]]["speaker"]]
        if re.search(r"\byou(r|rs|rself)?\b", text, re.IGNORECASE):
            assert replier in question.text
            assert not re.search(r"\byou(r|rs|rself)?\b", question.text, re.IGNORECASE)


def test_typed_questions_each_ask_for_one_kind_of_answer_and_are_taken_out():
    """``--questions typed``: every question asks for exactly the kind it is filed
    under, is one of the history's own questions taken out of it, and its evidence
    is the other person's next turn."""
    from hermes_trove.recall import answer_type

    typed = realchats.histories(12, 25, questions="typed")
    questions = [(h, q) for h in typed for q in h.questions]
    assert questions
    assert {q.kind for _, q in questions} <= {f"asks {k}" for k in realchats.ANSWER_KINDS}
    for history, q in questions:
        assert answer_type.expected(q.text) == {q.kind.split()[1]}
        assert realchats.self_contained(q.text)
        assert len(q.evidence) == 1
        stored = [line for t in history.turns for line in t["text"].split("\n")]
        assert q.text not in stored
    per = {}
    for history, q in questions:
        per[(id(history), q.kind)] = per.get((id(history), q.kind), 0) + 1
    assert max(per.values()) <= realchats.TYPED_PER_KIND
