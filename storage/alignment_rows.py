"""The rows a shown list may be: the SQL ``storage/alignment`` reads candidates with.

Identity's rules (``storage/identity``) decide which row a shown message is; these
functions only read the session's rows a gap, a block's tail or an anchored list may
line up with (all of them by ``store_id`` order, parameters bound). Kept apart so the
alignment module holds the reading of lists and this one the queries it needs
(with the two readings of rows that are only queries and their use: rows a view lists
between two rows, rows named by the host's timestamps).
"""

from __future__ import annotations

from typing import Iterator

from . import identity, timekeys, views
from .database import chunked

# Stored rows read past the shown list's length when aligning (room for skipped rows).
ALIGN_SLACK = 64
# A block whose tail is unknown is aligned against unsummarized rows among this many
# times the shown list's length of the session's newest rows.
FRESH_SCAN_FACTOR = 8
# A list's first message is also looked for by its fingerprint (when its exact stored
# copies do not explain the list) among this many of the session's oldest and as many
# of its newest rows.
ANCHOR_SCAN = 4096
# The columns a row's identity fingerprint is read from (``row_fp``).
FP_COLUMNS = "store_id, role, content, content_format, tool_calls, tool_call_id"


def row_fp(row) -> tuple[int, str]:
    """``(store_id, fingerprint)`` of a row selected with ``FP_COLUMNS`` first: every
    rule compares rows by the fingerprint views hold (``identity.fingerprint``, blind
    to the whitespace the host rewrites), never by the exact ``content_hash``."""
    return row[0], identity.fingerprint(row[1], row[2], row[3], row[4], row[5])


def fresh_from(conn, session_id: str, low: int, limit: int) -> list[int]:
    """The session's first ``limit`` rows from ``low`` on that no summary covers."""
    return [row[0] for row in conn.execute(
        "SELECT store_id FROM messages AS m WHERE session_id = ? AND store_id >= ?"
        " AND NOT EXISTS (SELECT 1 FROM node_edges AS e WHERE e.child_store_id = m.store_id)"
        " ORDER BY store_id LIMIT ?", (session_id, low, limit))]


def rows_between(conn, session_id: str, low: int, high: int, enough: int) -> int:
    """How many of the session's rows lie strictly between ``low`` and ``high``
    (counted up to ``enough``: the callers only compare). The subquery is named:
    PostgreSQL before 16 refuses one without a name, and every turn whose list needed
    this count failed to store (host walk 310003 on PostgreSQL 15)."""
    return conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM messages WHERE session_id = ? AND store_id > ?"
        " AND store_id < ? LIMIT ?) AS gap", (session_id, low, high, max(0, enough))).fetchone()[0]


