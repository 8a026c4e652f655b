"""What the host sends with every user message: the ``api_content`` sidecars.

Hermes 0.19 stamps each user message with an ``api_content`` sidecar (the text plus
what was injected for that turn: a memory provider's prefetch, a plugin's
``pre_llm_call`` context) and replays it for EVERY historical message that has one
(``agent/conversation_loop.py``, "Historical message: replay the exact bytes sent
when it was live"). A context plugin that injects ~1.5K tokens a turn so sends
~1.5K extra tokens for each user message the list keeps.

Driven through the real CLI object (clikit) with a second tiny plugin whose
``pre_llm_call`` returns a large context block, in a small window: every main
request's real prompt (cl100k of the body the fake server saw) must fit the
window, and a compaction must not starve the tail (walkkit's request checks).

Prose sidecars never got far: the host's own estimate (chars/4 of each message dict
of its list, content and sidecar both) counts them about twice, and trove prices the
trigger and the tail by that figure too. A CJK block (chars/4 counts it ~4x low) is
seen by the real count only, and that count used to leave the sidecars out of the
projection and the tail: requests reached 36.7K real tokens at a 32K trigger (64K
window) and 31.1K of a 32K window.
"""
import random
import textwrap
from dataclasses import dataclass

import pytest

import clikit as ck
import hostkit as hk
import walkkit as wk

pytestmark = pytest.mark.host

INJECTOR = "trove-test-injector"
CONFIGURED = 65536   # the host refuses a configured window under 64K


@pytest.fixture(scope="module")
def server():
    """One fake model for the module; it reports cl100k prompt tokens."""
    with hk.FakeOpenAIServer(prompt_tokens_fn=ck.real_prompt_tokens) as fake:
        yield fake


@dataclass
class Sent:
    """One main request of a turn as the provider saw it."""
    turn: int
    real: int            # its real prompt tokens (cl100k)
    refused: bool        # over the provider's real window
    started_at: int      # the engine's window when the turn started
    window: int          # the engine's window after the turn
    trigger: int         # the engine's trigger after the turn
    before_turn: int     # real tokens without the turn's user message (as sent)
    check: object        # walkkit.RequestCheck of a turn that compacted, else None


def wk_newest_user(body: dict) -> dict:
    """The newest user message of a request, as sent (its sidecar in place)."""
    return [m for m in body["messages"] if m.get("role") == "user"][-1]


def write_injector(home, kind: str, tokens: int) -> None:
    """A plugin whose ``pre_llm_call`` adds a new ``tokens``-sized block of ``kind``
    text to every user turn (what an external memory provider's prefetch does)."""
    dest = home / "plugins" / INJECTOR
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "plugin.yaml").write_text(textwrap.dedent(f"""\
        name: {INJECTOR}
        version: 0.0.1
        description: adds a large context block to every user turn
        author: tests
        kind: standalone
        manifest_version: 1
        provides_hooks:
          - pre_llm_call
        """), encoding="utf-8")
    (dest / "__init__.py").write_text(textwrap.dedent(f"""\
        import random, sys
        sys.path.insert(0, {str(ck.TESTS_DIR)!r})
        from walktexts import make_text
        TURNS = [0]

        def _pre_llm_call(**kw):
            TURNS[0] += 1
            rng = random.Random(TURNS[0])
            return {{"context": "Recalled memory:\\n" + make_text(rng, {kind!r}, {tokens}, None)}}

        def register(ctx):
            ctx.register_hook("pre_llm_call", _pre_llm_call)
        """), encoding="utf-8")


