"""One zone is one rollup key, and no rollup holds two owners' sessions.

Rollups are keyed by ``time_zone``. Older versions stored the zone as typed, so
``utc`` and ``UTC``, or a link (``US/Eastern``) and the zone it names
(``America/New_York``), were two keys: changing the spelling rebuilt every rollup
under the second key and left the first set behind for good. The world is
tests/test_rollups.py's (five sessions of one owner, a frozen clock); a build
under ``time_zone=<old name>`` writes what an older version wrote.
"""
import json

import pytest

from hermes_trove import command
from hermes_trove.operators import actions as ops, rollup_actions
from hermes_trove.storage.owners import Owners
from hermes_trove.storage.timeline import Timeline
from test_rollups import OWNER, World, call, world  # noqa: F401 (fixture)


def zones(world) -> set[str]:
    return {r["time_zone"] for r in world.timeline.all_rollups()}


def keys(world) -> dict[tuple, int]:
    """(kind, key, owner) -> rollup id; asserts the triple is unique across zones."""
    rows = world.timeline.all_rollups()
    found = {(r["kind"], r["period_key"], r["owner"]): r["rollup_id"] for r in rows}
    assert len(found) == len(rows), "one period of one owner is stored twice"
    return found


def assert_one_owner_each(world) -> None:
    """Every session under a rollup is recorded as the rollup's owner's."""
    owners = Owners(world.db)
    for rollup in world.timeline.all_rollups():
        under = {owners.owner_of(s) for s in world.timeline.sessions_of(rollup["rollup_id"])}
        assert under == {rollup["owner"]}, (rollup["kind"], rollup["period_key"], under)


@pytest.mark.parametrize("old, setting, key", [
    ("utc", "UTC", "UTC"), ("US/Eastern", "US/Eastern", "America/New_York"),
    ("Asia/Calcutta", "Asia/Kolkata", "Asia/Kolkata")])
def test_rollups_stored_under_another_name_of_the_zone_are_reused(tmp_path, backend, old,
                                                                  setting, key):
    world = World(tmp_path, backend[1], timezone=setting)
    assert world.config.timezone == key
    first = world.build(max_builds=50, time_zone=old)
    assert first.built and not first.errors and zones(world) == {old}
    before = keys(world)
    # before any pass moves them, they are the periods' rollups (not pending again)
    states = world.status()
    assert "pending" not in states.values() and "stale" not in states.values()
    report = world.build(max_builds=50)
    assert report.built == [] and report.removed == [] and not report.errors
    assert report.renamed == len(before)
    assert zones(world) == {key} and keys(world) == before          # same ids, one key
    yesterday = call(world.ctx(), "trove_recent", period="yesterday", session_scope="all")
    assert yesterday["used"] == ["rollups"] and "papaya" in json.dumps(yesterday)


def test_a_period_both_names_hold_keeps_one_rollup_per_owner(world):
    """Rollups under ``UTC`` and under the old ``utc``; Bob's under ``utc`` only. The
    pass keeps ``UTC``'s, drops the duplicates (derived data: nothing raw is touched)
    and files Bob's under ``UTC`` with their ids and their owner."""
    world.build(max_builds=50)
    canonical = keys(world)
    bob = "telegram:user:8"
    world.store.ensure_session("bob", source="telegram")
    Owners(world.db).record("bob", bob, platform="telegram")
    world.say("bob", 16, "durian secret", hour=15)
    world.build(max_builds=50, time_zone="utc")
    assert zones(world) == {"UTC", "utc"}
    old = {(r["kind"], r["period_key"], r["owner"]): r["rollup_id"]
           for r in world.timeline.all_rollups() if r["time_zone"] == "utc"}
    bobs = {k: v for k, v in old.items() if k[2] == bob}
    assert bobs and any(k[2] == OWNER for k in old)
    with world.db.reading() as conn:
        raw = conn.execute("SELECT count(*), sum(length(content)) FROM messages").fetchone()
    report = world.build(max_builds=50)
    assert not report.errors and report.renamed == len(bobs)
    assert sorted(report.removed) == sorted(v for k, v in old.items() if k[2] == OWNER)
    assert zones(world) == {"UTC"}
    after = keys(world)
    assert after == {**canonical, **bobs}
    assert_one_owner_each(world)
    with world.db.reading() as conn:
        assert conn.execute("SELECT count(*), sum(length(content)) FROM messages"
                            ).fetchone() == raw


