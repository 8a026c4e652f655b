"""The prompt's promises under generated conversations, checked after every turn.

The engine is driven the way the host drives it (``should_compress`` with the
host's own rough estimate of the request, ``compress`` with that estimate, up to
three passes a turn, ``update_from_response`` with the provider's real count,
``note_user_turn`` / ``learn_overhead`` / ``turn_done`` as the hooks do), over
turns of mixed sizes: tiny, huge single turns bigger than the whole budget, tool
outputs, images, unicode, CJK (where the host's chars/4 and real tokens differ
most), None and non-string content, calls with no results, a window that changes
mid-session and a system prompt that grows. After every turn:

(a) the request fits: under the trigger in the host's own units
    (``agent.model_metadata.estimate_request_tokens_rough``) and under the window
    in real tokens, whenever the engine had something to give way;
(b) the newest user message and the newest unit are in the prompt, whole, or as
    the engine's marked fallback for a message bigger than the budget;
(c) no message of the conversation appears twice raw, and each is stored once;
(d) nothing raises and no compaction aborts.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_trove import on_post_tool_call
from hermes_trove.compaction import assemble
from hermes_trove.compaction.budget import HOST_PROGRESS_MARGIN, HOST_PROGRESS_SHARE
from hermes_trove.storage import database

from enginekit import make_engine

agent_metadata = pytest.importorskip("agent.model_metadata")
host_request_tokens = agent_metadata.estimate_request_tokens_rough

PROSE = "the deployment failed because the proxy dropped idle connections after "
CODE = "def handler(x):\n    return {'k': x, 'v': [1, 2, 3]}\n"
CJK = "数据库连接池在高负载下耗尽，我们决定把超时改为三十秒并增加重试。"
EMOJI = "😀🚀✨ "
TEXTS = {"prose": PROSE, "code": CODE, "cjk": CJK, "emoji": EMOJI}
HUGE_WEIGHTS = [5, 5, 2, 1]
PNG = "data:image/png;base64," + "iVBORw0KGgo" * 40


def _text(rng: random.Random, serial: int, size: str) -> str:
    """A unique text of a kind and size (``size``: tiny / medium / big / huge)."""
    kind = rng.choice(sorted(TEXTS))
    unit = TEXTS[kind]
    chars = {"tiny": 8, "medium": 600, "big": 6_000, "huge": 60_000}[size]
    body = (unit * (chars // len(unit) + 1))[:chars]
    return f"m{serial} {body}"


def _size(rng: random.Random) -> str:
    return rng.choices(["tiny", "medium", "big", "huge"], weights=HUGE_WEIGHTS)[0]


class Conversation:
    """Generates one host turn at a time; every message carries a unique serial."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.serial = 0

    def _next(self) -> int:
        self.serial += 1
        return self.serial

    def user(self) -> dict:
        rng = self.rng
        n = self._next()
        text = _text(rng, n, _size(rng))
        if rng.random() < 0.15:
            return {"role": "user", "content": [{"type": "text", "text": text},
                                                {"type": "image_url", "image_url": {"url": PNG}}]}
        return {"role": "user", "content": text}

    def tool_groups(self) -> list[list[dict]]:
        """The tool iterations of a turn: each an assistant call and its results
        (one result may be missing: a call with no result)."""
        rng = self.rng
        groups = []
        for _ in range(rng.choice([0, 0, 1, 2])):
            ids = [f"call_{self._next()}" for _ in range(rng.randint(1, 2))]
            group = [{"role": "assistant", "content": rng.choice(["", None]), "tool_calls": [
                {"id": cid, "type": "function",
                 "function": {"name": "read_file", "arguments": json.dumps({"p": cid})}}
                for cid in ids]}]
            answered = ids if rng.random() > 0.1 else ids[:-1]
            group += [{"role": "tool", "tool_call_id": cid, "name": "read_file",
                       "content": _text(rng, self._next(), _size(rng))} for cid in answered]
            groups.append(group)
        return groups

    def answer(self) -> dict:
        """The turn's final answer: text, or odd content (None, a number)."""
        rng = self.rng
        n = self._next()
        content = rng.choice(["text", "text", "text", "none", "number"])
        if content == "none":
            return {"role": "assistant", "content": None, "note": f"m{n}"}
        if content == "number":
            return {"role": "assistant", "content": n * 1000 + 7}
        return {"role": "assistant", "content": _text(rng, n, _size(rng))}


def _key(message: dict) -> str:
    """A message's identity for the duplicate check (serials make each unique)."""
    return json.dumps({k: message.get(k) for k in ("role", "content", "tool_calls",
                                                    "tool_call_id", "note")},
                      sort_keys=True, default=str)


