"""The evidence tools inside the real hermes-agent 0.19.0 host (fake model on 127.0.0.1).

A generated conversation with planted dates, amounts and changing facts is told
to the real ``AIAgent`` turn by turn (long replies, so older turns are compacted
out of the prompt). Then, for each question, a scripted model calls
trove_grep(include_exact_ref) -> trove_evidence_pack -> trove_compute through the
host's own tool loop and answers with the computed value, which must be exact.
"""

import json
import re

import pytest

import evidencekit as ek
import hostkit as hk
from hostkit import fake_llm, trove_host  # noqa: F401 (fixtures)

pytestmark = pytest.mark.host
FILLER = "Noted, filed with the rest of your notes. " + "Some unrelated detail. " * 150


class NeedCall(Exception):
    """The scripted agent wants a tool result it has not seen yet."""

    def __init__(self, name: str, args: dict):
        super().__init__(name)
        self.name, self.arguments = name, args


def _text(message: dict) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def scripted(questions: list[ek.Question]):
    """A responder that replays this turn's tool results through ``ek.answer``.

    Results are remembered by tool_call_id: compaction may fold the turn's first
    tool exchanges out of the prompt, as it would for a real model's context.
    """
    remembered: dict[int, dict[str, dict]] = {}

    def responder(body: dict):
        if not hk.is_main_request(body):
            return hk.Reply(text="- summary: personal notes (moves, trips, addresses).")
        messages = body["messages"]
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        asked = re.match(r"Question (\d+):", _text(messages[last_user]))
        if not asked:
            return hk.Reply(text=FILLER)
        index = int(asked.group(1))
        results = remembered.setdefault(index, {})
        for message in messages[last_user + 1:]:
            if message["role"] == "tool":
                results.setdefault(message["tool_call_id"], json.loads(message["content"]))
        seen = iter(list(results.values()))

        def tool(name: str, args: dict) -> dict:
            try:
                return next(seen)
            except StopIteration:
                raise NeedCall(name, args) from None
        try:
            got = ek.answer(questions[index], tool, {})
        except NeedCall as need:
            return hk.ToolCall(need.name, need.arguments)
        return hk.Reply(text="ANSWER " + json.dumps(got))
    return responder


def test_scripted_agent_answers_exactly_through_the_real_host(trove_host):
    world = ek.make_world(7, sessions=1, relative=False)
    trove_host.server.responder = scripted(world.questions)
    agent = hk.make_agent()
    results = hk.run_turns(agent, [m.text for m in world.messages])
    assert hk.live_engine(agent).compression_count >= 1
    prompt = json.dumps(trove_host.server.main_bodies[-1]["messages"])
    assert world.messages[0].text not in prompt     # the first facts were compacted out
    history = results[-1]["messages"]
    for index, question in enumerate(world.questions):
        final = hk.run_turns(agent, [f"Question {index}: {question.text}"], history=history)[0]
        history = final["messages"]
        used = [m.get("name") or m.get("tool_name") for m in history if m.get("role") == "tool"]
        assert used[-2:] == ["trove_evidence_pack", "trove_compute"], question.operation
        got = json.loads(final["final_response"].removeprefix("ANSWER "))
        expected = question.expected
        if isinstance(expected, tuple):
            got, expected = tuple(got), tuple(expected)
        assert ek.correct(question, got), (question.operation, expected, got)


@pytest.mark.parametrize("case, fragment", [
    ("mixed_currency", "incompatible units"),
    ("tampered_quote", "quote not found"),
    ("two_dates", "more than one date"),
])
def test_fail_closed_cases_answer_errors_through_the_real_host(trove_host, case, fragment):
    import sqlite3
    trove_host.server.responder = lambda body: "Noted."
    agent = hk.make_agent()
    notes = ["The hotel cost $420.", "The museum pass was 30 EUR.",
             "I flew out on 2026-02-01 and back on 2026-02-09."]
    history = hk.run_turns(agent, notes)[-1]["messages"]
    db = sqlite3.connect(trove_host.hermes_home / "trove.db")
    ids = dict(db.execute("SELECT content, store_id FROM messages WHERE role = 'user'"))
    db.close()
    ref = {text: {"store_id": ids[text], "start": 0, "end": len(text), "quote": text}
           for text in notes}
    hotel, museum, flight = (ref[t] for t in notes)
    operation, inputs = {
        "mixed_currency": ("sum", [hotel, museum]),
        "tampered_quote": ("sum", [dict(hotel, quote="The hotel cost $240.")]),
        "two_dates": ("date_diff", [flight, flight]),
    }[case]
    trove_host.server.responder = hk.tool_then_text(
        "trove_compute", {"operation": operation, "inputs": inputs}, "I cannot compute that.")
    final = hk.run_turns(agent, ["Question: compute it"], history=history)[0]
    result = json.loads([m for m in final["messages"] if m.get("role") == "tool"][-1]["content"])
    assert fragment in result["error"] and "result" not in result and "trace" not in result


def test_assertions_are_extracted_by_the_hosts_auxiliary_model_at_compaction(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"trove": {"assertions_enabled": True}})
    extraction_prompts = []

    def responder(body):
        text = json.dumps(body.get("messages", []))
        if not hk.is_main_request(body):
            if "Extract assertions" not in text:
                return hk.Reply(text="- summary: notes about where the user lives.")
            prompt = body["messages"][-1]["content"]
            extraction_prompts.append(prompt)
            found = re.findall(r"\[(\d+) user\]\n(My address is (?:now )?([^.]+)\.)", prompt)
            return hk.Reply(text=json.dumps([
                {"id": int(i), "kind": "fact", "subject": "address", "value": value,
                 "quote": quote} for i, quote, value in found]))
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return hk.Reply(text="Checked.")
        if "where do I live" in _text(messages[-1]):
            return hk.ToolCall("trove_query_state", {"subject": "address"})
        return hk.Reply(text=FILLER)

    with hk.host_env(home):
        fake_llm.responder = responder
        agent = hk.make_agent()
        notes = (["My address is 12 Rua Augusta."] + [f"Chore {i}." for i in range(12)]
                 + ["My address is now 7 Avenida da Liberdade."]
                 + [f"Errand {i}." for i in range(22)])
        history = hk.run_turns(agent, notes)[-1]["messages"]
        assert hk.live_engine(agent).compression_count >= 1 and extraction_prompts
        final = hk.run_turns(agent, ["Remind me: where do I live now?"], history=history)[0]
    answer = json.loads([m for m in final["messages"] if m.get("role") == "tool"][-1]["content"])
    [address] = answer["assertions"]
    assert address["current"]["value"] == "7 Avenida da Liberdade"
    assert address["current"]["extractor"] == "model"
    assert address["conflict"] and address["earlier"][0]["value"] == "12 Rua Augusta"
    assert address["earlier"][0]["ref"]["quote"] == "My address is 12 Rua Augusta."
