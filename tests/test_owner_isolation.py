"""Owner isolation, generatively: nothing a tool answers a session of owner X holds text,
a session id, a store id, a node id or a rollup id that exists only in owner Y's data.

Two owners share one database (a messaging gateway), each with two sessions, raw rows,
leaves, a condensed node and a rollup. The links a real database grows between sessions
are planted too: a node of X carried into a session of Y and condensed there under a
summary of Y, a leaf of Y over rows of both owners' sessions (what a summary covering
rows of two sessions looks like), and summaries of X over Y's node and row. Seeded random calls of every tool from X's sessions,
with ids and session ids drawn from both owners' real data and from guesses, must not
show Y: Y's secret words (never an argument), Y's session ids, and Y's ids in any field
that carries an id, unless the call itself passed that value; and no figure X is shown
counts Y's items (a node's child count, the messages under it, the tokens it was built
from, a page's ordinals and cursor), nor does a status or health answer name the summary
routes the operator configured (a model, an endpoint in an error text).
"""

import json
import random

from hermes_trove import schemas, tools
from hermes_trove.dag import NewNode
from hermes_trove.storage import database
from hermes_trove.storage.owners import Owners
from hermes_trove.storage.timekeys import iso
from hermes_trove.storage.timeline import NewRollup, Timeline

from test_tools import NOW, Env

OWNER_X, OWNER_Y = "telegram:conversation:x-chat", "telegram:conversation:y-chat"
X_SESSIONS = ("tg-x-first", "tg-x-second")
Y_SESSIONS = ("tg-y-alpha-5081", "tg-y-beta-6192")
Y_SECRET = "quokkalantern"          # in every row and summary of Y; never an argument
STORE_KEYS = {"store_id", "first_store_id", "last_store_id", "next_cursor", "after_store_id"}
NODE_KEYS = {"node_id", "covering_nodes", "parents", "node_ids", "carried_node_ids"}
ROLLUP_KEYS = {"rollup_id"}
X_AT, Y_AT = NOW - 1800, NOW - 900   # Y's rows are newer: a time range over them shows
# the operator's summary routes: a model name and an endpoint in a failed call's text
ROUTE_MODEL, ROUTE_ENDPOINT = "routemodel-9431", "llm-9431.operator.example"


def _rows(env, session, word, at):
    """Three turns of a session, each starting with the shared word "staging"."""
    return env.ingest(session, [
        {"role": "user", "content": f"staging note {word} deploy port 6543 for {session}"},
        {"role": "assistant", "content": f"staging reply {word} retry backoff 250"},
        {"role": "user", "content": f"staging check {word} cache ttl ninety seconds"}],
        at=at)


def _world(tmp_path):
    """Both owners' data and the cross-session links; the handles a caller could name."""
    env = Env(tmp_path, summary_model=ROUTE_MODEL)
    owners, timeline = Owners(env.db), Timeline(env.db)
    x = {"sessions": set(X_SESSIONS), "store": set(), "node": set(), "rollup": set()}
    y = {"sessions": set(Y_SESSIONS), "store": set(), "node": set(), "rollup": set()}
    for sessions, owner, side, word in ((X_SESSIONS, OWNER_X, x, "xenial"),
                                        (Y_SESSIONS, OWNER_Y, y, Y_SECRET)):
        for session in sessions:
            env.store.ensure_session(session, source="telegram")
            owners.record(session, owner, platform="telegram")
            ids = _rows(env, session, word, Y_AT if owner == OWNER_Y else X_AT)
            leaf = env.node(session, f"staging summary {word} of {session}", store_ids=ids)
            top = env.node(session, f"staging overview {word}", node_ids=[leaf], depth=1)
            side["store"].update(ids)
            side["node"].update((leaf, top))
            side.setdefault("leaves", {})[session] = (leaf, ids)
        rollup = timeline.save_rollup(NewRollup(
            kind="day", period_key="2026-12-05", time_zone="UTC", owner=owner,
            period_start=NOW - 86_400, period_end=NOW + 86_400,
            text=f"staging day rollup {word}", token_count=20, source_token_count=200, level=3,
            model="deterministic", message_count=6, time_from=NOW - 1800, time_to=NOW - 1800,
            watermark="w", sources=[("node", side["leaves"][s][0]) for s in sessions],
            session_ids=list(sessions)), now=NOW)
        side["rollup"].add(rollup)
    x_leaf, x_rows = x["leaves"][X_SESSIONS[0]]
    y_leaf, y_rows = y["leaves"][Y_SESSIONS[0]]
    # X's leaf carried into Y's session, condensed there with Y's own leaf
    env.dag.carry_nodes(Y_SESSIONS[0], [x_leaf])
    y["node"].add(env.node(Y_SESSIONS[0], f"staging condensed {Y_SECRET}",
                           node_ids=[x_leaf, y_leaf], depth=1))
    # a leaf of Y over rows of both owners' sessions
    y["node"].add(env.node(Y_SESSIONS[1], f"staging mixed leaf {Y_SECRET}",
                           store_ids=[x_rows[1], y["leaves"][Y_SESSIONS[1]][1][0]]))
    # a summary of X over a node and a row of Y it cannot read (a lineage whose carry
    # was cleaned up): its sources are withheld, without Y's ids
    x["node"].add(env.node(X_SESSIONS[1], "staging condensed xenial",
                           node_ids=[x["leaves"][X_SESSIONS[1]][0], y_leaf], depth=1))
    x["node"].add(env.node(X_SESSIONS[1], "staging mixed leaf xenial",
                           store_ids=[x["leaves"][X_SESSIONS[1]][1][0], y_rows[2]]))
    # ... and one more level over both, so counts add up across levels
    x["node"].add(env.node(X_SESSIONS[1], "staging top xenial", node_ids=sorted(x["node"])[-2:],
                           depth=2))
    # a leaf of X that the operator's summary model wrote (trove_describe's ``model``)
    x["node"].add(env.dag.add_node(NewNode(
        session_id=X_SESSIONS[0], depth=0, text="staging model leaf xenial", token_count=5,
        source_token_count=40, level=1, model=ROUTE_MODEL, child_store_ids=x_rows[:1])))
    return env, x, y


