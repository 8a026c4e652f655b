"""Recall quality gate: planted facts in a long coding-agent conversation, natural questions.

A seeded generator writes a few hundred messages of coding-agent work (requests,
plans, tool calls, logs, code) with distractors that share vocabulary with the
facts, and plants 20 facts in session A and 6 in session B. Summary nodes are
built over it with the deterministic summarizer (leaves of 16 messages, then
depth-1 nodes over 4 leaves). Each question is stored as the current turn
before the tool runs, as the host does.

A hit is a result that is the planted message or a summary whose lineage
contains it. hit@1, hit@5 and MRR (over the top 10) are printed and held above
floors measured on this suite minus a small margin. Reproduce the figures with:

    .venv/bin/python -m pytest tests/test_recall_quality.py -q -s
"""
import json
from pathlib import Path
import random

import pytest

from hermes_trove.storage.owners import LOCAL_OWNER, Owners
from hermes_trove.compaction import tokens
from hermes_trove import tools
from hermes_trove.config import load_config
from hermes_trove.dag import Dag, NewNode
from hermes_trove.storage.database import Database
from hermes_trove.store import Store
from hermes_trove.compaction.summarize import CircuitBreaker, SourceItem, Summarizer

COUNTER = tokens.get_counter()
START = 1_790_000_000.0
LEAF_SIZE = 16
FANOUT = 4

FACTS_A = [
    ("assistant", "Confirmed: the staging database port is 6543, the production one stays on 5432.",
     "which port does the staging database use?"),
    ("assistant", "We decided to set retry_backoff_ms to 250 with full jitter and a cap of 8 s.",
     "what did we decide about the retry backoff?"),
    ("tool", "runner: ubuntu-22.04\npython: 3.11.7\ncache: pip, restored 412 MB",
     "what python version does the CI runner use?"),
    ("assistant", "Production deploys go to the eu-west-3 region, cluster kestrel-prod.",
     "which region do we deploy the production cluster to?"),
    ("assistant", "The new flag is enable_lazy_thumbnails, default off until QA signs off.",
     "what is the name of the thumbnail feature flag?"),
    ("assistant", "Max upload size is 25 MB, enforced by client_max_body_size in nginx.conf.",
     "what is the maximum upload size?"),
    ("assistant", "The flaky one is test_invoice_rounding in tests/billing/test_totals.py; it "
                  "depends on dict ordering.", "which test was flaky?"),
    ("user", "Let's use allkeys-lru as the Redis eviction policy, memory is tight.",
     "what eviction policy did we choose for redis?"),
    ("assistant", "Rate limit: 120 requests per minute per API token, bursts of 20.",
     "how many requests per minute does the API allow?"),
    ("assistant", "SENTRY_DSN is read from the environment in settings/base.py.",
     "where is the sentry dsn configured?"),
    ("assistant", "Pinned urllib3<2 because botocore 1.29 breaks with urllib3 2.x.",
     "why did we pin urllib3?"),
    ("assistant", "The nightly report cron runs at 02:30 UTC from deploy/cron.yaml.",
     "when does the nightly report job run?"),
    ("assistant", "Access tokens (JWT) expire after 15 minutes; refresh tokens after 30 days.",
     "how long do access tokens live before they expire?"),
    ("user", "Please always format with black and 4-space indentation, no tabs.",
     "what code formatting does the user want?"),
    ("assistant", "Root cause: parse_invoice_date built a timezone-naive datetime, so invoices "
                  "near midnight UTC landed on the wrong day.", "what caused the invoice date bug?"),
    ("assistant", "Migration 0042_add_customer_tier adds the tier column with default 'basic'.",
     "which migration added the customer tier column?"),
    ("assistant", "The staging admin account is ops-admin@example.com (password in the vault).",
     "what is the staging admin email address?"),
    ("tool", "IMAGE            SIZE\napp:slim         310MB\napp:old          1.2GB",
     "how big is the slim docker image?"),
    ("assistant", "The scheduler now uses PostgreSQL advisory locks instead of Redlock.",
     "what locking mechanism does the scheduler use?"),
    ("assistant", "The webhook signing secret rotates every 90 days; current key id whk_2024_q3.",
     "how often is the webhook secret rotated?"),
]
FACTS_B = [
    ("assistant", "For the mobile app we chose Expo SDK 50 with the new architecture enabled.",
     "which Expo SDK version did we pick for the mobile app?"),
    ("assistant", "Push notifications go through OneSignal, app id stored in ONESIGNAL_APP_ID.",
     "which service sends push notifications?"),
    ("user", "The brand colour is #1F6FEB, use it for the primary buttons.",
     "what is the brand colour for buttons?"),
    ("assistant", "Analytics events are batched every 30 seconds to reduce battery drain.",
     "how often are analytics events batched?"),
    ("assistant", "The App Store review was rejected for guideline 4.2 minimum functionality.",
     "why was the app store review rejected?"),
    ("assistant", "Offline storage uses WatermelonDB on top of SQLite.",
     "what offline database does the mobile app use?"),
]