def test_operators_see_and_file_the_other_names(world):
    """``/trove rollups`` names the other spelling; ``build apply`` files it even when
    no period needs building (it was a no-op that never moved them)."""
    world.build(max_builds=50, time_zone="utc")
    target = ops.open_target(world.config)
    shown = command.format_rollups(rollup_actions.status(target, now=world.now))
    assert "also stored as utc" in shown and "pending" not in shown
    preview = rollup_actions.build(target, apply=False, now=world.now)
    assert preview["status"] == "preview" and preview["to_build"] == []
    assert "would build nothing" in command.format_rollups(preview)
    target = ops.open_target(world.config, writable=True)
    done = rollup_actions.build(target, apply=True, now=world.now)
    assert done["status"] == "built" and done["renamed"] > 0 and zones(world) == {"UTC"}
    assert "under it" in command.format_rollups(done)


def test_a_rollup_never_holds_two_owners_when_an_owner_key_is_replaced(world):
    """Two sessions first recorded under one replaceable key (``gateway:user:5``: set
    before the platform was known, shared by one person's DM and group chat) get day,
    week and month rollups together, in February and in March. Once the DM gets its
    real key, no rollup may hold sessions of two owners: not March's (the pass found
    those stale and rebuilt them) and not February's, which has left a short lookback
    (no pass looks at it again: it kept both owners' sessions for good)."""
    shared = "gateway:user:5"
    for name, hour in (("dm", 8), ("group", 9)):
        world.store.ensure_session(name, source="telegram")
        Owners(world.db).record(name, shared, platform="telegram")
        world.say(name, 10, f"{name} feijoa", hour=hour, month=2)
        world.say(name, 17, f"{name} feijoa", hour=hour)
    world.build(max_builds=50)
    for key in ("2026-02-10", "2026-03-17"):
        day = world.timeline.get_rollup("day", key, "UTC", shared)
        assert world.timeline.sessions_of(day["rollup_id"]) == ["dm", "group"]
    assert world.timeline.get_rollup("month", "2026-02", "UTC", shared)
    assert Owners(world.db).record("dm", "telegram:conversation:dm-1",
                                   platform="telegram") == "telegram:conversation:dm-1"
    assert_one_owner_each(world)                                 # at once, not at a pass
    report = world.build(max_builds=50, lookback_days=10)        # February is outside
    assert not report.errors
    assert_one_owner_each(world)
    group_day = world.timeline.get_rollup("day", "2026-03-17", "UTC", shared)
    assert world.timeline.sessions_of(group_day["rollup_id"]) == ["group"]
    dm_day = world.timeline.get_rollup("day", "2026-03-17", "UTC", "telegram:conversation:dm-1")
    assert world.timeline.sessions_of(dm_day["rollup_id"]) == ["dm"]


def test_the_migration_drops_rollups_already_mixing_owners(tmp_path, backend, monkeypatch):
    """Rollups a replaced key left holding two owners' sessions (before ``Owners.record``
    dropped them) are deleted once, on both engines (SQLite's 13, the server's 7), with
    the rollups built on them; every other rollup, and every message, stays."""
    from hermes_trove.storage import database, migrations
    from hermes_trove.storage.postgres import schema as pg_schema
    engine, target = backend
    module, last = (migrations, 12) if engine == "sqlite" else (pg_schema, 6)
    shared = "gateway:user:5"
    with monkeypatch.context() as patch:
        patch.setattr(module, "MIGRATIONS", [m for m in module.MIGRATIONS if m[0] <= last])
        world = World(tmp_path, target)
        for name in ("dm", "group"):
            world.store.ensure_session(name, source="telegram")
            Owners(world.db).record(name, shared, platform="telegram")
            world.say(name, 10, f"{name} feijoa", month=2)
        world.build(max_builds=50)
        mixed = {r["rollup_id"] for r in world.timeline.all_rollups() if r["owner"] == shared}
        assert len(mixed) >= 3                                   # day, week, month
        kept = {r["rollup_id"] for r in world.timeline.all_rollups()} - mixed
        with world.db.transaction() as conn:    # a replacement as the code before made it
            conn.execute("UPDATE session_owners SET owner = 'telegram:conversation:dm-1'"
                         " WHERE session_id = 'dm'")
            raw = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        database.forget_database(target)
    world.db = database.get_database(target)
    world.timeline = Timeline(world.db)
    assert {r["rollup_id"] for r in world.timeline.all_rollups()} == kept and kept
    assert_one_owner_each(world)
    with world.db.reading() as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == raw
        assert conn.execute("SELECT max(version) FROM trove_migrations").fetchone()[0] \
            == module.latest_version() > last
