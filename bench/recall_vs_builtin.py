#!/usr/bin/env python3
"""Recall of planted facts after many compactions: trove vs Hermes's built-in compressor.

One synthetic coding-agent conversation (default 400 turns, ~2K tokens a turn:
user request, tool calls, tool results, answer) carries 26 planted facts
("the staging database port is 6543", "Priya Raman is on call for billing",
a config line ``pool_size=14``...) spread evenly from turn 4 to 30 turns before
the end, stated by the user, the assistant or inside tool output, plus one
distractor sentence per fact that shares its words but not its value. Every
value occurs exactly once in the conversation (checked).

The same conversation is replayed, in the same run, through
  trove    TroveEngine (fresh database in a temporary folder, deleted after)
           via ``replay.replay``, with ``engine.use_llm(stub)``;
  builtin  hermes-agent 0.19.0 ``agent.context_compressor.ContextCompressor``
           built like the host builds it (threshold 0.50, protect_first_n 3,
           protect_last_n 20, target_ratio 0.20, ``config_context_length`` so it
           makes no network lookup), driven by the same replay loop, with
           ``agent.context_compressor.call_llm`` patched to answer with the stub.
A third replay runs trove with TROVE_CONTEXT_THRESHOLD=0.75 (its default is
0.35; the built-in's trigger is 0.50 raised to 0.75 below 512K and floored at
64,000 tokens), to show how much of the in-prompt difference is that setting.
Same window (65,536 by default), same host overhead (12,500 tokens added to
the counted messages), same token counter (tiktoken cl100k), same summarizer.

The stub summarizer (offline, deterministic; stands in for the auxiliary LLM):
it reads the prompt's source material (trove: the <conversation>/<summaries>
block; built-in: PREVIOUS SUMMARY + NEW TURNS, or TURNS TO SUMMARIZE), splits
it into sentences and keeps the most specific ones (numbers, identifiers,
paths, hosts, versions; a sentence of at least 5 plain words beats a code,
log or config line with the same specifics) until 90% of the prompt's own
token target ("at most N tokens" / "Target ~N tokens"); ties go to the newer
sentence; output is "- sentence" lines in source order. Absolute recall depends
on this stub; the comparison (same stub, same conversation) is the point.

For each fact:
  (a) in prompt: the fact's value is in the final assembled prompt (every
      message's text and tool-call arguments) after the last turn;
  (b) trove only, recovered by tools: within 3 tool calls and 4,000 tokens of
      tool output, all through ``tools.dispatch`` on the engine's ToolContext:
      1. trove_grep(query=<natural question>, limit=5)
      2. trove_expand on the best hit's expand handle (max_tokens = what is left)
      3. if still missing: the best hit was a summary -> expand its child message
         sharing the most words with the question (shown in call 2); else expand
         the second hit. Recovered = the value appears in a tool answer.
The built-in has no tools: only its prompt counts.

With ``--stub deterministic`` trove gets no model at all: every summary is the
deterministic digest (what users get offline or with the breaker open).

    .venv/bin/python bench/recall_vs_builtin.py [--turns 360] [--window 65536]
        [--stub extractive|keep-facts|deterministic|both]
Prints a per-fact table and writes bench/results/recall_vs_builtin.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth  # noqa: E402  (loads the package)

from hermes_trove import config as trove_config  # noqa: E402
from hermes_trove.storage import database
from hermes_trove import tools  # noqa: E402
from hermes_trove.engine import TroveEngine  # noqa: E402
from hermes_trove.operators.replay import HOST_OVERHEAD_TOKENS, replay  # noqa: E402
from hermes_trove.compaction.tokens import get_counter  # noqa: E402

TOOL_BUDGET_TOKENS = 4000
MAX_CALLS = 3


@dataclass(frozen=True)
class Fact:
    value: str          # what must survive (unique in the conversation)
    statement: str      # the sentence planted
    question: str       # how the agent would ask for it later
    where: str          # user | assistant | tool
    distractor: str     # shares the words, not the value


FACTS = [
    Fact("6543", "Heads up: the staging database port is 6543, not the usual default.",
         "which port does the staging database listen on?", "user",
         "The staging database migrations finished without errors after the restart."),
    Fact("retry_backoff_ms=1750", "retry_backoff_ms=1750  # payment client retry backoff",
         "what retry backoff did we configure for the payment client?", "tool",
         "The payment client logs every retry with its attempt number."),
    Fact("release/2026.11-hotfix", "We agreed to cut the hotfix from the branch "
         "release/2026.11-hotfix and nothing else.", "which branch is the hotfix cut from?",
         "assistant", "The hotfix checklist lives in the wiki next to the release notes."),
    Fact("3.11.9", "CI runs Python 3.11.9 on every job; local machines may differ.",
         "what python version does CI use?", "user",
         "The CI job for the docs only builds on the main branch."),
    Fact("enable_vector_cache", "The new search path is guarded by the feature flag "
         "enable_vector_cache until the rollout is done.",
         "what feature flag guards the new search path?", "assistant",
         "Feature flags are listed in the admin panel under settings."),
    Fact("Priya Raman", "Priya Raman is on call for the billing service this week.",
         "who is on call for billing?", "user",
         "The billing service dashboard shows invoices per hour."),
    Fact("acme-trove-archive-eu", "EXPORT_BUCKET=acme-trove-archive-eu  # nightly exports S3 bucket",
         "which S3 bucket do the nightly exports go to?", "tool",
         "Nightly exports take about twenty minutes on a quiet day."),
    Fact("48 MB", "The upload endpoint rejects files larger than 48 MB with a clear error.",
         "what is the maximum upload size?", "assistant",
         "Upload progress is reported to the client in chunks."),
    Fact("17 3 * * *", "BACKUP_CRON=\"17 3 * * *\"  # nightly backup schedule, UTC",
         "when does the nightly backup cron run?", "tool",
         "The backup job writes a marker file when it completes."),
    Fact("120 requests per minute", "The public API rate limit is 120 requests per minute "
         "per token, enforced at the gateway.", "what rate limit does the public API enforce?",
         "user", "The public API documentation needs a new section on pagination."),
    Fact("WORKER_CONCURRENCY=6", "WORKER_CONCURRENCY=6  # queue worker processes",
         "how many queue worker processes did we configure?", "tool",
         "Queue workers restart automatically when they crash."),
    Fact("cache-02.internal", "Redis for sessions lives on cache-02.internal, the other "
         "cache host is for rate limiting.", "which host runs the session redis?", "assistant",
         "Session cookies are signed and expire when the browser closes."),
    Fact("OPS-4471", "The flaky checkout test is tracked in OPS-4471, please link it in the PR.",
         "what ticket tracks the flaky checkout test?", "user",
         "The checkout test suite takes four minutes on CI."),
    Fact("#deploy-watch", "Deployment notifications should go to #deploy-watch on Slack.",
         "which slack channel gets deployment notifications?", "user",
         "Deployment logs are kept for thirty days."),
    Fact("Europe/Lisbon", "Weekly reports are generated in the Europe/Lisbon timezone.",
         "what timezone are the weekly reports generated in?", "assistant",
         "Weekly reports include a chart of open tickets."),
    Fact("/v1/legacy-export", "The endpoint /v1/legacy-export is deprecated and goes away "
         "in March.", "which endpoint is deprecated?", "assistant",
         "The export endpoint streams rows as newline separated JSON."),
    Fact("python:3.11-slim-bookworm", "FROM python:3.11-slim-bookworm AS base  # Dockerfile base image",
         "what docker base image do we use?", "tool",
         "The docker build caches dependencies in a separate layer."),
    Fact("page size of 37", "Admin list views use a default page size of 37 items.",
         "what is the default page size of the admin list views?", "user",
         "Admin list views can be sorted by any column."),
    Fact("900 seconds", "Access tokens expire after 900 seconds; refresh tokens last a week.",
         "how long do access tokens live?", "assistant",
         "Access tokens are validated by the gateway before the request reaches us."),
    Fact("cust_8812x", "The bug only reproduces with customer id cust_8812x.",
         "which customer id reproduces the bug?", "user",
         "Customer ids are opaque strings generated at signup."),
    Fact("a3f9c1e", "git bisect: first bad commit is a3f9c1e (the regression)",
         "which commit introduced the regression?", "tool",
         "The regression tests run nightly against main."),
    Fact("8.5 seconds", "The payment gateway timeout is 8.5 seconds, after that we retry once.",
         "what is the payment gateway timeout?", "user",
         "The payment gateway sandbox is down on Sundays."),
    Fact("83%", "Coverage must stay above 83% or the CI job fails.",
         "what coverage threshold does CI enforce?", "assistant",
         "Coverage reports are uploaded as CI artifacts."),
    Fact("pool_size=14", "pool_size=14  # database connection pool",
         "what database pool size did we set?", "tool",
         "Database connections are recycled every hour."),
    Fact("IBM Plex Sans", "Charts in the dashboard use the IBM Plex Sans font.",
         "which font do the dashboard charts use?", "user",
         "Charts in the dashboard refresh every minute."),
    Fact("v2.14.3", "We pinned the client SDK to v2.14.3 after the breaking change.",
         "which client SDK version did we pin?", "assistant",
         "The client SDK changelog mentions the breaking change."),
]

AREAS = ["auth", "billing", "search", "export", "metrics", "notifications", "uploads", "admin",
         "scheduler", "gateway", "reports", "sessions", "inventory", "checkout", "profiles"]
FILES = ["service", "models", "handlers", "views", "tasks", "client", "schemas", "utils",
         "config", "queries", "serializers", "permissions"]
VERBS = ["refactor", "fix the failing test in", "add logging to", "speed up", "review",
         "document", "clean up", "add type hints to", "split", "simplify the error handling in"]
NOUNS = ["retry loop", "query builder", "cache layer", "serializer", "permission check",
         "pagination", "background job", "validation", "error handling", "rate limiter"]
PROSE = ("the change keeps the old behaviour for existing callers and only touches the new "
         "code path so the risk is low and the tests cover the edge cases we discussed "
         "including empty input large payloads and concurrent writers which used to race "
         "when the worker restarted in the middle of a batch").split()


# ---------------------------------------------------------------- the conversation
def _words(rng: random.Random, n: int) -> str:
    start = rng.randrange(len(PROSE))
    return " ".join(PROSE[(start + i) % len(PROSE)] for i in range(n))


def _path(rng: random.Random) -> str:
    return f"src/{rng.choice(AREAS)}/{rng.choice(FILES)}.py"


def _code(rng: random.Random, chars: int) -> str:
    lines = [f"# {_path(rng)}"]
    n = 1
    while sum(len(x) + 1 for x in lines) < chars:
        name = f"{rng.choice(NOUNS).replace(' ', '_')}_{rng.choice(FILES)}"
        lines.append(f"{n:>4}  def {name}(self, item, limit={rng.randint(1, 99)}):")
        lines.append(f"{n + 1:>4}      return self.{rng.choice(FILES)}.get(item, limit)  # {_words(rng, 6)}")
        n += 2
    return "\n".join(lines)


def _log(rng: random.Random, chars: int) -> str:
    lines = []
    while sum(len(x) + 1 for x in lines) < chars:
        area = rng.choice(AREAS)
        result = rng.choice(["PASSED", "PASSED", "PASSED", "FAILED"])
        lines.append(f"tests/test_{area}.py::test_{rng.choice(NOUNS).replace(' ', '_')}"
                     f"_{rng.randint(1, 99)} {result}")
    passed = sum("PASSED" in x for x in lines)
    lines.append(f"=== {passed} passed, {len(lines) - passed} failed in {rng.randint(1, 59)}.{rng.randint(10, 99)}s ===")
    return "\n".join(lines)


def _prose(rng: random.Random, chars: int) -> str:
    out = []
    while sum(len(x) + 1 for x in out) < chars:
        out.append(f"In {_path(rng)} the {rng.choice(NOUNS)} now handles {_words(rng, rng.randint(8, 20))}.")
    return " ".join(out)


def build_conversation(turns: int, seed: int = 17) -> tuple[list[dict], dict[str, int]]:
    """The messages and, per fact value, the turn it is planted in."""
    rng = random.Random(seed)
    first, last = 4, turns - 30
    plant_at = {first + round(i * (last - first) / (len(FACTS) - 1)): f
                for i, f in enumerate(FACTS)}
    distract_at: dict[int, list[str]] = {}
    for fact in FACTS:
        distract_at.setdefault(rng.randrange(2, turns - 1), []).append(fact.distractor)
    messages: list[dict] = []
    planted: dict[str, int] = {}
    call = 0
    for turn in range(turns):
        fact = plant_at.get(turn)
        extra = " ".join(distract_at.get(turn, []))
        request = (f"Can you {rng.choice(VERBS)} {_path(rng)}? The {rng.choice(NOUNS)} "
                   f"{_words(rng, rng.randint(10, 60))}.")
        if extra:
            request += " " + extra
        if fact and fact.where == "user":
            request += " " + fact.statement
        messages.append({"role": "user", "content": request})
        tool_planted = False
        for _ in range(rng.choice((1, 1, 2, 3))):
            call += 1
            tool = rng.choice(["read_file", "terminal", "search_files"])
            args = ({"path": _path(rng)} if tool == "read_file" else
                    {"command": f"pytest tests/test_{rng.choice(AREAS)}.py -q"} if tool == "terminal"
                    else {"pattern": rng.choice(NOUNS), "path": f"src/{rng.choice(AREAS)}"})
            messages.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": f"call_{call}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args)}}]})
            size = int(min(9000, max(300, rng.lognormvariate(7.9, 0.6))))
            output = _log(rng, size) if tool == "terminal" else _code(rng, size)
            if fact and fact.where == "tool" and not tool_planted:
                tool_planted = True
                lines = output.split("\n")
                lines.insert(rng.randrange(1, len(lines)), fact.statement)
                output = "\n".join(lines)
            messages.append({"role": "tool", "tool_call_id": f"call_{call}", "name": tool,
                             "content": output})
        answer = _prose(rng, rng.randint(300, 1500))
        if fact and fact.where == "assistant":
            answer += " " + fact.statement
        messages.append({"role": "assistant", "content": answer})
        if fact:
            planted[fact.value] = turn
    for fact in FACTS:
        holders = [i for i, m in enumerate(messages) if fact.value in prompt_text([m])]
        if len(holders) != 1:
            raise AssertionError(f"value {fact.value!r} occurs in {len(holders)} messages")
    return messages, planted


def prompt_text(messages: list[dict]) -> str:
    """Everything the model would read of a message list: contents and tool-call arguments."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict)]
        elif content:
            parts.append(str(content))
        for call in m.get("tool_calls") or []:
            parts.append(str(call.get("function", {}).get("arguments", "")))
    return "\n".join(parts)


