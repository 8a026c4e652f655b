"""Longest common subsequences of fingerprint lists, for identity's alignments.

Identity reads a list the host hands over against a view it sent (or a run against
its replay) by pairing equal fingerprints in order; which copy of a repeated element
("ok", "continue") a pair takes decides which stored row a message is. The pairing
rules live here so that every reading in ``identity`` uses the same ones: a list
read against a view prefers the LATEST copies (``lcs_pairs``), a run read against
its replay the EARLIEST (``replay_pairs``). ``None`` (a message with no fingerprint
to match) never pairs.
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
    # Among equally long matches the latest win (a repeated "ok" is the newest copy).
    pairs += _middle_pairs(a[lo:hi_a], b[lo:hi_b], lo, latest=True)
    return pairs + suffix[::-1]


def _middle_pairs(mid_a: Sequence, mid_b: Sequence, offset: int, *,
                  latest: bool) -> list[tuple[int, int]]:
    """An LCS of two runs that start at ``offset`` in their lists: the DP table when
    small (the ``latest`` or the earliest copies of a repeated element win),
    difflib's matching blocks when not."""
    if not mid_a or not mid_b:
        return []
    if len(mid_a) * len(mid_b) <= LCS_CELLS:
        if latest:  # the table's walk takes the earliest match: run it reversed
            na, nb = len(mid_a), len(mid_b)
            middle = [(na - 1 - i, nb - 1 - j)
                      for i, j in _lcs_table(mid_a[::-1], mid_b[::-1])][::-1]
        else:
            middle = _lcs_table(mid_a, mid_b)
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
    return pairs + _middle_pairs(a[lo:], b[lo:], lo, latest=False)


def _lcs_table(a: Sequence, b: Sequence) -> list[tuple[int, int]]:
    """The DP table's LCS of ``a`` and ``b``, walked from the start: equal elements
    pair at once, and where skipping either side keeps the same length the element
    of ``a`` is skipped (callers reverse both lists for the latest copies)."""
    n, m = len(a), len(b)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = table[i], table[i + 1]
        for j in range(m - 1, -1, -1):
            if a[i] is not None and a[i] == b[j]:
                row[j] = below[j + 1] + 1
            else:
                row[j] = max(below[j], row[j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] is not None and a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs
