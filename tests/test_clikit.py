"""clikit drives the real CLI object: its verbs reach the host's own paths.

These check the kit, not the engine: a turn reaches the fake model and state.db,
/retry's queued message is sent, /undo rewinds state.db, a second OS process
resumes the session from state.db, a restart brings the history back.
"""
import pytest

import clikit as ck
import hostkit as hk

pytestmark = pytest.mark.host


def reply(body):
    if not hk.is_main_request(body):
        return "- summary"
    return "re: " + ck.request_user_text(body).split("\n\n")[0]


def test_cli_verbs_reach_the_host(tmp_path):
    with ck.CliHost(tmp_path, responder=reply) as host:
        one = host.cli()
        assert one.chat("alpha") == "re: alpha"
        assert hk.uses_plugin_engine(one.agent, "trove", plugin_name="hermes-trove")
        assert one.chat("beta") == "re: beta"
        sent = host.main_request_count()
        assert one.retry() == "re: beta"
        assert host.main_request_count() == sent + 1
        assert ck.request_user_text(host.last_main_request()).startswith("beta")
        one.undo()
        assert [m["content"] for m in one.history] == ["alpha", "re: alpha"]
        # /retry keeps its first attempt active in state.db, /undo rewinds
        restored = one.cli._session_db.get_messages_as_conversation(one.session_id)
        assert [m["content"] for m in restored if m["role"] == "user"] == ["alpha", "beta"]

        other = host.process(resume=one.session_id)
        assert other.session_id == one.session_id
        assert [m["content"] for m in other.history] == ["alpha", "re: alpha", "beta", "re: beta"]
        assert other.chat("gamma") == "re: gamma"
        assert other.engine_state()["engine_session"] == one.session_id
        other.exit()

        again = host.restart(one)
        assert again.session_id == one.session_id
        assert [m["content"] for m in again.history][-2:] == ["gamma", "re: gamma"]
        first = again.session_id
        assert again.new() != first and again.history == []
        again.chat("delta")
        assert again.branch() not in (first,)
        assert [m["content"] for m in again.history] == ["delta", "re: delta"]
        again.resume(first)
        assert again.session_id == first
        again.exit()
        # the real `hermes chat -q --resume` command continues the same session
        done = ck.hermes_one_shot(host, "epsilon", resume=first)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "re: epsilon" in done.stdout
        assert ("user", "epsilon") in [(r["role"], r["content"]) for r in host.rows(first)]
        assert host.rows()  # trove stored something under the host's ids
        assert set(host.sessions()) >= {first}
    assert not host.env.blocked
