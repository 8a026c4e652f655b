"""Session switches inside the real hermes-agent 0.19.0 host (fake model on 127.0.0.1).

The CLI's /new, /resume and /branch are reset-only switches (cli.py new_session,
hermes_cli/cli_commands_mixin.py resume ~797 and branch ~991): each is replayed
here step by step with the host's own objects (``agent.reset_session_state()``,
the agent's SessionDB, ``gateway.session_context.set_current_session_id``), then
the real ``AIAgent`` keeps talking. After each switch every turn must be stored
exactly once under the session the host is in, and nowhere else.
"""

import json
import os
import sqlite3
import uuid
from collections import Counter

import pytest

import hostkit as hk
from hostkit import trove_host  # noqa: F401 (fixture)

pytestmark = pytest.mark.host

SAME_REPLY = "Sure, noted."  # every main reply is identical: identity is per session


@pytest.fixture
def fake_llm(monkeypatch):
    """hostkit's fake model, with /trove switched on and every summary depth carried
    into a new session, before the host loads the plugin."""
    monkeypatch.setenv("TROVE_ENABLE_SLASH_COMMAND", "true")
    monkeypatch.setenv("TROVE_NEW_SESSION_RETAIN_DEPTH", "0")
    with hk.FakeOpenAIServer() as server:
        yield server


def rows(home, session=None):
    """(session_id, role, content) of every stored message, in store order."""
    db = sqlite3.connect(home / "trove.db")
    try:
        sql = "SELECT session_id, role, content FROM messages"
        args = ()
        if session is not None:
            sql, args = sql + " WHERE session_id = ?", (session,)
        return db.execute(sql + " ORDER BY store_id", args).fetchall()
    finally:
        db.close()


def user_texts(home, session):
    return [c for s, r, c in rows(home, session) if r == "user"]


def sync_process_session(session_id):
    """cli.py ``_sync_process_session_id``: the ContextVar and os.environ move together."""
    from gateway.session_context import set_current_session_id
    set_current_session_id(session_id)


def new_session_id():
    return f"20261202_000000_{uuid.uuid4().hex[:6]}"


def cli_new(agent, history):
    """cli.py ``new_session``: on_session_end(old, history) at the boundary, flush,
    end the old row, switch the id, reset, then create the new row."""
    old = agent.session_id
    engine = hk.live_engine(agent)
    if history:
        engine.on_session_end(old, list(history))  # _launch_session_boundary_memory_flush
        agent._flush_messages_to_session_db(history)
    agent._session_db.end_session(old, "new_session")
    new = new_session_id()
    sync_process_session(new)
    agent.session_id = new
    agent.reset_session_state()
    agent._last_flushed_db_idx = 0
    agent._session_db_created = False
    agent._session_db.create_session(session_id=new, source="cli", model=agent.model)
    agent._session_db_created = True
    return new


def cli_resume(agent, history, target):
    """cli_commands_mixin ``resume``: flush, end the current row, restore the target's
    history from state.db, switch the id, reset. No engine hook before the switch."""
    db = agent._session_db
    agent._flush_messages_to_session_db(history)
    db.end_session(agent.session_id, "resumed_other")
    sync_process_session(target)
    restored = db.get_messages_as_conversation(target, repair_alternation=True)
    restored = [m for m in (restored or []) if m.get("role") != "session_meta"]
    db.reopen_session(target)
    agent.session_id = target
    agent.reset_session_state()
    agent._last_flushed_db_idx = len(restored)
    return restored


def cli_branch(agent, history):
    """cli_commands_mixin ``branch``: flush, end the parent, create the branch row with
    the parent link, copy the history, switch the id, reset; the history is kept."""
    db = agent._session_db
    parent = agent.session_id
    agent._flush_messages_to_session_db(history)
    db.end_session(parent, "branched")
    new = new_session_id()
    db.create_session(session_id=new, source="cli", model=agent.model,
                      parent_session_id=parent)
    for m in history:
        db.append_message(session_id=new, role=m.get("role", "user"), content=m.get("content"),
                          tool_name=m.get("tool_name") or m.get("name"),
                          tool_calls=m.get("tool_calls"), tool_call_id=m.get("tool_call_id"))
    sync_process_session(new)
    agent.session_id = new
    agent.reset_session_state()
    agent._last_flushed_db_idx = len(history)
    return new


def status_session(agent):
    """trove_status as the model gets it, and /trove status as the user types it."""
    engine = hk.live_engine(agent)
    answer = json.loads(engine.handle_tool_call("trove_status", {}, messages=[]))
    text = hk.run_slash_command("trove", "status")
    return answer["session_id"], text