def _is_fallback_of(shown: dict, original: dict) -> bool:
    """Whether ``shown`` is the engine's marked stand-in for ``original``."""
    try:
        from hermes_trove.compaction import oversize
    except ImportError:
        return False
    return oversize.is_cut(shown) and shown.get("role") == original.get("role")


class Host:
    """The host's side of a session: its overhead, its estimate, its passes."""

    def __init__(self, engine, rng: random.Random):
        self.engine = engine
        self.rng = rng
        self.system_prompt = "You are a helpful agent. " * 40
        self.tools = [{"type": "function", "function": {
            "name": f"tool_{i}", "description": "does a thing " * 10,
            "parameters": {"type": "object", "properties": {}}}} for i in range(6)]

    def rough(self, messages: list) -> int:
        """The host's own estimate of the request (its preflight figure)."""
        return host_request_tokens(messages, system_prompt=self.system_prompt, tools=self.tools)

    def real(self, messages: list) -> int:
        """What the provider counts: the system prompt and schemas as text, and the
        messages as trove counts them (tiktoken)."""
        counter = self.engine.counter
        overhead = counter.count_text(self.system_prompt) + counter.count_text(
            json.dumps(self.tools))
        return overhead + counter.count_messages(messages)

    def compact(self, messages: list) -> list:
        """The host's preflight: up to three passes while the engine asks."""
        self.returned = False
        for _ in range(3):
            figure = self.rough(messages)
            if not self.engine.should_compress(figure):
                break
            out = self.engine.compress(messages, current_tokens=figure)
            self.returned = self.returned or out is not messages
            messages = out
            assert not self.engine._last_compress_aborted, self.engine.last_compaction
            assert messages, "compress returned an empty list"
        for _ in range(3):
            # the provider refuses a request over the window: the host compresses
            # with its rough figure and retries (conversation_loop's overflow path)
            if self.real(messages) < self.engine.context_length:
                break
            out = self.engine.compress(messages, current_tokens=self.rough(messages))
            assert not self.engine._last_compress_aborted, self.engine.last_compaction
            self.returned = self.returned or out is not messages
            messages = out
        return messages

    def call_model(self, messages: list, reply: list[dict]) -> None:
        """The provider counts the request and its reply."""
        self.engine.update_from_response({
            "prompt_tokens": self.real(messages),
            "completion_tokens": max(1, self.engine.counter.count_messages(reply))})


def _check(host: Host, prompt: list, newest_user: dict, newest_unit: list,
           every: dict, engine, label: str) -> None:
    """(a)-(d) on the request the host sends next ((a) from a 16K window up: a window
    so small that one image, which the host prices at 1,500 tokens, is bigger than
    the room cannot hold it: the host refuses windows under 64K anyway)."""
    trigger, window = engine.threshold_tokens, engine.context_length
    strict = window >= 16_000
    # (d) validity for every provider (of a list the engine made)
    if host.returned:
        problems = assemble.sequence_problems(prompt)
        assert problems == [], (label, problems)
    # (c) nothing twice raw
    keys = [_key(m) for m in prompt if _key(m) in every]
    assert len(keys) == len(set(keys)), (label, "duplicated raw message")
    # (b) the newest user message and the newest unit, whole or marked
    for wanted in [newest_user, *newest_unit]:
        whole = any(_key(m) == _key(wanted) for m in prompt)
        assert whole or any(_is_fallback_of(m, wanted) for m in prompt), \
            (label, "newest message missing", str(wanted)[:200])
    # (a) under the trigger in the host's units, under the window in real tokens
    if not strict:
        return
    rough, real = host.rough(prompt), host.real(prompt)
    if "would not count this pass as progress" in str(engine.last_compaction.get("reason")):
        # the host's list kept as it was: a result the host takes only when it cuts
        # its figure by over 5% (budget.host_sees_progress), so the list was within
        # that share of the trigger, and the host runs no compaction of its own on it
        trigger = trigger / (HOST_PROGRESS_SHARE - HOST_PROGRESS_MARGIN)
    assert rough < trigger, (label, "host estimate over the trigger", rough, trigger,
                             engine.last_compaction)
    assert real < window, (label, "real tokens over the window", real, window,
                           engine.last_compaction)


