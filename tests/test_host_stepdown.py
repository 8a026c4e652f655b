"""The provider refuses a request as too long and the host steps the window down.

A user's config says ``context_length: 65536`` but the provider's real window is
smaller (a llama.cpp or Ollama server started with a small ``-c``, a proxy, a
model swapped behind the same name). Hermes 0.19 (``agent/conversation_loop.py``,
the ``is_context_length_error`` branch) reads the limit from the error
(``get_context_length_from_provider_error``), calls
``compressor.update_model(context_length=<limit>)``, runs ``_compress_context``
(a compaction like any other: ``on_session_end`` first, maybe a new session id)
and retries; when the error names no limit it keeps the window and only
compresses, and gives up after its attempts when that does not help.

Driven through the real CLI object (clikit) against the fake model, whose
responder refuses every main request over its real window (cl100k
tokens, ``clikit.real_prompt_tokens``) with the wording OpenAI-compatible servers
send (``clikit.RealWindow``). The store is compared with walkkit's oracle after
every step.
"""
import random

import pytest

import clikit as ck
import hostkit as hk
import walkkit as wk

pytestmark = pytest.mark.host

CONFIGURED = 65536
HOST_GAVE_UP = ("Context length exceeded", "Request payload too large")


@pytest.fixture(scope="module")
def server():
    """One fake model for the module; it reports cl100k prompt tokens."""
    with hk.FakeOpenAIServer(prompt_tokens_fn=ck.real_prompt_tokens) as fake:
        yield fake


def make_provider(window, report=True, seed=1, summary_chars=0):
    """The fake provider (``clikit.RealWindow``) over walkkit's scripted model;
    ``summary_chars``: long summaries, a frontier made for a bigger window."""
    model = wk.ScriptedModel(seed=seed, long_reply_share=0.0)

    def inner(body):
        reply = model(body)
        if summary_chars and not hk.is_main_request(body):
            reply += " " + wk.prose(random.Random(len(body["messages"][-1]["content"])), summary_chars)
        return reply
    return ck.RealWindow(inner, window, report=report)


class Talk:
    """A CLI object, its oracle, and what each turn sent."""

    def __init__(self, host, provider):
        self.host = host
        self.provider = provider
        self.cli = host.cli()
        self.oracle = wk.Oracle()
        self.markers = 0
        self.checks = []     # (turn, walkkit.RequestCheck) of each turn that compacted

    def text(self, rng, tokens, kind="prose"):
        self.markers += 1
        return wk.make_text(rng, kind, tokens, f"[T{self.markers}]")

    def say(self, text):
        """One turn; returns (reply, the turn's main requests as (body, real, refused)).
        A turn that compacted gets walkkit's request checks (``self.checks``)."""
        first = len(self.provider.sent)
        bodies_before = self.host.main_request_count()
        engine = self.cli.engine
        count = engine.compression_count if engine is not None else 0
        previous = wk.previous_exchange(self.cli.history, self.oracle)
        reply = self.cli.chat(text)
        for message in wk.new_messages_of_turn(self.cli.history, text):
            self.oracle.shown(self.cli.session_id, message)
        bodies = self.host.main_requests_since(bodies_before)
        engine = self.cli.engine
        if engine.compression_count > count and bodies:
            self.checks.append((text[:6], wk.check_request(
                bodies[-1], text, self.oracle, threshold=int(engine.threshold_tokens),
                context_length=int(engine.context_length), compacted=True, previous_pair=previous,
                host_list=wk.host_list_of_turn(self.cli.history, text))))
        return reply, list(zip(bodies, self.provider.sent[first:]))

    def retry(self):
        sent = [m for m in self.cli.history if m.get("role") == "user"][-1]["content"]
        first = len(self.provider.sent)
        reply = self.cli.retry()
        for message in wk.new_messages_of_turn(self.cli.history, sent):
            self.oracle.shown(self.cli.session_id, message)
        return reply, self.provider.sent[first:]

    def assert_stored_once(self, note=""):
        problems = self.oracle.check(self.host.home)
        assert problems.total == 0, (
            note + f" {problems.duplicates} duplicated, {problems.lost} lost, {problems.misfiled} "
            f"misfiled, {problems.phantom} phantom rows:\n" + "\n".join(problems.details[:25]))


def answered(reply, provider):
    """The turn ended with the fake model's answer, not the host's error text."""
    return bool(reply) and not reply.startswith(HOST_GAVE_UP) and reply == provider.answers[-1]