# ---------------------------------------------------------------- the shared summarizer stub
_SPECIFIC_TOKEN = re.compile(r"\d|_|/|#|=|[a-z][A-Z]|\w\.\w")
_NAME_PAIR = re.compile(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b")
_LABEL = re.compile(r"^\s*\[[^\]\n]{0,120}\]:?\s*")
_counter = get_counter("cl100k_base")
stub_calls = {"trove": 0, "builtin": 0}


def _source_of(prompt: str) -> str:
    for tag in ("conversation", "summaries"):
        start = prompt.find(f"<{tag}>\n")
        end = prompt.rfind(f"\n</{tag}>")
        if 0 <= start < end:
            return prompt[start + len(tag) + 3:end]
    for head, tail in (("PREVIOUS SUMMARY:\n", "\n\nUpdate the summary using this exact structure"),
                       ("TURNS TO SUMMARIZE:\n", "\n\nUse this exact structure:")):
        start, end = prompt.find(head), prompt.find(tail)
        if 0 <= start < end:
            return prompt[start + len(head):end].replace("NEW TURNS TO INCORPORATE:", "")
    return prompt


def _target_of(prompt: str) -> int:
    found = re.search(r"at most (\d+) tokens", prompt) or re.search(r"Target ~(\d+) tokens", prompt)
    return int(found.group(1)) if found else 500


STUB_MODES = ("extractive", "keep-facts", "deterministic")
stub_mode = {"mode": "extractive"}
_FACT_VALUES = tuple(f.value for f in FACTS)


def sentence_score(sentence: str) -> int:
    """How much a summarizer wants this sentence: specific tokens (numbers, identifiers,
    paths, hosts, versions, names; at most 3), +1 for a sentence of at least 5 plain
    words, -2 for a code line; ``keep-facts`` adds 10 for a planted fact (a perfect
    summarizer that never drops one)."""
    tokens = sentence.split()
    specific = sum(1 for t in tokens if _SPECIFIC_TOKEN.search(t)) + len(_NAME_PAIR.findall(sentence))
    prose = sum(1 for t in tokens if re.fullmatch(r"[A-Za-z]{2,}[,.;:!?]?", t)) >= 5
    code = sentence.startswith(("def ", "return ")) or re.match(r"^\d+\s", sentence) is not None
    score = min(3, specific) + (1 if prose else 0) - (2 if code else 0)
    if stub_mode["mode"] == "keep-facts" and any(v in sentence for v in _FACT_VALUES):
        score += 10
    return score


def stub_summary(prompt: str) -> str:
    """Keep the best-scoring sentences of the source, within 90% of the prompt's target;
    ties go to the newer sentence; output in source order."""
    budget = int(_target_of(prompt) * 0.9)
    sentences: list[str] = []
    seen: set[str] = set()
    for line in _source_of(prompt).split("\n"):
        line = _LABEL.sub("", line).strip().lstrip("- ").strip()
        if not line or (line.startswith("[") and line.endswith("]")):
            continue
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", line):
            sentence = sentence.strip()[:240]
            if len(sentence) >= 12 and sentence not in seen:
                seen.add(sentence)
                sentences.append(sentence)
    scores = [sentence_score(x) for x in sentences]
    order = sorted(range(len(sentences)), key=lambda i: (-scores[i], -i))
    chosen, used = set(), 0
    for i in order:
        cost = _counter.count_text(sentences[i]) + 2
        if used + cost > budget:
            continue
        chosen.add(i)
        used += cost
    return "\n".join("- " + sentences[i] for i in sorted(chosen)) or "- (nothing specific)"


def trove_stub(prompt: str, model=None, timeout=None) -> str:
    stub_calls["trove"] += 1
    return stub_summary(prompt)


def builtin_call_llm(**kwargs):
    """Stands in for agent.auxiliary_client.call_llm inside the built-in compressor."""
    stub_calls["builtin"] += 1
    prompt = kwargs["messages"][-1]["content"]
    message = SimpleNamespace(content=stub_summary(prompt))
    return SimpleNamespace(choices=[SimpleNamespace(message=message)])


# ---------------------------------------------------------------- the two engines
class BuiltinAdapter:
    """Hermes's ContextCompressor behind the interface ``replay.replay`` drives."""

    def __init__(self, window: int):
        import agent.context_compressor as cc
        cc.call_llm = builtin_call_llm  # the seam: every summary goes to the stub
        self.inner = cc.ContextCompressor(
            model="bench-model", threshold_percent=0.50, protect_first_n=3, protect_last_n=20,
            summary_target_ratio=0.20, quiet_mode=True, config_context_length=window)
        self.counter = _counter
        self.last_compaction: dict = {}

    def should_compress(self, tokens: int) -> bool:
        return self.inner.should_compress(tokens)

    def compress(self, messages: list, current_tokens: int | None = None) -> list:
        before = len(messages)
        out = self.inner.compress(messages, current_tokens=current_tokens)
        self.inner.update_from_response({"prompt_tokens": HOST_OVERHEAD_TOKENS
                                         + self.counter.count_messages(out)})
        self.last_compaction = {"messages_before": before, "messages_after": len(out),
                                "aborted": self.inner._last_compress_aborted}
        return out

    def ingest(self, messages: list) -> None:
        return None


class PrefixTracker:
    """Counts, at each compaction, how many tokens at the start of the prompt are the
    same as after the previous one: what a provider's prompt cache can still reuse
    (field lesson 9). Wraps the engine's ``compress``."""

    def __init__(self, engine) -> None:
        self.previous: str | None = None
        self.kept: list[int] = []
        inner = engine.compress

        def compress(messages: list, **kwargs) -> list:
            out = inner(messages, **kwargs)
            text = prompt_text(out)
            if self.previous is not None:
                self.kept.append(_counter.count_text(os.path.commonprefix([self.previous, text])))
            self.previous = text
            return out

        engine.compress = compress

    def summary(self) -> dict:
        """Median and 10th percentile of the reused prefix, in tokens."""
        kept = sorted(self.kept) or [0]
        return {"prefix_kept_median_tokens": kept[len(kept) // 2],
                "prefix_kept_p10_tokens": kept[len(kept) // 10]}


def recover(fact: Fact, ctx, count) -> dict:
    """Drive the tools like an agent would (see the module docstring); count calls and tokens."""
    used, calls, trail = 0, 0, []

    def call(name: str, args: dict) -> dict:
        nonlocal used, calls
        out = tools.dispatch(name, args, ctx)
        calls += 1
        used += count(out)
        trail.append(name)
        return {"text": out, "json": json.loads(out)}

    grep = call("trove_grep", {"query": fact.question, "limit": 5})
    found = fact.value in grep["text"]
    hits = grep["json"].get("results") or []
    expanded = None
    if not found and hits and TOOL_BUDGET_TOKENS - used >= 200:
        args = {**hits[0]["expand"]["args"], "max_tokens": TOOL_BUDGET_TOKENS - used}
        expanded = call("trove_expand", args)
        found = fact.value in expanded["text"]
    if not found and calls < MAX_CALLS and TOOL_BUDGET_TOKENS - used >= 200:
        target = None
        words = set(re.findall(r"[a-z0-9]+", fact.question.lower()))
        if hits and hits[0]["kind"] == "summary" and expanded is not None:
            children = [s for s in expanded["json"].get("sources") or [] if s.get("kind") == "message"]
            if children:
                best = max(children, key=lambda s: len(words & set(re.findall(
                    r"[a-z0-9]+", (s.get("content") or "").lower()))))
                target = best.get("expand", {}).get("args") or {"store_id": best.get("store_id")}
        elif len(hits) > 1:
            target = hits[1]["expand"]["args"]
        if target:
            more = call("trove_expand", {**target, "max_tokens": TOOL_BUDGET_TOKENS - used})
            found = fact.value in more["text"]
    return {"recovered": bool(found and used <= TOOL_BUDGET_TOKENS), "calls": calls,
            "tool_tokens": used, "trail": trail,
            "top_hit": (hits[0]["kind"] if hits else None)}


def _trove_variant(folder: Path, window: int, settings: dict) -> TroveEngine:
    cfg = trove_config.load_config({"HERMES_HOME": str(folder),
                                    "TROVE_DATABASE_PATH": str(folder / "trove.db"),
                                    "TROVE_FTS_INTEGRITY_CHECK_INTERVAL_HOURS": "0", **settings})
    engine = TroveEngine(cfg)
    # "deterministic": no model at all, what users get offline or with the breaker
    # open (the built-in still gets the extractive stub, as a reference)
    engine.use_llm(None if stub_mode["mode"] == "deterministic" else trove_stub)
    engine.update_model("bench-model", window)
    engine.on_session_start("recall-bench", platform="cli")
    return engine


def run(turns: int, window: int, mode: str) -> dict:
    stub_mode["mode"] = mode
    stub_calls.update(trove=0, builtin=0)
    messages, planted = build_conversation(turns)
    total_tokens = _counter.count_messages(messages)
    folder = Path(tempfile.mkdtemp(prefix="trove-bench-recall-"))
    try:
        engine = _trove_variant(folder, window, {})
        cfg = engine.config
        started = time.perf_counter()
        trove_prefix = PrefixTracker(engine)
        trove_report = replay(engine, [dict(m) for m in messages], overhead=HOST_OVERHEAD_TOKENS)
        trove_seconds = time.perf_counter() - started

        # The same engine with the trigger at 0.75 of the window (the built-in's own
        # floor below 512K): how much of the in-prompt gap is only the trigger setting.
        alt = _trove_variant(folder / "alt", window, {"TROVE_CONTEXT_THRESHOLD": "0.75"})
        alt_report = replay(alt, [dict(m) for m in messages], overhead=HOST_OVERHEAD_TOKENS)
        alt_prompt = prompt_text(alt_report.final_messages)
        alt_summary = {"compress_calls": alt_report.compactions,
                       "compactions": alt.compression_count,
                       "in_prompt": sum(f.value in alt_prompt for f in FACTS),
                       "final_prompt_tokens": HOST_OVERHEAD_TOKENS
                       + _counter.count_messages(alt_report.final_messages),
                       "threshold_tokens": alt.threshold_tokens}
        database.forget_database(alt.config.resolved_database_path)

        builtin = BuiltinAdapter(window)
        started = time.perf_counter()
        builtin_prefix = PrefixTracker(builtin)
        builtin_report = replay(builtin, [dict(m) for m in messages], overhead=HOST_OVERHEAD_TOKENS)
        builtin_seconds = time.perf_counter() - started

        trove_prompt = prompt_text(trove_report.final_messages)
        builtin_prompt = prompt_text(builtin_report.final_messages)
        ctx = engine.tool_context()
        rows = []
        for fact in FACTS:
            rows.append({"value": fact.value, "turn": planted[fact.value], "where": fact.where,
                         "question": fact.question,
                         "trove_in_prompt": fact.value in trove_prompt,
                         "builtin_in_prompt": fact.value in builtin_prompt,
                         "trove_075_in_prompt": fact.value in alt_prompt,
                         "trove_tools": recover(fact, ctx, _counter.count_text)})
        stored = engine.store.count_messages(engine.canonical_id)
        nodes = engine.dag.stats(engine.canonical_id) if hasattr(engine.dag, "stats") else {}
        database.forget_database(cfg.resolved_database_path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    n = len(FACTS)
    summary = {
        "trove": {"compress_calls": trove_report.compactions,
                  "compactions": engine.compression_count,
                  "in_prompt": sum(r["trove_in_prompt"] for r in rows),
                  "recovered_by_tools": sum(r["trove_tools"]["recovered"] for r in rows),
                  "in_prompt_or_tools": sum(r["trove_in_prompt"] or r["trove_tools"]["recovered"]
                                            for r in rows),
                  "final_prompt_tokens": HOST_OVERHEAD_TOKENS
                  + _counter.count_messages(trove_report.final_messages),
                  "max_prompt_tokens": trove_report.max_prompt_tokens,
                  "threshold_tokens": engine.threshold_tokens, "summarizer_calls": stub_calls["trove"],
                  "stored_messages": stored, "nodes": nodes, "seconds": round(trove_seconds, 1),
                  **trove_prefix.summary()},
        "trove_threshold_0.75": alt_summary,
        "builtin": {"compress_calls": builtin_report.compactions,
                    "compactions": builtin.inner.compression_count,
                    "in_prompt": sum(r["builtin_in_prompt"] for r in rows),
                    "final_prompt_tokens": HOST_OVERHEAD_TOKENS
                    + _counter.count_messages(builtin_report.final_messages),
                    "max_prompt_tokens": builtin_report.max_prompt_tokens,
                    "threshold_tokens": builtin.inner.threshold_tokens,
                    "summarizer_calls": stub_calls["builtin"], "seconds": round(builtin_seconds, 1),
                    **builtin_prefix.summary()},
    }
    return {"stub": mode, "turns": turns, "messages": len(messages),
            "conversation_tokens": total_tokens,
            "window": window, "host_overhead": HOST_OVERHEAD_TOKENS, "facts": n,
            "summary": summary, "rows": rows}


def report(result: dict) -> None:
    s = result["summary"]
    print(f"\nstub summarizer: {result['stub']}")
    print(f"{'turn':>5} {'where':>9} {'value':>26} {'builtin prompt':>14} {'trove prompt':>12}"
          f" {'trove tools (calls, tokens)':>28} {'trove@0.75 prompt':>17}")
    for r in result["rows"]:
        t = r["trove_tools"]
        tools_cell = f"{'yes' if t['recovered'] else 'no'} ({t['calls']}, {t['tool_tokens']})"
        print(f"{r['turn']:>5} {r['where']:>9} {r['value'][:26]:>26} "
              f"{'yes' if r['builtin_in_prompt'] else '-':>14} "
              f"{'yes' if r['trove_in_prompt'] else '-':>12} {tools_cell:>28}"
              f" {'yes' if r['trove_075_in_prompt'] else '-':>17}")
    b, t, a = s["builtin"], s["trove"], s["trove_threshold_0.75"]
    n = result["facts"]
    print(f"built-in: {b['in_prompt']}/{n} in the final prompt; "
          f"{b['compactions']} compactions ({b['compress_calls']} compress calls), "
          f"trigger {b['threshold_tokens']:,}, final prompt {b['final_prompt_tokens']:,} tokens")
    print(f"trove:    {t['in_prompt']}/{n} in the final prompt, "
          f"{t['recovered_by_tools']}/{n} recovered with <= {MAX_CALLS} tool calls and "
          f"<= {TOOL_BUDGET_TOKENS:,} tokens, {t['in_prompt_or_tools']}/{n} either; "
          f"{t['compactions']} compactions ({t['compress_calls']} compress calls), "
          f"trigger {t['threshold_tokens']:,}, final prompt {t['final_prompt_tokens']:,} tokens")
    print(f"prompt start reused from one compaction to the next (median / p10 tokens): "
          f"built-in {b['prefix_kept_median_tokens']:,} / {b['prefix_kept_p10_tokens']:,}; "
          f"trove {t['prefix_kept_median_tokens']:,} / {t['prefix_kept_p10_tokens']:,}")
    print(f"trove with TROVE_CONTEXT_THRESHOLD=0.75: {a['in_prompt']}/{n} in the final prompt; "
          f"{a['compactions']} compactions, trigger {a['threshold_tokens']:,}, "
          f"final prompt {a['final_prompt_tokens']:,} tokens")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--window", type=int, default=65_536)
    parser.add_argument("--stub", choices=STUB_MODES + ("both",), default="both",
                        help="both = every mode")
    args = parser.parse_args(argv)
    modes = STUB_MODES if args.stub == "both" else (args.stub,)
    results = [run(args.turns, args.window, mode) for mode in modes]
    first = results[0]
    print(f"{first['turns']} turns, {first['messages']:,} messages, "
          f"{first['conversation_tokens']:,} tokens; window {first['window']:,}, "
          f"host overhead {first['host_overhead']:,}; {first['facts']} planted facts")
    for result in results:
        report(result)
    synth.save_results("recall_vs_builtin", runs=results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
