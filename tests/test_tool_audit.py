"""Adversarial checks of the trove_* tools as the host calls them: paging that always
advances and always reassembles the exact original, at every cap; scope kept across
continuations; a seeded generative walk over the argument space (scope, owners, caps)."""
import json

import pytest

from hermes_trove import schemas, tools
from hermes_trove.dag import NewNode
from hermes_trove.storage import database, payloads
from hermes_trove.storage.owners import Owners

from enginekit import make_engine
from test_tools import COUNTER, Env


def _dispatch(ctx, name, args, cap):
    """One call as the host makes it when ``ctx`` is an engine (``handle_tool_call``),
    else through the dispatcher; the answer is JSON within ``cap``."""
    text = (ctx.handle_tool_call(name, args, messages=[]) if hasattr(ctx, "handle_tool_call")
            else tools.dispatch(name, args, ctx))
    assert COUNTER.count_text(text) <= cap, (name, args)
    return json.loads(text)


def _page_all(ctx, first_args, cap, key=None, min_piece=1):
    """Follow a tool's own ``expand`` handles to the end; the reassembled content (and,
    for a message, its tool calls)."""
    text, calls, args = "", "", dict(first_args)
    for _ in range(5000):
        page = _dispatch(ctx, "trove_expand", args, cap)
        assert "error" not in page, page
        holder = page[key] if key else page
        assert holder.get("content_offset", 0) == len(text)
        text += holder.get("content") or ""
        calls += holder.get("tool_calls") or ""
        if not holder["has_more"]:
            return (text, calls) if key else text
        assert len(holder.get("content") or holder.get("tool_calls") or "") >= min_piece
        following = holder["expand"]["args"]
        assert (following.get("content_offset", 0), following.get("tool_calls_offset", 0)) > \
            (holder.get("content_offset", 0), holder.get("tool_calls_offset", 0)), "no progress"
        args = {**following, **{k: v for k, v in first_args.items() if k == "max_tokens"}}
    raise AssertionError("paging did not end")


