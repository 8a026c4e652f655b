"""trove_recent's pages hold still: a later page passes the first page's ``snapshot``
and reads the store as it was then (``storage/timeline.Pin``), so storing, compacting
and rolling up between pages neither repeats nor skips an item."""

import json

import pytest

from enginekit import coding_turn, drive, make_engine
from test_rollups import NOW, call, world  # noqa: F401  (world is a fixture)


# ---------------------------------------------------------------- paging a live session
def keys(items: list[dict]) -> list[tuple]:
    """What an item is, whatever its text says: its kind and its id."""
    name = {"rollup": "rollup_id", "summary": "node_id", "session": "session_id",
            "message": "store_id"}
    return [(i["kind"], i[name[i["kind"]]]) for i in items]


def everything(ctx, **args) -> list[tuple]:
    """Every item of a trove_recent list, paged by 50 while nothing changes."""
    page = call(ctx, "trove_recent", limit=50, **args)
    seen = keys(page["items"])
    while page["next_offset"] is not None:
        page = call(ctx, "trove_recent", limit=50, offset=page["next_offset"], **args)
        seen += keys(page["items"])
    return seen


def page_all(ctx_of, between, **args) -> tuple[dict, list[tuple]]:
    """Page trove_recent by 2 with the first page's snapshot, running ``between`` before
    each later page; the first page and every item in page order."""
    first = page = call(ctx_of(), "trove_recent", limit=2, **args)
    seen = keys(page["items"])
    while page["next_offset"] is not None:
        between()
        page = call(ctx_of(), "trove_recent", limit=2, offset=page["next_offset"],
                    snapshot=first["snapshot"], **args)
        assert page["snapshot"] == first["snapshot"]
        seen += keys(page["items"])
    return first, seen


def test_recent_pages_hold_still_while_the_session_stores_and_compacts(tmp_path,
                                                                      engines_on_backend):
    """"What did we do today?" (the last 24 hours) paged by 2 while the agent goes on: before each page a new
    turn is stored and compacted (a summary appears on top, raw messages leave the
    list). Offsets over the live list repeated items and skipped others; with the first
    page's snapshot the pages are exactly the full list of the first call."""
    engine = make_engine(tmp_path, session="live")
    messages, _, _ = drive(engine, 20)
    assert engine.compression_count >= 1
    full = everything(engine.tool_context(), period="last 24h")     # rolling: pinned too
    assert {kind for kind, _ in full} == {"summary", "message"}
    turn = [100]

    def agent_goes_on():
        messages[:] = engine.compress(messages + coding_turn(turn[0]), force=True)
        turn[0] += 1

    compactions = engine.compression_count
    first, seen = page_all(engine.tool_context, agent_goes_on, period="last 24h")
    assert engine.compression_count - compactions >= 3         # the list did move
    assert keys(first["items"]) == full[:2] and first["total"] == len(full)
    assert seen == full                                      # no repeat, nothing skipped
    assert everything(engine.tool_context(), period="last 24h") != full   # a new first page


def test_a_rollup_gone_stale_between_pages_keeps_its_place(world):
    """Late messages make listed days stale between pages (Wednesday's before page two;
    Monday's before page three, rebuilt by a pass at once): under the snapshot each day
    is still listed where it was (ready then; rebuilt in place since, same id), the late
    messages are not, and nothing of the week repeats or goes missing."""
    world.build()
    full = everything(world.ctx(), period="this week", session_scope="all")
    assert [kind for kind, _ in full].count("rollup") == 3 and len(full) == 5
    steps = iter([lambda: world.say("wed", 18, "feijoa late addendum", hour=21),
                  lambda: (world.say("mon", 16, "durian late addendum", hour=21),
                           world.build())])

    def late_messages():
        next(steps, lambda: None)()

    _, seen = page_all(world.ctx, late_messages, period="this week", session_scope="all")
    assert seen == full
    status = world.status()
    assert status[("day", "2026-03-16")] == "ready" and status[("day", "2026-03-18")] == "ready"
    now = json.dumps(call(world.ctx(), "trove_recent", period="this week",
                          session_scope="all", limit=50))
    assert "durian" in now and "feijoa" in now


@pytest.mark.parametrize("bad", ["yesterday", "p1.1.2.3.4", "p1.1.2.3.4.zzzzzzzz",
                                 "p1.-1.2.3.4.00000000", "p1." + "9" * 30 + ".1.1.1.00000000"])
def test_a_bad_snapshot_is_a_clear_error(world, bad):
    out = call(world.ctx(), "trove_recent", period="this week", snapshot=bad)
    assert out["error"].startswith("snapshot:") and "first page" in out["error"]


def test_a_snapshot_pins_one_query_and_a_future_one_is_harmless(world):
    from hermes_trove.storage.timeline import Pin
    first = call(world.ctx(), "trove_recent", period="this week", session_scope="all", limit=2)
    assert first["total"] == 7 and first["next_offset"] == 2          # as without snapshots
    blank = call(world.ctx(), "trove_recent", period="this week", session_scope="all", limit=2,
                 snapshot=" ")                                        # a blank one is none
    assert blank["items"] == first["items"] and blank["snapshot"] == first["snapshot"]
    pin = first["snapshot"]
    for other in ({"period": "last week", "session_scope": "all"},
                  {"period": "this week"}):                           # another query's token
        assert call(world.ctx(), "trove_recent", snapshot=pin, **other)["error"].startswith(
            "snapshot:")
    edited = pin.replace("p1.", "p1.1", 1)
    assert "error" in call(world.ctx(), "trove_recent", period="this week",
                           session_scope="all", snapshot=edited)
    about = "this week|all"
    huge = Pin(2**63, 1, 1, 1).encode(about)                  # no column holds it
    assert "out of range" in call(world.ctx(), "trove_recent", period="this week",
                                  session_scope="all", snapshot=huge)["error"]
    future = Pin(2**62, 2**62, 2**62, int(NOW * 1000) + 10**10).encode(about)
    later = call(world.ctx(), "trove_recent", period=" This  Week", session_scope="all",
                 limit=50, snapshot=future)
    assert keys(later["items"]) == keys(call(world.ctx(), "trove_recent", period="this week",
                                             session_scope="all", limit=50)["items"])