def expected_trigger(engine, window):
    """The trigger trove's one rule (``config.trigger_tokens``) gives ``window``."""
    from hermes_trove.config import trigger_tokens
    return trigger_tokens(engine.config, window, engine._runtime.get("model") or "")


def chat_until_refused(talk, rng, tokens, *, turns=14, kind="prose"):
    """Big turns until the provider refuses one: (index, text, reply, requests) of
    that turn, or None."""
    for i in range(turns):
        text = talk.text(rng, tokens, kind)
        reply, requests = talk.say(text)
        if any(refused for _, (_, _, refused) in requests):
            return i, text, reply, requests
        assert answered(reply, talk.provider), (i, reply)
    return None


def assert_fits(requests, window, text):
    """Every request fits the real window and ends with the newest user message."""
    for body, (real, _, refused) in requests:
        assert not refused and real <= window, (real, window)
    body = requests[-1][0]
    assert ck.request_user_text(body).startswith(ck.text_of(text)), "newest user message not in the prompt"


def assert_frontier_sent(host, talk, body):
    """Every frontier summary of the session (its turn markers) is in the prompt:
    the summaries made for a bigger window were folded to fit, not left out. Where
    the window leaves no room for them beside the host's overhead and the turn
    (16K: 13K of system prompt and schemas), the block says how many it left out
    (``assemble.render_context_block``): reachable with the tools, never silent."""
    dropped = wk.dropped_nodes(wk.frontier_markers(host.home, talk.cli.session_id), body)
    if not dropped:
        return
    room = (talk.cli.engine.last_compaction.get("budget") or {}).get("real_room")
    note = "older summaries are not shown to save space"
    shown = "\n".join(ck.text_of(m.get("content")) for m in body["messages"])
    assert room == 0 and note in shown, (
        f"the prompt lacks frontier summaries (node: turns): {dropped}, room {room}")


# ---------------------------------------------------------------- the provider reports its limit
@pytest.mark.parametrize("window,swapped,in_place", [
    (24576, False, True), (16384, False, True),
    # a model swapped behind the same name, after compactions at the configured window:
    # the summaries made for a 32K trigger must now fit an 18K one
    (24576, True, True), (24576, True, False)],
    ids=["24k", "16k", "24k-swapped", "24k-swapped-new-id"])
def test_step_down_to_the_reported_limit_keeps_every_turn(tmp_path, server, window, swapped, in_place):
    """65,536 configured, ``window`` real: the turn the provider refuses completes with
    the model's answer after the host steps down; trove's window is the provider's
    and its trigger follows; every later request fits; /undo, /retry and exit after
    it store nothing twice (``in_place: false``: the compaction starts a new session id)."""
    provider = make_provider(CONFIGURED if swapped else window, summary_chars=6000 if swapped else 0)
    extra = {"compression": {"in_place": in_place}}
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED,
                    extra_config=extra) as host:
        talk = Talk(host, provider)
        rng = random.Random(window)
        if swapped:
            while talk.cli.engine is None or talk.cli.engine.compression_count < 3:
                reply, _ = talk.say(talk.text(rng, 6000, "code"))
                assert answered(reply, provider), reply
                assert talk.markers < 30, "no compactions at the configured window"
            provider.window = window
        hit = chat_until_refused(talk, rng, 3000, kind="code")
        assert hit is not None, "the provider never refused: the test proves nothing"
        _, text, reply, requests = hit
        engine = talk.cli.engine
        assert answered(reply, provider), f"the refused turn ended with {reply!r}"
        assert engine.context_length == window
        assert engine.threshold_tokens == expected_trigger(engine, window)
        assert ck.request_user_text(requests[-1][0]).startswith(ck.text_of(text))
        assert requests[-1][1][0] <= window
        assert_frontier_sent(host, talk, requests[-1][0])
        talk.assert_stored_once("after the step-down:")
        after = len(provider.sent)
        for _ in range(6):
            text = talk.text(rng, rng.choice([300, 1500, 2500]))
            reply, requests = talk.say(text)
            assert answered(reply, provider), reply
            assert_fits(requests, window, text)
            assert_frontier_sent(host, talk, requests[-1][0])
            talk.assert_stored_once(f"after turn {talk.markers}:")
        assert not provider.refusals(after), provider.refusals(after)
        compacted = talk.checks[-6:]
        assert not [c for c in compacted if c[1].overflow], compacted
        if window > 16384:   # at 16K the host's overhead alone is over the trigger
            assert not [c for c in compacted if c[1].over_threshold or c[1].starved], compacted
        talk.cli.undo()
        talk.assert_stored_once("after /undo:")
        reply, sent = talk.retry()
        assert answered(reply, provider) and not [s for s in sent if s[2]], (reply, sent)
        talk.assert_stored_once("after /retry:")
        text = talk.text(rng, 2000)
        reply, requests = talk.say(text)
        assert answered(reply, provider)
        assert_fits(requests, window, text)
        talk.cli.exit()
        talk.assert_stored_once("after exit:")
        assert engine.context_length == window


