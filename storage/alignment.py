"""Which stored row each shown message is: the store's half of ``storage/identity``.

``Store`` inherits these methods (``Alignment``): ``_identify`` applies identity's rules
inside the ingest transaction (the session's views, the rows a gap may be, another
session's views for a handed-over list), and the legacy anchored alignment serves
lists no view explains. All SQL here reads messages, nodes' lineage and views; the
rows themselves are written by ``store.Store.ingest``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from . import identity, views
from .alignment_legacy import KnownTail, legacy_alignment  # noqa: F401 (KnownTail: the API)
from .alignment_rows import (ALIGN_SLACK, FP_COLUMNS, fingerprints_of, fresh_from,
                             gap_rows, listed_between, listed_or_own_send, pin_timed, row_fp,
                             rows_between)



@dataclass
class _Identified:
    """Identity's answer for one list: store_ids (None: new), the engine's own
    elements, and the elements of another session's list (never stored)."""

    store_ids: list[int | None]
    engine: list[bool]
    foreign: frozenset[int] = frozenset()
    foreign_of: str | None = None
    same_as: dict[int, int] = field(default_factory=dict)  # a replay -> what it replays
    settled: bool = False  # read as the hint's list going on (``_read_settled``)
    resent: frozenset[int] = frozenset()  # read as a send of its own with its reply (new)


def view_entries(shown: identity.Shown, alignment: Sequence[int | None],
                 flags: Sequence[bool], start: int = 0) -> list[tuple[str, int]]:
    """A list's view: each element's fingerprint with its row, or with
    ``BLOCK_ID``/``ACK_ID`` for the engine's own; elements with neither are left out
    (from ``start`` on: the view of the list's elements from there)."""
    fps = shown.view_fps(flags)
    entries = []
    for i in range(start, len(fps)):
        fp = fps[i]
        if fp is None:
            continue
        if flags[i]:
            entries.append((fp, identity.ACK_ID if i in shown.ack_at else identity.BLOCK_ID))
        elif alignment[i] is not None:
            entries.append((fp, int(alignment[i])))
    return entries


BELOW_CHECKED = 64            # fresh rows below a list's first row looked up in its views
SLIDE_RUN = 8                 # a view's matched run slides back into a gap this far at most


def _lowest_followed(conn, session_id: str, claimed: set[int]) -> int:
    """The lowest row a list claiming ``claimed`` could go on with: its own first row,
    or a row that followed those rows in an earlier list of the session (an /undo
    after an edit drops rows older than the edited one's new row: [9, 10, 7, 8] ->
    [9, 10], and [9, 10, 7, 8] shown again is those rows, not new ones)."""
    low = min(claimed)
    below = [row[0] for row in conn.execute(
        "SELECT store_id FROM messages AS m WHERE session_id = ? AND store_id < ? AND NOT EXISTS"
        " (SELECT 1 FROM node_edges AS e WHERE e.child_store_id = m.store_id)"
        " ORDER BY store_id DESC LIMIT ?", (session_id, low, BELOW_CHECKED))]
    # only fresh rows below the list's first can be missed, and only views naming one
    for view in views.holding(conn, session_id, below, views.RING):
        ids = [sid for _, sid in view.entries]
        last = max((k for k, sid in enumerate(ids) if sid in claimed), default=None)
        if last is not None:
            low = min([low] + [sid for sid in ids[last + 1:] if sid > 0])
    return low


def _after(view: identity.View, store_id: int) -> list[int]:
    """The rows ``view`` lists after ``store_id``'s place in it."""
    ids = [sid for _, sid in view.entries]
    at = max((k for k, sid in enumerate(ids) if sid == store_id), default=len(ids))
    return [sid for sid in ids[at + 1:] if sid > 0]





def _block_before(fps: list, flags: list, ack_at, start: int) -> str | None:
    """The fingerprint of the engine's block nearest before ``start`` in a list,
    or None when none precedes it (its acknowledgement is no block)."""
    return next((fps[k] for k in range(start - 1, -1, -1)
                 if flags[k] and k not in ack_at), None)


def _rows_line_up(conn, session_id: str, run: list, before: int, after: int,
                  ids: list) -> bool:
    """Whether the session's rows between ``before`` and ``after`` that no element of
    the list claims line up, by fingerprint, with every element of a gap's ``run``
    (rule 3's reading of a run between two matches): only then can they be the gap."""
    wanted = sum(1 for fp in run if fp is not None)
    rows = gap_rows(conn, session_id, before, after, wanted + ALIGN_SLACK, fresh_only=False)
    claimed = {sid for sid in ids if sid is not None and sid > 0}
    aligned = identity.align_gap(run, rows, trailing=False, taken=claimed)
    return identity.matched_count(aligned) >= wanted


