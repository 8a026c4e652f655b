"""The last compaction and the token counts in words: what status shows.

The engine records each compaction's outcome in the session state (tokens
before and after, the trigger, the tail kept, whether it gave way, the reason
when nothing changed). These functions read those fields defensively (a
field may be missing in older rows or renamed later) and say which counter
each number comes from: the provider's usage of the last request, the host's
rough estimate (chars / 4) that the trigger is checked against, or trove's
own tokenizer.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


def noop_reason(tail_messages: int, fresh_tail_count: int, final: int, trigger: int) -> str:
    """Why a compaction that ran changed nothing, from what it kept verbatim."""
    if tail_messages <= fresh_tail_count:
        return (f"nothing to compact: every unsummarized message shown ({tail_messages}) is "
                f"in the fresh tail (up to TROVE_FRESH_TAIL_COUNT={fresh_tail_count} kept "
                f"verbatim) and the prompt is under the trigger ({final:,} < {trigger:,} "
                "tokens)")
    return (f"nothing to compact yet: beyond the fresh tail only a sliver of messages is "
            f"unsummarized, smaller than a summary chunk; it waits for the next compaction "
            f"(prompt {final:,} < trigger {trigger:,} tokens)")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _nodes(value: Any) -> int:
    return len(value) if isinstance(value, (list, tuple)) else (_int(value) or 0)


def _fallbacks(last: Mapping) -> str:
    """`` (2 by the deterministic digest: timeout x2, rejected: a refusal x1)`` when a
    model summary failed or was rejected, so status says why a summary is a digest."""
    levels = last.get("levels")
    digests = sum(1 for v in levels if v == 3) if isinstance(levels, list) else 0
    problems = last.get("summary_problems")
    if not isinstance(problems, Mapping) or not problems:
        return ""
    ranked = sorted(problems.items(), key=lambda kv: (-(_int(kv[1]) or 0), str(kv[0])))[:4]
    why = ", ".join(f"{str(k)[:80]} x{_int(v) or 0}" for k, v in ranked)
    head = f"{digests} by the deterministic digest: " if digests else "model retries: "
    return f" ({head}{why})"


def compaction_line(last: Mapping | None, when: Callable[[Any], str]) -> str:
    """``last compaction: compacted at T: 41,000 -> 19,800 tokens (trigger 32,000), 2 new
    summaries, tail kept 14 messages (whole)`` or the reason nothing changed."""
    if not isinstance(last, Mapping) or not last.get("outcome"):
        return "last compaction: none recorded"
    text = f"last compaction: {last['outcome']} at {when(last.get('at'))}"
    before, after = _int(last.get("tokens_before")), _int(last.get("tokens_after"))
    trigger, overhead = _int(last.get("trigger")), _int(last.get("overhead"))
    if before is not None and after is not None:
        text += f": {before:,} -> {after:,} tokens"
        extra = [f"trigger {trigger:,}" if trigger else "",
                 f"{overhead:,} of them host overhead" if overhead else ""]
        extra = [e for e in extra if e]
        text += (f" ({'; '.join(extra)}; trove's tokenizer)" if extra
                 else " (trove's tokenizer)")
    made = _nodes(last.get("leaf_nodes")) + _nodes(last.get("condensed_nodes"))
    if last.get("outcome") == "compacted":
        text += f", {made} new summar{'y' if made == 1 else 'ies'}"
        text += _fallbacks(last)
    tail = _int(last.get("tail_messages"))
    if tail is not None or "tail_gave_way" in last:
        kept = f"tail kept {tail} messages" if tail is not None else "tail"
        if last.get("tail_gave_way"):
            why = (last.get("tail_gave_way_reason") or
                   "the protected fresh tail did not fit the budget beside the summaries, so "
                   "it shrank toward the newest user message and tool group")
            text += f", {kept}, the tail gave way: {why}"
        else:
            text += f", {kept} (whole)"
    if last.get("reason"):
        text += f"; {last['reason']}"
    elif last.get("note"):
        text += f" ({last['note']})"
    if last.get("over_window"):
        text += " [OVER THE WINDOW]"
    return text


def counters_text(engine: Mapping) -> str:
    """Which counter each engine number is: the provider's count of the last request,
    the number the host's trigger check saw (its rough estimate at a turn's start),
    and the tokenizer trove counts its own budgets with."""
    counter = engine.get("token_counter") or {}
    checked = _int(engine.get("last_checked_tokens"))
    parts = ["prompt = the provider's count of the last request",
             "trigger = checked by the host against its rough estimate (chars/4) at a "
             "turn's start and the provider's count between tool calls"]
    if checked is not None:
        parts.append(f"last check saw {checked:,}")
    if counter.get("name"):
        parts.append(f"trove's own budgets: {counter['name']}"
                     + ("" if counter.get("exact", True) else " (approximate)"))
    return "token counts: " + "; ".join(parts)
