"""Status that explains itself (issue 26): the last compaction's tokens, tail and
reasons; a no-op's reason in status and the log; which counter each number is."""
import logging

import pytest

from enginekit import close_databases, coding_turn, drive, make_engine, operator_home
from hermes_trove import command
from hermes_trove.diagnostics import compaction_text
from test_cli import run


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    operator_home(monkeypatch, tmp_path, session="sess")
    yield
    close_databases()


def line_of(text: str, start: str) -> str:
    return next(l for l in text.splitlines() if l.startswith(start))


def test_a_compaction_shows_tokens_before_after_and_the_tail(tmp_path):
    engine = make_engine(tmp_path, window=16_000, fresh_tail_count=8)
    drive(engine, 30)
    last = engine.store.get_session(engine.canonical_id)["state"]["last_compaction"]
    assert last["outcome"] == "compacted"
    line = line_of(command.handle("status"), "last compaction: ")
    assert f": {last['tokens_before']:,} -> {last['tokens_after']:,} tokens (trigger " \
           f"{last['trigger']:,}" in line
    assert "trove's tokenizer" in line and "new summar" in line
    assert f"tail kept {last['tail_messages']} messages" in line
    assert ("the tail gave way: " in line) == bool(last["tail_gave_way"])


def test_a_forced_compaction_with_nothing_to_do_says_why(tmp_path, caplog):
    engine = make_engine(tmp_path, window=1_000_000, fresh_tail_count=8)
    messages = coding_turn(1) + coding_turn(2)
    caplog.set_level(logging.INFO)
    assert engine.compress(messages, current_tokens=20_000, force=True) == messages
    reason = engine.last_compaction["reason"]
    assert reason.startswith("nothing to compact: every unsummarized message shown (8) is in "
                             "the fresh tail (up to TROVE_FRESH_TAIL_COUNT=8 kept verbatim)")
    assert any(r.getMessage() == f"hermes-trove: compaction changed nothing: {reason}"
               for r in caplog.records)
    line = line_of(command.handle("status"), "last compaction: ")
    assert line.startswith("last compaction: noop at ") and reason in line


def test_the_reason_for_a_sliver_beyond_the_tail():
    assert compaction_text.noop_reason(12, 8, 900, 5600).startswith(
        "nothing to compact yet: beyond the fresh tail only a sliver")


def test_status_says_which_counter_each_number_is(tmp_path):
    engine = make_engine(tmp_path, window=64_000)
    engine.update_from_response({"prompt_tokens": 32_486})
    engine.should_compress(31_900)
    text = command.handle("status")
    line = line_of(text, "token counts: ")
    assert "prompt = the provider's count of the last request" in line
    assert "against its rough estimate (chars/4)" in line and "last check saw 31,900" in line
    assert f"trove's own budgets: {engine.counter.name}" in line


def test_old_or_odd_records_are_read_defensively():
    assert compaction_text.compaction_line(None, str) == "last compaction: none recorded"
    odd = {"outcome": "compacted", "at": None, "tokens_before": "many", "leaf_nodes": 3,
           "tail_gave_way": True, "tail_gave_way_reason": "the newest turn alone is huge"}
    line = compaction_text.compaction_line(odd, lambda t: "never")
    assert line == ("last compaction: compacted at never, 3 new summaries, tail, the tail "
                    "gave way: the newest turn alone is huge")


def test_an_unreachable_server_is_named_with_its_repair_not_taken_for_no_database(tmp_path,
                                                                                 monkeypatch):
    # with TROVE_DATABASE_URL set, status and doctor looked only for $HERMES_HOME/trove.db:
    # "none yet" / "no trove database" (WARN, exit 0) while the server was down
    url = "postgresql://u:secret@127.0.0.1:1/db"
    monkeypatch.setenv("TROVE_DATABASE_URL", url)
    shown = "cannot open postgresql://u:***@127.0.0.1:1/db: "
    for words in ("status", "doctor", "doctor full"):
        text = command.handle(words)
        assert shown in text and "Repair: check that the PostgreSQL server is up" in text, text
        assert "secret" not in text and "trove.db" not in text
    done = run(tmp_path, "doctor", env={"TROVE_DATABASE_URL": url})
    assert done.returncode == 2 and shown in done.stderr, done.stderr
    assert "secret" not in done.stdout + done.stderr and "trove.db" not in done.stderr
    assert list(tmp_path.iterdir()) == []