def assert_once_each(home, session, texts):
    stored = Counter((r, c) for s, r, c in rows(home) if s == session)
    for text in texts:
        assert stored[("user", text)] == 1, (text, stored)
    elsewhere = [c for s, r, c in rows(home) if s != session and c in texts]
    assert not elsewhere, f"turns of {session} stored under another session: {elsewhere}"


def test_cli_new_then_resume_then_branch_follow_the_host(trove_host):
    trove_host.server.responder = lambda body: SAME_REPLY
    home = trove_host.hermes_home
    agent = hk.make_agent()
    assert hk.uses_plugin_engine(agent, "trove", plugin_name="hermes-trove")
    first = agent.session_id
    a_texts = ["first session one", "first session two"]
    history = hk.run_turns(agent, a_texts)[-1]["messages"]

    # /new: three turns, each stored once under the new id, each reply kept.
    second = cli_new(agent, history)
    assert hk.live_engine(agent).session_id == second
    b_texts = ["second session one", "second session two", "second session three"]
    history = hk.run_turns(agent, b_texts)[-1]["messages"]
    assert_once_each(home, second, b_texts)
    replies = [c for s, r, c in rows(home, second) if r == "assistant"]
    assert replies == [SAME_REPLY] * 3, "an identical reply of another session dropped one"
    assert user_texts(home, first) == a_texts
    session, text = status_session(agent)
    assert session == second and f"session: {second}" in text
    assert f"session: {first}" not in text and f"last switch: new from {first}" in text

    # /resume the first session: its own store continues, nothing of the second moves.
    restored = cli_resume(agent, history, first)
    assert hk.live_engine(agent).session_id == first
    c_texts = ["back in the first one"]
    history = hk.run_turns(agent, c_texts, history=restored)[-1]["messages"]
    assert user_texts(home, first) == a_texts + c_texts
    assert user_texts(home, second) == b_texts
    assert [c for s, r, c in rows(home, first) if r == "assistant"] == [SAME_REPLY] * 3
    assert status_session(agent)[0] == first

    # /branch: a new id with the history kept; the parent gains no rows.
    parent_rows = rows(home, first)
    branch = cli_branch(agent, history)
    assert hk.live_engine(agent).session_id == branch
    d_texts = ["only in the branch"]
    history = hk.run_turns(agent, d_texts, history=history)[-1]["messages"]
    assert rows(home, first) == parent_rows
    assert user_texts(home, branch) == a_texts + c_texts + d_texts  # copied history, reachable
    assert [c for s, r, c in rows(home) if c == d_texts[0]] == d_texts
    assert status_session(agent)[0] == branch

    # CLI exit: on_session_end(branch, history) adds nothing anywhere.
    before = rows(home)
    hk.end_session(agent, history)
    assert rows(home) == before
    assert hk.live_engine(agent).last_switch["kind"] == "branch"


# ---------------------------------------------------------------- background review forks
HARNESS = "Review the conversation above"


def _last_user_text(body):
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else json.dumps(content)


def review_responder(body):
    """The user's turn calls trove_status once, then answers; the review fork's
    harness request gets a curator-style reply."""
    if not hk.is_main_request(body):
        return "- summary"
    msgs = body.get("messages") or []
    if _last_user_text(body).lstrip().startswith(HARNESS):
        if msgs and msgs[-1].get("role") == "tool":
            return "Nothing to save. CURATOR-REPLY-MARKER"
        return hk.ToolCall("trove_grep", {"query": "zanzibar"})  # the fork reads
    if msgs and msgs[-1].get("role") == "tool":
        return "The status looked fine, zanzibar checked."
    return hk.ToolCall("trove_status", {})


@pytest.fixture
def review_host(tmp_path, fake_llm):
    """The plugin in a host whose skill review runs after every tool iteration."""
    home = hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"skills": {"creation_nudge_interval": 1}})
    with hk.host_env(home) as env:
        env.server = fake_llm
        yield env
    assert not env.blocked, f"host tried to reach the network: {env.blocked}"


def wait_for_reviews(timeout=60):
    import threading
    for thread in [t for t in threading.enumerate() if t.name == "bg-review"]:
        thread.join(timeout)
        assert not thread.is_alive(), "the background review did not finish"


