"""Turning summaries plus a fresh tail into a chat sequence every provider accepts.

Providers reject sequences that look harmless: a tool result whose call was
compacted away, an assistant tool call without its result, an assistant message
first, no user message at all, an empty assistant turn (field lesson 4). This
module groups messages into units that must travel together, picks the fresh
tail, renders the summary block, and checks the result.

Everything here is pure: no database, no host, no LLM.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable, Container, Sequence

# The engine's own messages carry these exact openings; seen again in a
# transcript they are recognized and never stored as conversation.
BLOCK_MARKER = "[trove context: summaries of earlier turns]"
ACK_TEXT = ("[trove] Understood. I will treat the summaries above as background and use "
            "trove_grep / trove_expand when I need exact earlier details.")


@dataclass(frozen=True)
class Unit:
    """A run of messages that must stay together: [start, end) in the list.

    ``kind`` is ``tool_group`` (an assistant tool call and its results),
    ``orphan_tool`` (results whose call is not in the list: never replayed),
    ``empty_assistant`` (nothing to replay), or ``message``.
    ``complete`` is False for a tool group missing some results.
    """

    start: int
    end: int
    kind: str
    complete: bool = True


# Compaction aims this far below the trigger so the next turn does not re-trigger.
TARGET_MARGIN = 0.15
# Share of the message budget a count-protected tail may take in the first pass.
TAIL_SHARE = 0.6


def tail_token_cap(message_budget: int, max_tail_tokens: int) -> int:
    """Tokens the first pass's fresh tail may take: ``TAIL_SHARE`` of the message
    budget, and at most TROVE_FRESH_TAIL_MAX_TOKENS when set (0 = no cap). One
    place, because the background preparer predicts the tail the same way."""
    share = int(message_budget * TAIL_SHARE)
    return min(max_tail_tokens, share) if max_tail_tokens else share


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def is_trove_message(message: dict) -> bool:
    """True for the summary block and acknowledgement the engine itself inserted."""
    if not isinstance(message, dict):
        return False
    text = _text_of(message)
    if message.get("role") == "user":
        return text.startswith(BLOCK_MARKER)
    if message.get("role") == "assistant":
        return text.strip() == ACK_TEXT.strip() and not message.get("tool_calls")
    return False


def call_ids(message: dict) -> list[str]:
    """The ids of an assistant message's tool calls."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c.get("id") for c in calls if isinstance(c, dict) and c.get("id")]


def is_empty_assistant(message: dict) -> bool:
    """An assistant turn with no text and no tool calls: providers reject or ignore it."""
    return (message.get("role") == "assistant" and not call_ids(message)
            and not _text_of(message).strip() and not message.get("tool_calls"))


def group_units(messages: Sequence[dict]) -> list[Unit]:
    """Split a transcript into units that are kept or compacted as a whole."""
    units: list[Unit] = []
    i, n = 0, len(messages)
    while i < n:
        msg = messages[i]
        role = msg.get("role")
        if role == "assistant" and call_ids(msg):
            wanted = set(call_ids(msg))
            j = i + 1
            answered = set()
            while (j < n and messages[j].get("role") == "tool"
                   and messages[j].get("tool_call_id") in wanted):
                answered.add(messages[j].get("tool_call_id"))
                j += 1
            units.append(Unit(i, j, "tool_group", complete=wanted <= answered))
            i = j
        elif role == "tool":
            j = i + 1
            while j < n and messages[j].get("role") == "tool":
                j += 1
            units.append(Unit(i, j, "orphan_tool"))
            i = j
        elif is_empty_assistant(msg):
            units.append(Unit(i, i + 1, "empty_assistant"))
            i += 1
        else:
            units.append(Unit(i, i + 1, "message"))
            i += 1
    return units


def replayable(unit: Unit, is_last: bool) -> bool:
    """Whether a unit may stand in the prompt as raw messages.

    Orphan tool results and empty assistant turns never may; an incomplete
    tool group only as the very last unit (a call still in flight).
    """
    if unit.kind in ("orphan_tool", "empty_assistant"):
        return False
    if unit.kind == "tool_group" and not unit.complete:
        return is_last
    return True