def gap_rows(conn, session_id: str, before: int | None, after: int | None,
             limit: int, *, fresh_only: bool, rendered: int | None = None,
             beside: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """``(store_id, fingerprint)`` of the session's rows a gap may be: between
    its neighbours' rows, before the first (the newest of them) or after the last;
    with ``fresh_only`` only rows no summary covers, or, given ``rendered`` (the
    newest node when the list's block was rendered), no summary up to it covers:
    a row a later compaction summarized is still the stale list's message; and,
    whatever covers them, the rows ``beside`` (a view showed them raw after the
    list's block: ``Alignment._block_in_views``)."""
    first: tuple = (session_id,)
    fresh = ""
    if fresh_only:
        shown = [sid for sid in beside if (before is None or sid > before)
                 and (after is None or sid < after)]
        fresh, params = _candidate_clause(rendered, shown)
        first = (session_id, *params)
    head = f"SELECT {FP_COLUMNS} FROM messages AS m WHERE session_id = ?{fresh}"
    if before is not None and after is not None:
        rows = conn.execute(f"{head} AND store_id > ? AND store_id < ?"
                            f" ORDER BY store_id LIMIT ?",
                            (*first, before, after, limit)).fetchall()
    elif before is not None:
        rows = conn.execute(f"{head} AND store_id > ? ORDER BY store_id LIMIT ?",
                            (*first, before, limit)).fetchall()
    else:
        rows = conn.execute(f"{head} AND store_id < ? ORDER BY store_id DESC LIMIT ?",
                            (*first, after, limit)).fetchall()[::-1]
    return [row_fp(r) for r in rows]


def _candidate_clause(rendered: int | None, beside) -> tuple[str, tuple]:
    """The SQL condition (and its parameters) that a row ``m`` after the list's block
    may be a gap's element: no summary covers it (none up to ``rendered``, the newest
    node when the block was rendered, if known), or a view showed it raw after the
    block (``beside``). One rule for the rows by store order (``gap_rows``) and the
    rows a view lists between two matches (``listed_between``)."""
    shown = sorted(beside)
    clause = (" AND (NOT EXISTS (SELECT 1 FROM node_edges AS e"
              " WHERE e.child_store_id = m.store_id"
              + (" AND e.parent_id <= ?)" if rendered is not None else ")")
              + (f" OR store_id IN ({','.join('?' * len(shown))}))" if shown else ")"))
    return clause, (*(() if rendered is None else (rendered,)), *shown)


def fresh_rows(conn, session_id: str, limit: int) -> list[tuple[int, str]]:
    """``(store_id, fingerprint)`` of the session's newest ``limit`` rows that no summary
    covers and that come after the newest row one does, in store order (looking
    at most ``FRESH_SCAN_FACTOR * limit`` rows back). A row older than what the
    newest summary covers and left out of it is one the host dropped (a /retry's
    or /undo's first attempt): nothing shown after a block is that row."""
    rows = []
    for r in conn.execute(
            f"SELECT {FP_COLUMNS}, EXISTS (SELECT 1 FROM node_edges AS e"
            " WHERE e.child_store_id = m.store_id) FROM messages AS m"
            " WHERE session_id = ? ORDER BY store_id DESC LIMIT ?",
            (session_id, FRESH_SCAN_FACTOR * limit)):
        if r[6]:
            break
        rows.append(r)
    return [row_fp(r) for r in rows[:limit][::-1]]


def timed_rows(conn, session_id: str, times) -> dict[tuple[str, float], int]:
    """``(fingerprint, message_at) -> store_id`` of the session's rows stored with one of
    the host's ``times`` (the first in store order): a restored message carries its
    time, and the row it was stored as holds it (``pin_timed``)."""
    found: dict[tuple[str, float], int] = {}
    for chunk in chunked(sorted(times)):
        for r in conn.execute(
                f"SELECT {FP_COLUMNS}, message_at FROM messages WHERE session_id = ? AND"
                f" message_at IN ({','.join('?' * len(chunk))}) ORDER BY store_id",
                (session_id, *chunk)):
            store_id, fp = row_fp(r)
            found.setdefault((fp, r[6]), store_id)
    return found


def fingerprints_of(conn, store_ids: list[int]) -> list[tuple[int, str]]:
    """``(store_id, fingerprint)`` of these rows (any order; missing ones left out)."""
    found = []
    for chunk in chunked(store_ids):
        found += [row_fp(r) for r in conn.execute(
            f"SELECT {FP_COLUMNS} FROM messages WHERE store_id IN"
            f" ({','.join('?' * len(chunk))})", chunk)]
    return found


def anchor_rows(conn, session_id: str, digest: str, fp: str, count: int) -> Iterator[int]:
    """The stored copies of a list's first message, each at most once, the newest
    and the oldest ``count`` first: by its exact ``digest`` through the identity
    index, then (read only when the caller asks for more) by its fingerprint ``fp``
    among the session's oldest and newest ``ANCHOR_SCAN`` rows.

    Why: a list no view explains (rule 6) anchored by the exact hash alone found no
    copy of a first message the host had stripped, and the whole list was stored
    again; and when the user had later sent the stripped text itself, the exact
    hash found only that later send, so the list's own first row was never tried
    and everything before the later send was stored again. The scan is bounded: a
    list that starts with something new finds no copy either, and a session of 100K
    rows must not be read whole for it (a replayed transcript starts near the
    oldest rows, a tail shown again near the newest)."""
    seen: set[int] = set()
    for order in ("DESC", "ASC"):
        for (store_id,) in conn.execute(
                f"SELECT store_id FROM messages WHERE session_id = ? AND content_hash = ?"
                f" ORDER BY ordinal {order} LIMIT ?", (session_id, digest, count)).fetchall():
            if store_id not in seen:
                seen.add(store_id)
                yield store_id
    ends = {order: [sid for sid, other in map(row_fp, conn.execute(
        f"SELECT {FP_COLUMNS} FROM messages WHERE session_id = ? ORDER BY store_id {order}"
        f" LIMIT ?", (session_id, ANCHOR_SCAN)).fetchall()) if other == fp]
        for order in ("DESC", "ASC")}
    for store_id in dict.fromkeys(ends["DESC"][:count] + ends["ASC"][:count]):
        if store_id not in seen:
            seen.add(store_id)
            yield store_id


def listed_between(conn, session_id: str, before: int | None, after: int | None,
                    rows: list, *, fresh_only: bool = False, rendered: int | None = None,
                    beside: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """``(store_id, fingerprint)`` of the rows a view of the session lists between
    a gap's two matched rows that are not among the gap's ``rows`` by store
    order: rows another process stored later than ``after`` that its list showed
    between the two. After the list's block (``fresh_only``) only those ``gap_rows``
    would take are candidates: a view from before a compaction lists the rows the
    block summarized, and an edit of the tail is no such row (rule 3).

    Why: a second CLI's list stored a restored exchange (the branch's copied send
    and its reply) after the first CLI's newer rows; a later restore of the session
    read against the first CLI's view had them in the gap between their neighbours,
    whose rows by store order held only the undone retry of that send, and the
    exchange was stored again (host walk 630003). A view that does not hold
    ``after`` (a list from before that row was stored) gives the rows it lists
    after ``before`` that are older than ``after``: a restart's restored /branch
    showed the copied send state.db keeps beside the /retry's re-send, whose row
    the branch's first list stored before the copied one's; a second CLI's view
    read the list, the first CLI's view listed the re-send's rows after the copied
    one's, and the re-send was stored again (host walk 1640002)."""
    if before is None or after is None:
        return []
    have = {sid for sid, _ in rows}
    out: list[tuple[int, str]] = []
    for view in views.holding(conn, session_id, [before], views.RING):
        ids = [sid for _, sid in view.entries]
        at = ids.index(before)
        end = next((k for k in range(at + 1, len(ids)) if ids[k] == after), None)
        if end is None and after in ids:
            continue
        for fp, sid in view.entries[at + 1:end]:
            if sid > 0 and (end is not None or sid < after) and sid not in have:
                have.add(sid)
                out.append((sid, fp))
    if fresh_only and out:
        ok = _candidates_among(conn, session_id, [sid for sid, _ in out], rendered, beside)
        out = [(sid, fp) for sid, fp in out if sid in ok]
    return out


def _candidates_among(conn, session_id: str, rows: list[int], rendered: int | None,
                      beside: frozenset[int]) -> set[int]:
    """Which of the view-listed ``rows`` a gap after the list's block may be
    (``_candidate_clause``: the rows ``gap_rows`` would take)."""
    clause, params = _candidate_clause(rendered, beside & set(rows))
    return {r[0] for r in conn.execute(
        f"SELECT store_id FROM messages AS m WHERE session_id = ?"
        f" AND store_id IN ({','.join('?' * len(rows))}){clause}",
        (session_id, *rows, *params))}


def pin_timed(conn, session_id: str, shown: identity.Shown, fps: list, ids: list,
               flags: list, gaps: list) -> bool:
    """Rows by the host's timestamp, for a list with a run between two matched rows
    (rule 3): an element carrying one is the session's row stored with that time
    and its fingerprint, wherever the row stands; an element the view's reading gave
    that row to without carrying its time gives it up, to be looked up as a run
    (``ids`` is updated). Not after the engine's block (the rows it stands for are
    no candidates there). Whether any element moved.

    Why: a second CLI's list showed a /retry's first attempt the host keeps in
    state.db ("continue", "ok", before the next turn) and stored it after every row
    around its place. The view of that list left the rings; a later restored list,
    read against a view without the attempt, gave the retried exchange's rows to
    the attempt (the latest of equal elements) and the retried exchange lay between
    two consecutive rows: stored again (host walk 640000). The timestamps are the
    host's own names of those messages (rule 7 reads them so within one list)."""
    limit = len(fps) if shown.turn_index is None else shown.turn_index
    if not shown.stamps or not any(
            before is not None and after is not None and not any(flags[:start])
            for start, _, before, after in gaps):
        return False
    first_block = next((k for k in range(limit) if flags[k]), limit)
    times = {k: timekeys.message_time(shown.stamps[k])
             for k in range(min(first_block, len(shown.stamps)))
             if fps[k] is not None and shown.stamps[k] not in (None, "")}
    times = {k: t for k, t in times.items() if t is not None}
    if not times:
        return False
    rows = timed_rows(conn, session_id, set(times.values()))
    held = {sid: k for k, sid in enumerate(ids) if sid is not None and sid > 0}
    queue = sorted(times)
    moved = False
    while queue:
        k = queue.pop(0)
        sid = rows.get((fps[k], times[k])) if k in times else None
        if sid is None or ids[k] == sid:
            continue
        j = held.get(sid)
        if j is not None:
            if times.get(j) == times[k]:
                continue  # an element carrying the row's time holds it
            ids[j] = None
            queue.append(j)
        if ids[k] is not None and ids[k] > 0:
            held.pop(ids[k], None)
        ids[k], held[sid], moved = sid, k, True
    return moved


def exchange_listed(conn, session_id: str, fps: list, start: int, end: int, taken: set, *,
                    fresh_only: bool = False, rendered: int | None = None,
                    beside: frozenset[int] = frozenset()
                    ) -> tuple[int, list[int | None]] | None:
    """The rows of the exchange a view lists for the send matched just before
    ``start`` and the run after it: (the send's row, the run's rows, None from the
    first element that does not line up), or None when no view lists a row of the
    send's text, claimed by no other element, answered by the run's first element.
    After the list's block (``fresh_only``) only rows ``gap_rows`` would take count.

    Why: a send answered otherwise in a view is one of its own only when no other
    row of its text is answered by the run's reply. A /retry stores the text again
    with another reply; a second CLI restored both exchanges from the host's
    state.db, its list was read against a later retry's view (the text matched that
    retry's send, answered otherwise), and the first retry's send and reply were
    stored again (host walk 1710006)."""
    want = [(k, fps[k]) for k in range(start, end) if fps[k] is not None]
    if not want:
        return None
    free = lambda sid: sid > 0 and sid not in taken  # noqa: E731
    for view in views.each(conn, session_id):
        entries = view.entries
        for at in range(len(entries) - 1):
            (fp, sid), (reply_fp, reply) = entries[at], entries[at + 1]
            if fp != fps[start - 1] or reply_fp != want[0][1] or not (free(sid) and free(reply)):
                continue
            aligned: list[int | None] = [None] * (end - start)
            for (k, fp_k), (fp_v, sid_v) in zip(want, entries[at + 1:]):
                if fp_k != fp_v or not free(sid_v):
                    break
                aligned[k - start] = sid_v
            rows = [sid] + [r for r in aligned if r is not None]
            if fresh_only and not _candidates_among(conn, session_id, rows, rendered,
                                                    beside).issuperset(rows):
                continue
            return sid, aligned
    return None


def send_of_its_own(ids: list, taken: set, resent: set, start: int, upto: int) -> None:
    """The send matched just before ``start`` is a send of its own, not the row it
    matched: its row is freed for the message that owns it, and the send with what
    follows it up to ``upto`` is marked re-sent, so rule 1 stores them as new.
    (One place for the trailing run and the run between two matches: both read a
    copied send, answered otherwise in a view, as the re-send after it.)"""
    taken.discard(ids[start - 1])
    ids[start - 1] = None
    resent.update(range(start - 1, upto))


def listed_or_own_send(conn, session_id: str, fps: list, ids: list, taken: set,
                       resent: set, start: int, end: int, reply_end: int,
                       candidates: dict) -> list[int | None] | None:
    """For a run whose every element lined up with no row after a send matched just
    before ``start`` and answered otherwise in a view: the run's rows when a view lists
    another row of the send's text answered by the run (the send then takes that row),
    else None, the send and what follows it up to ``reply_end`` made a send of its own.

    Why one place for the trailing run and the run between two matches: in both the
    text is a send of its own only when no view lists it answered by the run's reply.
    Between two matches (host walk 3330003): a first CLI's /undo and re-send of a copied
    text on a branch (rows 49, 50), a second CLI's turn after its restored copy (51, 52,
    then 53, 54); a restore showed state.db's re-send, its reply and the second CLI's
    turn. Read against the second CLI's view the text matched row 51 (answered by 52),
    and the re-send's exchange was stored again."""
    listed = exchange_listed(conn, session_id, fps, start, end, taken, **candidates)
    if listed is None:
        send_of_its_own(ids, taken, resent, start, reply_end)
        return None
    taken.discard(ids[start - 1])   # the send and its reply are an exchange a view lists
    ids[start - 1], aligned = listed
    taken.add(ids[start - 1])
    return aligned
