"""walkkit: texts, a scripted model, an oracle of which message lives where, and
a seeded random walk over the host's own CLI object (clikit).

Used by tests/test_host_identity.py (the issue's cases one by one),
tests/test_host_walk.py (the generative test) and bench/soak.py (thousands of
steps).

The oracle (:class:`Oracle`)
----------------------------
* every ``chat()`` send creates one new user message (an identical re-send is a
  NEW message), every model reply one assistant message;
* /undo and /retry remove messages from the host's active history, but they
  were shown and stay stored; whitespace edits create nothing; /compress
  creates nothing (the engine's summary block and its acknowledgement are not
  messages);
* a /branch's session holds its own copy of the host's history at the branch
  point once its first ingest happened (0 copies before, never 2): the list at
  the branch point, the one its first ingest showed (shorter after an /undo), or
  the one a second CLI restored before that ingest;
* /new, /resume, a second process, a restart create nothing by themselves.

Compared after every step, per session (resolved to its canonical session):
the multiset of stored (role, content.strip()) rows of user messages and
assistant messages with text. What is stored beyond the oracle is a
*duplicate* (shown in that session, stored more often), *misfiled* (shown only
in another session) or *phantom* (never shown anywhere: a summary block stored
as a message); what the oracle has beyond the store is *lost*.

After each chat: the request ends with the newest user message; tool pairs are
valid; after a compaction the host's own estimate is under the threshold, the
provider's count under the window, the raw tail not starved, and every frontier
summary of the session (another process's too) is in the prompt: the fake
model's summaries list the turn markers ("[T12]") they cover, so a summary of
summaries still names its turns and a dropped summary shows as missing markers.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

import clikit as ck
import reviewkit
from walktexts import (CHARS_PER_TOKEN, GENERATORS, KINDS, MARKER_RE, REPEATED,  # noqa: F401
                       TOOL_WORD, ScriptedModel, code, cjk, longword, make_text, prose, turn_tokens)


# ---------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------

Key = Tuple[str, str]


def key_of(message: dict) -> Optional[Key]:
    """(role, stripped text) of a user or assistant message with text, else None."""
    role = message.get("role")
    if role not in ("user", "assistant"):
        return None
    text = ck.text_of(message.get("content"))
    if not text:
        return None
    return role, text


BLOCK_PREFIX = "[trove context:"


def without_replays(history: List[dict], replayable: set) -> List[dict]:
    """``history`` without the host's replay of a transcript: after a /compress and a
    /resume the CLI restores the engine's block and what followed it twice (it wrote
    its list to state.db twice), so the messages after the block's later copy that
    repeat, in order, those after its earlier copy are the same messages shown again,
    not new ones (a /branch then copies them once). Only restored message objects
    (``replayable``: their ids) are a replay; a text sent again since is a new message."""
    blocks = [i for i, m in enumerate(history) if m.get("role") == "user"
              and ck.text_of(m.get("content")).startswith(BLOCK_PREFIX)]
    drop = set()
    for first, second in zip(blocks, blocks[1:]):
        if ck.text_of(history[first].get("content")) != ck.text_of(history[second].get("content")):
            continue
        earlier = [key_of(m) for m in history[first + 1:second]]
        end = next((b for b in blocks if b > second), len(history))
        for offset, k in enumerate(range(second + 1, end)):
            if offset >= len(earlier) or key_of(history[k]) != earlier[offset] \
                    or id(history[k]) not in replayable:
                break
            drop.add(k)
    return [m for i, m in enumerate(history) if i not in drop]


def without_timed_copies(history: List[dict]) -> List[dict]:
    """``history`` without a message's later copies that carry its timestamp: after
    an /undo the CLI may write its whole list to state.db a second time with the
    original timestamps, and a /resume restores both copies (identity's rule 7: one
    message shown twice); a /branch then copies it once. A re-sent text has a
    timestamp of its own, and a message without one is never a copy."""
    seen: set = set()
    out = []
    for m in history:
        stamp = m.get("timestamp")
        mark = (key_of(m), stamp)
        if stamp is not None and mark[0] is not None and mark in seen:
            continue
        seen.add(mark)
        out.append(m)
    return out


@dataclass
class Problems:
    duplicates: int = 0
    lost: int = 0
    misfiled: int = 0
    phantom: int = 0
    details: List[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.duplicates + self.lost + self.misfiled + self.phantom

    def add(self, other: "Problems") -> None:
        """Fold another check's counts and details into these."""
        for name in ("duplicates", "lost", "misfiled", "phantom"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.details.extend(other.details)


class Oracle:
    """Which message exists where (see the module docstring)."""

    def __init__(self) -> None:
        self.expected: Dict[str, Counter] = {}
        self.where: Dict[Key, set] = {}
        self.branch_copy: Dict[str, List[Counter]] = {}
        self._ingested: set = set()
        self._restored: List[dict] = []    # the host's list as its last /resume restored it

    def restored(self, history: List[dict]) -> None:
        """The list a /resume (or a restart) just restored: only its message objects
        can be the host's replay of a transcript (see :func:`without_replays`)."""
        self._restored = list(history)

    def session(self, session: str) -> None:
        self.expected.setdefault(session, Counter())

    def shown(self, session: str, message: dict) -> None:
        key = key_of(message)
        if key is None:
            return
        self.expected.setdefault(session, Counter())[key] += 1
        self.where.setdefault(key, set()).add(session)

    def branched(self, branch: str, history: List[dict]) -> None:
        """The branch's copy of the shown messages of ``history`` (the host's
        history at the branch point). :meth:`first_ingest` adds the history as
        it was when the branch was first shown to the engine (an /undo in
        between shrinks it); either one copy is right, never two."""
        self.branch_copy[branch] = []
        self.session(branch)
        self.first_ingest(branch, history, final=False)

    def first_ingest(self, branch: str, history: List[dict], *, final: bool = True) -> None:
        """A candidate copy: the history the branch's first turn was sent with
        (``final=False`` for a candidate seen before that turn)."""
        copies = self.branch_copy.get(branch)
        if copies is None or branch in self._ingested:
            return
        if final:
            self._ingested.add(branch)
        replayable = {id(m) for m in self._restored}
        once = without_replays(history, replayable)
        for shown in (history, once, without_timed_copies(once)):
            copy = Counter(k for k in (key_of(m) for m in shown)
                           if k is not None and k in self.where)
            if copy in copies:
                continue
            copies.append(copy)
            for key in copy:
                self.where.setdefault(key, set()).add(branch)

    def retrying(self, branch: str, history: List[dict]) -> None:
        """A /retry about to run on ``history``: the host cuts it at its last user
        message (``retry_last``) and sends the turn with that list, a branch's copy
        when it is the branch's first turn. The list the turn leaves is no such
        candidate once the turn compacted it (seed 1540000: the /retry's compaction
        summarized a copied message, and that copy read as a second one)."""
        users = [i for i, m in enumerate(history) if m.get("role") == "user"]
        if users:
            self.first_ingest(branch, history[:users[-1]], final=False)

    def opened(self, session: str, history: List[dict]) -> None:
        """A second CLI just restored ``history`` of ``session`` from the host's state.db:
        a candidate copy while a branch has had no first ingest, since that CLI's turns
        show the list whole. The first CLI may still /undo part of it before its first
        turn: the engine then stores the shorter copy and, when the second CLI's turn
        shows the rest, the copied messages it had left out, so the branch holds this
        list's copy, once (host walk 2400000: the copied exchange the first CLI undid
        before its first turn read as lost, or as a second copy, without it). All of
        the list is restored: any of it may be the host's replay of a transcript."""
        kept, self._restored = self._restored, list(history)
        self.first_ingest(session, history, final=False)
        self._restored = kept

    def is_shown(self, message: dict) -> bool:
        key = key_of(message)
        return key is not None and key in self.where

    def check(self, home) -> Problems:
        """Stored rows against the oracle, per canonical session."""
        aliases = ck.stored_sessions(home)
        canon = lambda s: aliases.get(s, s)  # noqa: E731
        expected: Dict[str, Counter] = {}
        copies: Dict[str, List[Counter]] = {}
        shown_in: Dict[Key, set] = {}
        for session, counter in self.expected.items():
            expected.setdefault(canon(session), Counter()).update(counter)
        for session, options in self.branch_copy.items():
            copies.setdefault(canon(session), []).extend(options)
        for key, sessions in self.where.items():
            shown_in[key] = {canon(s) for s in sessions}
        stored: Dict[str, Counter] = {}
        for row in ck.stored_rows(home):
            key = key_of(row)
            if key is not None:
                stored.setdefault(row["session_id"], Counter())[key] += 1
        out = Problems()
        for session in set(expected) | set(stored):
            have = stored.get(session, Counter())
            want = expected.get(session, Counter())
            # a branch: 0 copies before its first ingest, exactly 1 after
            options = [want] + [want + copy for copy in copies.get(session, [])]
            want = min(options, key=lambda o: sum(((have - o) + (o - have)).values()))
            for key, n in (have - want).items():
                where = shown_in.get(key, set())
                if session in where:
                    out.duplicates += n
                    kind = "duplicate"
                elif where:
                    out.misfiled += n
                    kind = "misfiled"
                else:
                    out.phantom += n
                    kind = "phantom"
                out.details.append(f"{kind} x{n} in {session}: {key[0]} {key[1][:60]!r}")
            for key, n in (want - have).items():
                out.lost += n
                out.details.append(f"lost x{n} in {session}: {key[0]} {key[1][:60]!r}")
        return out


def is_send_of(content: Any, sent: str) -> bool:
    """Whether a user message's ``content`` is what ``chat(sent)`` sent: the text
    itself, or the host's merge of a user message its given-up turn left last with
    it (``repair_message_sequence``: "A\n\nB", an in-place edit of A)."""
    text, sent = ck.text_of(content), ck.text_of(sent)
    return text == sent or text.endswith("\n\n" + sent)


def new_messages_of_turn(history: List[dict], sent: str) -> List[dict]:
    """The messages one ``chat(sent)`` added: its user message and what follows it."""
    for i in range(len(history) - 1, -1, -1):
        m = history[i]
        if m.get("role") == "user":
            return history[i:] if is_send_of(m.get("content"), sent) else []
    return []


# ---------------------------------------------------------------------------
# Checks of one request
# ---------------------------------------------------------------------------

def tool_pair_problems(messages: List[dict]) -> List[str]:
    """Every tool result answers an earlier call; every call gets its result."""
    problems = []
    open_calls: Dict[str, int] = {}
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                open_calls[tc.get("id")] = i
        elif m.get("role") == "tool":
            if open_calls.pop(m.get("tool_call_id"), None) is None:
                problems.append(f"tool result {m.get('tool_call_id')} without its call")
    for call_id in open_calls:
        problems.append(f"tool call {call_id} without its result")
    return problems


def policy_suffix(wire: str, sent: str) -> str:
    """What pre_llm_call appended to a user message on the wire."""
    wire, sent = wire.strip(), sent.strip()
    return wire[len(sent):] if wire.startswith(sent) else ""


def raw_kept(body: dict, oracle: Oracle, suffix: str) -> List[dict]:
    """The request's user/assistant messages that are shown messages (not the
    engine's block or acknowledgement), with the recall policy taken off."""
    kept = []
    for m in body.get("messages") or []:
        if m.get("role") not in ("user", "assistant"):
            continue
        text = ck.text_of(m.get("content"))
        if suffix and text.endswith(suffix.strip()):
            text = text[: len(text) - len(suffix.strip())].strip()
        if (m.get("role"), text) in oracle.where:
            kept.append({"role": m.get("role"), "content": text})
    return kept


def rough_messages(messages: List[dict]) -> int:
    """The host's chars/4 estimate of a few messages."""
    try:
        from agent.model_metadata import estimate_messages_tokens_rough
    except Exception:
        return sum(len(ck.text_of(m.get("content"))) for m in messages) // 4
    return estimate_messages_tokens_rough(messages)


STARVE_MARGIN = 0.85  # the engine may keep 15% of the threshold as headroom


@dataclass
class RequestCheck:
    ends_with_user: bool
    tool_problems: List[str]
    over_threshold: bool
    starved: bool
    tail_size: int
    rough: int
    real: int
    overflow: bool      # after a compaction: the engine's budget failed the window
    over_window: bool   # any request over the window (the host did not compact in time)


def check_request(body: dict, sent: str, oracle: Oracle, *, threshold: int, context_length: int,
                  compacted: bool, previous_pair: List[dict],
                  host_list: Optional[List[dict]] = None) -> RequestCheck:
    """One main request after ``chat(sent)``: its newest user message is ``sent``;
    tool pairs are valid; after a compaction the host's own estimate is under
    ``threshold`` (but for the turn itself when nothing else was kept raw) and
    the raw tail is not starved (only the newest user message kept although the
    previous exchange would fit under STARVE_MARGIN of the threshold, by the host's
    count and the provider's); the
    provider's count fits the window.

    ``host_list``: the host's own list at that request (its history up to the
    newest user message, :func:`host_list_of_turn`): the host estimates that,
    keys and all. Without it the request's messages are estimated."""
    wire = ck.request_user_text(body)
    ends = wire.strip().startswith(sent.strip()) or "\n\n" + sent.strip() in wire
    msgs = [m for m in body.get("messages") or [] if m.get("role") != "system"]
    suffix = policy_suffix(wire, sent)
    kept = raw_kept(body, oracle, suffix)
    rough = ck.host_rough_tokens(body, host_list)
    real = ck.real_prompt_tokens(body)
    # Kept nothing raw but the newest user message: over only when the rest (host
    # overhead, summaries) is over without the turn, counted twice to be safe (the
    # host may count its api_content sidecar too); a turn larger than the
    # threshold is no compaction's fault.
    over = compacted and rough >= threshold
    if over and len(kept) <= 1:
        over = rough - 2 * rough_messages(kept[-1:]) >= threshold
    # Starved: the previous exchange would have fit by both counters (the engine's
    # budget holds both under its target; a CJK turn is ~5x more real tokens than
    # the host counts).
    starved = False
    if compacted and len(kept) <= 1 and previous_pair:
        starved = (rough + rough_messages(previous_pair) <= STARVE_MARGIN * threshold
                   and real + ck.real_prompt_tokens({"messages": previous_pair})
                   <= STARVE_MARGIN * threshold)
    return RequestCheck(ends_with_user=ends, tool_problems=tool_pair_problems(msgs), over_threshold=over,
                        starved=starved, tail_size=len(kept), rough=rough, real=real,
                        overflow=compacted and real > context_length,
                        over_window=real > context_length)


def frontier_markers(home, session: str) -> Dict[int, set]:
    """Turn markers in the text of each frontier node of ``session`` (summary
    nodes no other node contains), from the store (``clikit.connect_store``:
    trove.db or the PostgreSQL schema)."""
    db = ck.connect_store(home)
    if db is None:
        return {}
    try:
        canonical = db.execute("SELECT canonical_id FROM sessions WHERE session_id = ?", (session,)).fetchone()
        rows = db.execute(
            "SELECT n.node_id, n.text FROM nodes n WHERE n.session_id = ? AND NOT EXISTS"
            " (SELECT 1 FROM node_edges e WHERE e.child_node_id = n.node_id)",
            (canonical[0] if canonical else session,)).fetchall()
    finally:
        db.close()
    return {node_id: set(MARKER_RE.findall(text or "")) for node_id, text in rows}


def dropped_nodes(frontier: Dict[int, set], body: dict) -> Dict[int, List[str]]:
    """Frontier nodes (:func:`frontier_markers`) whose turn markers the request
    lacks: turns that fell out of the prompt (neither their summary nor their
    raw rows sent)."""
    sent = set(MARKER_RE.findall("\n".join(ck.text_of(m.get("content")) for m in body.get("messages") or [])))
    out = {}
    for node_id, markers in frontier.items():
        missing = sorted(markers - sent, key=lambda m: int(m[2:-1]))
        if missing:
            out[node_id] = missing
    return out


def host_list_of_turn(history: List[dict], sent: str) -> Optional[List[dict]]:
    """The host's list as its check after a turn-start compaction saw it in the
    turn that sent ``sent``: the history up to and including that user message,
    which has no ``api_content`` yet (pre_llm_call sets it after the check)."""
    for i in range(len(history) - 1, -1, -1):
        if history[i].get("role") == "user":
            if not is_send_of(history[i].get("content"), sent):
                return None
            current = {k: v for k, v in history[i].items() if k != "api_content"}
            return history[:i] + [current]
    return None


def previous_exchange(history: List[dict], oracle: Oracle) -> List[dict]:
    """The exchange before the one about to be sent: from the last shown user
    message to the end of the history (its tool calls and results included,
    since the tail keeps a tool group whole)."""
    for i in range(len(history) - 1, -1, -1):
        if history[i].get("role") == "user" and oracle.is_shown(history[i]):
            return history[i:]
    return []


# ---------------------------------------------------------------------------
# The random walk
# ---------------------------------------------------------------------------

STEP_WEIGHTS = {
    "chat": 40, "chat_other": 8, "resend": 5, "undo_resend": 5, "undo": 3, "retry": 5,
    "whitespace": 6, "compress": 4, "new": 2, "resume": 3, "branch": 2,
    "open_other": 2, "close_other": 1, "restart": 2, "tool": 3,
    # opt-in (bench/soak.py --weight gateway=N): 0 keeps every seed's walk as it was;
    # stepdown: the provider's real window shrinks (or grows back) under the same model;
    # silent_window: the same, its refusals naming no limit (the host keeps its window)
    "gateway": 0, "stepdown": 0, "silent_window": 0,
}
GATEWAY_CHATS = 12           # the gateway's chats a "gateway" step picks from


@dataclass
class WalkStats:
    walks: int = 0
    steps: int = 0
    chats: int = 0
    compactions: int = 0
    problems: Problems = field(default_factory=Problems)
    starved: int = 0
    dropped: int = 0
    over_threshold: int = 0
    overflow: int = 0
    over_window_uncompacted: int = 0
    not_ending_with_user: int = 0
    tool_problems: int = 0
    refused: int = 0     # main requests the provider refused as too long ("stepdown" steps)
    forks: int = 0       # background review forks run (CliHost(reviews=True))
    forks_late: int = 0  # run in a turn, let go unchecked (they waited on the parent)
    fork_problems: int = 0
    tail_sizes: List[int] = field(default_factory=list)
    step_counts: Counter = field(default_factory=Counter)
    failures: List[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, other: "WalkStats") -> None:
        """Fold another walk's figures into these."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, Problems):
                mine.add(theirs)
            elif isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, f.name, mine + theirs)

    @property
    def clean(self) -> bool:
        return not (self.problems.total or self.starved or self.dropped or self.over_threshold or self.overflow
                    or self.over_window_uncompacted or self.not_ending_with_user or self.tool_problems
                    or self.fork_problems)

    def summary(self) -> dict:
        sizes = sorted(self.tail_sizes)
        return {
            "walks": self.walks, "steps": self.steps, "chats": self.chats, "compactions": self.compactions,
            "duplicates": self.problems.duplicates, "lost": self.problems.lost,
            "misfiled": self.problems.misfiled, "phantom": self.problems.phantom,
            "starved_tails": self.starved, "summaries_dropped_from_prompt": self.dropped,
            "over_threshold_after_compaction": self.over_threshold,
            "over_window_after_compaction": self.overflow,
            "over_window_without_compaction": self.over_window_uncompacted, "prompt_not_ending_with_user": self.not_ending_with_user,
            "tool_pair_problems": self.tool_problems, "refused_as_too_long": self.refused,
            "review_forks": self.forks, "review_forks_late": self.forks_late,
            "review_fork_problems": self.fork_problems,
            "tail_size_min": sizes[0] if sizes else None,
            "tail_size_median": statistics.median(sizes) if sizes else None,
            "seconds": round(self.seconds, 1),
        }


class Walk:
    """One seeded random walk over one HERMES_HOME.

    ``use_process``: the "second process" is a real OS process (clikit.CliProcess);
    otherwise a second HermesCLI object in this process. ``stop_at_first``:
    stop at the first step whose checks fail (the test's failure message then
    names that step)."""

    def __init__(self, host: ck.CliHost, seed: int, *, steps: int, use_process: bool = True,
                 largest_turn: int = 8000, stop_at_first: bool = True,
                 weights: Optional[Dict[str, int]] = None):
        self.host = host
        self.rng = random.Random(seed)
        self.seed = seed
        self.steps = steps
        self.use_process = use_process
        self.largest_turn = largest_turn
        self.stop_at_first = stop_at_first
        self.weights = dict(weights or STEP_WEIGHTS)
        self.oracle = Oracle()
        self.stats = WalkStats(walks=1)
        self.markers = 0
        self.cli = host.cli()
        self.other: Any = None
        self.log: List[str] = []
        self._seen_details: set = set()
        self._leaks_seen: set = set()
        self._manual: Dict[int, Tuple[str, Dict[int, set]]] = {}  # CLI -> its /compress
        self._gateway: Any = None                  # the gateway's engine ("gateway" steps)
        self._gateway_chats: Dict[str, List[dict]] = {}

    # -- texts -----------------------------------------------------------------
    def _text(self, kind: Optional[str] = None) -> str:
        kind = kind or self.rng.choice(KINDS)
        if kind == "repeat":
            return self.rng.choice(REPEATED)
        self.markers += 1
        return make_text(self.rng, kind, turn_tokens(self.rng, self.largest_turn), f"[T{self.markers}]")

    # -- one chat through either CLI -------------------------------------------
    def _chat(self, who: Any, text: str, *, via_retry: bool = False) -> None:
        before_count = self._compression_count(who)
        history_before = who.history
        self.oracle.first_ingest(who.session_id, history_before, final=False)
        prev_pair = previous_exchange(history_before, self.oracle)
        sent_before = self.host.main_request_count()
        if via_retry:
            retried = self._last_user_text(who)
            self.oracle.retrying(who.session_id, history_before)
            who.retry()
            text = retried or text
        else:
            who.chat(text)
        session = who.session_id
        history = who.history
        added = new_messages_of_turn(history, text)
        self.oracle.first_ingest(session, history[:len(history) - len(added)])
        for m in added:
            self.oracle.shown(session, m)
        self.stats.chats += 1
        after_count = self._compression_count(who)
        compacted = after_count is not None and before_count is not None and after_count > before_count
        if compacted:
            self.stats.compactions += 1
        # the first request after a /compress gets the post-compaction checks too,
        # against the summaries that existed when it compacted
        manual = self._manual.pop(id(who), None)
        frontier = None
        if compacted:
            frontier = frontier_markers(self.host.home, who.session_id)
        elif manual is not None and manual[0] == who.session_id:
            compacted, frontier = True, manual[1]
        if self.host.main_request_count() == sent_before:
            self._fail(f"chat {text[:30]!r} sent no request")
            return
        body = self.host.last_main_request()
        threshold, window = self._threshold(who)
        # a provider that refuses without naming its smaller window: trove's trigger is
        # made for the configured one, so only the window itself can be judged
        blind = ck.unnamed_window(self.host, window)
        window = ck.window_in_force(self.host, window)   # the provider's, after a stepdown
        check = check_request(body, text, self.oracle, threshold=threshold, context_length=window,
                              compacted=compacted, previous_pair=prev_pair,
                              host_list=host_list_of_turn(history, text))
        if compacted:
            self.stats.tail_sizes.append(check.tail_size)
        if not check.ends_with_user:
            self.stats.not_ending_with_user += 1
            self._fail(f"last request does not end with {text[:40]!r}")
        if check.tool_problems:
            self.stats.tool_problems += len(check.tool_problems)
            self._fail(f"tool pairs: {check.tool_problems}")
        if check.over_threshold and not blind:
            self.stats.over_threshold += 1
            self._fail(f"after a compaction the host's estimate {check.rough} >= threshold {threshold}")
        if check.starved and not blind:
            self.stats.starved += 1
            self._fail(f"tail starved: {check.tail_size} raw message(s) kept, request ~{check.rough} of "
                       f"threshold {threshold}, previous exchange ~{rough_messages(prev_pair)}")
        if frontier is not None:
            dropped = dropped_nodes(frontier, body)
            if dropped:
                self.stats.dropped += len(dropped)
                self._fail(f"after a compaction the prompt lacks frontier summaries (node: turns): {dropped}")
        if check.overflow:
            self.stats.overflow += 1
            self._fail(f"after a compaction a request of {check.real} real tokens over the {window} window")
        elif check.over_window:
            # the host asks on its chars/4 figure, the engine also on real tokens (host
            # walk 120004): a request over the window is a failure either way
            self.stats.over_window_uncompacted += 1
            self._fail(f"a request of {check.real} real tokens over the {window} window, "
                       f"no compaction before it")

    def _last_user_text(self, who: Any) -> Optional[str]:
        for m in reversed(who.history):
            if m.get("role") == "user" and self.oracle.is_shown(m):
                return ck.text_of(m.get("content"))
        return None

    def _compression_count(self, who: Any) -> Optional[int]:
        if isinstance(who, ck.HeadlessCLI):
            return who.engine.compression_count if who.engine is not None else 0
        return who.engine_state().get("compression_count") or 0

    def _threshold(self, who: Any) -> Tuple[int, int]:
        if isinstance(who, ck.HeadlessCLI):
            return int(who.engine.threshold_tokens), int(who.engine.context_length)
        state = who.engine_state()
        return int(state["threshold_tokens"]), self.host.context_length

    def _fail(self, what: str) -> None:
        self.stats.failures.append(f"seed {self.seed} step {self.stats.steps}: {what}")

    # -- steps -----------------------------------------------------------------
    def step(self) -> str:
        names = [n for n in self.weights if self.weights[n] and self._possible(n)] or ["chat"]
        name = self.rng.choices(names, weights=[self.weights[n] for n in names])[0]
        if name in ("new", "resume", "branch", "restart", "undo", "undo_resend", "retry"):
            self._manual.clear()  # the next request is not the one right after the /compress
        getattr(self, "do_" + name)()
        self.stats.steps += 1
        self.stats.step_counts[name] += 1
        self.log.append(name)
        self._run_forks(f"after {name}")
        self._compare(f"after {name}")
        return name

    def _run_forks(self, when: str) -> None:
        """With review forks on (``CliHost(reviews=True)``): the forks the step's turn
        spawned run now, one at a time (a seed replays the same), and must leave the
        store as it was (reviewkit.ForkGate); no row anywhere holds a harness prompt or
        a fork's text."""
        if not self.host.reviews:
            return
        report = self.host.run_forks()
        self.stats.forks += report.forks
        self.stats.forks_late += report.late
        leaks = [row for row in reviewkit.leaked_rows(self.host.home) if row not in self._leaks_seen]
        self._leaks_seen.update(leaks)
        problems = report.problems + [f"fork text stored: {row}" for row in leaks]
        if problems:
            self.stats.fork_problems += len(problems)
            self._fail(f"{when}: " + "; ".join(problems[:4]))

    def _compare(self, when: str) -> None:
        """Store against oracle; a failure names what is new since the last step."""
        problems = self.oracle.check(self.host.home)
        fresh = [d for d in problems.details if d not in self._seen_details]
        if fresh:
            self._fail(f"{when}: " + "; ".join(fresh[:6]) + (f" (+{len(fresh) - 6} more)" if len(fresh) > 6 else ""))
        self._seen_details = set(problems.details)
        self._last_problems = problems

    def _has_history(self) -> bool:
        return any(self.oracle.is_shown(m) for m in self.cli.history)

    def _possible(self, name: str) -> bool:
        started = self.cli.agent is not None and self._has_history()
        if name in ("chat", "tool", "gateway", "stepdown", "silent_window"):
            return True
        if name == "chat_other":
            return self.other is not None
        if name == "retry":
            users = [m for m in self.cli.history if m.get("role") == "user"]
            return started and bool(users) and self.oracle.is_shown(users[-1])
        if name in ("resend", "undo_resend", "undo", "whitespace", "branch", "restart"):
            return started
        if name == "compress":
            return started and len(self.cli.history) >= 4
        if name == "new":
            return self.cli.agent is not None
        if name == "resume":
            return self.cli.agent is not None and bool(self._resumable())
        if name == "open_other":
            return self.other is None and started
        if name == "close_other":
            return self.other is not None
        return False

    def _resumable(self) -> List[str]:
        db = self.cli.cli._session_db
        out = []
        # in the order the sessions first appeared (their ids end in random hex: sorting
        # them would make a seed's walk differ from run to run)
        for session, counter in self.oracle.expected.items():
            if session != self.cli.session_id and counter and db is not None and db.get_session(session):
                out.append(session)
        return out

    def do_chat(self) -> None:
        self._chat(self.cli, self._text())

    def do_tool(self) -> None:
        self._chat(self.cli, self._text("prose" if self.rng.random() < 0.5 else "repeat") + " " + TOOL_WORD)

    def do_chat_other(self) -> None:
        self._chat(self.other, self._text())

    def do_resend(self) -> None:
        text = self._last_user_text(self.cli)
        self._chat(self.cli, text if text else self._text())

    def do_undo_resend(self) -> None:
        text = self._last_user_text(self.cli)
        self.cli.undo()
        self._chat(self.cli, text if text else self._text())

    def do_undo(self) -> None:
        self.cli.undo()

    def do_retry(self) -> None:
        self._chat(self.cli, "", via_retry=True)

    def do_whitespace(self) -> None:
        shown = [i for i, m in enumerate(self.cli.history) if self.oracle.is_shown(m)
                 and isinstance(m.get("content"), str)]
        if not shown:
            return
        index = self.rng.choice(shown[-12:])
        content = self.cli.history[index]["content"]
        if content != content.rstrip() and self.rng.random() < 0.6:
            new = content.rstrip()
        else:
            new = content + self.rng.choice([" ", "\n", "  \n", "\n\n"])
        self.cli.set_content(index, new)

    def do_compress(self) -> None:
        before = self._compression_count(self.cli)
        # a /compress hands the list to the engine: a branch's first ingest when no
        # turn came before it (after an /undo its copy is the shorter list)
        self.oracle.first_ingest(self.cli.session_id, list(self.cli.history))
        self.cli.compress()
        if self._compression_count(self.cli) > before:
            session = self.cli.session_id
            self._manual[id(self.cli)] = (session, frontier_markers(self.host.home, session))

    def do_new(self) -> None:
        self.cli.new()
        self.oracle.session(self.cli.session_id)

    def do_resume(self) -> None:
        self.cli.resume(self.rng.choice(self._resumable()))
        self.oracle.restored(self.cli.history)

    def do_branch(self) -> None:
        history = list(self.cli.history)
        branch = self.cli.branch()
        self.oracle.branched(branch, history)

    def do_gateway(self) -> None:
        """A messaging gateway on the same database writes a few turns in its own
        chats (Hermes's CLI and gateway share ``$HERMES_HOME``): the CLI's lists must
        still be told apart from the gateway's when the newest views are all its."""
        if self._gateway is None:
            import os

            ck.ensure_package()
            from hermes_trove import config as trove_config
            from hermes_trove.engine import TroveEngine
            self._gateway = TroveEngine(trove_config.load_config(dict(os.environ)))
            self._gateway.update_model("gateway-model", self.host.context_length)
        for _ in range(self.rng.randint(2, 8)):
            chat = f"telegram-walk-{self.rng.randrange(GATEWAY_CHATS)}"
            history = self._gateway_chats.setdefault(chat, [])
            self._gateway.on_session_start(chat, platform="telegram")
            for _ in range(self.rng.randint(1, 3)):
                n = len(history) // 2
                history += [{"role": "user", "content": f"{chat} user turn {n}"},
                            {"role": "assistant", "content": f"{chat} reply {n}"}]
                self._gateway.note_user_turn(history[-2])
                self._gateway.ingest(history)
                self._gateway.turn_done()
                for message in history[-2:]:
                    self.oracle.shown(chat, message)

    def do_stepdown(self) -> None:
        self.log.append(f"window {ck.step_window(self.host, self.rng)}")

    def do_silent_window(self) -> None:
        self.log.append(f"silent window {ck.step_window(self.host, self.rng, report=False)}")

    def _close_gateway(self) -> None:
        """The gateway's end: its background work done and its connections closed,
        before the walk's home is removed (a pass still writing there failed the
        removal with "Directory not empty")."""
        if self._gateway is None:
            return
        import threading

        from hermes_trove.storage import database
        deadline = time.monotonic() + 30
        for thread in threading.enumerate():
            if thread.name.startswith("trove-") and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        for key in list(database._registry):
            database.forget_database(key)
        self._gateway = None

    def do_open_other(self) -> None:
        if self.use_process:
            self.other = self.host.process(resume=self.cli.session_id)
        else:
            self.other = self.host.cli(resume=self.cli.session_id)
        self.oracle.opened(self.other.session_id, list(self.other.history))

    def do_close_other(self) -> None:
        self.other.exit()
        if isinstance(self.other, ck.HeadlessCLI):
            self.other.close()
        self.other = None

    def do_restart(self) -> None:
        if isinstance(self.other, ck.HeadlessCLI):  # a fresh plugin import: in-process peers go too
            self.do_close_other()
        self.cli = self.host.restart(self.cli)
        self.oracle.restored(self.cli.history)

    # -- the whole walk --------------------------------------------------------
    def run(self) -> WalkStats:
        started = time.perf_counter()
        try:
            for _ in range(self.steps):
                self.step()
                if self.stop_at_first and self.stats.failures:
                    break
            if not (self.stop_at_first and self.stats.failures):
                # the end: every CLI exits through the host's cleanup
                if self.other is not None:
                    self.do_close_other()
                self.cli.exit()
                self._compare("after exit")
        finally:
            if self.other is not None:
                try:
                    self.do_close_other()
                except Exception:
                    pass
            self._close_gateway()
            self.stats.refused = ck.refused_count(self.host)
            self.stats.seconds = time.perf_counter() - started
        self.stats.problems = getattr(self, "_last_problems", Problems())
        return self.stats


def describe(stats: WalkStats) -> str:
    """One readable report of a walk's figures and its first failures."""
    lines = [json.dumps(stats.summary())]
    lines += stats.failures[:12]
    return "\n".join(lines)