def block_fingerprint(content) -> str:
    """A short fingerprint of a summary block's text: how the engine recognizes a
    block it rendered itself (a pasted copy of the header text is not one).

    Whitespace at either end does not count: the host's session database strips
    it, so a block restored by /resume must still be recognized."""
    return _digest(_block_text(content).strip())


def legacy_block_fingerprint(content) -> str:
    """The fingerprint earlier versions kept in ``known_tail`` (whitespace included),
    so a database written by them still recognizes its last block once."""
    return _digest(_block_text(content))


def _block_text(content) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def engine_inserted(messages: Sequence[dict], known_blocks: Container[str],
                    candidates: dict[int, str] | None = None) -> list[bool]:
    """Which shown messages the engine itself inserted: a summary block whose exact
    text it rendered (``known_blocks`` holds their fingerprints) and the
    acknowledgement right after such a block. Everything else, including a user
    message that merely starts with the block header, is conversation.

    ``candidates`` (position -> ``block_fingerprint``) are the list's messages
    that open like a block, when the caller has them already."""
    if candidates is None:
        candidates = block_candidates(messages)
    flags = [False] * len(messages)
    for i, digest in candidates.items():
        if digest in known_blocks:
            flags[i] = True
            if i + 1 < len(messages) and is_trove_message(messages[i + 1]) \
                    and messages[i + 1].get("role") == "assistant":
                flags[i + 1] = True
    return flags


def block_candidates(messages: Sequence[dict]) -> dict[int, str]:
    """Position -> ``block_fingerprint`` of each message that opens like a block."""
    return {i: block_fingerprint(m.get("content")) for i, m in enumerate(messages)
            if is_block_candidate(m)}


def is_block_candidate(message: dict) -> bool:
    """A user message that opens like the engine's summary block: the engine's own
    only if a view of the session holds its fingerprint (``storage/identity``)."""
    return (isinstance(message, dict) and message.get("role") == "user"
            and _text_of(message).startswith(BLOCK_MARKER))


def is_real_user(message: dict) -> bool:
    """A user turn with text that the engine did not insert itself, judged by its text
    alone: for a list no identity reading explains (``newest_user`` says why a list
    that was read needs more)."""
    return _user_with_text(message) and not is_trove_message(message)


def _user_with_text(message: dict) -> bool:
    """A user message holding some text (whose it is is for the caller to say)."""
    return (isinstance(message, dict) and message.get("role") == "user"
            and bool(_text_of(message).strip()))


def newest_user(messages: Sequence[dict], engine: Sequence[bool] | None = None) -> int | None:
    """The newest user message with text that is not the engine's own: the turn's
    message, which the tail always keeps whole and chooses itself around.

    Which messages are the engine's is ``storage/identity``'s reading, never the
    text: a user's copy of a block (pasted from a log, an earlier prompt re-sent) has
    the block's very text, and only its place tells it from the engine's block
    (``identity.user_sent``, ``own_flags``). Judged by its text, the copy was not the
    user's, so an older question was kept in its place and the copy itself could be
    summarized out of the prompt. ``engine`` flags the engine's own messages as an
    ingest read them; None means none is among ``messages`` (the compaction's tail
    candidates and stored rows: ``tail_rows.candidates`` leaves the engine's out)."""
    return max((i for i, m in enumerate(messages)
                if _user_with_text(m) and not (engine is not None and engine[i])), default=None)


def choose_tail(messages: Sequence[dict], units: Sequence[Unit], *, max_count: int,
                max_tokens: int | None, count: Callable[[dict], int],
                engine: Sequence[bool] | None = None) -> tuple[set[int], bool]:
    """Pick the fresh tail: indices of messages that stay raw.

    Whole units are taken from the newest end while they fit ``max_count``
    messages and ``max_tokens`` tokens. The newest message's unit and the
    newest user message (``newest_user``; ``engine`` as there) always stay, even
    over the limits (the tail then "gives way" around them). Returns (indices,
    gave_way) where gave_way says a limit cut the tail short of ``max_count``.
    """
    keep: set[int] = set()
    used_tokens = 0
    gave_way = False
    last_user = newest_user(messages, engine)
    for pos in range(len(units) - 1, -1, -1):
        unit = units[pos]
        is_last = pos == len(units) - 1
        if not replayable(unit, is_last):
            continue
        size = sum(count(messages[i]) for i in range(unit.start, unit.end))
        n_msgs = unit.end - unit.start
        over_count = len(keep) + n_msgs > max_count
        over_tokens = max_tokens is not None and used_tokens + size > max_tokens
        if keep and (over_count or over_tokens):
            gave_way = gave_way or over_tokens
            break
        keep.update(range(unit.start, unit.end))
        used_tokens += size
    if last_user is not None and last_user not in keep:
        keep.add(last_user)
    return keep, gave_way