@pytest.mark.parametrize("max_tokens", [200, 300, 399, 1000])
def test_externalized_payload_pages_back_exactly_at_small_caps(tmp_path, max_tokens):
    """A payload page's text gets what its measured metadata leaves: a fixed 400-token
    reserve gave caps under ~640 a 'does not fit' error or empty pages whose cursor
    never moved. max_tokens has the floor of the configured cap (256): at 200 the two
    copies of the ref left a page a character or two."""
    engine = make_engine(tmp_path, window=200_000, large_output_externalization_enabled="true",
                         large_output_externalization_threshold_chars=2000)
    log = "".join(f"line {i}: ok ünï 日本 \x00\n" for i in range(150 if max_tokens < 300 else 400))
    engine.ingest([{"role": "user", "content": "run"},
                   {"role": "assistant", "content": "", "tool_calls": [{
                       "id": "c1", "type": "function",
                       "function": {"name": "terminal", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": log}])
    [ref] = payloads.refs_in(engine.store.session_messages("sess")[2]["content"])
    ctx = engine                       # the host's way in: handle_tool_call
    cap = max(256, min(max_tokens, engine.config.tool_response_max_tokens))
    assert _page_all(ctx, {"externalized_ref": ref, "max_tokens": max_tokens}, cap,
                     min_piece=5) == log


@pytest.fixture
def carried_env(tmp_path, backend):
    return Env(tmp_path, backend[1])       # forgotten with the backend (tests/pgkit.py)


def test_a_carried_message_of_an_ownerless_session_pages_to_its_end(carried_env):
    """The continuation of a row of another session reaches it the way it was read: a
    row under a carried node through its lineage. Naming its session (as continuations
    did) is refused when that session has no owner recorded."""
    env = carried_env
    env.store.ensure_session("P", source="cli")          # an older session, no owner
    text = "carried ünïcødé 日本 \x00 " * 400
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "t", "arguments": json.dumps({"x": "y" * 3000})}}]
    ids = env.ingest("P", [{"role": "assistant", "content": text, "tool_calls": calls}])
    leaf = env.node("P", "summary", store_ids=ids)
    env.dag.carry_nodes("A", [leaf])
    ctx = env.ctx("A")
    cap = env.config.tool_response_max_tokens
    first = _dispatch(ctx, "trove_expand", {"node_id": leaf}, cap)["sources"][0]
    assert first["has_more"] and first["expand"]["args"].get("session_id") is None
    content, tool_calls = _page_all(ctx, {"store_id": ids[0], "max_tokens": 300}, 300, "message")
    assert content == text and json.loads(tool_calls) == calls
    # the scope it uses opens nothing else of P
    other = env.ingest("P", [{"role": "user", "content": "not carried"}])
    assert "error" in _dispatch(ctx, "trove_expand", {"store_id": other[0],
                                                      "session_scope": "all"}, cap)


def test_the_payload_of_a_carried_row_is_as_readable_as_the_row(tmp_path, backend):
    """A tool result under a node carried into this session shows its placeholder; the
    exact original behind it opens from here too (it answered 'not found in this scope',
    and the session it suggested naming has no owner, so nothing opened it)."""
    from hermes_trove.ingest.policy import policy_for
    env = Env(tmp_path, backend[1], large_output_externalization_enabled="true",
              large_output_externalization_threshold_chars=2000)
    try:
        policy = policy_for(env.config)
        env.store.ensure_session("P", source="cli")      # an older session, no owner
        logs = ["".join(f"{word} line {i}\n" for i in range(300)) for word in ("kept", "other")]
        rows = []
        for n, log in enumerate(logs):
            turn = [{"role": "assistant", "content": "", "tool_calls": [{
                        "id": f"c{n}", "type": "function",
                        "function": {"name": "terminal", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": f"c{n}", "name": "terminal", "content": log}]
            rows.append(env.store.ingest("P", turn, encoded=[policy.prepare(m) for m in turn],
                                         now=1_795_000_000.0).store_ids)
        env.dag.carry_nodes("A", [env.node("P", "ran the job", store_ids=rows[0])])
        ctx = env.ctx("A", payloads=policy.payloads)
        cap = env.config.tool_response_max_tokens
        kept, other = (payloads.refs_in(env.store.get_message(r[1])["content"])[0] for r in rows)
        assert _page_all(ctx, {"externalized_ref": kept}, cap) == logs[0]
        assert _dispatch(ctx, "trove_describe", {"externalized_ref": kept}, cap)["size"]
        for scope in ({}, {"session_scope": "all"}):   # P's other payload stays closed
            assert "not found" in _dispatch(ctx, "trove_expand",
                                            {"externalized_ref": other, **scope}, cap)["error"]
    finally:
        database.forget_database(backend[1])


@pytest.mark.parametrize("scope", [{"session_scope": "all"}, {"session_id": "B"}])
def test_payload_hits_of_another_session_carry_the_scope_they_need(tmp_path, backend, scope):
    """A payload hit's expand handle is a complete call, as a message hit's is: a bare
    ref found in another session answered 'not found in this scope'."""
    from hermes_trove.ingest.policy import policy_for
    env = Env(tmp_path, backend[1], large_output_externalization_enabled="true",
              large_output_externalization_threshold_chars=2000)
    try:
        policy = policy_for(env.config)
        log = "".join(f"checksum kestrel mismatch {i}\n" for i in range(200))
        turn = [{"role": "assistant", "content": "", "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "terminal", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": log}]
        env.store.ingest("B", turn, encoded=[policy.prepare(m) for m in turn],
                         now=1_795_000_000.0)
        ctx = env.ctx("A", payloads=policy.payloads)
        cap = env.config.tool_response_max_tokens
        for content_scope, key in (("externalized", "results"), ("both", "externalized_results")):
            found = _dispatch(ctx, "trove_grep", {"query": "checksum kestrel", "content_scope":
                                                  content_scope, **scope}, cap)[key]
            assert len(found) == 1
            assert _page_all(ctx, found[0]["expand"]["args"], cap) == log
    finally:
        database.forget_database(backend[1])


@pytest.mark.parametrize("cap_args", [{"max_tokens": 200}, {}])
def test_a_message_with_big_other_fields_stays_readable_at_a_small_cap(tmp_path, backend,
                                                                          cap_args):
    """A message's other fields (reasoning, up to 2,000 characters) are left out, named in
    ``fields_omitted``, when they alone would take over half the cap: they made expand
    and load_session answer 'does not fit' at the smallest caps."""
    env = Env(tmp_path, backend[1], tool_response_max_tokens=256)
    try:
        message = {"role": "assistant", "content": "hello there " * 40,
                   "reasoning": "因为所以 " * 350}
        [sid] = env.ingest("A", [message])
        ctx = env.ctx("A")
        cap = cap_args.get("max_tokens", 256)
        content, _ = _page_all(ctx, {"store_id": sid, **cap_args}, cap, "message")
        assert content == message["content"]
        page = _dispatch(ctx, "trove_load_session", {}, 256)
        assert page["messages"][0]["fields_omitted"] == ["reasoning"]
        small = {"role": "assistant", "content": "hi", "name": "bot"}
        [kept] = env.ingest("A", [small])
        assert _dispatch(ctx, "trove_expand", {"store_id": kept, **cap_args},
                         cap)["message"]["fields"] == {"name": "bot"}
    finally:
        database.forget_database(backend[1])


def test_an_image_part_payload_opens_from_its_row_and_not_from_another_owner(tmp_path, backend):
    """An image in a multimodal message moves to a payload; its row's search text shows
    it as ``[image]``, so the ref's hash was no FTS token and the exact original answered
    'not found in this scope' from the very session that holds it."""
    import base64
    import random
    from hermes_trove.ingest.policy import policy_for
    env = Env(tmp_path, backend[1])
    try:
        policy = policy_for(env.config)
        uri = "data:image/png;base64," + base64.b64encode(random.Random(3).randbytes(6000)).decode()
        message = {"role": "user", "content": [{"type": "text", "text": "look"},
                                               {"type": "image_url", "image_url": {"url": uri}}]}
        [sid] = env.store.ingest("A", [message], encoded=[policy.prepare(message)],
                                 now=1_795_000_000.0).store_ids
        ctx = env.ctx("A", payloads=policy.payloads)
        cap = env.config.tool_response_max_tokens
        [ref] = _dispatch(ctx, "trove_expand", {"store_id": sid}, cap)["message"]["externalized_refs"]
        assert _page_all(ctx, {"externalized_ref": ref}, cap) == uri
        assert _dispatch(ctx, "trove_describe", {"externalized_ref": ref}, cap)["kind"] == "data_uri"
        env.store.ensure_session("C", source="telegram")
        Owners(env.db).record("C", "someone-else", platform="telegram")
        for scope in ({}, {"session_scope": "all"}):
            assert "not found" in _dispatch(env.ctx("C", payloads=policy.payloads), "trove_expand",
                                            {"externalized_ref": ref, **scope}, cap)["error"]
    finally:
        database.forget_database(backend[1])


def test_payloads_in_tool_call_arguments_are_listed_and_open(tmp_path, backend):
    """A base64 run in tool-call arguments moves to a payload as one in content does; the
    message item listed only the content's refs."""
    import base64
    import random
    from hermes_trove.ingest.policy import policy_for
    env = Env(tmp_path, backend[1])
    try:
        policy = policy_for(env.config)
        data = base64.b64encode(random.Random(5).randbytes(9000)).decode()
        message = {"role": "assistant", "content": "uploading", "tool_calls": [{
            "id": "u1", "type": "function",
            "function": {"name": "upload", "arguments": json.dumps({"data": data})}}]}
        [sid] = env.store.ingest("A", [message], encoded=[policy.prepare(message)],
                                 now=1_795_000_000.0).store_ids
        ctx = env.ctx("A", payloads=policy.payloads)
        cap = env.config.tool_response_max_tokens
        item = _dispatch(ctx, "trove_expand", {"store_id": sid}, cap)["message"]
        assert item["externalized_refs"] == payloads.refs_in(item["tool_calls"])
        assert _page_all(ctx, {"externalized_ref": item["externalized_refs"][0]}, cap) == data
    finally:
        database.forget_database(backend[1])


@pytest.mark.parametrize("asked", [-5, 0])
def test_expand_query_clamps_a_budget_below_one_and_says_so(carried_env, asked):
    """context_max_tokens is a count argument: clamped and reported. Zero or less packed
    nothing and answered 'skipped: no evidence found' beside evidence it never read."""
    env = carried_env
    env.ingest("A", [{"role": "user", "content": "the staging port is 6543"}])
    out = _dispatch(env.ctx("A"), "trove_expand_query",
                    {"prompt": "port?", "query": "staging port", "context_max_tokens": asked},
                    env.config.tool_response_max_tokens)
    assert out["context_max_tokens_clamped_from"] == asked
    assert out["evidence_refs"] and not out["llm"].startswith("skipped")


# ---------------------------------------------------------------- seeded generative walk
OWNERS = {"A": "u1", "B": "u1", "C": "u2", "D": None, "P": None}   # P: carried into A


def _marker(session: str) -> str:
    return f"zq{session.lower()}mark"


def _world(tmp_path, target, cap):
    """Five sessions (two of one owner, one of another, two of none, one carried into
    A), each with text, NUL and lone surrogates, tool calls, a payload, multimodal
    parts, a long reply with a name field, and a depth-1 summary over two leaves."""
    from hermes_trove.ingest.policy import policy_for
    env = Env(tmp_path, target, tool_response_max_tokens=cap,
              large_output_externalization_enabled="true",
              large_output_externalization_threshold_chars=2000)
    policy = policy_for(env.config)
    pool = {"ids": [], "nodes": [], "refs": []}
    for session, owner in OWNERS.items():
        env.store.ensure_session(session, source="cli")
        if owner:
            Owners(env.db).record(session, owner, platform="cli")
        mark = _marker(session)
        turn = [{"role": "user", "content": f"{mark} deploy staging port 6543 \x00 \ud800 日本"},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": f"c{session}", "type": "function",
                    "function": {"name": "terminal", "arguments": json.dumps({"cmd": mark * 40})}}]},
                {"role": "tool", "tool_call_id": f"c{session}", "name": "terminal",
                 "content": "".join(f"{mark} line {i} output\n" for i in range(300))},
                {"role": "user", "content": [{"type": "text", "text": f"{mark} parts"},
                                             {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
                {"role": "assistant", "content": f"{mark} done " + "long " * 3000, "name": "bot"}]
        ids = env.store.ingest(session, turn, encoded=[policy.prepare(m) for m in turn],
                               now=1_795_000_000.0 - 3600).store_ids
        leaves = [env.node(session, f"{mark} summary staging", store_ids=ids[:3]),
                  env.node(session, f"{mark} summary two", store_ids=ids[3:])]
        top = env.node(session, f"{mark} overview", node_ids=leaves, depth=1)
        pool["ids"] += ids
        pool["nodes"] += [*leaves, top]
        pool["refs"] += [r for i in ids for r in payloads.refs_in(
            env.store.get_message(i)["content"] or "")]
        if session == "P":
            env.dag.carry_nodes("A", [leaves[0]])
    return env, policy, pool


_TEXTS = ["A", "B", "C", "D", "P", "", " ", "../etc/passwd", "/etc/passwd", "*", '"', "NEAR(a b)",
          "a OR b", "tags : s41", "'; DROP TABLE messages; --", "\x00", "\ud800", "today",
          "last week", "2026-13-45", "1e999", "-1", "99999999999999999999", "staging", "all",
          "current", "session", "hybrid", "user", "true", "x" * 3000]


def _value(rng, pool):
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(pool["ids"] + pool["nodes"] + [0, -1, 2**63, -2**63, 10**30])
    if roll < 0.6:
        return rng.choice(_TEXTS + pool["refs"])
    if roll < 0.7:
        return rng.choice([True, False, None, 1.5, float("nan"), float("inf"), 3.0])
    if roll < 0.8:
        return rng.choice([[], [1, 2], {"a": 1}, [{"x": 1}], ["s"]])
    return rng.randint(-5, 300)


def _opens(session, caller, name, args) -> bool:
    """Whether ``caller`` may see ``session``'s rows through these arguments."""
    if session == caller or (session == "P" and caller == "A"):
        return True
    if OWNERS[session] is None or OWNERS[session] != OWNERS[caller]:
        return False
    return (name == "trove_recall" or args.get("session_scope") == "all"
            or args.get("session_id") == session)


@pytest.mark.parametrize("cap", [256, 4000])
def test_a_seeded_walk_over_the_argument_space_keeps_every_promise(tmp_path, backend, cap):
    """Random calls of every reading tool from every session (ids of other owners'
    rows, path-like and FTS-syntax strings, payload refs, huge and negative numbers,
    wrong types, unknown keys): each answer is JSON within the cap; nothing of a
    session the call may not open appears (markers not echoed from the arguments);
    an error names the problem, never an exception class; and every ``expand``
    handle of a page with more opens its next page."""
    import random
    env, policy, pool = _world(tmp_path, backend[1], cap)
    names = ["trove_grep", "trove_expand", "trove_describe", "trove_load_session",
             "trove_recent", "trove_expand_query", "trove_recall", "trove_status"]
    rng = random.Random(20261205 + cap)
    try:
        for _ in range(400):
            name, caller = rng.choice(names), rng.choice("AAABCD")
            keys = list(schemas.SCHEMAS_BY_NAME[name]["parameters"]["properties"])
            args = {rng.choice(keys + ["bogus"]): _value(rng, pool)
                    for _ in range(rng.randint(0, 5))}
            if rng.random() < .5:   # half the calls keep only well-typed values
                args = {k: v for k, v in args.items() if k != "bogus" and isinstance(
                    v, {"integer": int, "string": str, "boolean": bool}.get(
                        schemas.SCHEMAS_BY_NAME[name]["parameters"]["properties"][k]["type"],
                        object))}
            if name in ("trove_expand", "trove_describe") and rng.random() < .5:
                key = rng.choice(["store_id", "node_id", "externalized_ref"])
                args = {k: v for k, v in args.items() if k not in ("store_id", "node_id",
                                                                   "externalized_ref")}
                args[key] = rng.choice(pool[{"store_id": "ids", "node_id": "nodes",
                                             "externalized_ref": "refs"}[key]])
            if name in ("trove_grep", "trove_recall", "trove_expand_query") and rng.random() < .7:
                args.update(query=rng.choice(_TEXTS + ["zqbmark", "zqcmark"]), prompt="what")
            ctx = env.ctx(caller, payloads=policy.payloads)
            text = tools.dispatch(name, args, ctx)
            assert COUNTER.count_text(text) <= cap, (name, args)
            out, echo = json.loads(text), json.dumps(args, default=str)
            for session in OWNERS:
                if _marker(session) in text and _marker(session) not in echo:
                    assert _opens(session, caller, name, args), (session, caller, name, args)
            if "error" in out:
                assert "Error:" not in out["error"] and "does not fit" not in out["error"], \
                    (name, args, out)
            for holder in (out, out.get("message") or {}):
                if holder.get("has_more") and isinstance(holder.get("expand"), dict):
                    following = tools.dispatch("trove_expand", holder["expand"]["args"], ctx)
                    assert "error" not in json.loads(following), (name, args, following)
    finally:
        database.forget_database(backend[1])


@pytest.mark.parametrize("cap", [256, 4000])
def test_every_target_from_every_session_reads_to_its_end_or_is_refused(tmp_path, backend, cap):
    """Each message, summary and payload, asked from each session with a random scope and
    page size: either a clear refusal, or pages within the cap that the tool's own
    handles follow to the end, reassembling the stored text, and showing only what
    that caller may open."""
    import random
    env, policy, pool = _world(tmp_path, backend[1], cap)
    rng = random.Random(7 + cap)
    targets = ([("store_id", i) for i in pool["ids"]] + [("node_id", n) for n in pool["nodes"]]
               + [("externalized_ref", r) for r in pool["refs"]])
    try:
        for caller in "ABCD":
            ctx = env.ctx(caller, payloads=policy.payloads)
            for key, target in targets:
                scope = rng.choice([{}, {"session_scope": "all"}, {"session_id": "B"}])
                size = rng.choice([{}, {"max_tokens": 200}, {"max_tokens": 300}])
                if caller == "C" and "session_id" in scope:
                    continue                    # B is not C's: a refusal, checked above
                first = _dispatch(ctx, "trove_expand", {key: target, **scope, **size},
                                  max(256, min(cap, size.get("max_tokens", cap))))
                if "error" in first:
                    assert "Error:" not in first["error"] and "does not fit" not in first["error"]
                    continue
                text = json.dumps(first)
                for session in OWNERS:
                    if _marker(session) in text:
                        assert _opens(session, caller, "trove_expand", scope), (caller, key)
                if key == "node_id":
                    continue
                holder = "message" if key == "store_id" else None
                content, _ = (_page_all(ctx, {key: target, **scope, **size},
                                        max(256, min(cap, size.get("max_tokens", cap))), holder)
                              if holder else (_page_all(ctx, {key: target, **scope, **size},
                                              max(256, min(cap, size.get("max_tokens", cap)))),
                                              None))
                if key == "store_id":
                    assert content == (env.store.get_message(target)["content"] or "")
                else:
                    assert content == policy.payloads.get_text(target)
    finally:
        database.forget_database(backend[1])


def test_a_placeholder_row_of_another_session_pages_at_the_smallest_cap(tmp_path, backend):
    """A tool row holding a payload placeholder, read from another session at the
    floor of max_tokens: its refs list goes (``externalized_refs_omitted``) once its text
    is cut to its least, instead of the whole answer being 'does not fit'."""
    env, policy, pool = _world(tmp_path, backend[1], 256)
    try:
        ctx = env.ctx("A", payloads=policy.payloads)
        row = next(r for r in env.store.session_messages("B") if r["role"] == "tool")
        content, _ = _page_all(ctx, {"store_id": row["store_id"], "session_id": "B",
                                     "max_tokens": 200}, 256, "message")
        assert content == row["content"] and payloads.refs_in(content)
    finally:
        database.forget_database(backend[1])


def test_exact_refs_shrink_with_the_piece_they_quote(tmp_path, backend):
    """With include_exact_ref, a page's quote is the content piece shown, also when the
    renderer cuts that piece to fit: the quote kept the whole piece (a second copy the
    cut could not shorten), so a payload placeholder row did not fit the smallest cap
    and a long row's quote was not what was shown."""
    env, policy, pool = _world(tmp_path, backend[1], 256)
    try:
        ctx = env.ctx("A", payloads=policy.payloads)
        for row in env.store.session_messages("A"):
            args, text = {"store_id": row["store_id"], "include_exact_ref": True}, ""
            for _ in range(2000):
                item = _dispatch(ctx, "trove_expand", args, 256)["message"]
                piece = item.get("content") or ""
                if not piece:   # an empty quote supports nothing: no ref is handed out
                    assert "exact_ref" not in item and item["exact_ref_omitted"]
                else:
                    ref = item["exact_ref"]
                    assert ref["quote"] == piece == row["content"][ref["start"]:ref["end"]]
                text += piece
                if not item["has_more"] or "next_content_offset" not in item:
                    break
                args = {**item["expand"]["args"], "include_exact_ref": True}
            assert text == (row["content"] or "")
    finally:
        database.forget_database(backend[1])
