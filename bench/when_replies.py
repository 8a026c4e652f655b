#!/usr/bin/env python3
"""How often the reply to a question that asks *when* tells a time, on real chats.

Reads every conversation of the ``chitchat-dataset`` package (7,168 real typed
conversations; offline) as runs of one sender, and counts, for each turn whose last
line is a question: does it ask when (``recall.periods.asks_when``), and does the
other person's next turn tell a time (``recall.periods.tells_time``)? Beside it the
same share for replies to other questions and for any turn.

Why: ``recall.arms.TOLD_TIME`` prefers, for a question that asks when, the turns
that tell a time; this is the evidence for that preference from conversations
nobody here wrote (the question sets of ``recall_quality.py --data chitchat`` hold
only four such questions, too few to move R@5).

    .venv/bin/python bench/when_replies.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_quality  # noqa: E402,F401  (loads the package)
import realchats  # noqa: E402

from hermes_trove.recall import periods  # noqa: E402


def main() -> int:
    counts = {"when": [0, 0], "other questions": [0, 0], "any turn": [0, 0]}
    for conv in realchats.load_dataset().values():
        turns = realchats._conversation_turns(conv)
        for (sender, lines, _), (nxt_sender, nxt_lines, _) in zip(turns, turns[1:]):
            if nxt_sender == sender:
                continue
            told = periods.tells_time(" ".join(nxt_lines))
            groups = ["any turn"]
            if lines[-1].rstrip().endswith("?"):
                groups.append("when" if periods.asks_when(lines[-1]) else "other questions")
            for group in groups:
                counts[group][0] += 1
                counts[group][1] += told
    for group, (total, told) in counts.items():
        print(f"replies to {group:16} {told:6} of {total:6} tell a time ({told / max(total, 1):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