BLOCK_HEADER = (f"{BLOCK_MARKER}\nEarlier parts of this conversation were compacted into the "
                "summaries below (highest level first). They are cues, not proof: for exact "
                "wording, numbers or code use trove_expand(node_id=...) or trove_grep.\n")


def node_section(node: dict) -> str:
    """How one summary node is written in the block."""
    return f"\n## node {node['node_id']} (depth {node['depth']})\n{node['text']}\n"


def render_context_block(nodes: Sequence[dict], *, budget_tokens: int,
                         count_text: Callable[[str], int]) -> tuple[str, list[int], list[int]]:
    """The single user message holding the frontier summaries, highest depth first.

    Nodes that do not fit ``budget_tokens`` are left out oldest-first (they stay
    in the DAG, reachable with trove_recent / trove_grep) and the block says so.
    Returns (text, included node ids, omitted node ids).
    """
    ordered = sorted(nodes, key=lambda n: (-n["depth"], n.get("first_store_id") or 0,
                                           n["node_id"]))
    sections = {n["node_id"]: node_section(n) for n in ordered}
    used = count_text(BLOCK_HEADER)
    included: list[int] = []
    # Newest coverage is most useful: admit nodes newest-first, then print in order.
    for node in sorted(ordered, key=lambda n: -(n.get("last_store_id") or 0)):
        cost = count_text(sections[node["node_id"]])
        if used + cost <= budget_tokens:
            included.append(node["node_id"])
            used += cost
    omitted = [n["node_id"] for n in ordered if n["node_id"] not in included]
    body = "".join(sections[n["node_id"]] for n in ordered if n["node_id"] in included)
    note = ""
    if omitted:
        note = (f"\n({len(omitted)} older summaries are not shown to save space: "
                "trove_recent or trove_grep finds them.)\n")
    return BLOCK_HEADER + body + note, included, omitted


def build_prompt(system: dict | None, block_text: str | None,
                 tail: Sequence[dict]) -> list[dict]:
    """System prompt, then the summary block (a user turn), then the tail.

    When the tail itself starts with a user turn, a short assistant
    acknowledgement keeps roles alternating for strict chat templates; so it does
    when the tail is empty (everything summarized, e.g. a /compress whose last
    exchange had no room): a list ending with the block would have the host merge
    the next user message into it, and read again later the block would end the
    list as if the user had just sent its text (``identity.user_sent``).
    """
    out: list[dict] = [system] if system is not None else []
    if block_text is not None:
        out.append({"role": "user", "content": block_text})
        if not tail or tail[0].get("role") == "user":
            out.append({"role": "assistant", "content": ACK_TEXT})
    out.extend(tail)
    return out


def sequence_problems(messages: Sequence[dict]) -> list[str]:
    """Why a provider could reject this sequence (empty list when it is valid)."""
    problems: list[str] = []
    body = list(messages)
    if body and body[0].get("role") == "system":
        body = body[1:]
    if any(m.get("role") == "system" for m in body):
        problems.append("system message after the start")
    if not body:
        return problems + ["no messages"]
    if body[0].get("role") != "user":
        problems.append(f"first message after the system prompt is {body[0].get('role')!r}")
    if not any(m.get("role") == "user" for m in body):
        problems.append("no user message")
    units = group_units(body)
    for pos, unit in enumerate(units):
        if unit.kind == "orphan_tool":
            problems.append(f"tool result without its call at {unit.start}")
        elif unit.kind == "empty_assistant":
            problems.append(f"empty assistant turn at {unit.start}")
        elif unit.kind == "tool_group" and not unit.complete and pos != len(units) - 1:
            problems.append(f"tool call without its result at {unit.start}")
    return problems