# ---------------------------------------------------------------- the provider names no limit
@pytest.mark.parametrize("window", [24576, 16384])
def test_refusal_without_a_limit_compresses_or_gives_up_cleanly(tmp_path, server, window):
    """The refusal names no limit: the host keeps 65,536 and only compresses. Trove's
    trigger is made for the configured window: a request the provider refuses is under
    it, so the host's compaction of it is a no-op and the host gives up on that turn
    (its "cannot compress further"). Trove never raises, keeps the configured window,
    and the store stays exact through the refused turn, an /undo of it, a smaller turn
    that fits, and exit."""
    provider = make_provider(window, report=False)
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED) as host:
        talk = Talk(host, provider)
        rng = random.Random(window + 1)
        hit = chat_until_refused(talk, rng, 3000, kind="code")
        assert hit is not None, "the provider never refused: the test proves nothing"
        _, text, reply, requests = hit
        engine = talk.cli.engine
        assert engine.context_length == CONFIGURED
        assert engine.threshold_tokens == expected_trigger(engine, CONFIGURED)
        assert not engine.errors, engine.errors
        if answered(reply, provider):    # trove's compaction made it fit
            assert requests[-1][1][0] <= window
            assert ck.request_user_text(requests[-1][0]).startswith(ck.text_of(text))
        else:
            assert reply.startswith(HOST_GAVE_UP), reply
            assert len(requests) <= 4, "the host should give up after its attempts"
        talk.assert_stored_once("after the refused turn:")
        talk.cli.undo()
        talk.assert_stored_once("after /undo:")
        talk.cli.new()                   # what the host's error message suggests
        text = talk.text(rng, 300)
        reply, requests = talk.say(text)
        assert answered(reply, provider), reply
        assert_fits(requests, window, text)
        talk.assert_stored_once("after /new and a turn that fits:")
        talk.cli.exit()
        talk.assert_stored_once("after exit:")
        assert not engine.errors, engine.errors


def test_a_message_after_a_turn_the_host_gave_up_on_is_the_hosts_edit_of_it(tmp_path, server):
    """After the host gave up on a turn (the provider refused it, no limit named), its
    user message A stays last in the host's list, and the next message B is merged into
    it in place (``agent_runtime_helpers.repair_message_sequence``: "A\n\nB"). That is
    an in-place edit of A (identity rule 1): A's row stays as it was shown, the merged
    message is one new row, B is not stored on its own, and nothing else moves."""
    provider = make_provider(16384, report=False)
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED) as host:
        talk = Talk(host, provider)
        rng = random.Random(7)
        # a turn that with the host's overhead alone is over the real window: no
        # compaction can make it fit, and the host gives up on it
        hit = chat_until_refused(talk, rng, 6000, kind="code")
        assert hit is not None and not answered(hit[2], provider)
        talk.assert_stored_once("after the refused turn:")
        refused = ck.text_of(hit[1])
        text = talk.text(rng, 100)
        before = [r["store_id"] for r in host.rows()]
        talk.cli.chat(text)
        merged = [ck.text_of(m.get("content")) for m in talk.cli.history
                  if m.get("role") == "user" and text in ck.text_of(m.get("content"))]
        assert merged and merged[0].startswith(refused), "the host no longer merges"
        users = [ck.text_of(r["content"]) for r in host.rows() if r["role"] == "user"]
        assert users.count(refused) == 1 and users.count(merged[0]) == 1
        assert text not in users
        new_rows = [r for r in host.rows() if r["store_id"] not in before]
        assert [r["role"] for r in new_rows][:1] == ["user"]
        assert ck.text_of(new_rows[0]["content"]) == merged[0]


