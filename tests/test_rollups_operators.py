"""Operators and rollups: /trove rollups [status|build [apply]], scripts/trove.py rollups,
and the doctor's rollup lineage check."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_trove import command
from hermes_trove.operators import actions as ops
from hermes_trove.operators import rollup_actions
from hermes_trove.operators import housekeeping
from hermes_trove.storage import database
from hermes_trove.storage.owners import Owners
from test_rollups import NOW, OWNER, World

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "trove.py"


@pytest.fixture
def world(tmp_path, backend, monkeypatch):
    """HERMES_HOME/trove.db (the default path), or a PostgreSQL schema named by
    TROVE_DATABASE_URL (tests/pgkit.py): the operator commands on both engines."""
    if backend[0] == "postgresql":
        monkeypatch.setenv("TROVE_DATABASE_URL", backend[1])
    w = World(tmp_path, backend[1] if backend[0] == "postgresql" else None)
    yield w
    for key in list(database._registry):
        database.forget_database(key)


def test_status_build_preview_and_apply(world):
    target = ops.open_target(world.config)
    status = rollup_actions.status(target, now=NOW)
    assert status["counts"] == {"pending": 5, "open": 3}
    text = command.format_rollups(status)
    assert "day   2026-03-12 pending" in text and "week  2026-W12   open" in text

    preview = rollup_actions.build(target, now=NOW)
    assert preview["status"] == "preview" and len(preview["to_build"]) == 5
    assert "would build day 2026-03-12 (pending)" in command.format_rollups(preview)
    assert not (world.tmp / "backups").exists()          # a preview writes nothing

    with pytest.raises(ops.OperatorError, match="opened for writing"):
        rollup_actions.build(target, apply=True, now=NOW)  # a read-only target refuses
    target = ops.open_target(world.config, writable=True)  # what the apply word opens
    done = rollup_actions.build(target, apply=True, now=NOW)
    assert done["status"] == "built" and len(done["built"]) == 5 and not done["errors"]
    assert Path(done["backup"]["path"]).is_file()
    assert "backup written first" in command.format_rollups(done)
    assert rollup_actions.status(target, now=NOW)["counts"] == {"ready": 5, "open": 3}
    again = rollup_actions.build(target, apply=True, now=NOW)
    assert again["status"] == "noop"


def test_build_is_refused_while_rollups_are_off(tmp_path):
    world = World(tmp_path, rollups_enabled="false")
    out = rollup_actions.build(ops.open_target(world.config), apply=True, now=NOW)
    assert out["status"] == "refused" and "TROVE_ROLLUPS_ENABLED" in out["reason"]
    assert "refused" in command.format_rollups(out)
    world.db.close()


def test_slash_command_words(world, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(world.tmp))
    monkeypatch.setenv("TROVE_ROLLUPS_ENABLED", "1")
    monkeypatch.setenv("TROVE_ROLLUPS_LOOKBACK_DAYS", "36600")
    assert "trove rollups (on, UTC" in command.handle("rollups")
    assert command.handle("rollups status") == command.handle("rollups")
    assert "would build" in command.handle("rollups build")
    assert "built day 2026-03-12" in command.handle("rollups build apply")
    assert "rollups [status|build [apply]]" in command.ARGS_HINT
    assert "/trove rollups build apply" in command.help_text()


def test_doctor_checks_rollup_lineage(world):
    target = ops.open_target(world.config, writable=True)
    rollup_actions.build(target, apply=True, now=NOW)
    checks = {c["name"]: c for c in ops.doctor(target)["checks"]}
    assert checks["rollup_lineage"]["status"] == "ok"
    with world.db.transaction() as conn:
        conn.execute("DELETE FROM messages WHERE store_id = ?", (world.ids["wed"][0],))
    checks = {c["name"]: c for c in ops.doctor(target)["checks"]}
    assert checks["rollup_lineage"]["status"] == "warn"
    assert "rollups build apply" in checks["rollup_lineage"]["detail"]
    # the removal changed the day's watermark: the next build repairs the lineage
    assert rollup_actions.status(target, now=NOW)["counts"]["stale"] >= 1
    rollup_actions.build(target, apply=True, now=NOW)
    assert {c["name"]: c for c in ops.doctor(target)["checks"]}["rollup_lineage"]["status"] == "ok"


def run_cli(home, *args, **env):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("TROVE_") and k != "HERMES_SESSION_ID"}
    environ.update({"HERMES_HOME": str(home), **env})
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=environ, timeout=120)


def test_cli_rollups(world):
    db = world.target
    wide = {"TROVE_ROLLUPS_LOOKBACK_DAYS": "36600"}
    out = run_cli(world.tmp, "rollups", "--db", db, **wide)
    assert out.returncode == 0 and "trove rollups (off" in out.stdout, out.stderr
    refused = run_cli(world.tmp, "rollups", "build", "--apply", "--db", db, **wide)
    assert refused.returncode == 2 and "TROVE_ROLLUPS_ENABLED" in refused.stderr
    bad = run_cli(world.tmp, "rollups", "--apply", "--db", db)
    assert bad.returncode == 2 and "--apply needs 'rollups build'" in bad.stderr
    built = run_cli(world.tmp, "rollups", "build", "--apply", "--json", "--db", db,
                    TROVE_ROLLUPS_ENABLED="1", **wide)
    assert built.returncode == 0, built.stderr
    report = json.loads(built.stdout)
    assert report["status"] == "built" and {b["key"] for b in report["built"]} >= {
        "2026-03-12", "2026-W11"}


def test_clean_removes_the_rollups_over_its_sessions_even_outside_the_lookback(world):
    """A rollup keeps no foreign key to its sources: a session removed by doctor clean
    after its day left the lookback window (never rebuilt again) used to leave the
    day, its week and its month pointing at removed rows for good (a doctor warning
    no build could clear). Clean removes them with the session; another owner's
    rollups and the rollups of other days stay."""
    for name, owner in (("trove-ephemeral-x", OWNER), ("other-owner", "discord:user:9")):
        world.store.ensure_session(name, source="telegram")
        Owners(world.db).record(name, owner, platform="telegram")
        world.say(name, 12, f"{name} note")
    config = dataclasses.replace(world.config, doctor_clean_apply_enabled=True)
    target = ops.open_target(config, writable=True)
    rollup_actions.build(target, apply=True, now=NOW)
    before = {(r["kind"], r["period_key"], r["owner"]) for r in world.timeline.all_rollups()}
    assert ("day", "2026-03-12", "discord:user:9") in before and len(before) == 7
    later = NOW + 150 * 86400                    # day 12 is far outside the lookback now
    out = housekeeping.clean_apply(target, now=later)
    assert out["status"] == "cleaned" and out["removed_sessions"] == ["trove-ephemeral-x"]
    assert out["removed"]["rollups"] == 2        # day 2026-03-12 and week 2026-W11
    assert "rollups over them removed: 2" in command.format_clean(out)
    after = {(r["kind"], r["period_key"], r["owner"]) for r in world.timeline.all_rollups()}
    assert before - after == {("day", "2026-03-12", OWNER), ("week", "2026-W11", OWNER)}
    rollup_actions.build(target, apply=True, now=later)
    checks = {c["name"]: c for c in ops.doctor(target)["checks"]}
    assert checks["rollup_lineage"]["status"] == "ok", checks["rollup_lineage"]
