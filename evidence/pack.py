"""Evidence packs and compiled evidence briefs over exact refs.

``evidence_pack`` hydrates refs: verifies (or unambiguously repairs) each
quote, then keeps the two times apart - ``said_at``, when the message was
said, and ``happened``, the date the quote itself states, resolved against
the said time with the rule used. ``compile_evidence`` checks a model's
proposal (claims with refs, an optional computation) and answers with a
compact verdict per claim and an overall sufficiency; it never writes prose
and never lets a claim stand for something its refs do not show.
"""

from __future__ import annotations

import re
from datetime import tzinfo
from typing import Any, Callable

from ..recall.query_plan import fold
from ..schemas import ArgumentError, set_cursor, validate
from . import compute as compute_mod
from . import polarity
from . import refs as refs_mod
from .values import find_amounts, find_dates
from ..storage.timekeys import iso

MAX_REFS = 50
CONTEXT_CHARS = 80        # characters of the message shown before and after each quote
MAX_CLAIMS = 20
_STOPWORDS = frozenset("""about after again also because been before being between both could
does doing down during each from have having here into just more most only other over same
should some such than that their them then there these they this those through under until
very were what when where which while will with would your yours mine ours""".split())

Loader = Callable[[int], dict]


def hydrate(raw: Any, index: int, load: Loader, tz: tzinfo | None = None) -> dict:
    """One pack item: the verified ref with its two times, or a per-ref error."""
    try:
        ref = refs_mod.verify(raw, load)
    except refs_mod.RefError as exc:
        store_id = raw.get("store_id") if isinstance(raw, dict) else None
        return failed_item(index, store_id, str(exc))
    text = refs_mod.text_of(ref, load(ref.store_id))
    item = {"index": index, "ok": True, "ref": ref.as_dict(), "status": ref.status,
            "role": ref.role, "session_id": ref.session_id, "said_at": iso(ref.said_at),
            "before": text[max(0, ref.start - CONTEXT_CHARS):ref.start],
            "after": text[ref.end:ref.end + CONTEXT_CHARS]}
    if ref.original:
        item["text_source"] = ("the original text: the row was rewritten by transcript GC "
                               "and its payload still holds that text")
    item.update(happened_fields(ref, tz))
    signs = polarity.cues(ref.quote)
    if signs:      # the quote does not state its words as a plain fact
        item["polarity"] = signs
    try:
        amounts = find_amounts(ref.quote)
        if amounts:
            item["amounts"] = [a.as_dict() for a in amounts]
    except ValueError as exc:
        item["amounts_error"] = str(exc)
    return item


def failed_item(index: int, store_id: Any, error: str) -> dict:
    """A pack item that failed, with its own reason: one bad ref never fails the page."""
    return {"index": index, "ok": False, "store_id": store_id, "error": error}


def count_items(payload: dict) -> None:
    """``verified`` / ``failed`` of a page, counted from its items (after any item failed
    late, e.g. for its size)."""
    payload["verified"] = sum(1 for i in payload["items"] if i["ok"])
    payload["failed"] = len(payload["items"]) - payload["verified"]


def happened_fields(ref: refs_mod.Ref, tz: tzinfo | None = None) -> dict:
    """When the quoted event happened, as far as the quote says (never guessed);
    relative dates count from the local day (``tz``) it was said."""
    try:
        dates = find_dates(ref.quote, ref.said_at, tz)
    except ValueError as exc:
        return {"happened": None, "happened_note": str(exc)}
    distinct = {d.day for d in dates}
    if not dates:
        return {"happened": None, "happened_note": "the quote states no date; only said_at "
                "is known"}
    if len(distinct) == 1:
        return {"happened": dates[0].as_dict()}
    return {"happened": None, "happened_candidates": [d.as_dict() for d in dates],
            "happened_note": "the quote states several dates"}