TOPICS = ["billing", "invoices", "auth", "tokens", "deploy", "docker", "database", "migrations",
          "redis", "cache", "api", "tests", "ci", "nginx", "scheduler", "webhooks", "uploads",
          "logging", "metrics", "settings", "thumbnails", "reports", "customers", "search"]
FILES = ["app/models.py", "app/views.py", "billing/totals.py", "auth/jwt.py", "deploy/helm.yaml",
         "settings/base.py", "tests/test_api.py", "scheduler/locks.py", "nginx.conf",
         "Dockerfile", "webhooks/sign.py", "reports/nightly.py", "search/index.py"]
DISTRACTORS = [
    "The production database port stays on 5432 and pgbouncer listens on 6432.",
    "Retry logic for the email sender uses a fixed delay of 2 s, no backoff.",
    "Local development runs python 3.12 but that is not what CI uses.",
    "The staging cluster lives in eu-west-1 for now; we may move it later.",
    "Thumbnail generation is done by a Celery task named make_thumbnail.",
    "The upload endpoint streams files to S3 in 8 MB parts.",
    "Redis is also used for the session store with a TTL of one day.",
    "The API returns 429 with a Retry-After header when throttled.",
    "Docker build cache is stored in the registry with --cache-to.",
    "The scheduler runs jobs every minute and records them in job_runs.",
    "Webhook deliveries are retried five times with exponential delays.",
    "Access logs are shipped to Loki with a retention of 14 days.",
]


def filler(rng: random.Random, index: int) -> list[dict]:
    """One small coding task: request, plan, tool call, tool output, result."""
    topic, other = rng.sample(TOPICS, 2)
    path = rng.choice(FILES)
    call_id = f"call_{index}"
    command = rng.choice(["pytest -q", "git diff --stat", "rg TODO", "make lint", "ls -la"])
    log = "\n".join(f"{rng.choice(['PASSED', 'ok', 'INFO', 'DEBUG'])} {topic} step {i} "
                    f"{rng.randint(1, 999)} ms" for i in range(rng.randint(3, 12)))
    return [
        {"role": "user", "content": f"Can you look at the {topic} code in {path}? "
                                    f"Something about {other} seems off."},
        {"role": "assistant", "content": f"I'll read {path} and check how {topic} interacts "
                                         f"with {other}, then run the tests."},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})}}]},
        {"role": "tool", "tool_call_id": call_id, "name": "terminal", "content": log},
        {"role": "assistant", "content": f"The {topic} path looks fine; I refactored a helper "
                                         f"in {path} and the {other} tests pass."},
    ]


def conversation(rng: random.Random, facts, tasks: int, distractors=()) -> tuple[list, list]:
    """Messages with facts and distractors planted at random task boundaries."""
    messages, planted = [], []
    slots = sorted(rng.sample(range(2, tasks), len(facts) + len(distractors)))
    extra = {slot: item for slot, item in zip(slots, list(facts) + list(distractors))}
    for task in range(tasks):
        messages += filler(rng, task)
        item = extra.get(task)
        if isinstance(item, tuple):
            role, text, question = item
            message = {"role": role, "content": text}
            if role == "tool":
                call_id = f"fact_{task}"
                messages.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": call_id, "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "show"}'}}]})
                message.update(tool_call_id=call_id, name="terminal")
            planted.append((len(messages), question))
            messages.append(message)
        elif item is not None:
            messages.append({"role": "assistant", "content": item})
    for i, message in enumerate(messages):
        message["timestamp"] = START + 60 * i
    return messages, planted


