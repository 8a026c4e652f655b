"""Owners in shared gateways: one person's agent never reads another person's sessions.

Two gateway engines share one trove.db (one profile, one bot, two users); every
trove_* tool and every argument that names another session, row, node or
payload is tried from one user against the other's data.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_trove.binding.owners import owner_key
from hermes_trove.operators import actions as ops
from hermes_trove.operators import search
from hermes_trove.storage.owners import LOCAL_OWNER, Owners
from hermes_trove.tools import TOOL_NAMES
from enginekit import coding_turn, make_engine

SECRET = {"111": "marmalade-kingfisher-0451", "222": "obsidian-tortoise-9917"}


def gateway_engine(tmp_path, user, **settings):
    """A gateway user's engine: platform telegram, its own chat key, one shared DB."""
    engine = make_engine(tmp_path, session=None, window=8_000, **settings)
    engine.on_session_start(f"tg-{user}", platform="telegram",
                            conversation_id=f"agent:main:telegram:dm:{user}")
    return engine


def fill(engine, user):
    """Turns carrying the user's secret, compacted so nodes exist as well as rows."""
    messages = []
    for t in range(6):
        turn = coding_turn(t, filler=200)
        turn[0]["content"] += f" remember {SECRET[user]}"
        messages += turn
    out = engine.compress(messages, current_tokens=50_000, force=True)
    assert engine.dag.session_nodes(engine.canonical_id), "no node to probe"
    return out


@pytest.fixture
def two_users(tmp_path):
    a = gateway_engine(tmp_path, "111")
    b = gateway_engine(tmp_path, "222")
    fill(a, "111")
    fill(b, "222")
    return a, b


def call(engine, name, args):
    return engine.handle_tool_call(name, args, messages=[])


def targets_of(engine):
    """Every handle on the engine's data another tool call could name."""
    store_ids = [r["store_id"] for r in engine.store.session_messages(engine.canonical_id,
                                                                        limit=1000)]
    node_ids = [n["node_id"] for n in engine.dag.session_nodes(engine.canonical_id)]
    return {"session_id": [engine.session_id, engine.canonical_id], "store_id": store_ids,
            "node_id": node_ids}


def test_owner_key_precedence():
    assert owner_key(session_id="s", platform="telegram", conversation_id="k",
                     user_id="7") == "telegram:conversation:k"
    assert owner_key(session_id="s", platform="discord", conversation_id=None,
                     user_id="7") == "discord:user:7"
    assert owner_key(session_id="s", platform="cli", conversation_id=None,
                     user_id=None) == LOCAL_OWNER
    assert owner_key(session_id="s", platform="telegram", conversation_id=None,
                     user_id=None) == "session:s"


def test_a_provisional_owner_is_replaced_once_a_real_one_never(tmp_path):
    engine = make_engine(tmp_path, session="s1")
    owners = Owners(engine.store.db)
    assert owners.record("g1", "session:g1", platform="telegram") == "session:g1"
    assert owners.record("g1", "telegram:user:7", user_id="7") == "telegram:user:7"
    assert owners.record("g1", "telegram:user:8", user_id="8") == "telegram:user:7"
    assert owners.describe("g1")["user_id"] == "7"
    assert owners.owner_of("never-recorded") is None


def test_sender_id_fills_in_an_unidentified_gateway_session(tmp_path):
    engine = make_engine(tmp_path, session=None)
    engine.on_session_start("tg-x", platform="telegram")
    assert engine.owner == "session:tg-x"
    engine.note_owner("4242")
    assert engine.owner == "telegram:user:4242"