def evidence_pack(raw_refs: Any, load: Loader, *, offset: int, limit: int,
                  computation: dict | None, tz: tzinfo | None = None) -> dict:
    """A page of hydrated refs (``items``), and the computation over all refs when asked."""
    if not isinstance(raw_refs, list) or not raw_refs:
        raise ValueError("refs must be a non-empty list of {store_id, start, end, quote}")
    if len(raw_refs) > MAX_REFS:
        raise ValueError(f"at most {MAX_REFS} refs per pack")
    page = raw_refs[offset:offset + limit]
    items = [hydrate(raw, offset + i, load, tz) for i, raw in enumerate(page)]
    payload: dict = {"total_refs": len(raw_refs), "offset": offset, "items": items}
    count_items(payload)
    set_cursor(payload, offset, len(page), "total_refs", "next_offset")
    if computation is not None:
        payload["computation"] = run_computation(computation, raw_refs, load, tz)
    return payload


def run_computation(spec: Any, default_inputs: list | None, load: Loader,
                    tz: tzinfo | None = None) -> dict:
    """A canonical computation (``trove_compute``) as a result or an error, never raising.

    ``spec`` is checked against trove_compute's own schema, as a top-level call is:
    ``"absolute": "false"`` is false (``bool("false")`` was true), and a ``unit`` that is
    not a string is an error (it raised AttributeError or TypeError inside compute).
    """
    if not isinstance(spec, dict) or not spec.get("operation"):
        return {"ok": False, "error": "computation must be {operation, inputs?, unit?, absolute?}"}
    try:
        args, _ = validate("trove_compute", {
            "operation": spec["operation"], "inputs": spec.get("inputs", default_inputs),
            "unit": spec.get("unit"), "absolute": spec.get("absolute")})
        out = compute_mod.compute(args["operation"], args["inputs"], load, unit=args.get("unit"),
                                  absolute=args.get("absolute", False), tz=tz)
    except (ArgumentError, compute_mod.ComputeError) as exc:
        return {"ok": False, "operation": spec["operation"], "error": str(exc)}
    return {"ok": True, **out}


# ---------------------------------------------------------------- compile
def compile_evidence(proposal: Any, load: Loader, tz: tzinfo | None = None) -> dict:
    """Check a proposal ``{question, claims: [{text, refs}], computation?}`` against the store.

    A claim is supported when every ref verifies, every number and calendar
    date the claim states occurs among its quotes' values, at least half
    of its content words occur in its quotes, and the quotes say it the way the
    claim does (``polarity.mismatch``: a denial, a hedge or a question never
    supports a plain statement). Sufficiency: ``insufficient``
    (no claims, an unsupported claim, or a failed computation),
    ``conflicting`` (two supported claims that say the same thing with
    different numbers or dates), else ``sufficient``.
    """
    if not isinstance(proposal, dict):
        raise ValueError("proposal must be an object {question, claims, computation?}")
    claims = proposal.get("claims") or []
    if not isinstance(claims, list) or len(claims) > MAX_CLAIMS:
        raise ValueError(f"claims must be a list of at most {MAX_CLAIMS} {{text, refs}}")
    checked = [check_claim(i, c, load, tz) for i, c in enumerate(claims)]
    brief: dict = {"question": str(proposal.get("question") or "")[:300], "claims": checked}
    if proposal.get("computation") is not None:
        brief["computation"] = run_computation(proposal["computation"], None, load, tz)
    brief["sufficiency"], brief["why"] = sufficiency(checked, brief.get("computation"))
    return brief


def check_claim(index: int, claim: Any, load: Loader, tz: tzinfo | None = None) -> dict:
    """One claim's verdict: supported or not, with the reasons and its verified refs."""
    if not isinstance(claim, dict) or not isinstance(claim.get("text"), str):
        return {"index": index, "supported": False, "reasons": ["a claim is {text, refs}"]}
    text = claim["text"][:500]
    out: dict = {"index": index, "text": text, "refs": []}
    reasons: list[str] = []
    verified: list[refs_mod.Ref] = []
    raw_refs = claim.get("refs") or []
    if not isinstance(raw_refs, list) or not raw_refs:
        reasons.append("no refs")
        raw_refs = []
    for raw in raw_refs[:MAX_REFS]:
        try:
            ref = refs_mod.verify(raw, load)
            verified.append(ref)
            out["refs"].append({**ref.as_dict(), "status": ref.status})
        except refs_mod.RefError as exc:
            reasons.append(f"ref: {exc}")
    if verified and not reasons:
        reasons += _unshown(text, verified, tz)
    out["supported"] = not reasons
    out["values"] = sorted(_claim_values(text)[0])
    if reasons:
        out["reasons"] = reasons
    return out