def _status(session):
    """An engine snapshot whose summary routes failed: an open breaker on the operator's
    model, and a last compaction whose model calls failed naming the endpoint."""
    return lambda: {"session_id": session, "context_length": 64000, "last_prompt_tokens": 9000,
                    "summary_breaker": {ROUTE_MODEL: {"state": "open", "failures": 3,
                                                      "opened_at": NOW}},
                    "last_compaction": {"outcome": "compacted", "at": NOW, "levels": [3, 3],
                                        "summary_problems": {
                                            f"error: ConnectError: https://{ROUTE_ENDPOINT}"
                                            "/v1 refused": 2, "skipped: breaker open": 1}}}


def _visible(env, y_only, node_id):
    """What X may count under one of its nodes: its children that are not Y's, and the
    raw rows reached through them (another owner's node hides what lies under it)."""
    kids = [c for c in env.dag.children(node_id)
            if ("node" if c["kind"] == "node" else "store", c["id"]) not in y_only]
    under = [_visible(env, y_only, c["id"]) for c in kids if c["kind"] == "node"]
    rows = [c["id"] for c in kids if c["kind"] == "message"] + [i for u in under for i in u[1]]
    mixed = len(kids) < env.dag.child_count(node_id) or any(u[2] for u in under)
    return len(kids), rows, mixed


def _count_leaks(env, y_only, value, found=None):
    """Every figure of an answer that counts Y's items: a node's child count or message
    count, the source tokens of a summary built over Y's material, a page of sources whose
    ordinals skip (or hold a placeholder for) Y's children, a cursor past the count."""
    found = [] if found is None else found
    if isinstance(value, list):
        for v in value:
            _count_leaks(env, y_only, v, found)
    if not isinstance(value, dict):
        return found
    for v in value.values():
        _count_leaks(env, y_only, v, found)
    node = value.get("node_id")
    if isinstance(node, int) and ("node", node) not in y_only and env.dag.get_node(node):
        kids, rows, mixed = _visible(env, y_only, node)
        if "child_count" in value and value["child_count"] != kids:
            found.append(("child_count", node, value["child_count"], kids))
        for key in ("descendant_messages", "message_count"):
            if key in value and value[key] != len(rows):
                found.append((key, node, value[key], len(rows)))
        if mixed and value.get("source_tokens") is not None:
            found.append(("source_tokens", node, value["source_tokens"]))
        times = [m["message_at"] if m["message_at"] is not None else m["created_at"]
                 for m in env.store.get_messages(rows).values()]
        for key, edge in (("time_from", min), ("time_to", max)):
            shown = value.get(key)
            if shown is not None and shown not in (edge(times, default=None),
                                                   iso(edge(times, default=None))):
                found.append((key, node, shown))
    if isinstance(value.get("sources"), list) and "source_offset" in value:
        start, page = value["source_offset"], value["sources"]
        if [s.get("ordinal") for s in page] != list(range(start, start + len(page))):
            found.append(("ordinals", [s.get("ordinal") for s in page], start))
        for item in page:
            if item.get("withheld") and not isinstance(item.get("id"), int):
                found.append(("placeholder", item))
        following = value.get("next_source_offset")
        if following is not None and not start + len(page) == following < value["child_count"]:
            found.append(("cursor", start, len(page), following, value["child_count"]))
    return found


def _ids(value, key=None, kind=None):
    """(category, id) of every id-carrying field of a JSON answer (or of the arguments)."""
    found = set()
    if isinstance(value, dict):
        for k, v in value.items():
            found |= _ids(v, k, value.get("kind"))
    elif isinstance(value, list):
        for v in value:
            found |= _ids(v, key, kind)
    elif isinstance(value, int) and not isinstance(value, bool):
        if key in STORE_KEYS or (key == "id" and kind == "message"):
            found.add(("store", value))
        elif key in NODE_KEYS or (key == "id" and kind == "node"):
            found.add(("node", value))
        elif key in ROLLUP_KEYS or (key == "id" and kind == "rollup"):
            found.add(("rollup", value))
    return found


