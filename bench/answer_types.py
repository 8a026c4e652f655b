#!/usr/bin/env python3
"""How often the reply to a question that asks when / how many / where holds that
kind of answer, on real chats.

Reads every conversation of the ``chitchat-dataset`` package (7,168 real typed
conversations; offline) as runs of one sender. For each turn whose last line is a
question asking for a kind (``recall.answer_type.expected``), does the other
person's next turn hold an answer of that kind (``answer_type.holds``)? Beside it
the same share over every turn that follows the other person's turn.

Why: ``recall.arms.ANSWER_TYPE`` prefers, for such a question, the turns holding its
kind of answer; this is the evidence for that preference from conversations nobody
here wrote (the question sets of ``recall_quality.py --data chitchat`` hold only ~20
such questions, too few to move R@5 much).

    .venv/bin/python bench/answer_types.py
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recall_quality  # noqa: E402,F401  (loads the package)
import realchats  # noqa: E402

from hermes_trove.recall import answer_type  # noqa: E402

KINDS = ("time", "number", "place")


def main() -> int:
    asked, answered, replies, holding = Counter(), Counter(), 0, Counter()
    for conv in realchats.load_dataset().values():
        turns = realchats._conversation_turns(conv)
        for (sender, lines, _), (nxt_sender, nxt_lines, _) in zip(turns, turns[1:]):
            if nxt_sender == sender:
                continue
            reply = " ".join(nxt_lines)
            replies += 1
            held = {kind for kind in KINDS if answer_type.holds(kind, reply)}
            holding.update(held)
            if lines[-1].rstrip().endswith("?"):
                for kind in answer_type.expected(lines[-1]):
                    asked[kind] += 1
                    answered[kind] += kind in held
    for kind in KINDS:
        share, base = answered[kind] / max(asked[kind], 1), holding[kind] / max(replies, 1)
        print(f"{kind:7} asked {asked[kind]:4}: the reply holds one {answered[kind]:4} ({share:.3f}); "
              f"any reply {holding[kind]:6} of {replies} ({base:.3f}); x{share / max(base, 1e-9):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
