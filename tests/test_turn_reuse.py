"""Reusing the last ingest's reading (``orchestrator/ingest_side``) never changes
what is stored.

A turn's list usually goes on from the list the engine read last (the next turn) or
is that very list again (``compress`` and tool calls show it after the hook stored
it), so the engine reads only what is new. Two worlds run the same random walk of
host actions: one engine reuses its readings, the other reads every list whole.
After every step both must have answered with the same rows and stored the same
rows: the reuse is a shortcut of identity's rules, never a rule of its own. The
walk mixes what can defeat it: in-place edits of shown messages (the same dict
object), /undo and /retry, compactions, a second engine copy writing the same
session, lists shown twice with host timestamps (rule 7) and a doubled block
(rule 5).
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_trove.compaction import assemble

from enginekit import host_tokens, make_engine

WORDS = ("ok", "continue", "deploy staging", "fix the parser", "run tests", "done")


class World:
    """One engine (and a second copy of it on the same session) with its host list."""

    def __init__(self, path, reuse: bool):
        self.engine = make_engine(path, window=64_000, fresh_tail_count=6)
        self.twin = copy.deepcopy(self.engine)
        self.twin.on_session_start("sess", platform="cli")
        if not reuse:
            for engine in (self.engine, self.twin):
                engine._last_read = lambda *args, **kwargs: None
        self.messages: list[dict] = []
        self.answers: list = []
        self.clock = 0

    def stamp(self, message: dict, stamped: bool) -> dict:
        if stamped:
            self.clock += 1
            message["timestamp"] = 1_700_000_000 + self.clock
        return message

    def ingest(self, engine, messages: list[dict]) -> None:
        self.answers.append(engine.ingest(messages))

    def rows(self) -> list[tuple]:
        store = self.engine.store
        return [(r["store_id"], r["role"], r["content"])
                for r in store.session_messages("sess", limit=100_000)]

    def apply(self, op: tuple) -> None:
        kind = op[0]
        engine = self.engine
        if kind == "turn":
            _, user_text, reply_text, stamped, compress = op
            user = self.stamp({"role": "user", "content": user_text}, stamped)
            engine.note_user_turn(user)
            self.messages = self.messages + [user]
            self.ingest(engine, self.messages)
            if compress:
                self.messages = engine.compress(
                    self.messages, current_tokens=host_tokens(self.messages))
            reply = self.stamp({"role": "assistant", "content": reply_text}, stamped)
            self.messages = self.messages + [reply]
            self.ingest(engine, self.messages)
            engine.turn_done()
        elif kind == "tool":
            call = {"role": "assistant", "content": "", "tool_calls": [{
                "id": f"c{len(self.messages)}", "type": "function",
                "function": {"name": "read_file", "arguments": "{}"}}]}
            result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                      "content": op[1]}
            self.messages = self.messages + [call]
            self.ingest(engine, self.messages)
            self.messages = self.messages + [result]
            self.ingest(engine, self.messages)
        elif kind == "again":
            self.ingest(engine, self.messages)
        elif kind == "compact" and any(assemble.is_real_user(m) for m in self.messages):
            self.messages = engine.compress(self.messages, force=True)
            self.ingest(engine, self.messages)
        elif kind == "undo":
            users = [i for i, m in enumerate(self.messages) if assemble.is_real_user(m)]
            if users:
                self.messages = self.messages[:users[-1]]
        elif kind == "retry" and self.messages and self.messages[-1].get("role") == "assistant":
            self.messages = self.messages[:-1] + [{"role": "assistant", "content": op[1]}]
            self.ingest(engine, self.messages)
        elif kind == "mutate" and self.messages:
            # the host edits a shown message in place (the very dict object)
            message = self.messages[op[1] % len(self.messages)]
            if not assemble.is_trove_message(message) and isinstance(message.get("content"), str):
                message["content"] = (message["content"] + " ") if op[2] == "space" else op[2]
            self.ingest(engine, self.messages)
        elif kind == "twin":
            # a second copy of the engine goes on with the session; this one sees it next
            extra = [{"role": "user", "content": op[1]}, {"role": "assistant", "content": "ok"}]
            self.messages = self.messages + extra
            self.ingest(self.twin, self.messages)
            self.ingest(engine, self.messages)
        elif kind == "double" and self.messages:
            # the host restores its transcript twice (copies keep their timestamps)
            self.messages = self.messages + [dict(m) for m in self.messages[-4:]]
            self.ingest(engine, self.messages)


def operations():
    text = st.sampled_from(WORDS)
    return st.lists(st.one_of(
        st.tuples(st.just("turn"), text, text, st.booleans(), st.booleans()),
        st.tuples(st.just("tool"), text),
        st.tuples(st.just("again")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("undo")),
        st.tuples(st.just("retry"), text),
        st.tuples(st.just("mutate"), st.integers(0, 60), st.sampled_from(("space",) + WORDS)),
        st.tuples(st.just("twin"), text),
        st.tuples(st.just("double"))), min_size=3, max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=operations())
def test_reusing_the_last_reading_stores_what_reading_whole_stores(tmp_path_factory, ops):
    reusing = World(tmp_path_factory.mktemp("reuse"), reuse=True)
    whole = World(tmp_path_factory.mktemp("whole"), reuse=False)
    for step, op in enumerate(ops):
        reusing.apply(op)
        whole.apply(op)
        assert reusing.answers == whole.answers, f"step {step} {op}: answers differ"
        assert reusing.rows() == whole.rows(), f"step {step} {op}: stored rows differ"


def test_the_next_turn_is_read_from_the_last_reading(tmp_path):
    """The shortcut is taken in the common case (else the test above proves nothing):
    the hook's list after a turn goes on from the list it stored before."""
    world = World(tmp_path, reuse=True)
    calls = []
    engine = world.engine
    original = engine._read_whole
    engine._read_whole = lambda *a, **k: calls.append(1) or original(*a, **k)
    for t in range(5):
        world.apply(("turn", f"question {t}", f"answer {t}", False, True))
    assert len(calls) == 1, "only the first list is read whole"
    assert len(world.rows()) == 10