def _arguments(rng, name, x, y):
    """Random arguments of one tool: both owners' real handles, guesses, scopes."""
    every = {k: sorted(x[k] | y[k]) for k in ("store", "node", "rollup")}
    top = max(every["store"] + every["node"] + every["rollup"]) + 3
    sessions = sorted(x["sessions"] | y["sessions"]) + ["tg-y", "*", "", "tg-x-first "]

    def number(kind):
        return rng.choice(every[kind]) if rng.random() < .8 else rng.randint(0, top)

    def ref():
        store = number("store")
        return {"store_id": store, "start": 0, "end": 7, "quote": "staging",
                **({"session_id": rng.choice(sessions)} if rng.random() < .5 else {})}

    values = {"node_id": lambda: number("node"), "store_id": lambda: number("store"),
              "rollup_id": lambda: number("rollup"), "after_store_id": lambda: number("store") - 1,
              "session_id": lambda: rng.choice(sessions),
              "session_scope": lambda: rng.choice(["current", "all", "session"]),
              "node_ids": lambda: [number("node") for _ in range(rng.randint(1, 3))],
              "refs": lambda: [ref() for _ in range(rng.randint(1, 3))],
              "inputs": lambda: [{"ref": ref()} for _ in range(rng.randint(1, 2))],
              "period": lambda: rng.choice(["today", "yesterday", "this week"]),
              "content_scope": lambda: rng.choice(["messages", "externalized", "both"]),
              "include_exact_ref": lambda: True, "explain": lambda: True,
              "full": lambda: True, "limit": lambda: rng.randint(1, 50)}
    properties = schemas.SCHEMAS_BY_NAME[name]["parameters"]["properties"]
    args = {}
    for key in rng.sample(sorted(properties), k=min(len(properties), rng.randint(0, 4))):
        if key in values:
            args[key] = values[key]()
        elif properties[key].get("type") == "string":
            args[key] = rng.choice(["staging", "deploy port", "cache ttl", "retry"])
    if rng.random() < .6:    # most calls name no session: the scope is the caller's
        args.pop("session_id", None)
    if name in ("trove_expand", "trove_describe"):   # one target, as a valid call has
        targets = ["node_id", "store_id"] + (["rollup_id"] if name == "trove_expand" else [])
        for key in (*targets, "externalized_ref"):
            args.pop(key, None)
        key = rng.choice(targets)
        args[key] = values[key]()
    for key in ("query", "prompt", "question", "subject"):
        if key in properties and key not in args:
            args[key] = "staging"
    return args


def test_no_answer_to_one_owner_shows_another_owners_text_or_ids(tmp_path):
    env, x, y = _world(tmp_path)
    y_only = ({("store", i) for i in y["store"]} | {("node", i) for i in y["node"]}
              | {("rollup", i) for i in y["rollup"]})
    rng = random.Random(20261205)
    try:
        # the probe reaches Y from Y's own session: the markers are really there
        mine = tools.dispatch("trove_grep", {"query": "staging", "session_scope": "all",
                                             "limit": 50}, env.ctx(Y_SESSIONS[0]))
        assert Y_SECRET in mine and Y_SESSIONS[1] in mine
        for step in range(500):
            name = rng.choice(tools.TOOL_NAMES)
            caller = rng.choice(X_SESSIONS)
            args = _arguments(rng, name, x, y)
            text = tools.dispatch(name, args, env.ctx(caller, status=_status(caller)))
            echo = json.dumps(args)
            assert Y_SECRET not in text, (step, caller, name, args, text[:600])
            for route in (ROUTE_MODEL, ROUTE_ENDPOINT):
                assert route not in text, (step, caller, name, route, text[:900])
            for session in Y_SESSIONS:
                assert session not in text or session in echo, (step, caller, name, args,
                                                                 text[:600])
            leaked = (_ids(json.loads(text)) & y_only) - _ids(args)
            assert not leaked, (step, caller, name, args, leaked, text[:600])
            counted = _count_leaks(env, y_only, json.loads(text))
            assert not counted, (step, caller, name, args, counted, text[:600])
        # every X node, described and expanded whole, counts only what X may read
        for node in sorted(x["node"]):
            for name in ("trove_describe", "trove_expand"):
                text = tools.dispatch(name, {"node_id": node, "session_scope": "all"},
                                      env.ctx(X_SESSIONS[1]))
                counted = _count_leaks(env, y_only, json.loads(text))
                assert not counted, (name, node, counted, text[:600])
        # the caller still learns that summaries are degraded, not which route
        doctor = json.loads(tools.dispatch("trove_doctor", {}, env.ctx(
            X_SESSIONS[0], status=_status(X_SESSIONS[0]))))
        check = next(c for c in doctor["checks"] if c["name"] == "summary_model")
        assert check["status"] == "warn", check
        # the operator still reads the routes
        operator = tools.dispatch("trove_doctor", {}, env.ctx(
            X_SESSIONS[0], status=_status(X_SESSIONS[0]), operator=True))
        assert ROUTE_MODEL in operator and ROUTE_ENDPOINT in operator
    finally:
        database.forget_database(str(tmp_path / "trove.db"))
