"""Generate samples/coding-session.jsonl: a realistic coding-agent session (deterministic).

Ten planted facts, one every 16 turns, each confirmed in the assistant's answer:
the demo recovers one of them after compaction took it out of the prompt.
"""
import json, random
random.seed(7)
files = ["src/payments/retry.py", "src/payments/client.py", "src/api/routes.py", "src/db/pool.py",
         "tests/test_retry.py", "config/staging.yaml", "src/workers/queue.py", "docs/ops.md",
         "src/auth/tokens.py", "Makefile"]
facts = [
 ("The staging database listens on port 6543, not the default 5432.", "config/staging.yaml"),
 ("We decided to use exponential backoff with a base of 250ms and a cap of 8 seconds.", "src/payments/retry.py"),
 ("The flaky test was test_refund_after_timeout; it failed because the fake clock was not advanced.", "tests/test_retry.py"),
 ("The queue worker must ack messages only after the database commit.", "src/workers/queue.py"),
 ("Auth tokens expire after 900 seconds; the refresh happens at 80% of the lifetime.", "src/auth/tokens.py"),
 ("The connection pool size is 12 per worker, decided after the load test on Tuesday.", "src/db/pool.py"),
 ("The error 'ConnectionResetError: [Errno 104]' came from the payment gateway closing idle sockets.", "src/payments/client.py"),
 ("Release v2.4.1 is blocked until the migration 0042_add_refund_index is applied.", "docs/ops.md"),
 ("The user prefers pytest -x -q and short commit messages in the imperative mood.", "Makefile"),
 ("Rate limit for the /v1/refunds route is 30 requests per minute per merchant.", "src/api/routes.py"),
]
topics = ["retry logic", "refund endpoint", "queue worker", "connection pool", "token refresh",
          "staging config", "flaky test", "rate limits", "migration", "logging"]
lines = []
call = 0
def code_block(path, n):
    body = []
    for i in range(n):
        body.append(f"    {random.choice(['result', 'value', 'attempt', 'delay', 'payload'])}_{i} = "
                    f"{random.choice(['compute', 'fetch', 'retry', 'parse', 'validate'])}_{random.choice(['step','call','item'])}({i})")
    return f"# {path}\ndef handler(request):\n" + "\n".join(body) + "\n    return result_0\n"
for turn in range(160):
    topic = topics[turn % len(topics)]
    fact = facts[(turn // 16) % len(facts)] if turn % 16 == 3 else None
    ask = f"Let's look at the {topic} next." if not fact else f"Note for later: {fact[0]} Can you check {fact[1]}?"
    if turn % 7 == 0:
        ask = "ok, continue"
    lines.append({"role": "user", "content": ask})
    for step in range(random.randint(1, 3)):
        call += 1
        path = fact[1] if fact and step == 0 else random.choice(files)
        tool = random.choice(["read_file", "terminal", "search_files"])
        args = {"path": path} if tool == "read_file" else ({"command": f"pytest -x -q tests/ -k {topic.split()[0]}"} if tool == "terminal" else {"pattern": topic.split()[0], "path": "src"})
        cid = f"call_{call:04d}"
        lines.append({"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]})
        if tool == "read_file":
            out = code_block(path, random.randint(8, 30))
        elif tool == "terminal":
            out = "\n".join(f"tests/test_{topic.split()[0]}.py::test_case_{i} PASSED" for i in range(random.randint(5, 20))) + f"\n==== {random.randint(5,20)} passed in {random.random()*3:.2f}s ===="
        else:
            out = "\n".join(f"{random.choice(files)}:{random.randint(1,300)}: {topic.split()[0]} = configure()" for _ in range(random.randint(3, 12)))
        lines.append({"role": "tool", "tool_call_id": cid, "name": tool, "content": out})
    answer = f"I checked the {topic}. " + (f"Confirmed: {fact[0]} " if fact else "") + \
        " ".join(random.choice(["The change is small.", "Tests pass locally.", "I kept the public API unchanged.",
                                "I added a regression test.", "Nothing else depends on this path."]) for _ in range(4))
    lines.append({"role": "assistant", "content": answer})
with open(__import__("pathlib").Path(__file__).with_name("coding-session.jsonl"), "w") as f:
    for m in lines:
        f.write(json.dumps(m, ensure_ascii=False) + "\n")
print(len(lines))
