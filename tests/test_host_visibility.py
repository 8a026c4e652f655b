"""Issue 26 through the real host: ``/trove status`` shows the optional families,
``/trove embed backfill apply`` says how far and when done, ``/trove grep`` prints what
``scripts/trove.py grep`` prints. Hermes 0.19.0's ``cli.HermesCLI`` dispatches the
slash commands (its own ``process_command`` path, headless) against the fake server,
which also answers ``/v1/embeddings``."""
import json
import subprocess
import sys
import time

import pytest

import hostkit as hk
from hostkit import fake_llm  # noqa: F401 (fixture)
from test_cli import SCRIPT

FACT = "The BlueHeron relay answers on port 7311 behind the Oslo gateway."


def cli_command(monkeypatch, cli_module, hermes_cli, line: str) -> str:
    """One slash command typed into the CLI; what the CLI printed."""
    printed = []
    monkeypatch.setattr(cli_module, "_cprint", lambda text: printed.append(str(text)))
    hermes_cli.process_command(line)
    return "\n".join(printed)


def shell(home, env, *args) -> str:
    """``scripts/trove.py`` on the same HERMES_HOME, outside the host."""
    environ = {"HERMES_HOME": str(home), "PATH": "/usr/bin:/bin", **env}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout.rstrip("\n")


@pytest.mark.host
def test_status_grep_and_backfill_through_the_cli(tmp_path, fake_llm, monkeypatch, caplog):
    env = {"TROVE_EMBEDDINGS_ENABLED": "true", "TROVE_EMBEDDING_PROVIDER": "openai",
           "TROVE_EMBEDDING_MODEL": "fake-embed", "TROVE_EMBEDDING_BASE_URL": fake_llm.base_url,
           "TROVE_ROLLUPS_ENABLED": "true", "TROVE_ENABLE_SLASH_COMMAND": "true"}
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with hk.host_env(home, extra_env=env) as host:
        import cli as cli_module
        agent = hk.make_agent()
        hk.run_turns(agent, ["remember the relay", FACT, "thanks"])
        engine = hk.live_engine(agent)
        semantic = sys.modules[hk.plugin_module_name() + ".recall.semantic"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and engine.get_status()["embeddings"].get(
                "pending", 1) != 0:
            time.sleep(0.1)
        hermes_cli = cli_module.HermesCLI()
        status = cli_command(monkeypatch, cli_module, hermes_cli, "/trove status")
        assert f"session: {agent.session_id}" in status
        line = [l for l in status.splitlines() if l.startswith("embeddings: ")][0]
        assert line.startswith("embeddings: on (openai fake-embed): ")
        assert " 0 pending, " in line and "texts/s" in line and "caught up" in line
        assert "last error: none" in line
        assert "rollups: on: ready 0, pending 0, stale 0, open " in status

        grep = cli_command(monkeypatch, cli_module, hermes_cli, "/trove grep BlueHeron Relay")
        assert "BlueHeron relay answers on port 7311" in grep
        assert grep == shell(home, env, "grep", "BlueHeron Relay", "--color", "never")
        assert "unknown subcommand 'Grep2 BlueHeron'" in cli_command(
            monkeypatch, cli_module, hermes_cli, "/trove Grep2 BlueHeron")

        semantic.forget_shared()            # no worker from here on: the backfill does it
        monkeypatch.setattr(semantic.EmbeddingWorker, "run", lambda self: None)
        hk.run_turns(agent, ["one more about the Oslo gateway"])
        caplog.set_level("INFO")
        done = cli_command(monkeypatch, cli_module, hermes_cli, "/trove embed backfill apply")
        assert "0 pending" in done and "done: the index is caught up" in done
        batches = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("hermes-trove: embed backfill: ")]
        assert batches and batches[-1].startswith("hermes-trove: embed backfill: 2/2 (100%)")
        assert "embeddings: on (openai fake-embed): " in shell(home, env, "status")
        semantic.forget_shared()
    assert not host.blocked


@pytest.mark.host
def test_a_setting_typo_is_said_once_when_the_cli_agent_starts(tmp_path, fake_llm, monkeypatch):
    home = hk.make_hermes_home(tmp_path, fake_llm.port,
                               extra_config={"trove": {"fresh_tail_cuont": 8}})
    with hk.host_env(home, extra_env={"TROVE_ENABLE_SLASH_COMMAND": "true"}) as host:
        startup = sys.modules[hk.plugin_module_name() + ".diagnostics.startup"] \
            if hk.plugin_module_name() + ".diagnostics.startup" in sys.modules else None
        if startup is not None:
            startup.forget()
        import cli as cli_module                      # the hermes CLI prints it
        shown = []
        monkeypatch.setattr(cli_module, "_cli_visible_print", shown.append)
        agent = hk.make_agent()
        hk.run_turns(agent, ["hello"])
        err = "\n".join(shown)
        assert "⚠ hermes-trove at start:" in err
        assert "unknown setting 'trove.fresh_tail_cuont' is ignored (did you mean " \
               "trove.fresh_tail_count?)" in err
        hk.run_turns(hk.make_agent(), ["again"])
        assert len(shown) == 1                                          # once per process
        assert "did you mean trove.fresh_tail_count?" in hk.run_slash_command("trove", "status")
    assert not host.blocked