def run_session(seed: int, turns: int) -> None:
    """One generated session through the engine, checked after every turn."""
    rng = random.Random(seed)
    window = rng.choice([4_000, 16_000, 32_000, 64_000])
    home = Path(tempfile.mkdtemp(prefix="trove-budget-"))
    engine = make_engine(home, window=window, fresh_tail_count=rng.choice([4, 8, 32]),
                         leaf_chunk_tokens=800)
    try:
        host = Host(engine, rng)
        talk = Conversation(seed)
        messages: list = []
        every: dict = {}
        for turn in range(turns):
            label = f"seed {seed} turn {turn} window {engine.context_length}"
            if rng.random() < 0.1:  # /model to another window mid-session
                engine.update_model("fake-model", rng.choice([16_000, 32_000, 64_000]))
            if rng.random() < 0.2:  # the system prompt grows (memory, skills)
                host.system_prompt += "Remember: the user prefers short answers. " * 20
            user = talk.user()
            every[_key(user)] = user
            messages = messages + [user]
            engine.note_user_turn(user)                     # pre_llm_call
            messages = host.compact(messages)
            _check(host, messages, user, [user], every, engine,
                   label + " (turn start)")
            for group in talk.tool_groups():
                host.call_model(messages, group[:1])
                for message in group:
                    every[_key(message)] = message
                    if message.get("role") == "tool":                # post_tool_call
                        on_post_tool_call(session_id=engine.session_id,
                                          result=message["content"],
                                          tool_call_id=message["tool_call_id"],
                                          tool_name="read_file")
                messages = messages + group
                messages = host.compact(messages)           # the check before the next call
                if len(group) - 1 == len(group[0]["tool_calls"]):
                    _check(host, messages, user, group, every, engine,
                           label + " (after a tool call)")
            answer = talk.answer()
            host.call_model(messages, [answer])
            every[_key(answer)] = answer
            messages = messages + [answer]
            engine.learn_overhead(messages)                  # post_llm_call
            engine.turn_done()
        engine.ingest(messages)
        # nothing lost or stored twice: a cut shown again is the row it stands for
        assert engine.store.count_messages(engine.canonical_id) == len(every), seed
    finally:
        database.forget_database(engine.config.resolved_database_path)


def test_a_tool_result_grows_the_real_count_the_trigger_reads(tmp_path):
    """The host checks the request before its next model call on chars/4, about a
    fifth of the real tokens of Chinese text: a big Chinese tool output stayed under its
    figure of the trigger and the request went out over the window (seed 12). The
    ``post_tool_call`` hook counts the result into the real tokens the list holds."""
    engine = make_engine(tmp_path, window=64_000)
    ask = {"role": "user", "content": "read the design notes"}
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    engine.note_user_turn(ask)
    engine.update_from_response({"prompt_tokens": 900, "completion_tokens": 20})
    result = CJK * 1500                                     # 48K characters
    on_post_tool_call(session_id=engine.session_id, result=result, tool_call_id="c1",
                      tool_name="read_file")
    messages = [ask, call, {"role": "tool", "tool_call_id": "c1", "name": "read_file",
                            "content": result}]
    rough = 800 + agent_metadata.estimate_messages_tokens_rough(messages)
    assert rough < engine.threshold_tokens < engine.counter.count_messages(messages)
    assert engine.should_compress(rough)
    out = engine.compress(messages, current_tokens=rough)
    assert 800 + engine.counter.count_messages(out) < engine.threshold_tokens
    assert out[-1]["tool_call_id"] == "c1"


def test_a_result_the_host_persists_counts_as_what_the_host_keeps(tmp_path):
    """The host writes a result over its threshold (15% of the window in characters,
    ``tools.budget_config``) to a file and keeps a preview in its list; the hook sees
    the raw result first. Counted whole, a 400K-character log read as ~100K tokens of
    pressure in a 64K window that no request carried. It counts as the host's
    replacement, never lower."""
    from tools.budget_config import budget_for_context_window
    from tools.tool_result_storage import maybe_persist_tool_result

    engine = make_engine(tmp_path, window=64_000)
    ask = {"role": "user", "content": "run the build"}
    engine.note_user_turn(ask)
    engine.update_from_response({"prompt_tokens": 900, "completion_tokens": 20})
    result = "".join(f"line {i}: compiling module_{i}.c ok\n" for i in range(12_000))
    assert len(result) > 400_000
    on_post_tool_call(session_id=engine.session_id, result=result, tool_call_id="c1",
                      tool_name="terminal")
    assert not engine.should_compress(950)
    kept = maybe_persist_tool_result(result, "terminal", "c1", env=None,
                                     config=budget_for_context_window(64_000))
    assert len(kept) < 10_000       # the host did replace it
    grew = engine._real_projection.pressure(0)
    assert grew >= engine.counter.count_message(
        {"role": "tool", "content": kept, "tool_call_id": "c1", "name": "terminal"})