def test_neither_gateway_user_reaches_the_other_through_named_arguments(two_users):
    for me, other, user in ((two_users[0], two_users[1], "222"),
                            (two_users[1], two_users[0], "111")):
        handles = targets_of(other)
        probes = [("trove_recall", {"query": SECRET[user]}),
                  ("trove_grep", {"query": SECRET[user], "session_scope": "all"}),
                  ("trove_grep", {"query": SECRET[user], "content_scope": "both",
                                  "session_scope": "all"}),
                  ("trove_expand_query", {"prompt": "what", "query": SECRET[user]}),
                  ("trove_recent", {"period": "today"})]
        for sid in handles["session_id"]:
            probes += [("trove_grep", {"query": SECRET[user], "session_id": sid}),
                       ("trove_grep", {"query": SECRET[user], "session_id": sid,
                                       "session_scope": "session"}),
                       ("trove_load_session", {"session_id": sid})]
        for store_id in handles["store_id"]:
            probes += [("trove_expand", {"store_id": store_id}),
                       ("trove_expand", {"store_id": store_id, "session_scope": "all"}),
                       ("trove_describe", {"store_id": store_id, "session_scope": "all"})]
        for node_id in handles["node_id"]:
            probes += [("trove_expand", {"node_id": node_id, "session_scope": "all"}),
                       ("trove_describe", {"node_id": node_id, "session_scope": "all"}),
                       ("trove_expand_query", {"prompt": "what", "node_ids": [node_id]})]
        for name, args in probes:
            answer = call(me, name, args)
            assert f"remember {SECRET[user]}" not in answer, (name, args, answer[:300])
            assert other.canonical_id not in answer or "not found" in answer, (name, args)
        # and the own secret is still found: the restriction is not "find nothing"
        mine = json.loads(call(me, "trove_recall", {"query": SECRET["111" if user == "222"
                                                                    else "222"]}))
        assert mine["results"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_tool_argument_reaches_another_owner(two_users, data):
    me, other = two_users
    handles = targets_of(other)
    name = data.draw(st.sampled_from(TOOL_NAMES))
    keys = st.sampled_from(["session_id", "store_id", "node_id", "node_ids", "query",
                            "session_scope", "content_scope", "prompt", "period"])
    args = {}
    for key in data.draw(st.lists(keys, max_size=4, unique=True)):
        if key == "session_id":
            args[key] = data.draw(st.sampled_from(handles["session_id"]))
        elif key in ("store_id", "node_id"):
            args[key] = data.draw(st.sampled_from(handles[key]))
        elif key == "node_ids":
            args[key] = data.draw(st.lists(st.sampled_from(handles["node_id"]), min_size=1))
        elif key == "session_scope":
            args[key] = data.draw(st.sampled_from(["current", "session", "all"]))
        elif key == "content_scope":
            args[key] = data.draw(st.sampled_from(["messages", "externalized", "both"]))
        elif key == "period":
            args[key] = "today"
        else:
            args[key] = SECRET["222"]
    answer = call(me, name, args)
    assert f"remember {SECRET['222']}" not in answer, (name, args, answer[:300])


def test_cli_sessions_of_a_profile_share_one_owner(tmp_path):
    first = make_engine(tmp_path, session="cli-1")
    first.ingest([{"role": "user", "content": "the cli secret is peppercorn"}])
    second = make_engine(tmp_path, session="cli-2")
    assert first.owner == second.owner == LOCAL_OWNER
    found = json.loads(call(second, "trove_recall", {"query": "peppercorn"}))
    assert found["results"]


def test_cross_owner_recall_setting_opens_every_session(tmp_path):
    a = gateway_engine(tmp_path, "111", cross_owner_recall="true")
    b = gateway_engine(tmp_path, "222", cross_owner_recall="true")
    fill(a, "111")
    found = call(b, "trove_recall", {"query": SECRET["111"]})
    assert f"remember {SECRET['111']}" in found


def test_operators_see_every_owner(two_users):
    a, _ = two_users
    target = ops.open_target(a.config, a)
    found = search.grep(target, SECRET["222"])
    assert found["results"]
    assert f"remember {SECRET['222']}" in json.dumps(found)


@pytest.mark.parametrize("platform, conversation, owner", [
    ("telegram", "k", "telegram:conversation:k"), ("cli", None, LOCAL_OWNER)])
def test_the_hosts_init_order_bind_then_start_records_the_real_owner(
        tmp_path, platform, conversation, owner):
    """AIAgent init calls bind_session_state before on_session_start: the first,
    platform-less bind is provisional and the start replaces it."""
    engine = make_engine(tmp_path, session=None)
    engine.bind_session_state(None, "s-1")
    assert engine.owner == "session:s-1"
    engine.on_session_start("s-1", platform=platform, conversation_id=conversation)
    assert engine.owner == owner
    assert owner_key(session_id="s-1", platform=None, conversation_id=None,
                     user_id=None) == "session:s-1"


def test_a_single_owner_database_searches_without_a_session_filter(tmp_path):
    """A CLI-only profile keeps the unfiltered (fast) all-sessions search; the
    first gateway user makes the filter necessary."""
    from hermes_trove.tools import Access
    first = make_engine(tmp_path, session="cli-1")
    make_engine(tmp_path, session="cli-2")
    access = Access(first.tool_context(), {"session_scope": "all"}, first.canonical_id)
    assert access.search_sessions() is None
    gateway_engine(tmp_path, "111")
    access = Access(first.tool_context(), {"session_scope": "all"}, first.canonical_id)
    assert access.search_sessions() == ("cli-1", "cli-2")


def in_gateway_task(fn, *, platform="telegram", user="111", key=None):
    """Run ``fn`` in a gateway message's task context (gateway/run.py ``_set_session_env``:
    the agent of that chat is built and runs inside it)."""
    import contextvars

    from gateway import session_context

    def run():
        session_context.set_session_vars(platform=platform, chat_id=user, user_id=user,
                                         session_key=key or f"agent:main:{platform}:dm:{user}")
        return fn()
    engaged = session_context._session_context_engaged
    try:
        return contextvars.copy_context().run(run)
    finally:  # the process-wide latch: later tests run as a plain CLI process again
        session_context._session_context_engaged = engaged


def test_a_platformless_bind_is_provisional_even_with_a_user_id():
    """Agent init binds before the platform is known; in a gateway the user id is
    already there. A real key made of it alone was the same for the user's DM and
    every group chat they opened a session in, and never replaced."""
    assert owner_key(session_id="s", platform=None, conversation_id=None,
                     user_id="7") == "session:s"
    assert owner_key(session_id="s", platform="", conversation_id="k",
                     user_id="7") == "session:s"
    assert owner_key(session_id="s", platform="telegram", conversation_id="  ",
                     user_id=" ") == "session:s"


def test_a_gateway_group_chat_never_reads_the_dm_of_the_member_who_opened_it(tmp_path):
    """The gateway builds a chat's agent inside that message's task context: the
    platform-less bind at agent init saw the sender's user id and recorded
    ``gateway:user:<id>`` for the DM and the group alike, so anyone in the group
    read that member's DM."""
    def agent(chat, key):
        engine = make_engine(tmp_path, session=None)
        engine.bind_session_state(None, f"s-{chat}")        # agent init, in that order
        engine.on_session_start(f"s-{chat}", platform="telegram", conversation_id=key)
        return engine
    dm = in_gateway_task(lambda: agent("dm", "agent:main:telegram:dm:111"))
    dm.ingest([{"role": "user", "content": "my bank pin is quokka-7731"}])
    group_key = "agent:main:telegram:group:-100"
    group = in_gateway_task(lambda: agent("group", group_key), key=group_key)
    assert dm.owner == "telegram:conversation:agent:main:telegram:dm:111"
    assert group.owner == f"telegram:conversation:{group_key}"
    answer = call(group, "trove_grep", {"query": "quokka", "session_scope": "all"})
    assert "quokka-7731" not in answer


def test_the_gateway_hygiene_agent_records_the_chats_owner(tmp_path):
    """gateway/run.py's hygiene agent is built without a platform or key (the host
    then says "cli") inside the chat's task context; when it binds a session first,
    the owner is still the chat's, not ``cli:user:<id>`` or the CLI user's."""
    key = "agent:main:telegram:dm:555"

    def hygiene():
        engine = make_engine(tmp_path, session=None)
        engine.bind_session_state(None, "s-555")
        engine.on_session_start("s-555", platform="cli", conversation_id=None)
        return engine
    assert in_gateway_task(hygiene, user="555").owner == f"telegram:conversation:{key}"
    cli = make_engine(tmp_path, session="cli-1")   # no gateway task: the local owner
    assert cli.owner == LOCAL_OWNER


def test_a_key_recorded_before_the_platform_was_known_is_replaced_once(tmp_path):
    """Databases written with the platform-less ``gateway:user:<id>`` keys: the first
    real key replaces it, and then it never changes."""
    engine = make_engine(tmp_path, session="s1")
    owners = Owners(engine.store.db)
    owners.record("g1", "gateway:user:7", user_id="7")
    assert owners.record("g1", "telegram:conversation:k") == "telegram:conversation:k"
    assert owners.record("g1", "telegram:conversation:other") == "telegram:conversation:k"


def test_cron_runs_of_a_gateway_users_job_are_that_jobs_not_the_local_owners(monkeypatch):
    """cron/scheduler.py runs jobs as platform "cron" under cron_<job>_<stamp>: a job
    scheduled from a gateway chat owns its runs; a CLI job (no origin) is local."""
    import sys
    import types

    from hermes_trove.binding.owners import session_owner
    known = {"a1b2c3": {"id": "a1b2c3", "origin": {"platform": "telegram", "chat_id": "1"}},
             "cli999": {"id": "cli999", "origin": None}}
    monkeypatch.setitem(sys.modules, "cron.jobs", types.SimpleNamespace(get_job=known.get))

    def owner(session):
        return session_owner(session_id=session, platform="cron", conversation_id=None)[0]
    assert owner("cron_a1b2c3_20261205_041815") == "cron:job:a1b2c3"
    assert owner("cron_cli999_20261205_041815") == LOCAL_OWNER
    assert owner("cron_gone00_20261205_041815") == "cron:job:gone00"   # unknown: closed
    assert owner("my-cron-notes") == LOCAL_OWNER


def slash(words, *, bound=None, user="111", runner=True, monkeypatch=None):
    """``/trove <words>`` as a messaging gateway dispatches it: the runner is alive in
    the process; ``bound`` a session the task named (0.19 names none: the command runs
    before the message's session is bound)."""
    import sys
    import types

    from hermes_trove import command
    if runner:
        alive = object()
        monkeypatch.setitem(sys.modules, "gateway.run",
                            types.SimpleNamespace(_gateway_runner_ref=lambda: alive))
    if bound is None:
        return command.handle(words)
    from gateway import session_context

    def run():
        session_context.set_session_vars(platform="telegram", user_id=user, chat_id=user,
                                         session_key=f"agent:main:telegram:dm:{user}",
                                         session_id=bound)
        return command.handle(words)
    return in_gateway_task(run, user=user)


def test_trove_grep_typed_in_a_gateway_chat_reads_only_the_callers_owner(two_users,
                                                                        monkeypatch):
    """``/trove grep`` ran as the operator: every owner's sessions, so a Telegram user
    read another user's secret. In a gateway it now runs as the caller (their session,
    their owner, ``Access``); with no caller known (0.19's dispatch) it reads nothing."""
    a, b = two_users
    mine = slash(f"grep {SECRET['111']}", bound=a.session_id, monkeypatch=monkeypatch)
    assert f"remember {SECRET['111']}" in mine
    for words in (f"grep {SECRET['222']}", f"grep --session {b.session_id} {SECRET['222']}",
                  f"grep --session {b.session_id} remember"):
        answer = slash(words, bound=a.session_id, monkeypatch=monkeypatch)
        assert SECRET["222"] not in answer.replace(words, "")
    monkeypatch.setenv("TROVE_DATABASE_PATH", str(a.config.resolved_database_path))
    unknown = slash(f"grep {SECRET['222']}", monkeypatch=monkeypatch)
    assert "not known" in unknown and f"remember {SECRET['222']}" not in unknown


def test_trove_commands_over_every_owner_are_the_local_operators(two_users, monkeypatch):
    """``doctor clean`` / ``doctor retention`` list (and clean apply deletes) every
    owner's sessions: refused in a gateway chat; the local operator still sees all."""
    from hermes_trove import command
    a, b = two_users
    for words in ("doctor clean", "doctor clean apply", "doctor retention",
                  "rollups build", "rollups build apply"):
        answer = slash(words, bound=a.session_id, monkeypatch=monkeypatch)
        assert "refused" in answer and b.session_id not in answer
    theirs = "telegram:conversation:agent:main:telegram:dm:222"
    periods = slash("rollups status", bound=a.session_id, monkeypatch=monkeypatch)
    assert "dm:111" in periods and theirs not in periods
    monkeypatch.delitem(__import__("sys").modules, "gateway.run")
    monkeypatch.setenv("HERMES_SESSION_ID", a.session_id)   # the CLI: the operator
    assert f"remember {SECRET['222']}" in command.handle(f"grep {SECRET['222']}")
    assert b.session_id in command.handle("doctor retention")
    assert theirs in command.handle("rollups status")


# What a messaging gateway's user may run: reads of their own data, nothing else.
GATEWAY_ALLOWED = {("status",), ("rollups",), ("rollups", "status"), ("help",)}


def test_database_wide_trove_commands_are_refused_in_a_gateway_chat(two_users, monkeypatch):
    """``/trove backup``, ``doctor repair apply``, ``doctor source apply``, ``embed backfill
    apply`` (and every read over the whole database: doctor, repair and source previews,
    the embedding index's counts, the model download) ran from any Telegram chat: a group
    member wrote backups and repaired the operator's database. In a gateway they are
    refused with one line naming the CLI and scripts/trove.py; nothing is written."""
    from pathlib import Path

    from hermes_trove import command
    a, b = two_users
    db = Path(a.config.resolved_database_path)
    monkeypatch.setenv("TROVE_DATABASE_PATH", str(db))
    backups = db.parent / "backups"
    before = sorted(backups.iterdir()) if backups.exists() else []
    refused = set()
    for words in command.ACTIONS:
        for bound in (a.session_id, None):   # a task that names its session, and 0.19's
            answer = slash(" ".join(words), bound=bound, monkeypatch=monkeypatch)
            if "refused" not in answer:
                continue
            refused.add(words)
            assert "\n" not in answer, answer
            assert "Hermes CLI" in answer and "scripts/trove.py" in answer, answer
            assert b.session_id not in answer and a.session_id not in answer
    assert set(command.ACTIONS) - refused == GATEWAY_ALLOWED
    assert not any(command.ops.writes(words) for words in GATEWAY_ALLOWED)
    assert (sorted(backups.iterdir()) if backups.exists() else []) == before
    assert a.store.get_meta("last_backup_path") is None
    monkeypatch.delitem(__import__("sys").modules, "gateway.run")   # the CLI: the operator
    monkeypatch.setenv("HERMES_SESSION_ID", a.session_id)
    assert command.handle("backup").startswith("trove backup: ")
    assert len(list(backups.iterdir())) == len(before) + 1


def test_trove_status_in_a_gateway_chat_shows_no_other_owners_figures(two_users,
                                                                      monkeypatch):
    """``/trove status`` in a gateway chat showed the database's path and size, every
    owner's message, node and session totals, the embedding index's counts and the last
    backup's path. Now a caller named by the task sees their own session only; with no
    caller known (0.19's dispatch) it says so and shows no figures at all."""
    from hermes_trove import command
    a, b = two_users
    db = str(a.config.resolved_database_path)
    monkeypatch.setenv("TROVE_DATABASE_PATH", db)
    command.handle("backup")                              # a backup path to hide
    total = a.store.count_messages(a.canonical_id) + b.store.count_messages(b.canonical_id)
    operator = command.handle("status")
    assert f"{total:,} messages" in operator and db in operator   # what the gateway hides
    assert "last backup: " + str(a.store.get_meta("last_backup_path")) in operator
    mine = slash("status", bound=a.session_id, monkeypatch=monkeypatch)
    unknown = slash("status", monkeypatch=monkeypatch)
    for answer in (mine, unknown):
        assert "messaging gateway" in answer.splitlines()[0], answer
        assert f"{total:,} messages" not in answer and db not in answer
        assert str(a.store.get_meta("last_backup_path")) not in answer
        assert b.session_id not in answer and "session rows" not in answer
        assert SECRET["222"] not in answer and "dm:222" not in answer
        assert "scripts/trove.py status" in answer
    own = a.store.count_messages(a.canonical_id)
    assert f"session: {a.session_id}" in mine and f"{own:,} messages" in mine
    assert a.session_id not in unknown and "not known" in unknown
    assert not any(ch.isdigit() for ch in unknown.replace("0.19", "")), unknown


def test_trove_status_in_a_gateway_chat_names_no_backup_path_or_summary_route(two_users,
                                                                              monkeypatch):
    """The caller's own session record in ``/trove status`` still held the last rotate's
    backup path (the operator's data folder) and the stored last compaction's failed
    summary calls with their error text, which names the operator's summary endpoint or
    model. A gateway user now reads that a backup was written and the failures' kinds;
    the operator keeps both."""
    from hermes_trove import command
    a, _ = two_users
    db = str(a.config.resolved_database_path)
    monkeypatch.setenv("TROVE_DATABASE_PATH", db)
    backup = str(a.config.resolved_database_path.parent / "backups" / "trove-rotate-x.db")
    endpoint = "https://llm-5512.operator.example/v1"
    a.store.update_session_state(a.canonical_id, {
        "last_rotate_at": 1_795_000_000.0, "last_rotate_backup": backup,
        "last_compaction": {"outcome": "compacted", "at": 1_795_000_000.0, "levels": [3],
                            "summary_problems": {f"error: ConnectError: {endpoint} down": 2}}})
    mine = slash("status", bound=a.session_id, monkeypatch=monkeypatch)
    assert f"session: {a.session_id}" in mine, mine
    assert backup not in mine and endpoint not in mine, mine
    assert "last rotate: " in mine and "error: ConnectError x2" in mine, mine
    monkeypatch.delitem(__import__("sys").modules, "gateway.run")   # the CLI: the operator
    monkeypatch.setenv("HERMES_SESSION_ID", a.session_id)
    operator = command.handle("status")
    assert backup in operator and endpoint in operator, operator


# The agent's own status tools: a gateway chat member can ask the agent to call them.
DATABASE_WIDE_CHECKS = {"journal_mode", "schema_objects", "quick_check", "space", "largest_rows",
                        "server", "search_extensions", "messages_fts_rows", "nodes_fts_rows",
                        "fts_integrity", "rollup_lineage", "config_warnings"}
INDEX_TOTALS = {"indexed": 7, "pending": 3, "texts_this_process": 11}


def values_of(data, key):
    """Every value stored under ``key`` anywhere in a JSON answer."""
    if isinstance(data, dict):
        return [v for k, v in data.items() if k == key] + [
            x for v in data.values() for x in values_of(v, key)]
    if isinstance(data, list):
        return [x for v in data for x in values_of(v, key)]
    return []


def test_status_tools_show_a_gateway_user_no_database_wide_figures(two_users, tmp_path,
                                                                   monkeypatch):
    """trove_inspect's ``status`` gave any gateway chat member (through the agent) the
    database's path, size and every owner's message and node totals, the embedding index's
    totals, the host's home and every setting; trove_doctor listed the largest rows of the
    whole database (another owner's store ids), the FTS and rollup totals and the host's
    config; trove_status the index totals and the plugin's folder. A gateway user's
    session now gets its own session's figures only; the profile's CLI user (the local
    owner, the operator) keeps the full view."""
    from pathlib import Path

    from hermes_trove import tools as tools_module
    from hermes_trove.recall import semantic
    monkeypatch.setattr(semantic, "status_of", lambda config, found: {
        "enabled": True, "provider": "openai", "model": "m", "available": True,
        **INDEX_TOTALS})
    a, b = two_users
    db = str(a.config.resolved_database_path)
    home = str(a.config.hermes_home)
    plugin = str(Path(tools_module.__file__).resolve().parent)   # the plugin's folder
    total = a.store.count_messages()
    theirs = {r["store_id"] for r in b.store.session_messages(b.canonical_id, limit=1000)}
    answers = {name: call(a, name, {}) for name in ("trove_status", "trove_inspect",
                                                     "trove_doctor")}
    for name, text in answers.items():
        answer = json.loads(text)
        assert "error" not in answer, (name, text[:300])
        assert db not in text and home not in text and plugin not in text, (name, text[:300])
        assert b.canonical_id not in text and "dm:222" not in text, name
        assert not theirs & set(values_of(answer, "store_id")), name
        assert total not in values_of(answer, "messages"), name
        for key in INDEX_TOTALS:
            assert not values_of(answer, key), (name, key)
    inspect = json.loads(answers["trove_inspect"])
    assert inspect["messages"] == a.store.count_messages(a.canonical_id)   # still its own
    assert inspect["frontier"] and not {"database", "config"} & set(inspect.get("status", {}))
    doctor = json.loads(answers["trove_doctor"])
    names = {c["name"] for c in doctor["checks"]}
    assert "session_bound" in names and not names & DATABASE_WIDE_CHECKS, names
    assert not any(n.startswith("host_") for n in names), names
    assert json.loads(answers["trove_status"])["stored"]["messages"] == \
        a.store.count_messages(a.canonical_id)
    # the profile's own CLI session on the same database: the operator's full view
    cli = make_engine(tmp_path, session="cli-1")
    assert cli.owner == LOCAL_OWNER
    full = json.loads(call(cli, "trove_inspect", {}))["status"]
    assert full["database"]["messages"] == total and full["database"]["path"] == db
    assert full["engine"]["embeddings"]["indexed"] == INDEX_TOTALS["indexed"]
    checks = {c["name"] for c in json.loads(call(cli, "trove_doctor", {}))["checks"]}
    assert {"space", "largest_rows", "messages_fts_rows", "rollup_lineage"} <= checks
    status = json.loads(call(cli, "trove_status", {}))
    assert status["embeddings"]["pending"] == 3 and status["plugin"].startswith(plugin)


def test_a_broken_database_is_reported_to_a_gateway_user_without_its_path(tmp_path,
                                                                          monkeypatch):
    """While the database cannot be used every tool answers what is wrong and the repair
    (``unavailable.tool_answer``), with the file's path, its backups' folder and the
    whole engine snapshot: any chat member asking the agent read where the operator
    keeps the database. A gateway process now says what is wrong without a path; the
    CLI's operator still gets the path to repair."""
    import sqlite3
    import sys
    import types

    from hermes_trove import tools
    from hermes_trove.storage import database
    first = make_engine(tmp_path, session="cli-0")
    first.ingest([{"role": "user", "content": "hello"}])
    path = str(first.config.resolved_database_path)
    folder = str(tmp_path)
    database.forget_database(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")     # every page in the file itself
    conn.close()
    with open(path, "r+b") as f:
        f.write(b"\0" * 100)                                  # a damaged header
    monkeypatch.setitem(sys.modules, "gateway.run",           # a gateway process
                        types.SimpleNamespace(_gateway_runner_ref=lambda: object()))
    user = gateway_engine(tmp_path, "111")
    for name in ("trove_status", "trove_doctor", "trove_grep", "trove_inspect"):
        text = call(user, name, {"query": "hello"})
        assert "repair" in text and "damaged" in text, (name, text[:300])
        assert folder not in text, (name, text[:400])
    assert "database_path" not in json.loads(call(user, "trove_status", {}))["engine"]
    monkeypatch.delitem(sys.modules, "gateway.run")           # the CLI: the operator
    cli = make_engine(tmp_path, session="cli-1")
    assert path in call(cli, "trove_status", {})
    # a statement that fails inside a tool on a usable database: the same rule
    database.forget_database(path)
    import os
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    a = gateway_engine(tmp_path, "111")
    monkeypatch.setitem(sys.modules, "gateway.run",
                        types.SimpleNamespace(_gateway_runner_ref=lambda: object()))

    def broken(params, ctx, cap):
        raise sqlite3.DatabaseError("database disk image is malformed")
    monkeypatch.setitem(tools.HANDLERS, "trove_grep", broken)
    text = call(a, "trove_grep", {"query": "x"})
    assert "repair" in text and folder not in text, text


def test_a_reached_spend_guard_is_shown_to_a_gateway_user_without_its_figures(tmp_path):
    """The summary spend guard is one per process: its figures (calls and tokens in the
    last hour, the caps) count every user's compactions, and trove_doctor's
    ``summary_model`` check gave them to any gateway chat member, with the moment the
    oldest call leaves the hour (when someone else compacted). A gateway user now reads
    only that the guard is reached; the profile's CLI user (the operator) the figures."""
    caps = {"summary_max_calls_per_hour": 3, "summary_max_tokens_per_hour": 9_876_543}
    user = gateway_engine(tmp_path, "111", **caps)
    cli = make_engine(tmp_path, session="cli-1", **caps)
    guard = user.spend_guard
    assert guard is cli.spend_guard                      # one guard for the process
    for _ in range(3):                                   # another user's summaries
        guard.record(4_321)
    assert guard.state()["exhausted"]

    def summary_check(engine):
        checks = json.loads(call(engine, "trove_doctor", {}))["checks"]
        return next(c for c in checks if c["name"] == "summary_model")

    operator = summary_check(cli)
    assert operator["status"] == "warn" and "3 calls in the last hour" in operator["detail"]
    mine = summary_check(user)
    assert mine["status"] == "warn" and "spend guard reached" in mine["detail"], mine
    text = json.dumps(mine)
    assert not any(ch.isdigit() for ch in text), text          # no count, cap or time
    assert "TROVE_SUMMARY_MAX" not in text, text