def test_background_review_fork_writes_nothing_into_the_user_session(review_host):
    server = review_host.server
    server.responder = review_responder
    home = review_host.hermes_home
    agent = hk.make_agent()
    session = agent.session_id
    texts = ["check the status for the zanzibar project", "and once more for zanzibar"]
    history = None
    for text in texts:
        history = hk.run_turns(agent, [text], history=history)[-1]["messages"]
        wait_for_reviews()
    fork_requests = [b for b in server.main_bodies
                     if _last_user_text(b).lstrip().startswith(HARNESS)]
    assert len(fork_requests) == 4, "the host did not run its review fork"
    # The fork's trove_grep: hermes 0.19 denies it (the review fork may only call
    # memory and skill tools); the engine side of a fork's read-only tool call is
    # covered in test_binding.py. Either way the fork's turn is not stored (below).
    fork_tool_results = [b["messages"][-1]["content"] for b in fork_requests
                         if b["messages"][-1].get("role") == "tool"]
    assert len(fork_tool_results) == 2
    assert all("Background review denied" in r for r in fork_tool_results), fork_tool_results
    hk.end_session(agent, history)

    stored = rows(home)
    assert not [c for s, r, c in stored if c and (HARNESS in c or "CURATOR-REPLY-MARKER" in c)]
    assert Counter(c for s, r, c in stored if r == "user") == Counter(texts)
    assert {s for s, r, c in stored} == {session}
    # the forks' throwaway sessions are gone too: the user's is the only session row
    db = sqlite3.connect(home / "trove.db")
    try:
        assert [r[0] for r in db.execute("SELECT session_id FROM sessions")] == [session]
        assert [r[0] for r in db.execute("SELECT session_id FROM session_owners")] == [session]
    finally:
        db.close()
    assert [c for s, r, c in stored if r == "assistant" and c] == [
        "The status looked fine, zanzibar checked."] * 2
    # The user's own search never returns the fork's turns.
    engine = hk.live_engine(agent)
    assert engine.session_id == session and not engine.review_fork
    for query in ('"update the skill library"', "CURATOR-REPLY-MARKER"):
        found = json.loads(engine.handle_tool_call(
            "trove_grep", {"query": query, "session_scope": "all"}, messages=history))
        assert found["results"] == [], query


# ---------------------------------------------------------------- one gateway process, many sessions
def gateway_agent(user):
    """A gateway agent as gateway/run.py builds one per chat (own session id and key)."""
    return hk.make_agent(platform="telegram", session_id=f"tg-session-{user}",
                         gateway_session_key=f"agent:main:telegram:dm:{user}",
                         user_id=user, chat_id=user, session_db=False)


def gateway_turn(agent, user, text, history):
    """One message handled in its own task context, as the gateway scopes it."""
    import contextvars

    from gateway.session_context import set_session_vars

    def run():
        set_session_vars(platform="telegram", chat_id=user, user_id=user,
                         session_key=agent._gateway_session_key, session_id=agent.session_id)
        return agent.run_conversation(text, conversation_history=history)["messages"]
    return contextvars.copy_context().run(run)