def test_compress_counts_the_list_before_the_first_reply(tmp_path):
    """Before the first reply the real size of the list was unknown, so a first turn of
    Chinese text bigger than the window (under the trigger by the host's chars/4) was
    taken as under the trigger even on the host's retry after the provider refused it,
    and the host gave up: "cannot compress further" (seed 153)."""
    engine = make_engine(tmp_path, window=64_000)
    messages = [{"role": "user", "content": CJK * 1900}]
    rough = 800 + agent_metadata.estimate_messages_tokens_rough(messages)
    assert rough < engine.threshold_tokens and engine.counter.count_messages(messages) > 64_000
    out = engine.compress(messages, current_tokens=rough)   # the host's overflow retry
    assert engine.last_compaction["outcome"] == "compacted"
    assert 800 + engine.counter.count_messages(out) < engine.threshold_tokens
    assert len(out) == 1 and out[0]["role"] == "user"


def test_a_cut_is_the_message_it_stands_for(tmp_path):
    """Shown again in any list (a /resume restores it from the host's state.db, a
    second process has no view of it), a cut message has the identity of its original:
    the ingest policy restores it from its payload, for every role and for a text part."""
    from hermes_trove.compaction import oversize
    engine = make_engine(tmp_path, window=16_000)
    policy = engine.policy
    text = PROSE * 400
    originals = [
        {"role": "user", "content": text, "api_content": text + "\n\n[recall policy]"},
        {"role": "user", "content": [{"type": "text", "text": text},
                                     {"type": "image_url", "image_url": {"url": PNG}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": text},
        {"role": "assistant", "content": text}]
    for original in originals:
        cut = oversize.cut_to(original, 300, store_id=7, cost=engine.count_message,
                              put_text=lambda t: policy.payloads.put(
                                  t.encode(), kind="cut_message", mime="text/plain").ref)
        assert oversize.is_cut(cut) and engine.count_message(cut) <= 300
        assert "trove_expand(store_id=7)" in str(cut["content"])
        assert policy.prepare(cut).content_hash == policy.prepare(original).content_hash
        if "api_content" in original:
            assert cut["api_content"].endswith("[recall policy]")
            assert len(cut["api_content"]) < 2_000
    pasted = {"role": "user", "content": "see [trove externalized cut_message text/plain "
              "1 KB, preview 1+1 of 9 chars: trove-payload:" + "0" * 64 + "]"}
    assert policy.prepare(pasted).content_hash != policy.prepare(originals[0]).content_hash


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6))
def test_generated_conversations_keep_every_promise(seed):
    run_session(seed, turns=12)


@pytest.mark.host
def test_the_real_host_sends_no_request_over_the_window(tmp_path):
    """The real Hermes host (``AIAgent``, 64K window) against the fake provider, which
    counts real tokens (tiktoken) and refuses a request over the window with the error
    real providers give. A turn of 60K Chinese characters (about 15K tokens by the
    host's chars/4, some 60K real) and one of 100K characters of prose (25K by the
    host's figure, over its trigger): every request fits, the host never takes its
    overflow path, and each big turn is stored whole, once."""
    import sqlite3

    import hostkit as hk
    from hermes_trove.compaction import tokens

    counter = tokens.get_counter("cl100k_base")
    window = 65_536

    def real_tokens(body: dict) -> int:
        return counter.count_messages(body.get("messages") or []) + counter.count_text(
            json.dumps(body.get("tools") or []))

    refused: list[int] = []

    def responder(body: dict):
        size = real_tokens(body)
        if size > window:
            refused.append(size)
            return hk.Reply(status=400, text=(
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {size} tokens. Please reduce the length of the "
                "messages."))
        return hk.Reply(text="noted", prompt_tokens=size)

    chinese = ("数据库连接池在高负载下耗尽，我们决定把超时改为三十秒并增加重试。" * 2000)[:60_000]
    prose = (PROSE * 2000)[:100_000]
    with hk.FakeOpenAIServer(responder) as server:
        home = hk.make_hermes_home(tmp_path, server.port)
        with hk.host_env(home) as env:
            agent = hk.make_agent()
            assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
            engine = hk.live_engine(agent)
            results = hk.run_turns(agent, ["hello there", chinese, "thanks", prose, "bye"])
            assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
            for result in results:
                assert not result.get("failed"), result.get("error")
            assert refused == [], f"the provider refused requests of {refused} tokens"
            sizes = [real_tokens(b) for b in server.main_bodies]
            assert sizes and max(sizes) <= window, sizes
            statuses = " ".join(text for _, text in agent.hostkit_statuses)
            assert "Context too large" not in statuses and "cannot compress" not in statuses
            assert engine.last_compaction.get("outcome") != "error"
            sent = [m for b in server.main_bodies for m in b["messages"]]
            assert any(_is_fallback_of(m, {"role": "user"}) for m in sent)  # shown cut
            db = sqlite3.connect(home / "trove.db")
            users = [r[0] for r in db.execute(
                "SELECT content FROM messages WHERE role = 'user' ORDER BY store_id")]
            db.close()
            assert users.count(chinese) == 1 and users.count(prose) == 1, \
                [u[:30] for u in users]
        assert not env.blocked