def _claim_values(text: str) -> tuple[set[str], list[str]]:
    """The numbers and calendar dates a claim states, as comparable strings (and problems)."""
    values: set[str] = set()
    problems: list[str] = []
    try:
        values |= {d.day.isoformat() for d in find_dates(text, None)}
    except ValueError as exc:
        problems.append(f"claim: {exc}; state it as a calendar date")
    try:
        values |= {_number_key(a.value) for a in find_amounts(text)}
    except ValueError as exc:
        problems.append(f"claim: {exc}")
    return values, problems


def _number_key(value: float) -> str:
    """How a claim's number and a quote's compare: to 15 significant digits, all a double
    holds exactly ('{:g}' kept six, so 1234567 and 1234568 compared equal)."""
    return f"{value:.15g}"


def _quote_values(refs: list[refs_mod.Ref], tz: tzinfo | None = None) -> set[str]:
    values: set[str] = set()
    for ref in refs:
        try:
            values |= {d.day.isoformat() for d in find_dates(ref.quote, ref.said_at, tz)}
        except ValueError:
            pass
        try:
            values |= {_number_key(a.value) for a in find_amounts(ref.quote)}
        except ValueError:
            pass
    return values


def content_words(text: str) -> set[str]:
    """Words that carry a claim's meaning: 4+ letters, not a stopword (folded)."""
    return {w for w in re.findall(r"[^\W\d_]{4,}", fold(text)) if w not in _STOPWORDS}


def _unshown(text: str, refs: list[refs_mod.Ref], tz: tzinfo | None = None) -> list[str]:
    """What a claim states that its quotes do not show."""
    values, problems = _claim_values(text)
    missing = sorted(values - _quote_values(refs, tz))
    if missing:
        problems.append(f"values not in the quotes: {', '.join(missing)}")
    words = content_words(text)
    quoted = " ".join(fold(r.quote) for r in refs)
    stems = {w[:5] for w in re.findall(r"[^\W\d_]{4,}", quoted)}
    absent = sorted(w for w in words if w[:5] not in stems)
    if words and len(absent) * 2 > len(words):
        problems.append(f"most of the claim's words are not in the quotes: {', '.join(absent[:8])}")
    return problems + polarity.mismatch(text, [r.quote for r in refs])


def _shape(text: str) -> str:
    """A claim with its numbers and dates blanked, to find claims that differ only in them."""
    return " ".join(re.sub(r"[\d$€£¥.,/:-]+", "#", fold(text)).split())


def sufficiency(claims: list[dict], computation: dict | None) -> tuple[str, str]:
    """``sufficient`` | ``insufficient`` | ``conflicting``, with the reason."""
    if not claims:
        return "insufficient", "no claims were proposed"
    unsupported = [c["index"] for c in claims if not c["supported"]]
    if unsupported:
        return "insufficient", f"claims {unsupported} are not supported by their refs"
    if computation is not None and not computation.get("ok"):
        return "insufficient", f"the computation failed: {computation.get('error')}"
    by_shape: dict[str, dict] = {}
    for claim in claims:
        other = by_shape.setdefault(_shape(claim["text"]), claim)
        if other is not claim and other["values"] != claim["values"]:
            return "conflicting", (f"claims {other['index']} and {claim['index']} state "
                                   f"different values ({', '.join(other['values'])} vs "
                                   f"{', '.join(claim['values'])}); check which is newer")
    return "sufficient", "every claim is supported by exact quotes" + (
        " and the computation succeeded" if computation is not None else "")
