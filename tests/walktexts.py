"""walktexts: the user texts and the scripted model of the random walk (walkkit).

Texts of every kind issue 24 names, sized in real (cl100k) tokens: plain
technical prose and long identifiers (the host's chars/4 over-counts them),
code (under-counts a little) and CJK (under-counts about 4x), and repeated
short lines ("continue", "ok"). Each non-repeated text starts with a turn
marker ("[T12]") so a summary of it can be recognised in a later prompt.
"""
from __future__ import annotations

import random
import re
import threading
from typing import Any, List, Optional

import clikit as ck
import hostkit as hk
import reviewkit

MARKER_RE = re.compile(r"\[T\d+\]")

# ---------------------------------------------------------------------------
# Texts of every kind the issue names
# ---------------------------------------------------------------------------

_PROSE_SUBJECTS = ["The scheduler", "Each worker", "The billing service", "Our deployment", "The cache layer",
                   "The ingestion job", "A retry policy", "The load balancer", "The database migration",
                   "The monitoring stack", "The release train", "The API gateway", "Every tenant"]
_PROSE_VERBS = ["waits for", "records", "rejects", "replays", "batches", "throttles", "validates",
                "compresses", "forwards", "tracks", "summarizes", "retries"]
_PROSE_OBJECTS = ["the pending requests", "every failed payment", "the nightly export", "stale sessions",
                  "the audit trail", "incoming webhooks", "the rollout plan", "each queue partition",
                  "the error budget", "the customer's invoices", "idle connections", "the shard map"]
_PROSE_TAILS = ["before the lease expires.", "when the region fails over.", "after the quota resets.",
                "so the dashboard stays accurate.", "unless an operator pauses it.",
                "because the upstream is slow on Mondays.", "and logs a warning once.",
                "until the backlog drains.", "within the agreed latency budget."]
_IDENT_PARTS = ["Connection", "Pool", "Manager", "Factory", "Configuration", "Serializer", "Transaction",
                "Coordinator", "Replication", "Checkpoint", "Authentication", "Middleware", "Provider",
                "Observability", "Orchestrator", "Reconciliation", "Idempotency", "Partition"]
_SNAKE = ["max_inflight_requests_per_connection", "retry_backoff_multiplier_seconds",
          "kubernetes_horizontal_pod_autoscaler", "distributed_transaction_coordinator_timeout",
          "authentication_middleware_configuration", "replication_checkpoint_interval_milliseconds"]
_CJK = ("系统会在租约过期之前等待所有请求完成。数据库迁移需要在维护窗口内执行，"
        "监控平台记录每一次失败的支付并发出警告。我们的部署流程包括灰度发布和自动回滚，"
        "缓存层负责减少上游服务的压力。每个分区的队列都有独立的重试策略。")
REPEATED = ["continue", "ok", "go on", "yes", "continue"]
KINDS = ("prose", "code", "longword", "cjk", "repeat")


def prose(rng: random.Random, chars: int) -> str:
    """Plain technical prose (chars/4 over-counts it a little)."""
    out: List[str] = []
    size = 0
    while size < chars:
        sentence = " ".join([rng.choice(_PROSE_SUBJECTS), rng.choice(_PROSE_VERBS),
                             rng.choice(_PROSE_OBJECTS), rng.choice(_PROSE_TAILS)])
        if rng.random() < 0.15:
            sentence += "\n\n"
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)[:max(1, chars)].strip()


def longword(rng: random.Random, chars: int) -> str:
    """Identifier-heavy technical text (chars/4 over-counts it about 2x)."""
    out: List[str] = []
    size = 0
    while size < chars:
        if rng.random() < 0.5:
            word = "".join(rng.choice(_IDENT_PARTS) for _ in range(rng.randint(3, 5)))
        else:
            word = rng.choice(_SNAKE) + "_" + rng.choice(_SNAKE)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:max(1, chars)].strip()