@pytest.mark.host
def test_an_unusable_database_is_the_first_thing_status_says(tmp_path, fake_llm):
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    (home / "trove.db").mkdir()
    with hk.host_env(home, extra_env={"TROVE_ENABLE_SLASH_COMMAND": "true"}) as host:
        fake_llm.responder = lambda body: (
            hk.Reply(text="ok") if body["messages"][-1].get("role") == "tool"
            else hk.ToolCall("trove_status", {}))
        agent = hk.make_agent()
        result = hk.run_turns(agent, ["how is trove?"])[0]
        status = hk.run_slash_command("trove", "status").splitlines()
        assert status[1].startswith("DATABASE UNUSABLE, nothing is stored: ")
        assert "is a directory" in status[1] and status[2].startswith("repair: ")
        tool = [m for m in result["messages"] if m.get("role") == "tool"][-1]
        answer = json.loads(tool["content"])
        assert list(answer)[0] == "database" and "is a directory" in answer["database"]["problem"]
        assert answer["database"]["repair"]
    assert not host.blocked


@pytest.mark.host
def test_status_names_the_cli_session_before_the_first_message(tmp_path, fake_llm,
                                                               monkeypatch):
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with hk.host_env(home, extra_env={"TROVE_ENABLE_SLASH_COMMAND": "true"}) as host:
        import cli as cli_module
        from hermes_cli.plugins import get_plugin_manager
        agent = hk.make_agent()
        hk.run_turns(agent, ["first session, first words"])
        earlier = agent.session_id
        for key in list(sys.modules[hk.plugin_module_name() + ".storage.database"]._registry):
            sys.modules[hk.plugin_module_name() + ".storage.database"].forget_database(key)
        # a fresh `hermes --resume ID` process: no agent yet, so nothing set the session
        from gateway import session_context
        monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
        token = session_context._SESSION_ID.set(session_context._UNSET)
        try:
            resumed = cli_module.HermesCLI(resume=earlier)
            monkeypatch.setattr(get_plugin_manager(), "_cli_ref", resumed)  # what run() sets
            status = cli_command(monkeypatch, cli_module, resumed, "/trove status")
        finally:
            session_context._SESSION_ID.reset(token)
        assert f"session: {earlier} " in status and "2 messages" in status
        assert "HERMES_SESSION_ID is not set" not in status
    assert not host.blocked


@pytest.mark.host
def test_compress_with_nothing_to_do_says_why(tmp_path, fake_llm, monkeypatch, caplog):
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with hk.host_env(home, extra_env={"TROVE_ENABLE_SLASH_COMMAND": "true"}) as host:
        import cli as cli_module
        hermes_cli = cli_module.HermesCLI()
        monkeypatch.setattr(cli_module, "_cprint", lambda text: None)
        hermes_cli.chat("a first short question")
        hermes_cli.chat("a second short question")
        caplog.set_level("INFO")
        hermes_cli.process_command("/compress")
        said = [r.getMessage() for r in caplog.records]
        ours = [m for m in said if m.startswith("hermes-trove: compaction changed nothing: ")]
        assert ours and "every unsummarized message shown (4) is in the fresh tail" in ours[-1]
        assert any(m.startswith("Compression made no progress") for m in said)  # the host's
        status = cli_command(monkeypatch, cli_module, hermes_cli, "/trove status")
        assert "last compaction: noop at " in status
        assert "every unsummarized message shown (4) is in the fresh tail" in status
    assert not host.blocked


@pytest.mark.host
def test_grep_after_branch_shows_a_message_once(tmp_path, fake_llm):
    from test_host_sessions import cli_branch
    home = hk.make_hermes_home(tmp_path, fake_llm.port)
    with hk.host_env(home, extra_env={"TROVE_ENABLE_SLASH_COMMAND": "true"}) as host:
        agent = hk.make_agent()
        history = hk.run_turns(agent, ["note: " + FACT, "and a second turn"])[-1]["messages"]
        parent = agent.session_id
        branch = cli_branch(agent, history)
        hk.run_turns(agent, ["only in the branch"], history=history)
        rows = [l for l in shell(home, {}, "grep", "BlueHeron relay").splitlines()
                if "BlueHeron" in l]
        assert len(rows) == 1, rows
        assert (f"(same copy in {branch})" in rows[0]) or (f"(same copy in {parent})" in rows[0])
        chat = [l for l in hk.run_slash_command("trove", "grep BlueHeron relay").splitlines()
                if "BlueHeron" in l]
        assert chat == rows
    assert not host.blocked