def summarize_session(store: Store, dag: Dag, session: str, store_ids: list[int]) -> None:
    """Leaves over consecutive chunks, then depth-1 nodes over groups of leaves."""
    summarizer = Summarizer(llm_call=None, count_tokens=COUNTER.count_text, models=[],
                            breaker=CircuitBreaker(2, 60), timeout_s=1.0)
    rows = store.get_messages(store_ids)
    leaves = []
    for start in range(0, len(store_ids), LEAF_SIZE):
        chunk = store_ids[start:start + LEAF_SIZE]
        items = [SourceItem(ref=f"m{sid}", role=rows[sid]["role"],
                            text=tools.codec.message_text(tools.codec.decode_message(rows[sid])),
                            tool_name=rows[sid]["tool_name"]) for sid in chunk]
        result = summarizer.summarize(items, budget_tokens=300, depth=0)
        leaves.append(dag.add_node(NewNode(session, 0, result.text, result.tokens, 1000,
                                           result.level, result.model, child_store_ids=chunk)))
    for start in range(0, len(leaves), FANOUT):
        group = leaves[start:start + FANOUT]
        nodes = dag.get_nodes(group)
        items = [SourceItem(ref=f"n{n}", role="summary", text=nodes[n]["text"]) for n in group]
        result = summarizer.summarize(items, budget_tokens=400, depth=1)
        dag.add_node(NewNode(session, 1, result.text, result.tokens, 1000, result.level,
                             result.model, child_node_ids=group))


@pytest.fixture
def suite(tmp_path_factory):
    """A fresh store per test, so questions asked by one tool's run are not history for
    the next."""
    rng = random.Random(20261129)
    db = Database(str(tmp_path_factory.mktemp("recall") / "trove.db"))
    store, dag = Store(db), Dag(db)
    planted = {}
    for session, facts, tasks in (("A", FACTS_A, 70), ("B", FACTS_B, 30)):
        store.ensure_session(session, source="cli")
        Owners(store.db).record(session, LOCAL_OWNER)   # the profile's CLI user
        messages, where = conversation(rng, facts, tasks, DISTRACTORS if session == "A" else ())
        ids = store.ingest(session, messages, now=START).store_ids
        summarize_session(store, dag, session, ids)
        planted[session] = [(ids[i], question) for i, question in where]
    config = load_config(environ={}, hermes_home=tmp_path_factory.mktemp("home"))
    yield store, dag, config, planted
    db.close()


def hit_rank(dag: Dag, results: list[dict], store_id: int) -> int | None:
    """1-based rank of the first result that is the message or a summary above it."""
    for rank, result in enumerate(results, start=1):
        if result["kind"] == "message" and result["store_id"] == store_id:
            return rank
        if result["kind"] == "summary" and store_id in dag.descendant_store_ids(result["node_id"]):
            return rank
    return None


def measure(tool: str, suite, questions) -> dict:
    """Ask every question as the current turn of session A; return hit@1, hit@5, MRR."""
    store, dag, config, _ = suite
    ranks = []
    for store_id, question in questions:
        asking = store.ingest("A", [{"role": "user", "content": question}]).store_ids[0]
        ctx = tools.ToolContext(store=store, dag=dag, config=config,
                                count_tokens=COUNTER.count_text, session_id="A",
                                conversation_id=None, current_turn_store_id=asking,
                                status=dict, llm_call=None, data_dir=Path(store.db.path).parent)
        out = json.loads(tools.dispatch(tool, {"query": question, "limit": 10}, ctx))
        ranks.append(hit_rank(dag, out["results"], store_id))
    n = len(ranks)
    figures = {"questions": n,
               "hit@1": sum(r == 1 for r in ranks) / n,
               "hit@5": sum(r is not None and r <= 5 for r in ranks) / n,
               "mrr": sum(1 / r for r in ranks if r) / n,
               "misses": [q for (_, q), r in zip(questions, ranks) if r is None or r > 5]}
    print(f"\n{tool}: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                     for k, v in figures.items()}))
    return figures


# Floors: the figures measured when this suite was written, minus a margin of
# about one question. Raise them when ranking improves; never lower them to
# make a change pass.
# Measured: trove_grep hit@1 0.95, hit@5 1.00, MRR 0.975 (20 questions);
# trove_recall hit@1 0.923, hit@5 1.00, MRR 0.955 (26 questions, two sessions).
# (Before the ranking of issue #16: 0.90 / 1.00 / 0.933 and 0.846 / 0.962 / 0.891.)
GREP_FLOORS = {"hit@1": 0.90, "hit@5": 0.95, "mrr": 0.93}
RECALL_FLOORS = {"hit@1": 0.88, "hit@5": 0.96, "mrr": 0.91}


def test_grep_recall_quality(suite):
    figures = measure("trove_grep", suite, suite[3]["A"])
    for name, floor in GREP_FLOORS.items():
        assert figures[name] >= floor, (name, figures)


def test_recall_quality_across_sessions(suite):
    questions = suite[3]["A"] + suite[3]["B"]
    figures = measure("trove_recall", suite, questions)
    for name, floor in RECALL_FLOORS.items():
        assert figures[name] >= floor, (name, figures)
