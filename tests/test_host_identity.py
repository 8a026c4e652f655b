"""Issue 24, case by case, through the real Hermes 0.19 CLI object (clikit).

Every test drives ``cli.HermesCLI`` (its own chat(), /undo, /retry, /new,
/resume, /branch, exit cleanup) against the fake model on 127.0.0.1 with a
65,536-token window and default trove settings, then compares what trove stored
with an oracle of what was shown where (walkkit.Oracle): every send is a new
message, every reply one, nothing else is.
"""
import random
import sqlite3

import pytest

import clikit as ck
import hostkit as hk
import walkkit as wk

pytestmark = pytest.mark.host


@pytest.fixture(scope="module")
def server():
    """One fake model for the module; it reports cl100k prompt tokens."""
    with hk.FakeOpenAIServer(prompt_tokens_fn=ck.real_prompt_tokens) as fake:
        yield fake


class Talk:
    """A CLI object plus the oracle of what it showed."""

    def __init__(self, host, cli=None):
        self.host = host
        self.cli = cli or host.cli()
        self.oracle = wk.Oracle()
        self.compacted_turns = []  # (text sent, request body, previous exchange, host list)

    def say(self, text, cli=None):
        cli = cli or self.cli
        before = cli.engine.compression_count if cli.engine is not None else 0
        previous = wk.previous_exchange(cli.history, self.oracle)
        cli.chat(text)
        for message in wk.new_messages_of_turn(cli.history, text):
            self.oracle.shown(cli.session_id, message)
        if cli.engine.compression_count > before:
            self.compacted_turns.append((text, self.host.last_main_request(), previous,
                                         wk.host_list_of_turn(cli.history, text)))
        return cli.history

    def retry(self, cli=None):
        cli = cli or self.cli
        sent = [m for m in cli.history if m.get("role") == "user"][-1]["content"]
        cli.retry()
        for message in wk.new_messages_of_turn(cli.history, sent):
            self.oracle.shown(cli.session_id, message)

    def problems(self):
        return self.oracle.check(self.host.home)


def assert_stored_once(talk, note=""):
    problems = talk.problems()
    assert problems.total == 0, (
        note + f"{problems.duplicates} duplicated, {problems.lost} lost, {problems.misfiled} misfiled, "
        f"{problems.phantom} phantom rows:\n" + "\n".join(problems.details[:25]))


def rows(host, session=None):
    return [(r["role"], ck.text_of(r["content"])) for r in host.rows(session)
            if ck.text_of(r["content"])]


