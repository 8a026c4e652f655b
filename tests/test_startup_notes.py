"""Mistakes the user sees (issue 26): setting typos with "did you mean" at start, a new
database beside an unused ``$HERMES_HOME/trove.db``, an unusable database path said
first with its repair, doctor on a directory path."""
import io
import re
import json

import pytest

from enginekit import close_databases, make_engine, operator_home
from hermes_trove import command
from hermes_trove.config import load_config
from hermes_trove.diagnostics import startup
from test_cli import run


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    operator_home(monkeypatch, tmp_path)
    startup.forget()
    yield
    startup.forget()
    close_databases()


# ---------------------------------------------------------------- item 5: typos
def test_typos_name_the_closest_known_setting(tmp_path):
    (tmp_path / "config.yaml").write_text("trove:\n  fresh_tail_cuont: 8\n")
    config = load_config({"TROVE_EMBEDINGS_ENABLED": "true",
                          "TROVE_EMBEDDING_PROVIDER": "loacl", "TROVE_ZZZ": "1"},
                         hermes_home=tmp_path)
    text = "\n".join(config.warnings)
    assert ("unknown environment variable TROVE_EMBEDINGS_ENABLED is ignored "
            "(did you mean TROVE_EMBEDDINGS_ENABLED?)") in text
    assert "unknown setting 'trove.fresh_tail_cuont' is ignored (did you mean " \
           "trove.fresh_tail_count?)" in text
    assert "using 'local' (did you mean local?)" in text
    assert "TROVE_ZZZ is ignored" in text and "TROVE_ZZZ is ignored (did" not in text


def test_problems_are_said_once_at_start_on_the_terminal(tmp_path):
    config = load_config({"TROVE_FRESH_TAIL_CUONT": "8"}, hermes_home=tmp_path)
    out = io.StringIO()
    said = startup.announce(config, "cli", stream=out)
    assert said == ["unknown environment variable TROVE_FRESH_TAIL_CUONT is ignored "
                    "(did you mean TROVE_FRESH_TAIL_COUNT?)"]
    assert out.getvalue().startswith("⚠ hermes-trove at start:\n  - unknown environment")
    assert startup.announce(config, "cli", stream=out) == []          # once per process
    assert out.getvalue().count("TROVE_FRESH_TAIL_CUONT") == 1
    startup.forget()
    quiet = io.StringIO()
    assert startup.announce(config, "telegram", stream=quiet) and quiet.getvalue() == ""


def test_the_engine_announces_when_a_cli_session_starts(tmp_path, capsys):
    make_engine(tmp_path, session="s1", fresh_tail_cuont=8)
    seen = capsys.readouterr()          # stderr; stdout when the host CLI module is loaded
    said = seen.err + seen.out
    assert "⚠ hermes-trove at start:" in said and "did you mean TROVE_FRESH_TAIL_COUNT?" in said
    make_engine(tmp_path, session="s2", fresh_tail_cuont=8)      # a second agent: silent
    seen = capsys.readouterr()
    assert "TROVE_FRESH_TAIL_CUONT" not in seen.err + seen.out


# ---------------------------------------------------------------- item 6: beside
def test_a_new_database_beside_the_default_one_is_named(tmp_path, monkeypatch, capsys):
    make_engine(tmp_path, session="old").ingest([{"role": "user", "content": "history"}])
    close_databases()
    elsewhere = tmp_path / "typo" / "trove.db"
    config = load_config({"TROVE_DATABASE_PATH": str(elsewhere)}, hermes_home=tmp_path)
    note = startup.unused_default_database(config)
    assert note.startswith(f"TROVE_DATABASE_PATH points at {elsewhere} (a new empty database "
                           f"is created there), while {tmp_path / 'trove.db'} (")
    assert "exists and is not used; if it holds your history, remove the setting" in note
    out = io.StringIO()
    # the default file's size may move between the two reads (a writer thread of the
    # first engine still checkpointing): the sentence is the same around it
    sized = re.compile(r"\([^()]*\) exists")
    assert sized.sub("(size) exists", note) in [
        sized.sub("(size) exists", said) for said in startup.announce(config, "cli", stream=out)]
    monkeypatch.setenv("TROVE_DATABASE_PATH", str(elsewhere))
    startup.forget()
    make_engine(tmp_path, session="new", database_path=str(elsewhere)).ingest(
        [{"role": "user", "content": "hi"}])
    seen = capsys.readouterr()
    assert (f"TROVE_DATABASE_PATH points at {elsewhere} (a new empty database was just "
            "created there)") in seen.err + seen.out          # said when the engine starts
    close_databases()
    status = run(tmp_path, "status", env={"TROVE_DATABASE_PATH": str(elsewhere)}).stdout
    assert f"database note: TROVE_DATABASE_PATH points at {elsewhere} (that database is used)" \
        in status
    doctor = run(tmp_path, "doctor", env={"TROVE_DATABASE_PATH": str(elsewhere)}).stdout
    assert "[WARN] database_location: TROVE_DATABASE_PATH points at" in doctor
    assert "database note: " in command.handle("status")
    assert startup.unused_default_database(load_config({}, hermes_home=tmp_path)) is None


# ---------------------------------------------------------------- items 7 and 15
def test_an_unusable_path_is_said_first_with_its_repair(tmp_path, monkeypatch):
    (tmp_path / "trove.db").mkdir()
    chat = command.handle("status").splitlines()
    assert chat[1] == (f"DATABASE UNUSABLE, nothing is stored: {tmp_path / 'trove.db'} is a "
                       "directory, not a database file")
    assert chat[2].startswith("repair: move that directory away")
    shell = run(tmp_path, "status")
    assert shell.returncode == 1 and shell.stdout.splitlines()[1] == chat[1]
    monkeypatch.setenv("HERMES_SESSION_ID", "s")
    engine = make_engine(tmp_path, session="s")
    assert engine.database_fault is not None
    live = command.handle("status").splitlines()
    assert live[1].startswith("DATABASE UNUSABLE, nothing is stored: ") and "directory" in live[1]
    assert any(l.startswith("engine: ") for l in live)
    answer = json.loads(engine.handle_tool_call("trove_status", {}))
    assert list(answer)[0] == "database" and answer["database"]["ok"] is False
    assert "directory" in answer["database"]["problem"] and answer["database"]["repair"]


def test_a_path_under_a_file_is_unusable_too(tmp_path):
    (tmp_path / "afile").write_text("x")
    text = run(tmp_path, "status", env={"TROVE_DATABASE_PATH": str(tmp_path / "afile" /
                                                                   "trove.db")}).stdout
    assert f"{tmp_path / 'afile'} is a file, so " in text and "repair: set TROVE_DATABASE_PATH" \
        in text


def test_doctor_on_a_directory_says_so_and_runs_the_host_checks(tmp_path):
    (tmp_path / "trove.db").mkdir()
    done = run(tmp_path, "doctor")
    assert done.returncode == 1
    assert "[FAIL] database: " in done.stdout and "is a directory" in done.stdout
    assert "host_config" in done.stdout and "plugin_install" in done.stdout
    chat = command.handle("doctor")
    assert "is a directory" in chat and "host_config" in chat
    assert "is a directory, not a trove database file" in run(tmp_path, "sessions").stderr