def test_two_gateway_sessions_interleaved_in_one_process(trove_host):
    import threading

    trove_host.server.responder = lambda body: SAME_REPLY
    home = trove_host.hermes_home
    agents = {"111": gateway_agent("111"), "222": gateway_agent("222")}
    texts = {user: [f"user {user} message {i}" for i in range(4)] for user in agents}
    histories = {user: None for user in agents}
    errors = []
    turn_lock = {user: threading.Event() for user in agents}

    def converse(user, other):
        try:
            for i, text in enumerate(texts[user]):
                if user == "222" or i:  # strict alternation: 111, 222, 111, 222, ...
                    turn_lock[user].wait(30)
                    turn_lock[user].clear()
                histories[user] = gateway_turn(agents[user], user, text, histories[user])
                turn_lock[other].set()
        except Exception as exc:  # surfaced below
            errors.append(exc)
            turn_lock[other].set()

    workers = [threading.Thread(target=converse, args=("111", "222")),
               threading.Thread(target=converse, args=("222", "111"))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert not errors, errors
    for user, agent in agents.items():
        session = agent.session_id
        engine = hk.live_engine(agent)
        assert engine.session_id == session and engine.platform == "telegram"
        assert engine.conversation_id == f"agent:main:telegram:dm:{user}"
        assert user_texts(home, session) == texts[user]
        assert [c for s, r, c in rows(home, session) if r == "assistant"] == [SAME_REPLY] * 4
    assert {s for s, r, c in rows(home)} == {a.session_id for a in agents.values()}

    # Owners: each user's agent finds its own words and never the other's, whatever
    # the tool argument (recall, scope all, a named session, a store_id).
    for user, other in (("111", "222"), ("222", "111")):
        engine = hk.live_engine(agents[user])
        assert engine.owner == f"telegram:conversation:agent:main:telegram:dm:{user}"
        theirs = agents[other].session_id
        their_ids = [r["store_id"] for r in engine.store.session_messages(theirs, limit=100)]
        probes = [("trove_recall", {"query": f"user {other} message"}),
                  ("trove_grep", {"query": f"user {other} message", "session_scope": "all"}),
                  ("trove_grep", {"query": f"user {other} message", "session_id": theirs}),
                  ("trove_load_session", {"session_id": theirs})]
        probes += [("trove_expand", {"store_id": i, "session_scope": "all"}) for i in their_ids]
        for name, args in probes:
            answer = engine.handle_tool_call(name, args, messages=histories[user])
            assert f"user {other} message 0" not in answer, (name, args, answer[:300])
        mine = json.loads(engine.handle_tool_call(
            "trove_recall", {"query": f"user {user} message"}, messages=histories[user]))
        assert mine["results"]


def test_a_gateway_group_chat_never_reads_a_members_dm(trove_host):
    """gateway/run.py builds a chat's agent inside the message's task context
    (``_set_session_env``, then ``run_sync`` in a copy of it): AIAgent init's
    platform-less ``bind_session_state`` already sees the sender's user id. The
    owner is the chat's key all the same, so a group chat opened by a member does
    not read that member's DM (it did: both were ``gateway:user:<id>``)."""
    import contextvars

    from gateway.session_context import set_session_vars

    trove_host.server.responder = lambda body: SAME_REPLY
    agents = {}

    def message(chat, user, key, text, history):
        def run():
            set_session_vars(platform="telegram", chat_id=chat, user_id=user, session_key=key)
            if chat not in agents:   # first message of the chat: the gateway builds its agent
                agents[chat] = hk.make_agent(platform="telegram", session_id=f"tg-{chat}",
                                             gateway_session_key=key, user_id=user,
                                             chat_id=chat, session_db=False)
            return agents[chat].run_conversation(text, conversation_history=history)["messages"]
        return contextvars.copy_context().run(run)

    dm = message("111", "111", "agent:main:telegram:dm:111", "my bank pin is quokka-7731", None)
    dm = message("111", "111", "agent:main:telegram:dm:111", "thanks", dm)
    group_key = "agent:main:telegram:group:-100"
    history = message("-100", "111", group_key, "[Alice] hello everyone", None)
    history = message("-100", "222", group_key, "[Bob] what is Alice's bank pin?", history)
    group = hk.live_engine(agents["-100"])
    assert group.owner == f"telegram:conversation:{group_key}"
    for name, args in (("trove_grep", {"query": "quokka", "session_scope": "all"}),
                       ("trove_recall", {"query": "bank pin quokka"}),
                       ("trove_load_session", {"session_id": "tg-111"})):
        answer = group.handle_tool_call(name, args, messages=history)
        assert "quokka-7731" not in answer, (name, answer[:300])
    mine = hk.live_engine(agents["111"]).handle_tool_call(
        "trove_grep", {"query": "quokka", "session_scope": "all"}, messages=dm)
    assert "quokka-7731" in mine


def _telegram_chats(agents: dict):
    """``(message, slash)``: a Telegram user's message run as the gateway runs it (its
    session variables set, one agent per chat, kept in ``agents``) and a ``/trove``
    command dispatched as 0.19 does (the variables reset first)."""
    import contextvars

    from gateway.session_context import reset_session_vars, set_session_vars

    def message(chat, text):
        def run():
            reset_session_vars()
            set_session_vars(platform="telegram", chat_id=chat, user_id=chat,
                             session_key=f"agent:main:telegram:dm:{chat}")
            if chat not in agents:
                agents[chat] = hk.make_agent(platform="telegram", session_id=f"tg-{chat}",
                                             gateway_session_key=f"agent:main:telegram:dm:{chat}",
                                             user_id=chat, chat_id=chat, session_db=False)
            return agents[chat].run_conversation(text)["messages"]
        return contextvars.copy_context().run(run)

    def slash(args):
        def run():
            reset_session_vars()   # what the gateway does at the top of every message
            return hk.run_slash_command("trove", args)
        return contextvars.copy_context().run(run)

    return message, slash

def test_trove_typed_in_a_gateway_chat_never_names_another_chats_session(trove_host):
    """gateway/run.py resets a message's session variables before it dispatches a
    plugin command (``_handle_message``: ``reset_session_vars``), so ``HERMES_SESSION_ID``
    falls back to ``os.environ``: the id of whichever chat's agent started last.
    /trove status showed that chat's session and /trove rotate apply rotated it."""
    trove_host.server.responder = lambda body: SAME_REPLY
    agents = {}

    message, slash = _telegram_chats(agents)
    message("111", "alice was here")
    message("222", "bob was here")
    assert os.environ.get("HERMES_SESSION_ID") == "tg-222"   # the last agent started
    status = slash("status")
    assert "tg-222" not in status and "tg-111" not in status, status
    rotated = slash("rotate apply")
    assert "tg-222" not in rotated, rotated
    assert user_texts(trove_host.hermes_home, "tg-222") == ["bob was here"]
    assert hk.live_engine(agents["222"]).session_id == "tg-222"


def test_trove_grep_typed_in_a_gateway_chat_never_reads_another_users_messages(
        trove_host, monkeypatch):
    """``/trove grep`` ran as the operator (every owner's sessions), so in a gateway any
    user read everyone's chats. With the gateway's runner alive (gateway/run.py
    ``_gateway_runner_ref``) the command runs as its caller, whom 0.19's dispatch does
    not name (the message's variables are reset first): it reads nothing."""
    import gateway.run as gateway_run

    trove_host.server.responder = lambda body: SAME_REPLY
    agents = {}

    message, slash = _telegram_chats(agents)
    message("111", "alice pin is quokka-7731")
    message("222", "bob pin is wombat-5511")
    runner = object()
    monkeypatch.setattr(gateway_run, "_gateway_runner_ref", lambda: runner)
    for words in ("grep quokka", "grep --session tg-111 quokka", "doctor retention"):
        answer = slash(words)
        assert "quokka-7731" not in answer and "tg-111" not in answer.replace(words, ""), answer
    monkeypatch.setattr(gateway_run, "_gateway_runner_ref", lambda: None)   # no gateway
    assert "quokka-7731" in slash("grep quokka")   # the local operator reads every owner


def test_database_wide_trove_commands_are_refused_in_a_gateway_chat(trove_host, monkeypatch):
    """Through the host's plugin command path, as the gateway dispatches it (its runner
    alive, the message's variables reset): ``/trove backup``, ``doctor repair apply``,
    ``doctor source apply`` and ``embed backfill apply`` ran for any Telegram user (a
    group member wrote backups of everyone's chats and repaired the operator's
    database), and ``/trove status`` showed the database's path and every owner's
    totals. Now each is one refusal line naming the CLI; status shows no figure."""
    import gateway.run as gateway_run

    trove_host.server.responder = lambda body: SAME_REPLY
    home = trove_host.hermes_home
    agents = {}
    message, slash = _telegram_chats(agents)
    message("111", "alice pin is quokka-7731")
    message("222", "bob pin is wombat-5511")
    backups = home / "backups"
    before = sorted(backups.iterdir()) if backups.exists() else []
    runner = object()
    monkeypatch.setattr(gateway_run, "_gateway_runner_ref", lambda: runner)
    for words in ("backup", "doctor repair apply", "doctor source apply",
                  "embed backfill apply", "doctor", "rotate apply"):
        answer = slash(words)
        assert answer.startswith(f"/trove {words}: refused in a messaging gateway chat"), answer
        assert "\n" not in answer and "scripts/trove.py" in answer and "Hermes CLI" in answer
    assert (sorted(backups.iterdir()) if backups.exists() else []) == before
    status = slash("status")
    assert status.splitlines()[:2] == ["trove status (messaging gateway chat: your own "
                                       "session only)", "database: in use"], status
    assert str(home) not in status and "session rows" not in status and "tg-" not in status
    assert "last backup" not in status and "embeddings" not in status
    monkeypatch.setattr(gateway_run, "_gateway_runner_ref", lambda: None)   # no gateway
    assert slash("backup").startswith("trove backup: ")            # the operator's CLI
    assert len(list(backups.iterdir())) == len(before) + 1
    assert f"database: {home / 'trove.db'}" in slash("status")


def test_a_cron_job_from_one_gateway_user_never_reads_anothers(trove_host, monkeypatch):
    """cron/scheduler.py ``run_job`` runs each job as ``platform="cron"`` under
    ``cron_<job id>_<stamp>`` with the gateway's user variables cleared: every run was
    the local owner's, so one user's job read another user's job (its prompt and
    results) and the CLI user's sessions. A job scheduled from a gateway chat owns its
    runs; a CLI job stays the local owner's; each run is its own session."""
    from datetime import timedelta

    from cron import jobs, scheduler

    def responder(body):   # a cron agent does not stream: its calls are the ones with tools
        msgs = body.get("messages") or []
        names = [t["function"]["name"] for t in body.get("tools") or []]
        if "trove_grep" not in names or msgs[-1].get("role") == "tool":
            return "Done."
        return hk.ToolCall("trove_grep", {"query": "heron", "session_scope": "all"})

    trove_host.server.responder = responder
    TOOLS = ["context_engine"]   # the trove_* tools reach a cron agent only when listed
    alice = jobs.create_job("remind alice: her locker code is 4417-heron", "every 1h",
                            origin={"platform": "telegram", "chat_id": "111", "user_id": "111"},
                            deliver="local", enabled_toolsets=TOOLS)
    bob = jobs.create_job("bob's weekly digest", "every 1h",
                          origin={"platform": "telegram", "chat_id": "222", "user_id": "222"},
                          deliver="local", enabled_toolsets=TOOLS)
    cli_job = jobs.create_job("the operator's own nightly check", "every 1h", deliver="local",
                              enabled_toolsets=TOOLS)
    start = scheduler._hermes_now()
    for hour, job in enumerate((alice, bob, cli_job, alice)):   # each run an hour apart
        monkeypatch.setattr(scheduler, "_hermes_now", lambda h=hour: start + timedelta(hours=h))
        assert scheduler.run_job(jobs.get_job(job["id"]))[0]
    db = sqlite3.connect(trove_host.hermes_home / "trove.db")
    try:
        owners = dict(db.execute("SELECT session_id, owner FROM session_owners"))
    finally:
        db.close()
    by_job = {job["id"]: owner for job in (alice, bob, cli_job)
              for session, owner in owners.items() if session.startswith(f"cron_{job['id']}_")}
    assert by_job == {alice["id"]: f"cron:job:{alice['id']}", bob["id"]: f"cron:job:{bob['id']}",
                      cli_job["id"]: "local"}
    assert len([s for s in owners if s.startswith(f"cron_{alice['id']}_")]) == 2
    results = [body["messages"][-1]["content"] for body in trove_host.server.chat_bodies
               if body["messages"][-1].get("role") == "tool"]
    assert len(results) == 4, "the cron agents never called trove_grep"
    assert "4417-heron" not in results[1]      # Bob's job does not find Alice's prompt
    assert "4417-heron" not in results[2]      # nor the CLI user's job
    assert "4417-heron" in results[3]          # Alice's next run finds her first run


def test_two_runs_of_a_cron_job_in_one_second_are_two_sessions(trove_host, monkeypatch):
    """cron/scheduler.py names a run ``cron_<job>_<YYYYmmdd_HHMMSS>``: two runs started in
    the same second (a tick and a manual run) shared one id, and trove stored both runs'
    messages in one session. The second run is stored under ``<id>-2``; each run's
    messages stay together in its own session, each under the job's owner."""
    from cron import jobs, scheduler

    prompts = iter(["first run: the pump pressure is 41 psi", "second run: the pump is off"])
    trove_host.server.responder = lambda body: "Noted."
    job = jobs.create_job("check the pump", "every 1h", deliver="local",
                          origin={"platform": "telegram", "chat_id": "9", "user_id": "9"})
    frozen = scheduler._hermes_now()
    monkeypatch.setattr(scheduler, "_hermes_now", lambda: frozen)
    for _ in range(2):
        run = dict(jobs.get_job(job["id"]), prompt=next(prompts))
        assert scheduler.run_job(run)[0]
    db = sqlite3.connect(trove_host.hermes_home / "trove.db")
    try:
        texts = {}
        for session, content in db.execute(
                "SELECT session_id, content FROM messages WHERE role = 'user' ORDER BY store_id"):
            texts.setdefault(session, []).append(content)
        owners = dict(db.execute("SELECT session_id, owner FROM session_owners"))
    finally:
        db.close()
    run_id = f"cron_{job['id']}_{frozen.strftime('%Y%m%d_%H%M%S')}"
    assert sorted(texts) == [run_id, f"{run_id}-2"], texts
    assert ["first run" in t for t in texts[run_id]] == [True] * len(texts[run_id])
    assert ["second run" in t for t in texts[f"{run_id}-2"]] == [True] * len(texts[f"{run_id}-2"])
    assert owners[run_id] == owners[f"{run_id}-2"] == f"cron:job:{job['id']}"


# ---------------------------------------------------------------- switches after compactions
def long_answer(body):
    """Long main answers (so the 64K window compacts), short summaries."""
    if not hk.is_main_request(body):
        return hk.Reply(text="- summary: earlier questions about modules.")
    return hk.Reply(text="Answer about " + _last_user_text(body)[:40] + ". "
                    + "Explanation sentence with detail. " * 160)


def leaf_children(home, session):
    db = sqlite3.connect(home / "trove.db")
    try:
        return [r[0] for r in db.execute(
            "SELECT e.child_store_id FROM node_edges e JOIN nodes n ON n.node_id = e.parent_id"
            " WHERE n.session_id = ? AND e.child_store_id IS NOT NULL", (session,))]
    finally:
        db.close()


def carried(home, session):
    db = sqlite3.connect(home / "trove.db")
    try:
        return [r[0] for r in db.execute(
            "SELECT node_id FROM session_carry WHERE session_id = ? ORDER BY ordinal", (session,))]
    finally:
        db.close()


def test_new_carries_resume_continues_branch_links_after_compactions(trove_host):
    trove_host.server.responder = long_answer
    home = trove_host.hermes_home
    agent = hk.make_agent()
    engine = hk.live_engine(agent)
    first = agent.session_id
    a_texts = [f"Question {i}: module_{i} retry settings?" for i in range(24)]
    history = hk.run_turns(agent, a_texts)[-1]["messages"]
    assert engine.compression_count >= 1
    a_covered = leaf_children(home, first)
    assert a_covered and len(a_covered) == len(set(a_covered))

    # /new carries the old frontier's nodes of depth >= TROVE_NEW_SESSION_RETAIN_DEPTH
    # (0 in this module), exactly as the gateway's /new does.
    frontier = engine.dag.frontier(first)
    second = cli_new(agent, history)
    expected = [n["node_id"] for n in frontier if n["depth"] >= engine.config.new_session_retain_depth]
    assert carried(home, second) == expected
    assert expected, "nothing to carry: the test would prove nothing"
    assert engine.last_switch["kind"] == "new"
    history = hk.run_turns(agent, ["Question 100: something new?"])[-1]["messages"]

    # /resume the compacted session: its restored history (summary block + tail)
    # lines up with its own rows; continuing compacts again without re-summarizing.
    restored = cli_resume(agent, history, first)
    assert engine.last_switch["kind"] == "resume" and engine.session_id == first
    more = [f"Question {i}: module_{i} retry settings?" for i in range(24, 40)]
    count_before = engine.compression_count
    history = hk.run_turns(agent, more, history=restored)[-1]["messages"]
    assert engine.compression_count > count_before
    assert Counter(user_texts(home, first)) == Counter(a_texts + more)
    covered = leaf_children(home, first)
    assert len(covered) == len(set(covered)), "a resumed session re-summarized its rows"
    assert set(a_covered) <= set(covered)
    assert user_texts(home, second) == ["Question 100: something new?"]

    # /branch: the branch carries the parent's whole frontier (what its copied
    # summary block stands for stays reachable); the parent gains nothing.
    parent_rows = rows(home, first)
    parent_frontier = [n["node_id"] for n in engine.dag.frontier(first)]
    branch = cli_branch(agent, history)
    assert engine.last_switch["kind"] == "branch"
    assert carried(home, branch) == parent_frontier
    history = hk.run_turns(agent, ["Question 200: only on the branch?"], history=history)[-1]["messages"]
    assert rows(home, first) == parent_rows
    assert "Question 200: only on the branch?" in user_texts(home, branch)
    # A row the parent summarized before the branch is one trove_expand away from
    # the branch, through the carried lineage, without naming the parent.
    summarized = min(a_covered)
    reached = json.loads(engine.handle_tool_call(
        "trove_expand", {"store_id": summarized}, messages=history))
    assert "error" not in reached, reached
    assert json.dumps(reached).count(str(summarized)) >= 1


def test_gateway_reset_transition_keeps_one_owner_across_the_chats_sessions(trove_host):
    """The gateway's /new path (``_transition_context_engine_session`` through
    ``reset_session_state(previous_messages=, old_session_id=)``): on_session_end,
    on_session_reset, on_session_start(new, old_session_id=old)."""
    trove_host.server.responder = lambda body: SAME_REPLY
    home = trove_host.hermes_home
    agent = gateway_agent("333")
    old = agent.session_id
    history = gateway_turn(agent, "333", "the parking spot is level minus two", None)
    agent.session_id = "tg-session-333-b"
    agent.reset_session_state(previous_messages=history, old_session_id=old,
                              carry_over_context=True)
    engine = hk.live_engine(agent)
    assert engine.session_id == "tg-session-333-b"
    history = gateway_turn(agent, "333", "where did I park?", None)
    assert user_texts(home, old) == ["the parking spot is level minus two"]
    assert user_texts(home, "tg-session-333-b") == ["where did I park?"]
    found = json.loads(engine.handle_tool_call("trove_recall", {"query": "parking spot level"},
                                               messages=history))
    assert any(r.get("session_id") == old for r in found["results"])


# ---------------------------------------------------------------- owners and clean-up (issue 25)
def test_clean_elsewhere_never_takes_a_held_gateway_session_and_unknown_owners_fail_closed(
        trove_host):
    """A CLI user's PIN, then a gateway chat that stays empty for over an hour while
    ``doctor clean --apply`` runs in another process: the held session survives, owner
    row included. An owner row lost anyway is recorded again at the next turn, and
    until then the session is nobody's: it reads only itself."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    trove_host.server.responder = lambda body: SAME_REPLY
    home = trove_host.hermes_home
    cli = hk.make_agent()
    hk.run_turns(cli, ["Remember: my bank PIN is 4711."])
    cli_session = cli.session_id
    gateway = gateway_agent("111")
    engine = hk.live_engine(gateway)
    session = engine.canonical_id
    db_path = home / "trove.db"
    db = sqlite3.connect(db_path)
    db.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?",
               (time.time() - 7200, session))
    db.commit()
    db.close()

    script = Path(__file__).resolve().parent.parent / "scripts" / "trove.py"
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("TROVE_") and k != "HERMES_SESSION_ID"}
    environ.update(HERMES_HOME=str(home), TROVE_DOCTOR_CLEAN_APPLY_ENABLED="true")
    done = subprocess.run([sys.executable, str(script), "--db", str(db_path), "doctor", "clean",
                           "--apply", "--json"], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert session not in report.get("removed_sessions", [])
    held = [c for c in report["protected"] if c["session_id"] == session]
    assert held and any("held by a running Hermes" in p for p in held[0]["protected_by"])
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("SELECT owner FROM session_owners WHERE session_id = ?",
                          (session,)).fetchone() == (
            "telegram:conversation:agent:main:telegram:dm:111",)
        # the row goes anyway (an older version's clean, a hand edit)
        db.execute("DELETE FROM session_owners WHERE session_id = ?", (session,))
        db.commit()
    finally:
        db.close()

    probes = [("trove_grep", {"query": "4711", "session_scope": "all"}),
              ("trove_recall", {"query": "bank PIN"}),
              ("trove_load_session", {"session_id": cli_session}),
              ("trove_recent", {"period": "today", "session_scope": "all"})]
    for name, args in probes:   # nobody's session: only itself
        answer = engine.handle_tool_call(name, args, messages=[])
        assert "PIN is 4711" not in answer, (name, answer[:300])
    history = gateway_turn(gateway, "111", "hello from the gateway", None)
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("SELECT owner FROM session_owners WHERE session_id = ?",
                          (session,)).fetchone() == (
            "telegram:conversation:agent:main:telegram:dm:111",)
    finally:
        db.close()
    for name, args in probes:   # recorded again: still never the CLI user's words
        answer = engine.handle_tool_call(name, args, messages=history)
        assert "PIN is 4711" not in answer, (name, answer[:300])
    mine = engine.handle_tool_call("trove_load_session", {}, messages=history)
    assert "hello from the gateway" in mine


# ---------------------------------------------------------------- bad input at the hooks (issue 25)
def test_bad_input_at_every_host_entry_point_is_a_logged_fallback(trove_host):
    """A non-dict entry, content nested 3,000 levels deep, a context length of "128k",
    a session id with a lone surrogate: the host's own calls reach the engine with
    them and nothing raises into the host; what could be stored is stored."""
    trove_host.server.responder = lambda body: SAME_REPLY
    agent = hk.make_agent()
    history = hk.run_turns(agent, ["first real message"])[-1]["messages"]
    engine = hk.live_engine(agent)
    deep = "bottom"
    for _ in range(3000):
        deep = [deep]
    shown = history + ["not a message", 7, {"role": "user", "content": deep},
                       {"role": "user", "content": "kept after the junk"}]
    hk.end_session(agent, shown)                 # the CLI's exit path: on_session_end
    texts = user_texts(trove_host.hermes_home, agent.session_id)
    assert texts == ["first real message", "kept after the junk"]
    assert any("not a dict" in e for e in engine.errors)
    assert any("nests deeper" in e for e in engine.errors)

    agent.context_compressor.update_model("fake-model", "128k")   # what /model hands over
    assert engine.context_length == 65536 and engine.threshold_tokens > 0
    assert any("'128k' is not a token count" in e for e in engine.errors)

    # The host cannot put such an id in its own environment (os.environ refuses it), so
    # it reaches the engine only through a hook's argument: the gateway's transition.
    engine.on_session_start("odd-\ud800-id", platform="telegram", old_session_id=None)
    assert engine.session_id == "odd-\\ud800-id"      # one stable, storable spelling
    engine.on_session_end("odd-\ud800-id", [{"role": "user", "content": "hello odd id"}])
    assert user_texts(trove_host.hermes_home, "odd-\\ud800-id") == ["hello odd id"]
    assert engine.should_compress("lots") is False


def test_an_unusable_database_path_leaves_the_agent_running(tmp_path, fake_llm):
    """TROVE_DATABASE_PATH with a NUL byte: no file can have that name; the agent runs
    its turns, status and the tools say what is wrong and how to fix it."""
    home = hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"trove": {"database_path": "bad\0name.db"}})
    with hk.host_env(home):
        fake_llm.responder = lambda body: hk.Reply(text="Still here.")
        agent = hk.make_agent()
        assert hk.uses_plugin_engine(agent)
        result = hk.run_turns(agent, ["are you there?"])[-1]
        assert result["final_response"] == "Still here."
        engine = hk.live_engine(agent)
        status = json.loads(engine.handle_tool_call("trove_status", {}, messages=[]))
        assert "not a usable file name" in json.dumps(status)
        hk.end_session(agent, result["messages"])
    assert not (home / "bad").exists()
