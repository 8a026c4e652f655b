"""Which shown message is which stored row: the one place that decides it.

The host never names its messages. It hands the engine lists (``compress``,
``on_session_end``, the turn hooks) and rewrites them between calls: it strips
whitespace, restores history from its own database, drops undone turns, keeps
a retried message twice, shows a list from before the latest compaction, or
one of another session altogether. Identity is decided here, for every entry
point, by one rule:

**A shown list is read against the lists the engine already knows the rows of.**
Every list the engine stores (each ingest) and every list it returns from
``compress`` is remembered as a *view*: the fingerprint and store_id of each
element, in the host's order, per session, in the database (``storage/views``),
so deep copies, a second process and a restart see them. A new list is diffed
against the session's views as a sequence (common prefix, common suffix and a
longest common subsequence of fingerprints between them); the view that
explains most of it wins, counting only what rule 1 leaves of its reading (a
reply it matched after an element it could not is no evidence). Then:

1. **Matched elements keep their rows.** A replaced element (an edit, a new
   reply after /retry) is one new row; everything around it keeps its own, but a
   reply belongs to the message it answers: the non-user messages after a new
   element are new too, up to the next user message already stored. Replies a view's
   reading matched last, after an element it could not match, bound no gap: the run
   after the match before them is looked up with them (rule 3).
2. **The turn's user message is new.** Each ``pre_llm_call`` is one message the
   user just sent; the first list that shows it stores it as a new row, even when
   its text equals an undone or retried one, and so is everything after it in
   that list (the turn's replies and tool results). Even a text that is one of
   the engine's blocks (pasted from a log) is the user's there, and at a list's
   end (``user_sent``); views hold it by the block's fingerprint with its row, so
   later lists tell it from the engine's block by place (``own_flags``).
3. **Gaps are looked up, in order.** An unmatched run between two matched
   elements (a restored list that interleaves what another process stored) is
   aligned against the session's rows between those two rows; a run after the
   last matched element against the rows after it, stopping at the first
   element that does not line up: from there on everything is new (so is a run
   whose next matched row is lower: the list starts over past a repeated block). After a
   block, rows a summary written before that block covers are none of them, but
   one a later compaction summarized still is, and so is one a view of the session
   lists raw after that same block (a second process's compaction kept it beside
   the block that summarized it). A list whose block the engine
   returned but none of whose other elements a view holds (the views of the lists
   that went on from it have left the rings) goes on from that returned list: what
   follows the block is a run after the newest row that list was shown. A run after
   the last match that lines up with no row, after a user message whose row (the
   session's only one of its text) a view lists answered by another reply, answers
   another send of that text: the message is new with it (one send, one reply). So
   does a reply in a run that lines up with no row right after a user message of the
   run that did (a copied send restored before its undone retry's row). A gap's
   candidates also hold the rows a view lists between its two matched rows, wherever
   another process stored them, and the rows a view lists after one of the engine's
   blocks the run shows (another copy's compacted list inside this one's transcript).
   In a list with a run between two matched elements, an element carrying the host's
   timestamp is the session's row stored with that timestamp and fingerprint, wherever
   it was stored (a second process stored a restored /retry's first attempt after the
   rows around its place); an element the view's reading gave that row to without that
   timestamp gives it up.
4. **A list of another session stores nothing.** A list handed over at a
   session end (``on_session_end``: exit, /new, a review fork's end) that no view of its session
   explains, but a view of another session does (the previous session's
   transcript handed over at exit after /new or /resume, a review fork replaying
   its parent), is not this session's: nothing is stored from it. A /branch
   stores its own copy of its parent's history from the first list of its own
   (a turn, a compaction); one handed over under its id that a view of the parent
   explains is the parent's (a list from before the parent's last /compress; also
   the branch's copy undone down to the parent's block and one reply: the block
   and a message it holds are two elements, ``foreign_owner``).
5. **A repeated block replays what followed it.** A list that shows the engine's
   block a second time (the host appended its copy of a returned list to its
   transcript twice, and a /resume restores both) shows the same messages again
   after it: the elements after the later copy that repeat, in order, those
   after the earlier copy are those rows, not new ones (where neither copy has a
   row yet, both share the one new row; where the reading gave each a row of its
   own, the earlier copy's is both: ``_share``); also in a list no view explains, after
   rule 6 aligned it (``replayed``). In a restored list (its messages carry the
   host's timestamps) the replay ends at the first message without one: it was
   sent since the restore (``_restored``).
6. **A list no view explains at all** (a database written before views existed,
   an import, a replay) is aligned against the stored history by the older
   anchored rule (``align`` below and ``store.Store``).
7. **A message shown twice in one list is one message.** Two elements with the
   same fingerprint and the same host timestamp (the host wrote its transcript to
   its database twice, e.g. after an /undo, and restores both copies) share one
   row; the later copy is left out of the reading. A re-sent text has a timestamp
   of its own, and a message without one is never such a copy. Where such copies
   open a second copy of the list, the stamped elements after them that repeat,
   in order and whole, the stamped ones between the earlier copies and them are
   those messages too, stamped anew by a second write (``_rewritten_runs``).

Fingerprints ignore what the host is known to rewrite: whitespace around text,
the memory-context fences ``sanitize_context`` removes, host-internal keys, the
``api_content`` sidecar, timestamps and reasoning. They are taken of the stored
form (after redaction and payload externalization), so a shown message and its
row fingerprint alike. Everything here is pure: no database, no host.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Container, Iterator, Sequence

from .sequences import lcs_pairs, replay_pairs

# How far ahead in the stored window a shown message may match (the legacy rule).
LOOKAHEAD = 64
# Store ids of the engine's own elements in a view (they have no row).
BLOCK_ID = -1
ACK_ID = -2
# A list another session's view explains this well (share of its elements) is that
# session's, when its own views explain less.
FOREIGN_SHARE = 0.8
# Sessions an engine copy was bound to before, kept for rule 4 (newest first).
EARLIER_SESSIONS = 4

# What the host's sanitize_context removes (agent/memory_manager.py): injected
# memory-context blocks, their system note, and stray fence tags.
_CONTEXT_BLOCK = re.compile(r"<\s*memory-context\s*>[\s\S]*?</\s*memory-context\s*>", re.I)
_CONTEXT_NOTE = re.compile(
    r"\[System note:\s*The following is recalled memory context,\s*NOT new user input\."
    r"\s*Treat as (?:informational background data|authoritative reference data[^\]]*)\.\]\s*",
    re.I)
_FENCE_TAG = re.compile(r"</?\s*memory-context\s*>", re.I)


def normalize_text(text: str) -> str:
    """Text as the host may show it back: without memory-context fences and the
    whitespace around it (``sanitize_context(...).strip()``)."""
    if "memory-context" in text or "System note" in text:
        text = _FENCE_TAG.sub("", _CONTEXT_NOTE.sub("", _CONTEXT_BLOCK.sub("", text)))
    return text.strip()


def _normal_parts(parts) -> list:
    out = []
    for part in parts if isinstance(parts, list) else [parts]:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(["text", normalize_text(part["text"])])
        else:
            out.append(part)
    return out


def _normal_calls(tool_calls: str | None) -> list:
    if not tool_calls:
        return []
    try:
        calls = json.loads(tool_calls)
    except ValueError:
        return [tool_calls.strip()]
    out = []
    for call in calls if isinstance(calls, list) else [calls]:
        if not isinstance(call, dict):
            out.append(call)
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = arguments.strip()
        out.append([call.get("id"), function.get("name"), arguments])
    return out


def fingerprint(role: str | None, content: str | None, content_format: str | None,
                tool_calls: str | None, tool_call_id: str | None) -> str:
    """The identity of one message in the stored form (the columns of its row, or
    the ``EncodedMessage`` it will be stored as), blind to what the host rewrites."""
    if content_format == "json" and content is not None:
        try:
            body = _normal_parts(json.loads(content))
        except ValueError:
            body = normalize_text(content)
    else:
        body = normalize_text(content or "")
    key = json.dumps([role or "", body, _normal_calls(tool_calls), tool_call_id or ""],
                     ensure_ascii=True, sort_keys=True, default=str)
    return hashlib.sha256(key.encode("ascii")).hexdigest()[:16]


def fingerprint_encoded(encoded) -> str:
    """``fingerprint`` of an ``EncodedMessage``."""
    return fingerprint(encoded.role, encoded.content, encoded.content_format,
                       encoded.tool_calls, encoded.tool_call_id)


def fingerprint_block(text) -> str:
    """The fingerprint of one of the engine's own messages (summary block or its
    acknowledgement), by its text."""
    body = text if isinstance(text, str) else json.dumps(text, sort_keys=True, default=str)
    return "b" + hashlib.sha256(normalize_text(body).encode("utf-8", "surrogatepass")
                                ).hexdigest()[:15]


# The fingerprint every acknowledgement of a block has in a view.
ACK_FP = "back"


@dataclass
class Shown:
    """A shown list as identity reads it: each element's fingerprint (None: not
    conversation, e.g. a leading system prompt or a message the ignore patterns
    match), which elements may be one of the engine's own blocks (``block_fps``:
    position -> fingerprint; decided against the views), the engine copy that
    shows it (``origin``), where the turn's user message stands (``turn_index``)
    and the session whose lists this session may copy (a /branch's parent)."""

    fps: list[str | None]
    block_fps: dict[int, str] = field(default_factory=dict)
    ack_at: frozenset[int] = frozenset()
    preinserted: frozenset[int] = frozenset()
    origin: str = ""
    turn_index: int | None = None
    copy_from: str | None = None
    roles: tuple = ()
    handover: bool = False   # a list the host handed over at a session end (rule 4)
    copies: dict[int, int] = field(default_factory=dict)  # rule 7: later -> earlier copy
    # (store_ids, engine flags) of the list's first elements as this copy's last
    # ingest read them: the list goes on from that list, whose view is the hint
    settled: tuple | None = None
    # each element's host timestamp as the message carries it (None: none); a restored
    # message's row holds it (rule 3: a list with a run between two matched rows)
    stamps: tuple = ()
    # the sessions this engine copy was bound to before, newest first
    # (``earlier_sessions``): a list handed over at a session end is theirs first
    earlier: tuple = ()

    def engine_flags(self, known_blocks: set[str]) -> list[bool]:
        """Which elements may be the engine's own: ``preinserted`` ones, a block whose
        fingerprint a view of the session holds, and every acknowledgement (the
        engine's exact text in the assistant's role, which nobody else writes; the
        host may restore one away from its block: host walk 120017). A block that no
        view holds is the engine's too when the acknowledgement follows it: the pair
        is the engine's compaction output (views lost or dropped, a database from
        before views), and read as conversation the block was stored as a user
        message and the tail after it stored again. A pasted block header is
        conversation, and so is a copy of a block the user sent (``user_sent``). A
        flagged block that a view reads as a row is the user's too (``own_flags``)."""
        flags = [i in self.preinserted for i in range(len(self.fps))]
        for pos, fp in self.block_fps.items():
            if fp in known_blocks or pos + 1 in self.ack_at:
                flags[pos] = True
        for pos in self.ack_at:
            flags[pos] = True
        for pos in self.user_sent():
            flags[pos] = False
        return flags

    def user_sent(self) -> list[int]:
        """``user_sent`` of this list's elements."""
        return user_sent(self.block_fps, self.turn_index,
                         len(self.fps) - 1 if self.fps and self.fps[-1] is not None else None)

    def reading_fps(self, flags: Sequence[bool]) -> list[str | None]:
        """The fingerprints a list is aligned with against stored rows: the engine's
        elements by their block fingerprint, conversation by its own."""
        return [ACK_FP if flags[i] and i in self.ack_at else
                self.block_fps.get(i) if flags[i] else fp
                for i, fp in enumerate(self.fps)]

    def view_fps(self, flags: Sequence[bool]) -> list[str | None]:
        """The fingerprints a list is read against views with and a view holds:
        ``reading_fps``, but a conversational element that opens like a block (a
        user's copy of one) by its block fingerprint (``held_fp``). Its text equals
        the engine's block, so only its place tells them apart: read by one
        fingerprint, the view's entry at that place says whose it is (a row or
        ``BLOCK_ID``)."""
        return [ACK_FP if flags[i] and i in self.ack_at else
                self.block_fps.get(i) if flags[i] else held_fp(fp, self.block_fps.get(i))
                for i, fp in enumerate(self.fps)]


def user_sent(blocks: Container[int], turn_index: int | None,
              last: int | None) -> list[int]:
    """Which of a list's elements that open like a block (``blocks``: positions) the
    user sent, whatever their text: the turn's user message (rule 2), and a block
    copy that ends the list (``last``: its last element, None when it is not
    stored). The engine returns its block with the newest message after it, so a
    list ending with a block's text ends with a message the user just sent (the
    host's compaction before ``pre_llm_call`` shows it so)."""
    return [i for i in dict.fromkeys((turn_index, last)) if i is not None and i in blocks]


def held_fp(fp: str | None, block_fp: str | None) -> str | None:
    """The fingerprint a view holds for a conversational element (``fp``; None: not
    stored): its block fingerprint when it opens like one of the engine's blocks
    (``block_fp``), so a list read later lines it up by place, not by which of the
    two fingerprints it was read with."""
    return None if fp is None else block_fp or fp


def own_flags(flags: Sequence[bool], store_ids: Sequence[int | None]) -> list[bool]:
    """The engine's own elements of a list read against a view: those ``flags`` marks
    that the view does not read as a row. A view holds the engine's block as
    ``BLOCK_ID`` and a user's message with the same text as its row, each at its
    place: the user's copy of a block is a message, stored once and kept."""
    return [bool(flag) and not (sid is not None and sid > 0)
            for flag, sid in zip(flags, store_ids)]


# ---------------------------------------------------------------------- views
@dataclass
class View:
    """One list the engine knows the rows of: ``entries`` are (fingerprint,
    store_id) in the host's order, with ``BLOCK_ID`` / ``ACK_ID`` for the engine's
    own messages. ``session`` is the canonical session it belongs to."""

    entries: list[tuple[str, int]]
    session: str = ""
    origin: str = ""
    meta: dict = field(default_factory=dict)
    text: str = ""  # ``encode_entries(entries)`` when known (a longer view extends it)

    def encoded(self) -> str:
        """The entries as stored (``encode_entries``), worked out once."""
        if not self.text and self.entries:
            self.text = encode_entries(self.entries)
        return self.text

    def fingerprints(self) -> list[str]:
        """The entries' fingerprints, in order."""
        return [fp for fp, _ in self.entries]


def encode_entries(entries: Sequence[tuple[str, int]]) -> str:
    """A view's entries as stored: ``fp:store_id`` separated by spaces."""
    return " ".join(f"{fp}:{sid}" for fp, sid in entries)


def decode_entries(text: str) -> list[tuple[str, int]]:
    """The entries ``encode_entries`` wrote (a damaged token is skipped)."""
    out = []
    for token in (text or "").split():
        fp, _, sid = token.rpartition(":")
        try:
            out.append((fp, int(sid)))
        except ValueError:
            continue
    return out


@dataclass
class Reading:
    """How a shown list reads against the known views: for each element the
    store_id it is (None: unknown yet), which view explained it, and the runs
    still to look up (``gaps``: start, end, store_id before, store_id after)."""

    store_ids: list[int | None]
    view: View | None
    matched: int
    gaps: list[tuple[int, int, int | None, int | None]] = field(default_factory=list)
    # position -> earlier position it replays (rule 5): one row for both, new or not
    same_as: dict[int, int] = field(default_factory=dict)


def continues(shown: Sequence[str | None], view: View) -> bool:
    """Whether the list starts with the whole view (and may go on after it)."""
    fps = view.fingerprints()
    present = [fp for fp in shown if fp is not None]
    return bool(fps) and present[:len(fps)] == fps


def read_against(shown: Sequence[str | None], view: View) -> tuple[list[int | None], int]:
    """The store_ids a view gives the shown fingerprints (engine elements as
    ``BLOCK_ID``/``ACK_ID``) and how many conversational elements it matched."""
    ids: list[int | None] = [None] * len(shown)
    matched = 0
    fps = view.fingerprints()
    present = [i for i, fp in enumerate(shown) if fp is not None]
    if len(present) >= len(fps) and all(shown[present[j]] == fp for j, fp in enumerate(fps)):
        # The list goes on from this view: the view is its start, the rest is new (a
        # repeated "ok" at its end is not the view's last "ok").
        pairs = [(present[j], j) for j in range(len(fps))]
    elif present and all(shown[i] == fps[j] for j, i in enumerate(present)):
        # The list is the view cut short (an /undo): each element is the view's at
        # its place (the undone reply's newer twin is not the one that stayed).
        pairs = [(i, j) for j, i in enumerate(present)]
    else:
        pairs = lcs_pairs(list(shown), fps)
        if len(present) == len(fps):
            # As long as the view and no more matched than at their places: an edit in
            # place (the replaced element is the new one, the others keep theirs).
            placed = [(i, j) for j, i in enumerate(present) if shown[i] == fps[j]]
            if len(placed) >= len(pairs):
                pairs = placed
    for i, j in pairs:
        ids[i] = view.entries[j][1]
        if ids[i] > 0:
            matched += 1
    return ids, matched


def read(shown: Sequence[str | None], views: Sequence[View], *,
         turn_index: int | None = None, roles: Sequence[str] | None = None,
         engine: Sequence[bool] | None = None,
         copies: dict[int, int] | None = None, stamps: Sequence[object] = ()) -> Reading:
    """Read a shown list (its fingerprints, None where nothing is to be stored)
    against the session's views, newest first (rules 1-3 of the module).

    ``turn_index`` is where the turn's user message stands (rule 2). Given the
    elements' ``roles`` (and which are the ``engine``'s), a view is credited only
    with what ``replies_follow`` leaves of its reading: an "ok" it matched after a
    message it could not is no evidence (host walk 160017: an older list's "ok"
    replies outvoted the view the list went on from). Gaps are returned for the
    caller to look up in the store (``align_gap``). ``copies`` are rule 7's later
    copies (later -> earlier), read as nothing (None in ``shown``) yet holding their
    places in a replay (rule 5); ``stamps`` are the elements' host timestamps (rule 7's
    replay: ``_rewritten_runs``)."""
    best: tuple[float, int, list[int | None], View | None] = (0, 0, [None] * len(shown), None)
    limit = len(shown) if turn_index is None else turn_index
    wanted = sum(1 for fp in shown[:limit] if fp is not None)
    for view in views:  # newest first; ``views`` may be a lazy iterator
        ids, matched = read_against(shown, view)
        # The view that explains most of what precedes the turn wins (the engine's own
        # block counts: it is the strongest evidence of which list this is); between
        # two that explain as much, the newer, or one the list simply goes on from.
        credited = ids if roles is None else replies_follow(
            ids, shown, roles, own_flags(engine or [False] * len(shown), ids))
        score: float = sum(1 for sid in credited[:limit] if sid is not None)
        if continues(shown, view):
            score += 0.25
        if matched and score > best[0]:
            best = (score, matched, ids, view)
        if score >= wanted:  # explained entirely: no older view can do better
            break
    _, matched, ids, view = best
    if turn_index is not None:
        for k in range(turn_index, len(ids)):
            if ids[k] is not None and ids[k] > 0:
                matched -= 1
            if ids[k] is None or ids[k] > 0:
                ids[k] = None
    if matched <= 0:  # what matched was only the turn itself: nothing is explained
        view = None
    reading = Reading(store_ids=ids, view=view, matched=matched)
    if view is None:
        return reading
    # Views may hold the same row twice (a list that showed a message twice): a
    # row is claimed once, by its first element.
    seen: set[int] = set()
    for k, sid in enumerate(ids):
        if sid is not None and sid > 0:
            if sid in seen:
                ids[k] = None
                reading.matched -= 1
            seen.add(sid)
    reading.matched += _replays(shown, ids, limit, reading.same_as, copies or {}, stamps)
    if roles is not None:
        reading.matched -= _unanchor_trailing_replies(shown, ids, limit, roles, engine)
    reading.gaps = find_gaps(shown, ids, limit)
    return reading


def _unanchor_trailing_replies(shown: Sequence[str | None], ids: list[int | None], limit: int,
                               roles: Sequence[str], engine: Sequence[bool] | None) -> int:
    """Rule 1 before the gaps: when the reading's last matches (before ``limit``) are
    replies after an element it could not match, which ``replies_follow`` would make new,
    they are no anchors: they are unmatched, and the run after the last match rule 1
    keeps goes on with them (a trailing run, rule 3). Returns how many were unmatched.

    Why: a reply's row is not the list's reply because its text is equal. A CLI restored
    after a second CLI's turns ([..., T12, ok, continue, ok, T17, ...]) was read against
    its own older view [..., T12, ok, T16, ok]: "continue" matched nothing, its "ok"
    matched T16's, and the gap before that row could not hold "continue" (its row is
    higher): "continue" and its "ok" were stored again (host walk 1910005). Only the
    last matches: a reply matched before a later match still places a run between two
    matches (``Alignment._slide_into_room``, host walk 1500005)."""
    kept = replies_follow(ids, shown, roles, own_flags(engine or [False] * len(shown), ids))
    matched = [k for k in range(limit) if ids[k] is not None and ids[k] > 0]
    trusted = [k for k in matched if kept[k] is not None]
    if not matched or not trusted or kept[matched[-1]] is not None:
        return 0
    undone = [k for k in matched if k > trusted[-1]]
    for k in undone:
        ids[k] = None
    return len(undone)


def find_gaps(shown: Sequence[str | None], ids: Sequence[int | None],
              limit: int) -> list[tuple[int, int, int | None, int | None]]:
    """The runs of unexplained elements before ``limit`` that a matched row bounds:
    (start, end, the store_id before, the store_id after; None at the list's end, or
    when the next matched row is lower: the list starts over there (host walk 1620011))."""
    gaps = []
    k = 0
    while k < limit:
        if shown[k] is None or ids[k] is not None:
            k += 1
            continue
        start = k
        while k < limit and (shown[k] is None or ids[k] is None):
            k += 1
        before = next((ids[p] for p in range(start - 1, -1, -1)
                       if ids[p] is not None and ids[p] > 0), None)
        after = next((ids[p] for p in range(k, len(ids)) if ids[p] is not None and ids[p] > 0),
                     None) if k < limit else None
        if before is not None and after is not None and after <= before:
            after = None
        if before is not None or after is not None:
            gaps.append((start, k, before, after))
    return gaps


def _replays(shown: Sequence[str | None], ids: list[int | None], limit: int,
             same_as: dict[int, int], copies: dict[int, int],
             stamps: Sequence[object] = ()) -> int:
    """Rule 5: elements after a repeated block that repeat, in order, those after
    the block's other copy share their rows (``ids`` is updated, whichever copy the
    view matched; where neither copy has a row yet, ``same_as`` records that the
    later one is the earlier one, so both get the one new row); how many got a row.

    A later copy of an element (rule 7, in ``copies``: read as nothing) holds its
    place in the replay and gets its row from rule 7. Why: the host restored its
    compacted transcript twice with the original timestamps, so everything after the
    later block was such a copy but the re-sent text after them; read as the replay of
    the earlier copy's question, the re-send shared that row, was left out of the
    prompt and lost (host walk 610001)."""
    placed = [shown[copies[k]] if shown[k] is None and k in copies else shown[k]
              for k in range(len(shown))]
    rewritten = list(_rewritten_runs(placed, copies, limit, stamps))
    at: dict[str, list[int]] = {}
    for k in range(limit):
        if shown[k] is not None and ids[k] in (None, BLOCK_ID):
            at.setdefault(shown[k], []).append(k)
    repeated = [ks for ks in at.values() if len(ks) > 1 and any(ids[k] == BLOCK_ID for k in ks)]
    copies = sorted(k for ks in repeated for k in ks)
    for k in copies:
        ids[k] = BLOCK_ID

    def run_after(k: int) -> range:
        return range(k + 1, next((c for c in copies if c > k), limit))

    given = 0
    for ks in repeated:
        for first, second in zip(ks, ks[1:]):
            earlier, later = run_after(first), _restored(run_after(second), run_after(first),
                                                         stamps)
            for e, l in replay_pairs([placed[i] for i in earlier], [placed[i] for i in later]):
                given += _share(shown, ids, same_as, earlier[e], later[l])
    for earlier, later in rewritten:
        for one, other in zip(earlier, later):
            given += _share(shown, ids, same_as, one, other)
    return given


def _restored(later: range, earlier: range, stamps: Sequence[object]) -> range:
    """The part of a replay's run (rule 5) that the host restored with the run it
    replays: up to its first element without a host timestamp, when the earlier run's
    elements carry them. Why: a restore stamps every message, and one without a stamp
    was sent since (a /retry's re-send after a /resume of a list written twice); read as
    the replay of the restored question at its place, it shared that row and was lost
    (host walk 1310001). Without timestamps (a host that sets none) the run is whole."""
    if not any(k < len(stamps) and _stamped(stamps[k]) for k in earlier):
        return later
    end = next((k for k in later if k >= len(stamps) or not _stamped(stamps[k])), later.stop)
    return range(later.start, end)


def _share(shown: Sequence[str | None], ids: list[int | None], same_as: dict[int, int],
           one: int, other: int) -> int:
    """One replayed pair (``other`` shows ``one`` again): the row either has goes to the
    one without; with none, ``same_as`` makes them one new row; with two, the earlier
    copy's row is both. 1 when a row was given. Why one place: rules 5 and 7's
    replays pair elements the same way.

    Why the earlier row: the view's reading lines the earlier copy up with the rows
    after the block in order, and the later copy only with what the view lists after
    those, an equal text further on. A /branch's two turns, both undone, left the
    view with an "ok" after the kept rows; the later copy's "ok" took that row, and
    the /compress of the list returned it last, the question it answers right before
    the next user message, which the host merged with it (soak seed 2380001)."""
    if shown[one] is None or shown[other] is None:
        return 0
    if ids[one] is not None and ids[one] > 0 and ids[other] is not None and ids[other] > 0:
        ids[other] = ids[one]
        return 0
    if ids[one] is None and ids[other] is not None and ids[other] > 0:
        ids[one] = ids[other]
        return 1
    if ids[other] is None and ids[one] is not None and ids[one] > 0:
        ids[other] = ids[one]
        return 1
    if ids[one] is None and ids[other] is None:
        same_as[other] = same_as.get(one, one)
    return 0


def _rewritten_runs(placed: Sequence[str | None], copies: dict[int, int], limit: int,
                    stamps: Sequence[object]) -> Iterator[tuple[range, range]]:
    """Rule 7's replay: where a run of later copies (``copies``: later -> earlier)
    opens a second copy of the list, the elements after it that repeat, in order and
    whole, those between the earlier copies and it, every one of both with a host
    timestamp (both restored from the host's transcript): (those, the repeats).

    Why: the host writes the list a /compress returned to its state.db twice, stamping
    each message that carries no timestamp at each write, and a /resume restores both
    copies. The first message and its reply kept their timestamps (rule 7's copies);
    the re-sent turn after them, stamped anew, read as a third send of its text and
    was stored again (soak seed 1130002, rare flows weighted up). A run that differs
    anywhere (a /retry's new reply) is no such copy, nor one without timestamps (sent
    since the restore: a new message, as in rule 7)."""
    for c in sorted(copies):
        o = copies[c]
        if copies.get(c - 1) == o - 1:
            continue  # inside a run of copies: read from its first
        m = 1
        while copies.get(c + m) == o + m:
            m += 1
        earlier = range(o + m, c)
        end = next((k for k in sorted(copies) if k >= c + m), limit)
        later = range(c + m, min(end, limit, c + m + len(earlier)))
        if earlier and len(later) == len(earlier) \
                and [placed[k] for k in earlier] == [placed[k] for k in later] \
                and all(k < len(stamps) and _stamped(stamps[k]) for k in (*earlier, *later)):
            yield earlier, later


def replayed(shown: Sequence[str | None], store_ids: Sequence[int | None],
             engine: Sequence[bool], ack_at: Container[int], limit: int,
             copies: dict[int, int], stamps: Sequence[object] = ()
             ) -> tuple[list[int | None], dict[int, int]]:
    """Rule 5 for a list no view explains (rule 6 aligned it): its rows with those
    the replay gives, and which later element replays which earlier one
    (``same_as``). Why: ``read`` applies rule 5 only to a view's reading; a /branch's
    first list of a compacted transcript the host wrote twice (the second time with
    new timestamps on the block and the turn it ran in) had rule 7 share the rows of
    the elements with equal timestamps only, and that turn was stored twice (host
    walk 1110002)."""
    ids = [ACK_ID if engine[k] and k in ack_at else BLOCK_ID if engine[k] else sid
           for k, sid in enumerate(store_ids)]
    same_as: dict[int, int] = {}
    _replays(shown, ids, limit, same_as, copies, stamps)
    return [sid if sid is not None and sid > 0 else None for sid in ids], same_as


def timed_copies(fps: Sequence[str | None], stamps: Sequence[object]) -> dict[int, int]:
    """Rule 7: elements of one list with the same fingerprint and the same host
    timestamp are one message shown twice (the host wrote its transcript twice and
    restored both copies): later position -> the first one. Elements without a
    timestamp are never copies (a re-sent text is a new message)."""
    first: dict[tuple, int] = {}
    out: dict[int, int] = {}
    for i, (fp, stamp) in enumerate(zip(fps, stamps)):
        if fp is None or not _stamped(stamp):
            continue
        key = (fp, repr(stamp))
        if key in first:
            out[i] = first[key]
        else:
            first[key] = i
    return out


def _stamped(stamp: object) -> bool:
    """Whether an element carries a host timestamp (rule 7)."""
    return not (stamp is None or stamp == "" or isinstance(stamp, bool))


def share_rows(store_ids: list[int | None], same_as: dict[int, int]) -> list[int | None]:
    """Rules 5 and 7 after the gaps are looked up: an element that replays another
    shares the row either one found (``same_as``: later -> earlier)."""
    out = list(store_ids)
    for later, earlier in sorted(same_as.items()):
        if out[later] is None and out[earlier] is not None:
            out[later] = out[earlier]
        elif out[earlier] is None and out[later] is not None:
            out[earlier] = out[later]
    return out


def align_gap(shown: Sequence[str | None], rows: Sequence[tuple[int, str]], *,
              trailing: bool, taken: set[int]) -> list[int | None]:
    """Store_ids for one unmatched run (rule 3): ``rows`` are the candidate
    ``(store_id, fingerprint)`` in store order; rows in ``taken`` are claimed by
    other elements already. A run between two matched elements takes a longest
    common subsequence; a trailing run lines up in order and stops at the first
    element that does not: a message after a new one is new itself."""
    free = [(sid, fp) for sid, fp in rows if sid not in taken]
    out: list[int | None] = [None] * len(shown)
    if not trailing:
        for i, j in lcs_pairs(list(shown), [fp for _, fp in free]):
            out[i] = free[j][0]
        return out
    cursor = 0
    for i, fp in enumerate(shown):
        if fp is None:
            continue
        found = next((o for o in range(cursor, min(len(free), cursor + LOOKAHEAD))
                      if free[o][1] == fp), None)
        if found is None:
            break
        out[i], cursor = free[found][0], found + 1
    return out


def replies_follow(store_ids: list[int | None], fps: Sequence[str | None],
                   roles: Sequence[str], engine: Sequence[bool]) -> list[int | None]:
    """Rule 1's other half: a reply belongs to the message it answers. Once an
    element is new, the non-user messages after it (its replies, tool calls and
    results) are new too, until a user message that is stored already: a
    repeated "ok" after a new request is that request's answer, not an undone one."""
    out = list(store_ids)
    carry = False
    for i, fp in enumerate(fps):
        if fp is None or engine[i]:
            continue
        role = roles[i] if i < len(roles) else ""
        if out[i] is None:
            carry = True
        elif role == "user":
            carry = False
        elif carry:
            out[i] = None
    return out


def earlier_sessions(earlier: tuple, leaving: str | None, joining: str) -> tuple:
    """The sessions an engine copy was bound to before ``joining``, newest first and
    at most ``EARLIER_SESSIONS``: ``leaving`` (the session it is bound to now) ahead
    of the ones it had.

    Why: after /new or /resume the CLI hands the previous session's transcript to
    ``on_session_end`` under the new session's id (rule 4). That list was told apart
    only by the newest views of all other sessions, and with a gateway writing to the
    same database those were soon all the gateway's: the transcript was stored again
    under the new session. The copy itself knows which sessions it showed."""
    ahead = (leaving,) if leaving and leaving != joining else ()
    kept = tuple(s for s in earlier if s != joining)
    return tuple(dict.fromkeys(ahead + kept))[:EARLIER_SESSIONS]


def foreign_owner(shown: Sequence[str | None], own_matched: int,
                  others: Sequence[View]) -> View | None:
    """The view of another session that explains this list (rule 4), or None.

    Only a list of two or more elements can be another session's, only when
    another session's view explains ``FOREIGN_SHARE`` of it and more of it than
    the session's own views do. Two elements the view holds are the evidence: two
    messages, or that session's block and a message after it (a block is the
    engine's for one session only). A /branch handed over at /new before a turn of
    its own, its copy of a compacted parent undone down to [block, reply], is the
    parent's (host walk 3320002: the reply was stored again in the branch)."""
    wanted = sum(1 for fp in shown if fp is not None)
    if wanted < 2:
        return None
    for view in others:
        reading = read(shown, [view])  # with rule 5: a doubled restore counts whole
        # the view's own blocks are that session's, not conversation to explain
        own_blocks = sum(1 for sid in reading.store_ids if sid in (BLOCK_ID, ACK_ID))
        matched = reading.matched
        block = any(sid == BLOCK_ID for sid in reading.store_ids)  # an ack is any session's
        if matched + block >= 2 and matched > own_matched \
                and matched >= FOREIGN_SHARE * (wanted - own_blocks):
            return view
    return None


def matched_count(alignment: Sequence[int | None]) -> int:
    """How many shown messages an alignment found in the store."""
    return sum(1 for store_id in alignment if store_id is not None)