# ---------------------------------------------------------------- case 1
def test_sixteen_big_prose_turns_are_stored_once_across_compactions(tmp_path, server):
    """16 user turns of ~14,000 chars of plain technical prose: the compactions
    (the tail gives way at the second) store no turn a second time."""
    model = wk.ScriptedModel(seed=1, long_reply_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        rng = random.Random(24)
        first_failure = None
        for i in range(16):
            talk.say(f"[T{i + 1}] " + wk.prose(rng, 14000))
            if first_failure is None and talk.problems().total:
                first_failure = i + 1
        assert talk.cli.engine.compression_count >= 2, "no second compaction: the test proves nothing"
        talk.cli.exit()
        assert_stored_once(talk, f"first wrong after turn {first_failure}: ")


# ---------------------------------------------------------------- case 2
@pytest.mark.parametrize("kind", ["longword", "code"])
def test_tail_is_not_starved_and_the_host_check_passes_after_compaction(tmp_path, server, kind):
    """Text where chars/4 over-counts (long identifiers) or under-counts (code):
    after each compaction the next request keeps more than the newest user
    message when the previous exchange fits, the host's own
    estimate_request_tokens_rough of it is under the threshold, and the
    provider's count (cl100k) is under the window."""
    model = wk.ScriptedModel(seed=2, long_reply_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        rng = random.Random(7)
        for i in range(14):
            talk.say(f"[T{i + 1}] " + wk.GENERATORS[kind](rng, 6000))
        engine = talk.cli.engine
        assert talk.compacted_turns, "no compaction: the test proves nothing"
        report = []
        for sent, body, previous, host_list in talk.compacted_turns:
            check = wk.check_request(body, sent, talk.oracle, threshold=int(engine.threshold_tokens),
                                     context_length=int(engine.context_length), compacted=True,
                                     previous_pair=previous, host_list=host_list)
            report.append((sent[:6], check.tail_size, check.rough, check.real, check.starved))
            assert check.ends_with_user
            assert not check.over_threshold, (check.rough, engine.threshold_tokens, report)
            assert not check.overflow, (check.real, report)
        starved = [r for r in report if r[-1]]
        assert not starved, (
            f"{len(starved)} of {len(report)} compactions kept only the newest user message although "
            f"the previous exchange fit (turn, raw kept, host estimate, real, starved): {report}; "
            f"threshold {engine.threshold_tokens}")
        assert_stored_once(talk)


# ---------------------------------------------------------------- case 3
@pytest.mark.parametrize("how", ["manual", "automatic"])
def test_whitespace_edit_of_a_tail_reply_after_compaction_stores_nothing_again(tmp_path, server, how):
    """After a compaction one assistant message of the fresh tail changes only by
    whitespace ("ok" -> "ok "), then new user messages arrive: nothing is stored
    again (the host's own restore strips whitespace the same way).

    ``manual``: 20 short turns, then the CLI's /compress (the fresh tail holds
    most of them, as in the issue's 30-message tail); ``automatic``: turns of
    3,000 chars until the host compacts by itself (the fresh tail must then
    hold at least two replies: issue case 2 starves it today)."""
    model = wk.ScriptedModel(seed=3, ok_share=1.0)  # every reply is "ok"
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        rng = random.Random(3)
        turn = 0
        if how == "manual":
            for turn in range(1, 21):
                talk.say(f"[T{turn}] " + wk.prose(rng, 200))
            talk.cli.compress()
            assert talk.cli.engine.compression_count == 1, "/compress did not compact"
        else:
            while not talk.compacted_turns and turn < 40:
                turn += 1
                talk.say(f"[T{turn}] " + wk.prose(rng, 3000))
            assert talk.compacted_turns, "no compaction: the test proves nothing"
        history = talk.cli.history
        tail_replies = [i for i, m in enumerate(history)
                        if m.get("role") == "assistant" and talk.oracle.is_shown(m)]
        assert len(tail_replies) >= 2, f"only {len(tail_replies)} reply kept in the fresh tail to edit"
        before = len(host.rows())
        talk.cli.set_content(tail_replies[0], history[tail_replies[0]]["content"] + " ")
        for _ in range(3):
            turn += 1
            talk.say(f"[T{turn}] " + wk.prose(rng, 400))
        stored = len(host.rows())
        assert stored == before + 6, (
            f"{stored - before - 6} rows stored again after the edit of one of "
            f"{len(history) - tail_replies[0]} tail messages ({stored} rows, {before + 6} expected)")
        talk.cli.exit()
        assert_stored_once(talk)


# ---------------------------------------------------------------- case 4
def covered_markers(home, session):
    """Turn markers of the user rows a summary node of ``session`` covers."""
    db = sqlite3.connect(home / "trove.db")
    try:
        texts = [r[0] for r in db.execute(
            "SELECT m.content FROM node_edges e JOIN nodes n ON n.node_id = e.parent_id"
            " JOIN messages m ON m.store_id = e.child_store_id"
            " WHERE n.session_id = ? AND m.role = 'user'", (session,))]
    finally:
        db.close()
    return {marker for text in texts for marker in wk.MARKER_RE.findall(text or "")}


def request_markers(body):
    return set(wk.MARKER_RE.findall("\n".join(ck.text_of(m.get("content")) for m in body["messages"])))


def test_two_processes_on_one_session_store_once_and_see_each_others_summaries(tmp_path, server):
    """Two CLIs on one session (this process, A, and a second OS process, B),
    turns alternating, both compacting; B compacts between two compactions of
    A. Nothing is stored twice, and A's prompts after its next compaction carry
    every turn a summary of the session covers (as summary text or raw: the
    summaries the fake model writes list the turn markers they cover)."""
    model = wk.ScriptedModel(seed=4, long_reply_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        a = talk.cli
        rng = random.Random(4)
        n = 1
        talk.say(f"[T{n}] " + wk.prose(rng, 6000))
        b = host.process(resume=a.session_id)
        session = a.session_id

        def b_says(text):
            b.chat(text)
            for message in wk.new_messages_of_turn(b.history, text):
                talk.oracle.shown(b.session_id, message)

        b_count = lambda: b.engine_state()["compression_count"] or 0  # noqa: E731
        checked, first_duplicates, missing_report = 0, None, []
        b_seen = 0
        for _ in range(40):
            n += 1
            b_says(f"[T{n}] " + wk.prose(rng, 9000))
            b_now = b_count()
            n += 1
            before = a.engine.compression_count
            talk.say(f"[T{n}] " + wk.prose(rng, 6000))
            problems = talk.problems()
            if first_duplicates is None and problems.duplicates:
                first_duplicates = (n, problems)
            if a.engine.compression_count > before and before >= 1 and b_now > b_seen:
                # A compacted again after B compacted since A's previous look
                covered = covered_markers(host.home, session)
                for body in (host.last_main_request(),):
                    lost = sorted(covered - request_markers(body), key=lambda m: int(m[2:-1]))
                    if lost:
                        missing_report.append((n, lost))
                n += 1
                talk.say(f"[T{n}] " + wk.prose(rng, 300))
                lost = sorted(covered - request_markers(host.last_main_request()), key=lambda m: int(m[2:-1]))
                if lost:
                    missing_report.append((n, lost))
                checked += 1
                if checked >= 1:
                    break
            if a.engine.compression_count > before:
                b_seen = b_now
        b.exit()
        a.exit()
        assert checked, "A never compacted after B did: the test proves nothing"
        failures = []
        if first_duplicates is not None:
            failures.append(f"{first_duplicates[1].duplicates} rows stored twice by turn {first_duplicates[0]}:\n"
                            + "\n".join(first_duplicates[1].details[:12]))
        if missing_report:
            failures.append("turns a summary of the session covers are neither summarized nor raw in "
                            f"A's later prompts (turn, markers): {missing_report}")
        assert not failures, f"after {n} turns:\n" + "\n".join(failures)
        assert_stored_once(talk)


def test_rows_a_second_clis_compaction_kept_beside_the_block_are_not_stored_again(tmp_path, server):
    """A second CLI (B) resumes the session; the first (A) sends a big turn and
    compacts, summarizing everything before it. B's next turn compacts its older list
    into the same block and keeps the exchange before its turn raw beside it, rows
    A's block covers (the second-process rule of compaction/tail_rows). The host
    writes B's compacted list to its state.db, A's next turns go after it, and A
    restarted restores that list: its own view holds the block but not those rows,
    which were refused as summarized and stored again (3 rows)."""
    model = wk.ScriptedModel(seed=4, long_reply_share=0.0)
    rng = random.Random(5)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        a = talk.cli
        # sizes inside a region where every step below holds (T7 too big to stay in A's
        # tail beside [T8], small enough to stay in B's beside [S1]); each step is checked
        for n in range(1, 7):
            talk.say(wk.make_text(rng, "prose", 1200, f"[T{n}]"))
        talk.say(wk.make_text(rng, "prose", 2600, "[T7]"))
        assert a.engine.compression_count == 0
        b = host.cli(resume=a.session_id)
        talk.say(wk.make_text(rng, "prose", 5500, "[T8]"))
        talk.say(wk.make_text(rng, "prose", 2000, "[S1]"), cli=b)
        assert a.engine.compression_count == 1 and b.engine.compression_count == 1
        kept = [ck.text_of(m.get("content")) for m in b.history]
        assert kept[0] == ck.text_of(a.history[0].get("content")), "B rendered a block of its own"
        assert any(text.startswith("[T7]") for text in kept) and "[T7]" in covered_markers(
            host.home, a.session_id), "B kept no row A's block covers: the test proves nothing"
        for n in range(3):
            talk.say(f"[A{n}] a short turn")
        assert a.engine.compression_count == 1
        talk.cli = host.restart(a)
        assert any(ck.text_of(m.get("content")).startswith("[T7]") for m in talk.cli.history)
        talk.say("[R] after the restart")
        assert_stored_once(talk)


# ---------------------------------------------------------------- case 5
@pytest.mark.parametrize("path", ["undo_resend", "retry", "undo_retry"])
def test_identical_resend_after_undo_or_retry_is_a_new_user_row(tmp_path, server, path):
    """/undo puts the text back and Enter re-sends it unchanged: the stored
    transcript is u1 a1 u2 a2 u2 a2' ... (a re-sent message is a new one).
    /retry re-sends the last user message; /undo + /retry re-sends the one
    before."""
    model = wk.ScriptedModel(seed=5, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        talk.say("first message")
        talk.say("second message")
        if path == "undo_resend":
            talk.cli.undo()
            talk.say("second message")
            again = "second message"
        elif path == "retry":
            talk.retry()
            again = "second message"
        else:
            talk.cli.undo()
            talk.retry()
            again = "first message"
        talk.say("third message")
        talk.cli.exit()
        users = [text for role, text in rows(host) if role == "user"]
        assert users == ["first message", "second message", again, "third message"], users
        replies = [text for role, text in rows(host) if role == "assistant"]
        assert len(replies) == 4 and len(set(replies)) == 4, replies
        assert [role for role, _ in rows(host)] == ["user", "assistant"] * 4
        assert_stored_once(talk)


def branch_after_two_turns(talk) -> tuple[str, list, str, list]:
    """Two turns ("first message", "second message"), then /branch: the parent's id, its
    history at the branch point (the oracle's branch copy), the branch's id and the
    parent's stored rows before the branch."""
    talk.say("first message")
    talk.say("second message")
    parent = talk.cli.session_id
    parent_rows = rows(talk.host, parent)
    history = list(talk.cli.history)
    branch = talk.cli.branch()
    talk.oracle.branched(branch, history)
    return parent, history, branch, parent_rows


def test_undo_and_retry_on_a_branch_store_each_send(tmp_path, server):
    """The issue's branch variant: on a branch (its copy stored by its first
    turn), /undo + /retry store one more user row with its reply, and the
    parent gains nothing."""
    model = wk.ScriptedModel(seed=6, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        parent, history, branch, parent_rows = branch_after_two_turns(talk)
        talk.say("on the branch")
        talk.cli.undo()
        talk.retry()  # re-sends "second message"
        talk.say("third message")
        talk.cli.exit()
        assert rows(host, parent) == parent_rows
        branch_rows = rows(host, branch)
        users = [t for r, t in branch_rows if r == "user"]
        assert users == ["first message", "second message", "on the branch", "second message",
                         "third message"], branch_rows
        assert [r for r, _ in branch_rows] == ["user", "assistant"] * 5, branch_rows
        assert_stored_once(talk)


# ---------------------------------------------------------------- case 6
def test_pre_compaction_list_after_an_automatic_compaction_stores_nothing(tmp_path, server):
    """Right after an automatic compaction the host hands on_session_end the list
    from BEFORE the compaction (commit_memory_session): nothing new is stored
    from it. The real method runs; the spy only counts rows around it."""
    model = wk.ScriptedModel(seed=7, long_reply_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        rng = random.Random(6)
        talk.say("[T0] hello")
        engine = talk.cli.engine
        calls = []
        real = engine.on_session_end

        def spy(session_id, messages):
            before = len(host.rows(roles=None))
            result = real(session_id, messages)
            calls.append((session_id, len(messages), before, len(host.rows(roles=None)),
                          engine.compression_count))
            return result

        engine.on_session_end = spy
        turn = 0
        while engine.compression_count < 2 and turn < 40:
            turn += 1
            talk.say(f"[T{turn}] " + wk.prose(rng, 8000))
        assert engine.compression_count >= 2, "too few compactions: the test proves nothing"
        assert calls, "the host never handed the engine its pre-compaction list"
        grew = [c for c in calls if c[3] != c[2]]
        assert not grew, f"the pre-compaction list stored rows (session, len, before, after, count): {grew}"
        talk.cli.exit()
        assert_stored_once(talk)


def busy_gateway(home, oracle, users: int = 10, turns: int = 4) -> None:
    """A messaging gateway on the same database (Hermes's CLI and gateway share
    ``$HERMES_HOME``): ``users`` chats of ``turns`` turns, each writing its views
    (the ``oracle`` is told each message)."""
    from enginekit import make_engine
    gateway = make_engine(home, window=64_000, session=None)
    for u in range(users):
        gateway.on_session_start(f"telegram-chat-{u}", platform="telegram")
        history = []
        for t in range(turns):
            history += [{"role": "user", "content": f"gateway user {u} says {t}"},
                        {"role": "assistant", "content": f"gateway reply {u}.{t}"}]
            gateway.note_user_turn(history[-2])
            gateway.ingest(history)
            gateway.turn_done()
            for message in history[-2:]:
                oracle.shown(f"telegram-chat-{u}", message)


@pytest.mark.parametrize("gateway", [False, True], ids=["alone", "busy_gateway"])
def test_exit_after_new_without_a_turn_stores_nothing_under_the_new_session(tmp_path, server,
                                                                            gateway):
    """/new then exit: the CLI hands the PREVIOUS session's transcript to
    on_session_end under the NEW session's id; nothing is stored there. Also when a
    gateway on the same database wrote many views meanwhile: the newest views of
    other sessions were then all the gateway's, and the transcript was stored again."""
    model = wk.ScriptedModel(seed=8, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        talk.say("alpha in the first session")
        talk.say("beta in the first session")
        first = talk.cli.session_id
        second = talk.cli.new()
        talk.oracle.session(second)
        if gateway:
            busy_gateway(host.home, talk.oracle)
        talk.cli.exit()
        assert rows(host, second) == [], f"the first session's transcript landed in {second}"
        assert_stored_once(talk)


@pytest.mark.parametrize("gateway", [False, True], ids=["alone", "busy_gateway"])
def test_exit_after_resume_without_a_turn_stores_nothing_under_the_resumed_session(
        tmp_path, server, gateway):
    """/new, a turn, /resume the first session, exit: the second session's
    transcript (still the agent's _session_messages) is not stored under the
    first, also with a busy gateway on the same database."""
    model = wk.ScriptedModel(seed=9, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        talk.say("alpha in the first session")
        first = talk.cli.session_id
        second = talk.cli.new()
        talk.say("gamma in the second session")
        talk.say("delta in the second session")
        talk.cli.resume(first)
        assert talk.cli.session_id == first
        if gateway:
            busy_gateway(host.home, talk.oracle)
        talk.cli.exit()
        assert ("user", "gamma in the second session") not in rows(host, first)
        assert_stored_once(talk)


def test_retry_then_resume_stores_nothing_again(tmp_path, server):
    """/retry keeps its first attempt active in state.db, so the restored history
    of a /resume shows the retried message twice: lined up, nothing re-stored."""
    model = wk.ScriptedModel(seed=10, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        talk.say("first message")
        talk.say("second message")
        talk.retry()
        talk.say("third message")
        first = talk.cli.session_id
        talk.cli.new()
        talk.say("in another session")
        talk.cli.resume(first)
        restored_users = [m["content"] for m in talk.cli.history if m.get("role") == "user"]
        assert restored_users.count("second message") == 2, "the host no longer restores both attempts"
        talk.say("fourth message")
        talk.cli.exit()
        assert_stored_once(talk)


def test_resume_after_compress_and_branch_stores_nothing_again(tmp_path, server):
    """After a /compress and a /branch the host's state.db holds the compacted list
    more than once, and a /resume restores the engine's block and the tail after it
    twice: the second copy is the same messages (identity rule 5), not new ones."""
    model = wk.ScriptedModel(seed=5, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        rng = random.Random(5)
        for n in range(1, 9):
            talk.say(f"[T{n}] " + wk.prose(rng, 4000))
        first = talk.cli.session_id
        talk.cli.compress()
        history = list(talk.cli.history)
        branch = talk.cli.branch()
        talk.oracle.branched(branch, history)
        talk.say("[T7] on the branch")
        talk.cli.new()
        talk.oracle.session(talk.cli.session_id)
        talk.say("[T8] in another session")
        talk.cli.resume(first)
        blocks = [m for m in talk.cli.history if "[trove context" in ck.text_of(m.get("content"))]
        talk.say("[T9] back in the first session")
        talk.cli.exit()
        assert blocks, "the restored history carries no summary block: the test proves nothing"
        assert_stored_once(talk)



def test_a_sent_copy_of_the_current_or_an_older_block_is_stored_once(tmp_path, server):
    """Audit: a user who sends text that is exactly one of the engine's blocks (a
    paste from a log, an operator re-sending an earlier prompt) sent a message; it
    was taken for the engine's block and never stored. Through the CLI: a copy of
    the current block and one of an older block are each one row, in place, also
    after a /resume in a second CLI restores them beside the engine's block."""
    model = wk.ScriptedModel(seed=11, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        rng = random.Random(11)

        def block_of(history):
            return next(ck.text_of(m.get("content")) for m in history
                        if ck.text_of(m.get("content")).startswith(wk.BLOCK_PREFIX))

        for n in range(1, 7):
            talk.say(f"[T{n}] " + wk.prose(rng, 4000))
        talk.cli.compress()
        older = block_of(talk.cli.history)
        for n in range(7, 11):
            talk.say(f"[T{n}] " + wk.prose(rng, 4000))
        talk.cli.compress()
        current = block_of(talk.cli.history)
        assert current != older
        talk.say(current)
        talk.say(older)
        talk.say("[T11] what were those?")
        session = talk.cli.session_id
        talk.cli.exit()
        users = [text for role, text in rows(host) if role == "user"]
        assert users.count(current) == 1 and users.count(older) == 1, users[-4:]
        assert users[-3:] == [current, older, "[T11] what were those?"]
        second = Talk(host)
        second.oracle = talk.oracle
        second.cli.resume(session)
        assert [m for m in second.cli.history if ck.text_of(m.get("content")) == older]
        second.say("[T12] from the second CLI")
        second.cli.exit()
        users = [text for role, text in rows(host) if role == "user"]
        assert users[-4:] == [current, older, "[T11] what were those?", "[T12] from the second CLI"]
        assert_stored_once(talk)


def test_a_sent_copy_of_the_block_stays_the_turns_message_through_a_compress(tmp_path, server):
    """A user who sends the current block's text sent the turn's message: the model is
    asked with it, and a /compress after the turn (a one-message tail) keeps it with
    its answer. The tail chooser judged user messages by their text, so it kept the
    older question in the copy's place: the next request showed the answer after a
    question it never answered, and the copy was gone."""
    model = wk.ScriptedModel(seed=11, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model,
                    extra_env={"TROVE_FRESH_TAIL_COUNT": "1"}) as host:
        talk = Talk(host)
        rng = random.Random(11)
        for n in range(1, 7):
            talk.say(f"[T{n}] " + wk.prose(rng, 4000))
        talk.cli.compress()
        for n in range(7, 11):
            talk.say(f"[T{n}] " + wk.prose(rng, 4000))
        talk.cli.compress()
        current = next(ck.text_of(m.get("content")) for m in talk.cli.history
                       if ck.text_of(m.get("content")).startswith(wk.BLOCK_PREFIX))
        talk.say(current)

        def sent() -> list:
            return [(m.get("role"), ck.text_of(m.get("content")))
                    for m in server.main_bodies[-1]["messages"]]
        asked = sent()   # the turn's message (the plugin may append its recall policy)
        assert asked[-1][0] == "user" and asked[-1][1].startswith(current)
        rest = asked[-1][1][len(current):]
        assert rest == "" or rest.startswith("\n\n")
        answer = talk.cli.history[-1]
        assert answer["role"] == "assistant"
        talk.cli.compress()
        talk.say("[T11] what was that?")
        asked = sent()
        at = [k for k, (role, text) in enumerate(asked)
              if k > 1 and role == "user" and text.startswith(current)]   # [1]: the block
        assert len(at) == 1, asked
        at = at[0]
        assert asked[at - 1][0] == "assistant" and asked[at - 1][1].startswith("[trove] ")
        assert asked[at + 1] == ("assistant", ck.text_of(answer.get("content"))), asked[at - 2:]
        assert len(asked) == at + 3 and asked[-1][1].startswith("[T11] what was that?")
        assert not any(text.startswith("[T10]") for _, text in asked)
        talk.cli.exit()
        users = [text for role, text in rows(host) if role == "user"]
        assert users.count(current) == 1 and users[-2:] == [current, "[T11] what was that?"]
        assert_stored_once(talk)


def test_a_branch_retried_then_undone_keeps_the_copied_attempt(tmp_path, server):
    """/branch, /retry on the branch, /undo, then the branch restored: the host copied
    the parent's last exchange (u2, a2) into the branch and /retry left it active in
    state.db, so the restore ends with it, while the branch's copy (its first list,
    the retry's) held only the re-send (u2', a2'). The restored u2 is the copied send,
    not the re-send: the next turn on the branch stores both u2 and a2 there, a2 no
    second reply of u2' (host walk 490000: u2 was lost)."""
    model = wk.ScriptedModel(seed=6, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        parent, history, branch, _ = branch_after_two_turns(talk)
        # the branch's first list is the retry's: its copy may lack the retried attempt
        talk.oracle.first_ingest(branch, history[:-2])
        talk.retry()
        talk.cli.undo()
        talk.cli.resume(parent)
        talk.cli.resume(branch)
        restored = [ck.text_of(m.get("content")) for m in talk.cli.history]
        assert restored.count("second message") == 1 and len(restored) == 4, restored
        talk.say("third message")
        talk.cli.exit()
        branch_rows = rows(host, branch)
        users = [t for r, t in branch_rows if r == "user"]
        assert users == ["first message", "second message", "second message", "third message"], \
            branch_rows
        assert len({t for r, t in branch_rows if r == "assistant"}) == 4, branch_rows
        assert_stored_once(talk)


@pytest.mark.parametrize("after_branch", ["compress", "nothing"])
def test_exit_after_undo_and_branch_stores_nothing_the_branch_never_showed(tmp_path, server,
                                                                          after_branch):
    """A turn, /undo, /branch, (a /compress on the branch), exit: the CLI hands over the
    agent's transcript from before the /undo (the undone exchange at its end) under the
    branch's id. The branch's own view explained the list's start, and the fast paths
    took the undone exchange for new messages of the branch and stored it there (soak
    seed 960003, rare flows weighted up); a list handed over at a session end is read
    whole, and the parent's view makes that exchange the parent's (rule 4)."""
    model = wk.ScriptedModel(seed=11, ok_share=0.0)
    with ck.CliHost(tmp_path, server=server, responder=model) as host:
        talk = Talk(host)
        talk.say("alpha in the parent")
        talk.say("beta in the parent")
        talk.say("gamma, undone in the parent")
        talk.cli.undo()
        history = list(talk.cli.history)
        branch = talk.cli.branch()
        talk.oracle.branched(branch, history)
        if after_branch == "compress":
            talk.cli.compress()
            talk.oracle.first_ingest(branch, history)
        talk.cli.exit()
        assert ("user", "gamma, undone in the parent") not in rows(host, branch)
        assert_stored_once(talk)
