"""Longest common subsequences of fingerprint lists, for identity's alignments.

Identity reads a list the host hands over against a view it sent (or a run against
its replay) by pairing equal fingerprints in order; which copy of a repeated element
("ok", "continue") a pair takes decides which stored row a message is. The pairing
rules live here so that every reading in ``identity`` uses the same ones: a list
read against a view prefers the LATEST copies (``lcs_pairs``), a run read against
its replay the EARLIEST (``replay_pairs``), once the pairing that keeps most pairs
next to each other is chosen among the longest (a list keeps its exchanges together:
``_lcs_table``). ``None`` (a message with no fingerprint to match) never pairs.
"""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Sequence

# A dynamic-programming LCS is used up to this many cells, difflib beyond.
LCS_CELLS = 40_000


def lcs_pairs(a: Sequence, b: Sequence) -> list[tuple[int, int]]:
    """Index pairs (i, j) of a longest common subsequence of ``a`` and ``b``
    (``None`` never matches), preferring the latest copies of a repeated element:
    common prefix and suffix first, a DP table between them when it is small,
    difflib's matching blocks when it is not."""
    n, m = len(a), len(b)
    pairs: list[tuple[int, int]] = []
    # The common prefix is matched directly while its element has no later copy in
    # ``a`` (a list restored with older copies before it pairs its later ones; one
    # cut short by /undo keeps its prefix).
    later = Counter(a)
    lo = 0
    while lo < n and lo < m and a[lo] is not None and a[lo] == b[lo]:
        later[a[lo]] -= 1
        if later[a[lo]]:
            break
        pairs.append((lo, lo))
        lo += 1
    hi_a, hi_b = n, m
    suffix = []
    while hi_a > lo and hi_b > lo and a[hi_a - 1] is not None and a[hi_a - 1] == b[hi_b - 1]:
        hi_a, hi_b = hi_a - 1, hi_b - 1
        suffix.append((hi_a, hi_b))
    # Among equally long matches that keep as many pairs together, the latest win (a
    # repeated "ok" is the newest copy).
    pairs += _middle_pairs(a[lo:hi_a], b[lo:hi_b], lo, latest=True,
                           paired_before=bool(pairs), paired_after=bool(suffix))
    return pairs + suffix[::-1]


def _middle_pairs(mid_a: Sequence, mid_b: Sequence, offset: int, *, latest: bool,
                  paired_before: bool = False,
                  paired_after: bool = False) -> list[tuple[int, int]]:
    """An LCS of two runs that start at ``offset`` in their lists: the DP table when
    small (the ``latest`` or the earliest copies of a repeated element win),
    difflib's matching blocks when not. ``paired_before``/``paired_after``: the
    elements just before/after both runs are paired, so a pair at the run's edge
    continues them (the table's ``_lcs_table`` counts it)."""
    if not mid_a or not mid_b:
        return []
    if len(mid_a) * len(mid_b) <= LCS_CELLS:
        # An element equal only to itself stands for each paired neighbour.
        head = [object()] if paired_before else []
        tail = [object()] if paired_after else []
        run_a, run_b = head + list(mid_a) + tail, head + list(mid_b) + tail
        if latest:  # the table's walk takes the earliest match: run it reversed
            na, nb = len(run_a), len(run_b)
            table = [(na - 1 - i, nb - 1 - j)
                     for i, j in _lcs_table(run_a[::-1], run_b[::-1])][::-1]
        else:
            table = _lcs_table(run_a, run_b)
        middle = [(i - len(head), j - len(head)) for i, j in table
                  if len(head) <= i < len(head) + len(mid_a)]
    else:
        matcher = difflib.SequenceMatcher(None, list(mid_a), list(mid_b), autojunk=False)
        middle = [(blk.a + k, blk.b + k) for blk in matcher.get_matching_blocks()
                  for k in range(blk.size) if mid_a[blk.a + k] is not None]
    return [(i + offset, j + offset) for i, j in middle]


def replay_pairs(a: Sequence, b: Sequence) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of a run ``a`` and its replay
    ``b``, preferring the earliest copies in ``b``: a replay repeats the run and
    then goes on, so a repeated "ok" at the run's end is the replay's copy at that
    place, not a newer "ok" after it (host walk 90004). ``lcs_pairs`` prefers the
    latest copies, which suits a list read against a view, not a replay."""
    lo = 0
    pairs: list[tuple[int, int]] = []
    while lo < len(a) and lo < len(b) and a[lo] is not None and a[lo] == b[lo]:
        pairs.append((lo, lo))
        lo += 1
    return pairs + _middle_pairs(a[lo:], b[lo:], lo, latest=False, paired_before=bool(pairs))


def _lcs_table(a: Sequence, b: Sequence) -> list[tuple[int, int]]:
    """The DP table's LCS of ``a`` and ``b``, walked from the start. Among the longest,
    the one with most pairs right after a pair (``(i, j)`` after ``(i - 1, j - 1)``)
    wins: a list keeps its exchanges together, so a reply paired with the copy of it
    right after its message's is better evidence than an equal one further on (host
    walk 3320002: the newest copies of a repeated "T19"/"ok" split the list's own
    exchanges and lost their view the reading). Where that ties too, equal elements
    pair at once and otherwise the element of ``a`` is skipped (callers reverse both
    lists for the latest copies)."""
    n, m = len(a), len(b)
    # value = length * weight + pairs right after a pair; ``after[i][j]``: given that
    # (i - 1, j - 1) was paired, ``alone[i][j]``: given it was not.
    weight = min(n, m) + 1
    after = [[0] * (m + 1) for _ in range(n + 1)]
    alone = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            skip = max(alone[i + 1][j], alone[i][j + 1])
            if a[i] is not None and a[i] == b[j]:
                pair = weight + after[i + 1][j + 1]
                alone[i][j] = max(pair, skip)
                after[i][j] = max(pair + 1, skip)
            else:
                alone[i][j] = after[i][j] = skip
    pairs, i, j, linked = [], 0, 0, False
    while i < n and j < m:
        best = (after if linked else alone)[i][j]
        if a[i] is not None and a[i] == b[j] \
                and weight + after[i + 1][j + 1] + int(linked) == best:
            pairs.append((i, j))
            i, j, linked = i + 1, j + 1, True
        elif alone[i + 1][j] == best:
            i, linked = i + 1, False
        else:
            j, linked = j + 1, False
    return pairs