def run_walk(tmp_path, server, *, window: int, kind: str, inject: int, turns: int,
             turn_tokens: tuple, seed: int = 1):
    """``turns`` user turns through the CLI with the injector on, the provider's real
    window ``window`` (the host's floor is 64K: configured 65,536, it steps down at the
    provider's first refusal, as in tests/test_host_stepdown.py). Returns the engine
    and, for every main request, (turn, real prompt tokens, refused, the engine's
    window when the turn started, the turn's RequestCheck when it compacted): ``Sent``."""
    home = tmp_path / "hermes_home"
    write_injector(home, kind, inject)
    extra = {"plugins": {"enabled": ["hermes-trove", INJECTOR]}}
    provider = ck.RealWindow(wk.ScriptedModel(seed=seed, long_reply_share=0.0), window)
    rng = random.Random(seed)
    figures = []
    with ck.CliHost(tmp_path, server=server, responder=provider, context_length=CONFIGURED,
                    extra_config=extra) as host:
        cli, oracle = host.cli(), wk.Oracle()
        for turn in range(1, turns + 1):
            text = wk.make_text(rng, "prose", rng.randint(*turn_tokens), f"[T{turn}]")
            before, sent_before = host.main_request_count(), len(provider.sent)
            engine = cli.engine
            count = engine.compression_count if engine is not None else 0
            started_at = engine.context_length if engine is not None else CONFIGURED
            previous = wk.previous_exchange(cli.history, oracle)
            cli.chat(text)
            for message in wk.new_messages_of_turn(cli.history, text):
                oracle.shown(cli.session_id, message)
            engine = cli.engine
            assert engine is not None, cli.output[-3000:]
            bodies = host.main_requests_since(before)
            check = None
            if engine.compression_count > count and bodies:
                check = wk.check_request(
                    bodies[-1], text, oracle, threshold=int(engine.threshold_tokens),
                    context_length=int(engine.context_length), compacted=True,
                    previous_pair=previous, host_list=wk.host_list_of_turn(cli.history, text))
            newest = [ck.real_prompt_tokens({"messages": [wk_newest_user(b)]}) for b in bodies]
            for (real, _, refused), own in zip(provider.sent[sent_before:], newest):
                figures.append(Sent(turn, real, refused, started_at, engine.context_length,
                                    int(engine.threshold_tokens), real - own, check))
        users = [m for m in cli.history if m.get("role") == "user"]
        assert any(isinstance(m.get("api_content"), str) and "Recalled memory" in m["api_content"]
                   for m in users), "the injector's context never reached a sidecar"
        return engine, figures


@pytest.mark.parametrize("kind,inject,window", [
    ("prose", 1500, CONFIGURED), ("cjk", 1500, CONFIGURED), ("cjk", 2500, 32768)],
    ids=["prose-64k", "cjk-64k", "cjk-32k-stepdown"])
def test_the_sidecars_of_every_kept_user_message_are_counted(tmp_path, server, kind, inject,
                                                             window):
    """A plugin injects ``inject`` tokens of ``kind`` text into every user turn; small
    turns, so many user messages (and their sidecars) stay raw. Every request without
    the turn's own message (whose injection no hook shows before it is sent) is under
    the trigger in real tokens, none goes over the window once the host knows it
    (``cjk-32k-stepdown``: the provider's window is 32K, the host steps down at its
    first refusal), compactions happen and none starves the tail.

    Before the budget counted the sidecars in the projection and the tail, the CJK
    blocks (which the host's chars/4 counts ~5x low) went out uncounted for every user
    message kept: 36.7K real at a 32K trigger, 31.1K in a 32K window."""
    engine, figures = run_walk(tmp_path, server, window=window, kind=kind, inject=inject,
                               turns=40, turn_tokens=(150, 600))
    known = [f for f in figures if f.started_at == f.window == window]
    assert engine.context_length == window and len(known) >= 20, "no step-down: nothing proved"
    assert engine.compression_count >= 4, "too few compactions: the test proves nothing"
    over_window = [(f.turn, f.real) for f in known if f.refused or f.real > window]
    assert not over_window, f"requests over the {window}-token window: {over_window}"
    over_trigger = [(f.turn, f.before_turn, f.trigger) for f in known
                    if f.before_turn > f.trigger]
    assert not over_trigger, f"requests over the trigger before their turn: {over_trigger}"
    checks = {f.turn: f.check for f in known if f.check is not None}
    assert not [t for t, c in checks.items() if c.overflow or c.starved], checks