# ---------------------------------------------------------------- /model: bigger, then smaller
def test_model_switch_to_a_bigger_then_a_smaller_window(tmp_path, server):
    """/model to a 131,072 window mid-session, then to 24,576 (what the provider has):
    trove's window and trigger follow each update, the next turns fit the window in
    force and the store stays exact."""
    provider = make_provider(None)
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED) as host:
        talk = Talk(host, provider)
        rng = random.Random(5)
        for _ in range(3):
            talk.say(talk.text(rng, 2500))
        engine = talk.cli.engine
        for window in (131072, 24576):
            talk.cli.agent.context_compressor.update_model("fake-model", window)
            provider.window = window
            assert engine.context_length == window
            assert engine.threshold_tokens == expected_trigger(engine, window)
            for _ in range(5):
                text = talk.text(rng, 2500)
                reply, requests = talk.say(text)
                assert answered(reply, provider), reply
                assert_fits(requests, window, text)
                talk.assert_stored_once(f"at {window}, turn {talk.markers}:")
        talk.cli.exit()
        talk.assert_stored_once("after exit:")


# ---------------------------------------------------------------- a step-down right after a restart
def test_a_step_down_right_after_a_restart_compacts_to_the_new_window(tmp_path, server):
    """A CLI restarted on a session of Chinese turns (real tokens about 4x the host's
    chars/4), then a provider that holds less than the configured window. The host's
    overflow path hands ``compress`` its estimate of the messages without the tool
    schemas, and the restarted engine had no provider count yet: it read the refused
    request as under the trigger, did nothing, and the host gave up on the turn (soak
    seed 1290001). The real overhead the session learned before the restart is known
    after it, so the first compaction makes the request fit. (A provider that names no
    limit leaves the host at the configured window, under whose trigger the request is:
    trove cannot know the real one; ``test_refusal_without_a_limit_compresses_or_gives_up_cleanly`` pins that case.)"""
    provider = make_provider(None)
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED) as host:
        talk = Talk(host, provider)
        rng = random.Random(11)
        # Talk until the list is over the smaller window with room to spare: the
        # host's prompt (its system prompt names the date, the machine and paths;
        # its tools depend on what is installed) moves each request's size a little
        # from one machine to the next, and a list at the edge tests nothing.
        real = 0
        for turn in range(12):
            reply, requests = talk.say(talk.text(rng, 2000, kind="cjk"))
            assert answered(reply, provider)
            real = requests[-1][1][0] if requests else real
            if turn >= 5 and real > 24576 + 2000:
                break
        talk.cli = host.restart(talk.cli)
        provider.window = 24576
        text = talk.text(rng, 300)
        reply, requests = talk.say(text)
        assert any(refused for _, (_, _, refused) in requests), "the provider took it: no test"
        assert answered(reply, provider), reply
        assert talk.cli.engine.compression_count >= 1
        body, (real, _, refused) = requests[-1]
        assert not refused and real <= 24576
        talk.assert_stored_once("after the step-down:")


# ---------------------------------------------------------------- a refusal that names no limit
def test_a_refusal_without_a_limit_is_answered_after_the_hosts_compaction(tmp_path, server):
    """The provider refuses as too long and names no limit (llama-server's wording): the
    host keeps its configured 65,536 and calls ``compress`` on its overflow path, where
    the refused request is under trove's trigger for that window. Read as a no-op the
    host gave up on the turn, and on every turn after it (Hermes's own compressor
    summarizes whatever it is handed). The host asking un-prompted, with a smaller figure
    than the one trove just declined, is its overflow: trove compacts the list to less
    than it holds, and the host's retry is answered within the real window."""
    provider = make_provider(24576, report=False)
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED) as host:
        talk = Talk(host, provider)
        rng = random.Random(24577)
        hit = chat_until_refused(talk, rng, 3000, kind="code")
        assert hit is not None, "the provider never refused: the test proves nothing"
        _, text, reply, requests = hit
        assert answered(reply, provider), reply
        assert requests[-1][1][0] <= 24576
        assert ck.request_user_text(requests[-1][0]).startswith(ck.text_of(text))
        assert talk.cli.engine.context_length == CONFIGURED
        talk.assert_stored_once("after the refused turn:")
        for _ in range(3):                      # the turns after it are answered too
            text = talk.text(rng, 1500, kind="code")
            reply, requests = talk.say(text)
            assert answered(reply, provider), reply
            assert_fits(requests, 24576, text)
        talk.assert_stored_once("after three more turns:")