def code(rng: random.Random, chars: int) -> str:
    """Python-like code (chars/4 under-counts it a little)."""
    lines: List[str] = []
    size = 0
    n = 0
    while size < chars:
        n += 1
        name = rng.choice(_SNAKE)[:24]
        block = [f"def handler_{n}(request, {name}=None):",
                 f"    if request.get('{name}') is None:",
                 f"        return {{'status': {rng.randint(200, 504)}, 'retry': {rng.randint(1, 9)}}}",
                 f"    for item in request['items'][:{rng.randint(2, 64)}]:",
                 "        item['seen'] = True",
                 "    return request", ""]
        lines.extend(block)
        size += sum(len(line) + 1 for line in block)
    return "\n".join(lines)[:max(1, chars)].strip()


def cjk(rng: random.Random, chars: int) -> str:
    """Chinese technical text (chars/4 under-counts it about 5x)."""
    start = rng.randrange(len(_CJK))
    text = (_CJK * (chars // len(_CJK) + 2))[start:start + max(1, chars)]
    return text.strip()


GENERATORS = {"prose": prose, "code": code, "longword": longword, "cjk": cjk}


# characters per cl100k token of each generator (measured on 20,000 characters);
# chars/4 is the host's estimate, so prose and long words are over-counted by it
# and CJK under-counted about 4x
CHARS_PER_TOKEN = {"prose": 5.8, "code": 3.9, "longword": 7.1, "cjk": 0.95}


def make_text(rng: random.Random, kind: str, tokens: int, marker: Optional[str]) -> str:
    """A user message of about ``tokens`` real (cl100k) tokens."""
    if kind == "repeat":
        return rng.choice(REPEATED)
    chars = max(4, int(tokens * CHARS_PER_TOKEN[kind]))
    body = GENERATORS[kind](rng, chars)
    return f"{marker} {body}" if marker else body


def turn_tokens(rng: random.Random, largest: int = 8000) -> int:
    """A turn size between a few tokens and ``largest``: log-uniform, with one
    turn in four drawn from the top quarter so compactions come often."""
    if rng.random() < 0.25:
        return rng.randint(largest // 4, largest)
    return int(round(3 * (largest / 3) ** rng.random()))


# ---------------------------------------------------------------------------
# The scripted model
# ---------------------------------------------------------------------------

TOOL_WORD = "[use-a-tool]"


class ScriptedModel:
    """Deterministic replies for the fake server.

    Main requests: about a quarter answer exactly "ok" (identical messages),
    the rest "Noted <marker> ..." of varying length. A user message containing
    TOOL_WORD makes the model call ``trove_status`` first. Summaries (the
    non-streaming auxiliary calls) list the turn markers they were given, so a
    summary of summaries still names every turn it covers. A background review
    fork's requests get :class:`reviewkit.ReviewReplies` (an RNG of their own: the
    replies above are the seed's with forks on or off).
    """

    def __init__(self, seed: int = 0, long_reply_share: float = 0.2, ok_share: float = 0.25):
        self.rng = random.Random(seed)
        self.long_reply_share = long_reply_share
        self.ok_share = ok_share
        self.lock = threading.Lock()
        self.replies = 0
        self.review = reviewkit.ReviewReplies(seed)

    def __call__(self, body: dict) -> Any:
        msgs = body.get("messages") or []
        if not hk.is_main_request(body):
            text = "\n".join(hk._content_text(m.get("content")) for m in msgs)
            markers = list(dict.fromkeys(MARKER_RE.findall(text)))
            return "- summary of turns " + (" ".join(markers) if markers else "without markers") + "."
        if reviewkit.is_fork_request(body):
            return self.review(body)
        last_user = ck.request_user_text(body)
        if msgs and msgs[-1].get("role") == "user" and TOOL_WORD in last_user:
            return hk.ToolCall("trove_status", {})
        with self.lock:
            self.replies += 1
            roll = self.rng.random()
            size = self.rng.randint(200, 6000) if self.rng.random() < self.long_reply_share else self.rng.randint(5, 200)
            n = self.replies
        if roll < self.ok_share:
            return "ok"
        found = MARKER_RE.search(last_user)
        head = f"Noted {found.group(0)} (reply {n})." if found else f"Noted (reply {n})."
        filler = prose(random.Random(n), size)
        return f"{head} {filler}".strip()
