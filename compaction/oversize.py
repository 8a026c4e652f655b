"""The last resort of a compaction: a tail message bigger than the whole budget.

The tail gives way down to the newest user message and the newest tool group,
and those always stay (``assemble.choose_tail``). When they alone are bigger
than the room the prompt has (a pasted log, a huge tool output, CJK text the
host's chars/4 counts five times low), returning them whole sends a request over
the host's trigger, and over the window: the provider rejects it, and the host
retries a compaction that can do nothing more. So such a message is shown *cut*:
its start and end around a marker that says so and names the stored row
(``payloads.cut_message_placeholder``). It is never dropped, and nothing is lost:
the row holds it whole, and the cut is recognized as that row when the host
shows it again (``IngestPolicy`` restores the placeholder from its payload).

Pure but for ``put_text`` (the payload store) and the cost callables.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..storage import payloads

# What a cut keeps of the text, as a share of the characters it shows: the start
# (what the message is) weighs more than its end (where it stopped).
HEAD_SHARE = 0.7
# A text this short is never cut: the marker and header alone are about as long.
MIN_CUT_CHARS = 1_000


def is_cut(message: dict) -> bool:
    """Whether ``message`` is shown cut (for tests, status and the host's eyes)."""
    return any(f"[trove externalized {payloads.KIND_CUT_MESSAGE} " in text
               for text in _texts(message))


def _texts(message: dict) -> list[str]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def _with_text(message: dict, text: str) -> dict:
    """``message`` with its (longest) text replaced; the host's ``api_content`` sidecar
    (the wire text: the content plus what plugins added) follows the content."""
    content = message.get("content")
    out = dict(message)
    if isinstance(content, str):
        out["content"] = text
        sidecar = message.get("api_content")
        if isinstance(sidecar, str):
            suffix = sidecar[len(content):] if sidecar.startswith(content) else ""
            out["api_content"] = text + suffix
        return out
    longest = max((i for i, p in enumerate(content)
                   if isinstance(p, dict) and isinstance(p.get("text"), str)),
                  key=lambda i: len(content[i]["text"]))
    parts = list(content)
    parts[longest] = {**parts[longest], "text": text}
    out["content"] = parts
    out.pop("api_content", None)  # a multimodal turn's wire copy is rebuilt from its parts
    return out


def _longest_text(message: dict) -> str:
    texts = _texts(message)
    return max(texts, key=len) if texts else ""


def cut_to(message: dict, allowance: int, *, store_id: int, cost: Callable[[dict], int],
           put_text: Callable[[str], str]) -> dict:
    """``message`` shown cut so that it costs at most ``allowance`` (as little as its
    marker when even that does not fit): the most of its longest text that fits.
    ``put_text`` stores the whole text as a payload and returns its ref. A message
    the marker alone would not make smaller comes back as it is."""
    text = _longest_text(message)
    if len(text) <= MIN_CUT_CHARS:
        return message
    ref = put_text(text)

    def shown(keep: int) -> dict:
        head = int(keep * HEAD_SHARE)
        return _with_text(message, payloads.cut_message_placeholder(
            text, ref, head, keep - head, store_id))

    low, high = 0, len(text) - 1     # keeping everything would not be a cut
    best = shown(0)
    if cost(best) >= cost(message):
        return message
    while low <= high:
        mid = (low + high) // 2
        candidate = shown(mid)
        if cost(candidate) <= allowance:
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return best


def fit(tail: Sequence[dict], store_ids: Sequence[int | None], allowance: int, *,
        cost: Callable[[dict], int], put_text: Callable[[str], str]) -> list[dict]:
    """The tail with its biggest messages cut until the whole fits ``allowance``.

    Messages are taken smallest first; each keeps its whole self while it fits its
    fair share of what is left, and the rest share the remainder (the biggest is
    cut most). A message without a stored row (an ignore pattern matched it) is
    never cut: nothing could bring it back; nor is one with little text."""
    out = list(tail)
    costs = [cost(m) for m in tail]
    if sum(costs) <= allowance:
        return out
    cuttable = [i for i, m in enumerate(tail)
                if store_ids[i] is not None and len(_longest_text(m)) > MIN_CUT_CHARS]
    left = allowance - sum(c for i, c in enumerate(costs) if i not in cuttable)
    order = sorted(cuttable, key=lambda i: costs[i])
    for n, i in enumerate(order):
        share = max(0, left) // (len(order) - n)
        if costs[i] <= share:
            left -= costs[i]
            continue
        out[i] = cut_to(tail[i], share, store_id=int(store_ids[i]), cost=cost,
                        put_text=put_text)
        left -= cost(out[i])
    return out