class Alignment:
    """The identity half of ``store.Store`` (a mixin: it uses only the connection
    the caller passes and ``self.db``)."""

    def _identify(self, conn, session_id: str, shown: identity.Shown,
                  hashes: list[str | None], hint: identity.View | None,
                  known: KnownTail | None) -> "_Identified":
        """Which row each shown element is (``storage/identity``, rules 1-7)."""
        copies = shown.copies
        if not copies:
            return self._identify_once(conn, session_id, shown, hashes, hint, known)
        # rule 7: a later copy of an element is read as nothing (holding its place in a
        # replay: ``identity.read``), then shares its row
        masked = replace(shown, fps=[None if i in copies else fp
                                     for i, fp in enumerate(shown.fps)])
        found = self._identify_once(conn, session_id, masked,
                                    [None if i in copies else h for i, h in enumerate(hashes)],
                                    hint, known)
        found.store_ids = identity.share_rows(found.store_ids, copies)
        found.same_as = {**copies, **found.same_as}
        if found.foreign:  # a copy of another session's message is that session's too
            found.foreign = found.foreign | {i for i, j in copies.items() if j in found.foreign}
        return found

    def _identify_once(self, conn, session_id: str, shown: identity.Shown,
                       hashes: list[str | None], hint: identity.View | None,
                       known: KnownTail | None) -> "_Identified":
        """Rules 1-6 for a list whose later copies of its own elements (rule 7) are
        read as nothing."""
        # A list handed over at a session end that the fast paths read as going on with
        # new messages is read whole: those may be another session's (rule 4).
        if shown.settled is not None and hint is not None and hint.session == session_id:
            found = self._read_settled(conn, session_id, shown)
            if found is not None and not (shown.handover and self._unexplained(shown, found)):
                return found
        if hint is not None and hint.session == session_id:
            fast = self._read_views(conn, session_id, shown, [hint], gaps=False)
            if fast is not None and not (shown.handover and self._unexplained(shown, fast)):
                return fast
        # a /branch shows its parent's block before it has views: the parent's (and
        # theirs, a branch of a branch) are the engine's too, also when another
        # process resumed the branch and never saw the /branch
        known_blocks = views.lineage_block_fps(conn, session_id, shown.copy_from)
        found = self._read_views(conn, session_id, shown, views.each(conn, session_id),
                                 gaps=True, known_blocks=known_blocks)
        if found is not None and not found.foreign:
            open_ = self._unexplained(shown, found)
            if open_:
                # Part of it is no view's: a whole-transcript list from before the ring
                # (a stale copy, a replay) may line up with the history as it stands.
                legacy = legacy_alignment(conn, session_id, self._masked(
                    shown, shown.fps, found.engine), known, any(found.engine),
                    self._masked(shown, hashes, found.engine))
                if identity.matched_count(legacy) > sum(
                        1 for sid in found.store_ids if sid is not None):
                    return _Identified(legacy, found.engine)
        if found is not None:
            return found
        # No view explains the list: another session's list, or one from before views.
        flags = shown.engine_flags(known_blocks)
        if shown.handover:
            owner, body = self._foreign_list(conn, session_id, shown, known_blocks)
            if owner is not None:
                return _Identified([None] * len(shown.fps), flags, foreign=frozenset(body),
                                   foreign_of=owner.session)
        alignment = legacy_alignment(conn, session_id, self._masked(shown, shown.fps, flags),
                                     known, any(flags) or bool(shown.preinserted),
                                     self._masked(shown, hashes, flags))
        # rule 5 holds for it too: a repeated block replays what followed it
        alignment, same_as = identity.replayed(
            shown.view_fps(flags), alignment, flags, shown.ack_at,
            len(shown.fps) if shown.turn_index is None else shown.turn_index, shown.copies,
            shown.stamps)
        return _Identified(alignment, flags, same_as=same_as)

    @staticmethod
    def _foreign_list(conn, session_id: str, shown: identity.Shown, known_blocks: set[str],
                      own_matched: int = 0) -> tuple[identity.View | None, list[int]]:
        """Rule 4: the other session whose view explains the list better than the
        ``own_matched`` elements this session's views do, and the list's elements
        before the turn. The blocks that session rendered count as its own, not as
        conversation (its compacted list at exit, seed 80000). The sessions this copy
        was bound to before are read first (``Shown.earlier``), then the newest views
        of all others."""
        others = [v for earlier in shown.earlier if earlier != session_id
                  for v in views.load(conn, earlier, views.RING)] \
            + list(views.load_others(conn, session_id))
        blocks = known_blocks | {fp for v in others for fp, sid in v.entries
                                 if sid == identity.BLOCK_ID}
        fps = shown.view_fps(shown.engine_flags(blocks))
        body = [i for i, fp in enumerate(fps) if fp is not None
                and (shown.turn_index is None or i < shown.turn_index)]
        owner = identity.foreign_owner([fps[i] for i in body], own_matched, others)
        return owner, [i for i in body if shown.fps[i] is not None]

    @staticmethod
    def _masked(shown: identity.Shown, hashes: Sequence[str | None],
                flags: list[bool]) -> list[str | None]:
        """Fingerprints (or content hashes) for the legacy rule: none for the engine's
        own elements, and none from the turn's user message on (rule 2: those are new)."""
        out = [None if flags[i] else h for i, h in enumerate(hashes)]
        if shown.turn_index is not None:
            out = out[:shown.turn_index] + [None] * (len(out) - shown.turn_index)
        return out

    @staticmethod
    def _unexplained(shown: identity.Shown, found: "_Identified") -> list[int]:
        """Conversational elements before the turn that no row explains yet."""
        limit = len(shown.fps) if shown.turn_index is None else shown.turn_index
        return [i for i in range(limit) if shown.fps[i] is not None and not found.engine[i]
                and found.store_ids[i] is None and i not in found.resent]

    def _read_views(self, conn, session_id: str, shown: identity.Shown,
                    candidates: Iterable[identity.View], *, gaps: bool,
                    known_blocks: set[str] | None = None) -> "_Identified | None":
        """Read the list against ``candidates`` (newest first); None when they explain
        nothing (or, without ``gaps``, when the list is not explained whole)."""
        reading, flags = self._view_reading(conn, session_id, shown, candidates, gaps=gaps,
                                            known_blocks=known_blocks)
        if reading is None:
            return None
        ids = reading.store_ids
        fps = shown.reading_fps(flags)
        if not gaps:  # the fast path: the one view explains every element before the turn
            if reading.gaps and not self._only_new_after(
                    conn, session_id, reading.gaps,
                    {sid for sid in ids if sid is not None and sid > 0}):
                return None
            return _Identified(identity.share_rows(identity.replies_follow(
                [sid if sid is not None and sid > 0 else None for sid in ids], fps,
                shown.roles, flags), reading.same_as), flags, same_as=reading.same_as)
        limit = len(fps) if shown.turn_index is None else shown.turn_index
        if pin_timed(conn, session_id, shown, fps, ids, flags, reading.gaps):
            reading.gaps = identity.find_gaps(fps, ids, limit)
        # a run slid back leaves a gap before it that may take the next slide (host walk
        # 1910002: two restored sends of one text before the view's matched run)
        for _ in range(SLIDE_RUN):
            if not self._slide_into_room(conn, session_id, fps, ids, reading.gaps, shown.roles):
                break
            reading.gaps = identity.find_gaps(fps, ids, limit)
        taken = {sid for sid in ids if sid is not None and sid > 0}
        seen_with: dict = {}    # per block shown: its views read once per list
        resent: set[int] = set()
        for start, end, before, after in reading.gaps:
            run, matched = fps[start:end], before
            # After the engine's block only rows no summary covers are candidates: the
            # block stands for the summarized ones (a repeated "ok" is never mapped
            # onto an old, summarized copy and dropped from the prompt).
            if after is None and reading.view is not None:
                # after a returned list: not onto rows that compaction saw and dropped
                before = max(before or 0, int(reading.view.meta.get("seen") or 0)) or None
            block = _block_before(fps, flags, shown.ack_at, start)
            rendered, beside = self._block_in_views(conn, session_id, block, seen_with)
            candidates = {"fresh_only": any(flags[:start]),
                          "rendered": rendered if before is not None else None,
                          "beside": beside}
            rows = gap_rows(conn, session_id, before, after,
                            sum(1 for fp in run if fp is not None) + ALIGN_SLACK,
                            **candidates)
            rows = listed_between(conn, session_id, before, after, rows, **candidates) + rows
            rows = self._listed_after_blocks(conn, session_id, fps, flags, shown.ack_at,
                                             range(start, end), rows, seen_with) + rows
            aligned = plain = identity.align_gap(run, rows, trailing=after is None, taken=taken)
            after_match = start > 0 and ids[start - 1] == matched   # the send before the run
            if after is None and after_match and all(sid is None for sid in aligned):
                aligned = self._slide_back_for_run(conn, session_id, fps, ids, start, run,
                                                   taken, candidates, bool(rows)) or aligned
                if rows and all(sid is None for sid in aligned) and self._answered_otherwise(
                        conn, session_id, fps, shown.roles, start, end, matched):
                    aligned = listed_or_own_send(conn, session_id, fps, ids, taken, resent,
                                                 start, end, end, candidates) or aligned
            elif after is None and after_match and self._sends_answered_otherwise(
                    conn, session_id, fps, shown.roles, start, end, aligned):
                # the view's last matched elements may be this run (host walk 1110000)
                aligned = self._slide_back_for_run(conn, session_id, fps, ids, start, run,
                                                   taken, candidates, bool(rows)) or aligned
            elif after is not None and rows and after_match \
                    and all(sid is None for sid in aligned) and self._answered_otherwise(
                        conn, session_id, fps, shown.roles, start, end, matched):
                # between two matches too: a second CLI's restored branch shows its
                # undone copied send, read as the re-send after it (host walk 1590006);
                # its reply goes on after the run's end (rule 1 makes it new there too);
                # unless a view lists the text answered by the run (host walk 3330003)
                reply_end = next((k for k in range(end, limit) if fps[k] is not None
                                  and k < len(shown.roles) and shown.roles[k] == "user"),
                                 limit)
                aligned = listed_or_own_send(conn, session_id, fps, ids, taken, resent,
                                             start, end, reply_end, candidates) or aligned
            aligned = self._without_own_sends(conn, session_id, fps, shown.roles, start, end,
                                              run, rows if aligned is plain else None,
                                              after is None, taken, aligned, resent)
            for offset, sid in enumerate(aligned):
                if sid is not None:
                    ids[start + offset] = sid
                    taken.add(sid)
        alignment = identity.share_rows(identity.replies_follow(
            [sid if sid is not None and sid > 0 else None for sid in ids], fps,
            shown.roles, flags), reading.same_as)
        limit = len(fps) if shown.turn_index is None else shown.turn_index
        open_ = [i for i in range(limit) if fps[i] is not None and not flags[i]
                 and alignment[i] is None]
        wanted = sum(1 for i in range(limit) if fps[i] is not None and not flags[i])
        if shown.handover and open_:
            # Part of it is unexplained: it may be another session's list (rule 4), when
            # another session's view explains more of it than this session's do.
            owner, _ = self._foreign_list(conn, session_id, shown, known_blocks,
                                          own_matched=wanted - len(open_))
            if owner is not None:
                return _Identified(alignment, flags, foreign=frozenset(open_),
                                   foreign_of=owner.session)
        return _Identified(alignment, flags, same_as=reading.same_as, resent=frozenset(resent))

    def _view_reading(self, conn, session_id: str, shown: identity.Shown,
                      candidates: Iterable[identity.View], *, gaps: bool,
                      known_blocks: set[str] | None = None
                      ) -> tuple[identity.Reading | None, list[bool]]:
        """How the list reads against ``candidates`` before any gap is looked up, and
        which of its elements are the engine's own: (reading, flags); the reading is
        None when they explain nothing, and the flags are then ``engine_flags``'s."""
        candidates = iter(candidates)
        if known_blocks is None:
            candidates = list(candidates)
            known_blocks = {fp for v in candidates for fp, sid in v.entries
                            if sid == identity.BLOCK_ID}
        flags = shown.engine_flags(known_blocks)
        held = shown.view_fps(flags)
        blocks = {held[i] for i, flag in enumerate(flags) if flag and i not in shown.ack_at}
        if blocks:  # a list carrying one of the engine's blocks is read against its views
            candidates = (v for v in candidates if any(fp in blocks for fp, _ in v.entries))
        if not gaps:
            # the fast path serves only a list that goes on from the view (the next turn)
            candidates = [v for v in candidates if identity.continues(held, v)]
        reading = identity.read(held, candidates, turn_index=shown.turn_index,
                                roles=shown.roles, engine=flags, copies=shown.copies,
                                stamps=shown.stamps)
        if reading.view is None and gaps and blocks:
            reading = self._after_returned(conn, session_id, shown, held, flags) or reading
        if reading.view is None:
            return None, flags
        # a block the view reads as a row is the user's copy of it (a message)
        return reading, identity.own_flags(flags, reading.store_ids)

    def engine_elements(self, session_id: str, shown: identity.Shown) -> list[bool]:
        """Which elements of a shown list are the engine's own block and
        acknowledgement, as an ingest of it would read them, writing nothing.

        Why: a question about a list that stores nothing (the /compress preflight)
        must get the ingest's answer. By the views' blocks alone, a user's copy of a
        block (its very text) was the engine's wherever it stood; only the views'
        reading of its place tells it is a message (``identity.own_flags``)."""
        with self.db.reading() as conn:
            canonical = self._canonical(conn, session_id)
            known_blocks = views.lineage_block_fps(conn, canonical, shown.copy_from)
            _, flags = self._view_reading(conn, canonical, shown, views.each(conn, canonical),
                                          gaps=True, known_blocks=known_blocks)
            return flags

    @staticmethod
    def _after_returned(conn, session_id: str, shown: identity.Shown, fps: list,
                        flags: list) -> identity.Reading | None:
        """A list whose block is one the engine returned but none of whose messages a
        view holds, read as that returned list going on: the block (and its
        acknowledgement) are the engine's, and the run after them is a gap after the
        newest row that list was shown (rule 3 looks it up among the rows after it,
        with the rows summarized since the block was rendered still candidates).
        None when no returned view holds the list's first block or nothing follows it.

        Why: the views of the lists that went on from a returned list leave the rings
        as the session goes on; a second CLI that restored the session long before shows
        its old block and the turns after it, which the first CLI has summarized since.
        Only the returned view still held the block, it matched none of those turns, and
        all of them were stored again (host walk 280002: 16 rows)."""
        at = next((k for k, flag in enumerate(flags)
                   if flag and k not in shown.ack_at and fps[k] is not None), None)
        if at is None:
            return None
        limit = len(fps) if shown.turn_index is None else shown.turn_index
        start = next((k for k in range(at + 1, limit) if fps[k] is not None and not flags[k]),
                     None)
        if start is None:
            return None
        view = next((v for v in views.each(conn, session_id)
                     if int((v.meta or {}).get("seen") or 0) > 0
                     and (fps[at], identity.BLOCK_ID) in v.entries), None)
        if view is None:
            return None
        ids: list[int | None] = [None] * len(fps)
        for k in range(len(fps)):
            if flags[k] and fps[k] is not None:
                ids[k] = identity.ACK_ID if k in shown.ack_at else identity.BLOCK_ID
        return identity.Reading(store_ids=ids, view=view, matched=0,
                                gaps=[(start, limit, int(view.meta["seen"]), None)])

    def _read_settled(self, conn, session_id: str,
                      shown: identity.Shown) -> "_Identified | None":
        """The next turn's list: it goes on from the list this copy read last (whose
        view is the hint), with no block, acknowledgement or timed copy after it and
        the turn's message, if any, among the new elements. Its first elements keep
        the rows they had; the rest is new when nothing stored can be it (the fast
        path's test), else None and the list is read whole. This is what reading it
        against the hint gives (rules 1, 2 and 3), without reading the whole list."""
        ids, flags = shown.settled
        k, n = len(ids), len(shown.fps)
        if shown.copies or k > n or (shown.turn_index is not None and shown.turn_index < k):
            return None
        found = _Identified(list(ids) + [None] * (n - k), list(flags) + [False] * (n - k),
                            settled=True)
        if any(fp is not None for fp in shown.fps[k:]):
            before = next((sid for sid in reversed(ids) if sid is not None and sid > 0), None)
            claimed = {sid for sid in ids if sid is not None and sid > 0}
            if not self._only_new_after(conn, session_id, [(k, n, before, None)], claimed):
                return None
        return found

    @staticmethod
    def _only_new_after(conn, session_id: str, gaps, claimed: set[int]) -> bool:
        """Whether the only gap is a run after the last matched row while every row of
        the session from the list's first row on that no summary covers is one the
        list claimed: nothing stored can be that run (not even a row an /undo dropped
        from the view), it is new."""
        if len(gaps) != 1 or gaps[0][3] is not None or gaps[0][2] is None or not claimed:
            return False
        # The rows themselves, not a count: a list may claim rows a summary covers (a
        # view from before a compaction), and those must not stand in for an unclaimed
        # fresh row (an /undo's dropped turn the list shows again). One more row than
        # the list claims is enough to know.
        rows = fresh_from(conn, session_id, _lowest_followed(conn, session_id, claimed),
                          len(claimed) + 1)
        if all(sid in claimed for sid in rows):
            return True
        # Unclaimed rows below the run's row that never followed it in a list are a
        # turn an /undo dropped before this list re-sent its text as a new row (the
        # compaction inside the turn stored it): the run after that new row cannot
        # be them (host walk 160002, its reply read as the dropped one's and lost).
        last = gaps[0][2]
        if any(sid not in claimed for sid in fresh_from(conn, session_id, last + 1,
                                                         len(claimed) + 1)):
            return False
        # ... only after a user message: the re-sent turn. A list claiming an older
        # reply's text as a newer row (a stale list whose "ok" equals a retried reply's)
        # goes on from the rows below, and is read whole (test_rewrites).
        role = conn.execute("SELECT role FROM messages WHERE store_id = ?", (last,)).fetchone()
        if role is None or role[0] != "user":
            return False
        followed = {sid for view in views.holding(conn, session_id, [last], views.RING)
                    for sid in _after(view, last)}
        return not followed - claimed

    @staticmethod
    def _slide_into_room(conn, session_id: str, fps: list, ids: list,
                         gaps: list, roles: Sequence[str] = ()) -> bool:
        """Move a view's matched run back into the gap before it when the rows between
        the gap's neighbours cannot explain the whole gap: the view's entries are the
        gap's later elements, and what the run leaves is what came after them.

        Why: a view's reading prefers the latest of equal elements; a transcript the
        host restored with a /retry's first attempts ("ok", T9, "ok", T9, reply, ...)
        then had the view's "ok" read as the second one, leaving the first "ok" and
        T9 in a gap between two consecutive rows, stored again (host walk 150004: a
        second CLI's restored list); with rows between them for part of the gap, a
        turn sent four times read against a view holding two of them stored one
        again (host walk 180004). The run moves (one to ``SLIDE_RUN`` elements, the
        shortest that works) only when the rows before the next match can hold what
        it leaves. The same holds for a gap between the list's block and its first
        match: a second CLI's transcript kept a /retry's dropped attempt (ok, T32, ok,
        T32, ...) that the view after the block lists without it (ok, T32, ...), and the
        view's "ok" was read as the later one (host walk 280003: the attempt stored
        again). A run that opens with a reply moves even when those rows cannot hold
        what it leaves, if it leaves no more to store than the gap holds: after the
        gap's new elements rule 1 makes that reply new and its row is lost (a /branch's
        restored list with the copied attempt its /retry dropped, "ok", T7, ..., "ok",
        T7, between two consecutive rows: host walk 1500005, the "ok" stored again).
        Rows between that do not line up with the gap count as none (a /retry's dropped
        attempt, go on/a16, beside two restored sends of go on/ok: host walk 1910002)."""
        moved = False
        for start, end, before, after in gaps:
            # a gap right after the list's block has no row before it: the rows it may
            # be are summarized ones, so none count and the run may always move
            leading = before is None and start > 0 and all(
                fps[k] is None or (ids[k] is not None and ids[k] < 0) for k in range(start))
            if not (((before or 0) > 0 or leading) and (after or 0) > 0 and end < len(ids)
                    and ids[end] == after):
                continue
            elements = sum(1 for k in range(start, end) if fps[k] is not None)
            between = 0 if leading else rows_between(conn, session_id, before, after, elements)
            if between >= elements:
                if _rows_line_up(conn, session_id, fps[start:end], before, after, ids):
                    continue  # the rows between may be the whole gap: read it as it is
                # rows that cannot be it (another send's exchange) are none of the gap:
                # the view's run may move to its earliest equal element
                between = 0
            # the rows between are the gap's first elements; the view's run is later
            target = next((k for k in range(start + between, end) if fps[k] == fps[end]), None)
            if target is None:
                continue
            for run in range(1, SLIDE_RUN + 1):
                last = end + run - 1
                if last >= len(ids) or (ids[last] or 0) <= 0 \
                        or fps[target + run - 1] != fps[last]:
                    break
                nxt = next((k for k in range(last + 1, len(ids)) if (ids[k] or 0) > 0), None)
                if nxt is None:
                    break
                slid = list(ids)
                for k in range(run):
                    slid[target + k] = ids[end + k]
                for k in range(max(end, target + run), end + run):
                    slid[k] = None
                left = sum(1 for k in range(target + run, nxt)
                           if fps[k] is not None and slid[k] is None)
                room = rows_between(conn, session_id, ids[last], ids[nxt], left)
                if room >= left or (end < len(roles) and roles[end] != "user"
                                    and left - room <= elements - between):
                    ids[:] = slid
                    moved = True
                    break
        return moved

    def _slide_back_for_run(self, conn, session_id: str, fps: list, ids: list, start: int,
                            run: list, taken: set[int], candidates: dict,
                            went_on: bool = True) -> list | None:
        """Rows for a run after the list's last match (rule 3) that lines up with none
        of the rows after it, found by moving the last matched elements back: when the
        session holds those elements' texts, followed by the run's first, as consecutive
        rows between the match before them and their rows, those rows are them and the
        run goes on after them (``ids`` and ``taken`` are updated); else None.

        Why: a view's reading prefers the latest of equal elements. A second CLI's list
        restored before the first CLI's /retry of a turn (T12, reply 21) shows T12 and
        its first reply; the first CLI's views, which dropped that attempt, read T12 as
        the retried copy, after which the reply lines up with nothing and was stored
        again (host walk 250002). Only for a list whose last match has rows after it
        that the run does not continue: the session went on past it elsewhere. The
        elements may follow the list's block alone: a second CLI restored a compacted
        session with a /retry's first attempt kept ([block, T23, ok, T23, reply 46]);
        the first CLI's view after its /undo and re-send reads T23, ok as the re-sent
        rows, and T23 with reply 46 were stored again (host walk 520001). The run's first
        may be the first moved element's own row, a moved element may be one no row
        explained (looked up with the others), and the last match may have no row after
        it (``went_on`` false): a turn sent four times (/retry, re-sends), restored whole by
        a /resume and its last send undone; the newest view, holding the last two sends,
        was read as the first two, and the first reply and the third send with its reply
        were stored again (host walk 680002). Without a row after the last match only a
        move over such an element counts: a list read whole but for its last run is the
        turn going on, its reply new (a re-sent text's "ok" read as an older send's:
        host walk 280003, the reply lost). Tried before ``_sends_answered_otherwise``
        too; the run then goes on from the first moved element's own row if that explains
        as much (the re-send's rows given to a restored first send: host walk 1110000)."""
        first = next(fp for fp in run if fp is not None)
        over_open = False
        for length in range(1, SLIDE_RUN + 1):
            k0 = start - length
            if k0 < 0 or fps[k0] is None or (ids[k0] is not None and ids[k0] <= 0):
                return None
            if ids[k0] is None:
                over_open = True
                continue  # an element no row explained: looked up with the others
            if not (went_on or over_open):
                continue
            prev = next((ids[p] for p in range(k0 - 1, -1, -1) if (ids[p] or 0) > 0), None)
            if prev is None:
                # only the engine's block (and its acknowledgement) before them: the
                # rows are looked up before theirs among the gap's candidates, which
                # leave out what the block stands for
                own = [ids[p] for p in range(k0) if fps[p] is not None]
                if not own or any(sid is None or sid > 0 for sid in own):
                    return None
            elif prev >= ids[k0]:
                return None
            want = fps[k0:start] + [first]
            # the run's first may be the first moved element's row itself: the view's
            # run then goes on as the list's run
            moving = {ids[k] for k in range(k0, start)}
            between = [(sid, fp) for sid, fp in gap_rows(
                conn, session_id, prev, ids[k0] + 1, len(want) + ALIGN_SLACK, **candidates)
                if sid not in taken or sid in moving]
            at = next((i for i in range(len(between) - len(want) + 1)
                       if [fp for _, fp in between[i:i + len(want)]] == want), None)
            if at is None:
                continue
            for k in range(length):
                taken.discard(ids[k0 + k])
                ids[k0 + k] = between[at + k][0]
                taken.add(ids[k0 + k])
            rows = gap_rows(conn, session_id, ids[start - 1], None,
                            sum(1 for fp in run if fp is not None) + ALIGN_SLACK,
                            **candidates)
            aligned = identity.align_gap(run, rows, trailing=True, taken=taken)
            own = min((sid for sid in moving if sid is not None), default=None)
            if own is not None:
                # the view's run going on as the list's run (host walk 1110000)
                theirs = identity.align_gap(run, [(sid, fp) for sid, fp in rows if sid >= own],
                                            trailing=True, taken=taken)
                if identity.matched_count(theirs) >= identity.matched_count(aligned):
                    aligned = theirs
            return aligned
        return None

    def _sends_answered_otherwise(self, conn, session_id: str, fps: list,
                                  roles: Sequence[str], start: int, end: int,
                                  aligned: list) -> list[int]:
        """The user messages of a gap's run that lined up with a row while the reply
        after them lined up with none, where a view lists that row answered by another
        reply (``_answered_otherwise``): each is a send of its own, new with its reply.

        Why: a /retry on a /branch before its first turn, an /undo of it and the text
        sent again; a second CLI's restore shows the copied send and its reply before
        the re-send (state.db keeps them active). Between two matched rows the copied
        send lined up with the retry's undone send, answered by the retry's reply in a
        view, and only its own reply was stored (host walk 630003: the send lost)."""
        return [start + offset for offset, sid in enumerate(aligned[:-1])
                if sid is not None and fps[start + offset + 1] is not None
                and aligned[offset + 1] is None and self._answered_otherwise(
                    conn, session_id, fps, roles, start + offset + 1, end, sid)]

    def _without_own_sends(self, conn, session_id: str, fps: list, roles: Sequence[str],
                           start: int, end: int, run: list, rows: list | None,
                           trailing: bool, taken: set, aligned: list, resent: set) -> list:
        """A gap's ``aligned`` run without its sends of their own
        (``_sends_answered_otherwise``): each, first to last, is marked ``resent`` with its
        reply and left out of the run, and the rest of the run is lined up again with the
        gap's ``rows`` (None: a slide chose them; only the sends are dropped then).

        Why: the row such a send had lined up with is the one it was read as, freed; the
        run's later copy of that exchange is that row. A /branch's restart restored the
        copied send (answered otherwise) before the sends the branch stored; the gap's
        LCS gave every send the row of the one before it, each reply lined up with none,
        and the first send's exchange was stored again (host walk 1670001)."""
        run = list(run)
        for _ in range(len(run)):
            sends = self._sends_answered_otherwise(conn, session_id, fps, roles, start, end,
                                                   aligned)
            if not sends:
                break
            k = sends[0] - start
            resent.update((start + k, start + k + 1))
            run[k] = run[k + 1] = None
            aligned = identity.align_gap(run, rows, trailing=trailing, taken=taken) \
                if rows is not None else aligned[:k] + [None] + aligned[k + 1:]
        return aligned

    @staticmethod
    def _answered_otherwise(conn, session_id: str, fps: list, roles: Sequence[str],
                            start: int, end: int, matched: int) -> bool:
        """Whether a run after the list's last match that lines up with no row (nor
        after a slide back) answers another send of the last matched user message's
        text: a view lists that row answered by a reply and the run opens with a
        different one. One send has one reply (a /retry is a new send: rule 2): the
        list's message is new with it. How often the session holds the text does not
        matter: the run's reply lines up with no row, so no other copy is its send
        either (a repeated "continue": host walk 500000).

        Why: a /retry on a /branch before its first turn drops the exchange the host
        copied from the parent from the branch's first list (its copy); state.db keeps
        it active, and after an /undo of the retry it ends the restored branch. Read
        as the re-send, only its reply was stored (host walk 490000: the send lost).
        Between two matches too, when the run's reply ends like the re-send's (host walk
        1590006: a second CLI's restore of the branch from before the /undo)."""
        role = lambda k: roles[k] if k < len(roles) else ""  # noqa: E731
        first = next((k for k in range(start, end) if fps[k] is not None), None)
        if start < 1 or role(start - 1) != "user" or first is None or role(first) == "user":
            return False
        for view in views.holding(conn, session_id, [matched], views.RING):
            at = next((k for k, (_, sid) in enumerate(view.entries) if sid == matched), None)
            if at is None or at + 1 >= len(view.entries):
                continue
            fp, reply = view.entries[at + 1]
            if reply <= 0 or fp == fps[first]:
                continue
            kind = conn.execute("SELECT role FROM messages WHERE store_id = ?",
                                (reply,)).fetchone()
            if kind is not None and kind[0] != "user":
                return True
        return False

    def _listed_after_blocks(self, conn, session_id: str, fps: list, flags: list, ack_at,
                             run: range, rows: list, known: dict) -> list[tuple[int, str]]:
        """``(store_id, fingerprint)`` of the rows a view lists after one of the engine's
        blocks that a gap's ``run`` shows (once in the list: a doubled block is rule 5's),
        not among the gap's ``rows`` already, in store order.

        Why: two CLIs on one session each compacted it into a block of their own; the
        host's state.db appended the first CLI's returned list (its block and the rows
        after it) inside the second CLI's transcript, and a /resume restored both. Read
        against the second CLI's view, the first CLI's block and its rows lay between
        two consecutive rows, no row stood between them, and those rows were stored
        again (host walk 1240009). The block's own views say which rows follow it."""
        have = {sid for sid, _ in rows}
        listed: set[int] = set()
        for k in run:
            if not flags[k] or k in ack_at or fps[k] is None or fps.count(fps[k]) > 1:
                continue
            _, beside = self._block_in_views(conn, session_id, fps[k], known)
            listed.update(sid for sid in beside if sid not in have)
        return sorted(fingerprints_of(conn, sorted(listed))) if listed else []

    @staticmethod
    def _block_in_views(conn, session_id: str, block: str | None,
                        known: dict) -> tuple[int | None, frozenset[int]]:
        """What the session's views say of ``block`` (the block nearest before a gap),
        read in one pass and kept per block in ``known``:

        - the newest node when it was rendered (the highest node of the frontier the
          first view holding it recorded: every node then was under it), or None;
        - the rows some view lists raw after it. Why: a second process's compaction
          keeps raw beside the block the exchange its list showed before its newest
          turn, rows the first process had summarized into that very block
          (``compaction/tail_rows``, the second-process rule). A later list showing
          the block with such a row after it, read against a view without it (the
          first CLI's, restored merged from the host's state.db), found it refused as
          summarized and stored it again. A row a list with the block showed raw
          beside it is no row the block dropped from the prompt."""
        if block is None:
            return None, frozenset()
        if block not in known:
            rendered, rows = None, set()
            for view in views.each(conn, session_id):
                at = next((k for k, (fp, sid) in enumerate(view.entries)
                           if fp == block and sid == identity.BLOCK_ID), None)
                if at is None:
                    continue
                if rendered is None and (view.meta or {}).get("frontier"):
                    rendered = max(int(n) for n in view.meta["frontier"])
                rows.update(sid for _, sid in view.entries[at + 1:] if sid > 0)
            known[block] = (rendered, frozenset(rows))
        return known[block]

    def _remember(self, conn, session_id: str, shown: identity.Shown,
                  alignment: list[int | None], flags: list[bool], now: float,
                  settled: identity.View | None = None) -> identity.View | None:
        """Save the view this list gives (its elements' fingerprints and rows); a
        list read as the ``settled`` view's list going on adds to its entries."""
        text = None
        if settled is not None and shown.settled is not None:
            added = view_entries(shown, alignment, flags, start=len(shown.settled[0]))
            entries = settled.entries + added
            text = " ".join(t for t in (settled.encoded(), identity.encode_entries(added)) if t)
        else:
            # a later copy of an element (rule 7) is left out, as the reading leaves it
            # out: the next list, read the same way, goes on from this view
            read = replace(shown, fps=[None if i in shown.copies else fp
                                       for i, fp in enumerate(shown.fps)]) \
                if shown.copies else shown
            entries = view_entries(read, alignment, flags)
        if not entries or not shown.origin:
            return None
        view = identity.View(entries=entries, session=session_id, origin=shown.origin,
                             text=text or "")
        views.save(conn, session_id, shown.origin, entries, now=now, text=view.encoded())
        return view

    def save_view(self, session_id: str, origin: str, entries: list[tuple[str, int]],
                  meta: dict | None = None) -> identity.View | None:
        """Remember a list the engine returned (``compress``): the host shows it back."""
        if not entries or not origin:
            return None
        with self.db.transaction() as conn:
            canonical = self._canonical(conn, session_id)
            views.save(conn, canonical, f"{origin}/returned", entries, now=time.time(),
                       meta=meta, ring=views.RETURNED_RING)
        return identity.View(entries=list(entries), session=canonical, origin=origin,
                             meta=dict(meta or {}))

    def known_blocks(self, session_id: str) -> set[str]:
        """Fingerprints of the summary blocks the session's views hold."""
        with self.db.reading() as conn:
            canonical = self._canonical(conn, session_id)
            return views.block_fps(conn, canonical)

    def block_meta(self, session_id: str, block_fp: str) -> dict | None:
        """What the engine recorded with the view that holds this block (the frontier
        it rendered), or None."""
        with self.db.reading() as conn:
            canonical = self._canonical(conn, session_id)
            for view in views.load(conn, canonical):
                if view.meta and any(fp == block_fp and sid == identity.BLOCK_ID
                                     for fp, sid in view.entries):
                    return view.meta
        return None
