"""Replaying a saved conversation through the engine, turn by turn, as the host would.

Used by the offline demo, by ``scripts/trove.py replay`` (try settings on your
own transcript before switching the engine on) and by the benchmarks. The loop
mirrors the host: the list grows a turn at a time, and whenever the prompt
estimate reaches the trigger, ``compress`` replaces the list with its result.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# What the host adds around the messages (system prompt + tool schemas), from
# the host reference: about 12.5K tokens.
HOST_OVERHEAD_TOKENS = 12_500


class TranscriptError(ValueError):
    """The transcript file cannot be read as OpenAI-format messages."""


VALID_ROLES = ("system", "user", "assistant", "tool")


def load_transcript(path: str | Path) -> list[dict]:
    """Messages from a JSON list, a ``{"messages": [...]}`` object, or JSONL (one per line)."""
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            messages = json.loads(text)
        elif stripped.startswith("{") and "\n{" not in stripped.strip():
            data = json.loads(text)
            messages = data.get("messages") if isinstance(data, dict) else None
        else:
            messages = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise TranscriptError(f"{path}: not JSON or JSONL ({exc})") from exc
    if not isinstance(messages, list):
        raise TranscriptError(f"{path}: expected a list of messages with a 'role' each")
    for number, message in enumerate(messages, 1):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in VALID_ROLES:
            raise TranscriptError(f"{path}: message {number} has no valid role ({role!r}; "
                                  f"expected one of {', '.join(VALID_ROLES)}); nothing was "
                                  "stored")
    return messages


def split_turns(messages: list[dict]) -> list[list[dict]]:
    """Consecutive groups that each start at a user message (a leading group may not)."""
    turns: list[list[dict]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


@dataclass
class ReplayReport:
    """What a replay did."""

    turns: int = 0
    messages: int = 0
    compactions: int = 0
    max_prompt_tokens: int = 0
    seconds: float = 0.0
    outcomes: list[dict] = field(default_factory=list)
    final_messages: list[dict] = field(default_factory=list)


def replay(engine, messages: list[dict], *, overhead: int = HOST_OVERHEAD_TOKENS,
           on_turn: Callable[[int, int, ReplayReport], None] | None = None) -> ReplayReport:
    """Feed ``messages`` to ``engine`` a turn at a time; compact when it asks."""
    started = time.perf_counter()
    report = ReplayReport(messages=len(messages))
    live: list[dict] = []
    turns = split_turns(messages)
    for index, turn in enumerate(turns, start=1):
        live.extend(turn)
        current = overhead + engine.counter.count_messages(live)
        if engine.should_compress(current):
            live = engine.compress(live, current_tokens=current)
            report.compactions += 1
            report.outcomes.append(dict(engine.last_compaction))
            current = overhead + engine.counter.count_messages(live)
        report.max_prompt_tokens = max(report.max_prompt_tokens, current)
        report.turns = index
        if on_turn is not None:
            on_turn(index, len(turns), report)
    engine.ingest(live)
    report.final_messages = live
    report.seconds = time.perf_counter() - started
    return report
