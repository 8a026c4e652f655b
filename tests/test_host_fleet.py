"""Two hosts, one memory: two Hermes 0.19 CLI processes with different HERMES_HOMEs on
one PostgreSQL database (issue 29), through the real host (clikit.CliProcess).

Each process talks in its own session until both have compacted; then one is
killed with SIGKILL right after a turn was answered. The server must hold every
message of both sessions exactly once (no duplicates, nothing lost up to the last
acknowledged turn of the killed process), each session's owner, and summaries of
both sessions, written by two processes that share no file.
"""
import os
import random
import signal

import pytest

import clikit as ck
import hostkit as hk
import walkkit as wk
from pgkit import PgSchema, require_pg

pytestmark = pytest.mark.host


def stored(url: str, session: str) -> list[tuple[str, str]]:
    """(role, text) of a session's rows in store order, read on a fresh connection."""
    import psycopg
    with psycopg.connect(url) as conn:
        return [(r[0], ck.text_of(r[1])) for r in conn.execute(
            "SELECT role, content FROM messages WHERE session_id = %s ORDER BY store_id",
            (session,))]


def scalar(url: str, sql: str, *params):
    import psycopg
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchone()[0]


def test_two_hosts_share_one_postgresql_memory_and_a_kill_loses_nothing(tmp_path):
    require_pg()
    schema = PgSchema()
    env = {"TROVE_DATABASE_URL": schema.url}
    rng = random.Random(29)
    model = wk.ScriptedModel(seed=29, long_reply_share=0.0)
    sent = {"a": [], "b": []}
    try:
        with hk.FakeOpenAIServer(prompt_tokens_fn=ck.real_prompt_tokens) as server, \
                ck.CliHost(tmp_path / "a", server=server, responder=model, extra_env=env) as host_a:
            first = host_a.process()
            with ck.CliHost(tmp_path / "b", server=server, responder=model,
                            extra_env=env) as host_b:
                second = host_b.process()
                for turn in range(12):  # 14,000 chars a turn: past the 32K trigger
                    for name, proc in (("a", first), ("b", second)):
                        text = f"[{name.upper()}{turn}] " + wk.prose(rng, 14000)
                        proc.chat(text)
                        sent[name].append(text)
                compactions = {name: proc.engine_state()["compression_count"]
                               for name, proc in (("a", first), ("b", second))}
                assert min(compactions.values()) >= 1, f"no compaction in both: {compactions}"
                sessions = {"a": first.session_id, "b": second.session_id}
                last = "[A-last] " + wk.prose(rng, 2000)
                first.chat(last)  # answered: acknowledged
                sent["a"].append(last)
                os.kill(first.proc.pid, signal.SIGKILL)
                first.proc.wait(30)
                second.chat("[B-after] the other host died; this one goes on")
                sent["b"].append("[B-after] the other host died; this one goes on")
                second.exit()
        url = schema.url
        assert sessions["a"] != sessions["b"]
        for name in ("a", "b"):
            rows = stored(url, sessions[name])
            users = [text for role, text in rows if role == "user"]
            assert users == sent[name], f"host {name}: user messages lost, duplicated or reordered"
            # one reply per turn, in order (the model may answer "ok" twice: equal
            # texts of two turns are two rows); the killed host's last reply may be
            # unstored (no hook ran after it), every earlier one is there
            roles = [role for role, _ in rows]
            answered = roles.count("assistant")
            assert roles[:2 * answered] == ["user", "assistant"] * answered, roles
            assert answered in ((len(sent[name]) - 1, len(sent[name])) if name == "a"
                                else (len(sent[name]),)), (name, answered)
            assert scalar(url, "SELECT count(*) FROM nodes WHERE session_id = %s",
                          sessions[name]) >= 1, f"host {name}: no summary on the server"
            assert scalar(url, "SELECT owner FROM session_owners WHERE session_id = %s",
                          sessions[name]) == "local"
        # nothing of one host's session was filed under the other's
        assert not any(t.startswith("[B") for _, t in stored(url, sessions["a"]))
        assert not any(t.startswith("[A") for _, t in stored(url, sessions["b"]))
    finally:
        schema.drop()
