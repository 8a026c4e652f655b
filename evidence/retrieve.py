"""trove_retrieve (opt-in, TROVE_RETRIEVE_ENABLED): a bounded evidence controller for one
answering turn.

Typed slots (date, amount, place, person, item) are filled by at most
``MAX_CALLS`` targeted searches (``trove_grep`` with exact refs, run by the
tool layer through the ``search`` callable); only refs observed in those
results are accepted, each re-verified through the caller's scope; the
evidence kept is capped in characters; a quote that negates, hedges or asks
(``polarity``) never fills a slot; an optional computation finishes the
turn. The evidence view (question, slots, refs, calls, computation) and the
hash of its trace are stored so a later turn can cite them by ``view_id``. It
returns data, never prose.
"""

from __future__ import annotations

import json
import time
from datetime import tzinfo
from typing import Any, Callable, Sequence

from ..storage import codec
from ..storage.database import Database, chunked
from . import compute as compute_mod
from . import refs as refs_mod
from .pack import run_computation
from .polarity import polarity
from .values import find_amounts, find_dates

SLOT_TYPES = ("date", "amount", "place", "person", "item")
MAX_SLOTS = 6
MAX_CALLS = 3
REFS_PER_SLOT = 3            # the ref that fills a slot and up to two alternatives
CONTEXT_MAX_CHARS = 3000     # all quotes of one evidence view together

Search = Callable[[str], list[dict]]


def _slots(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw or len(raw) > MAX_SLOTS:
        raise ValueError(f"slots must be a list of 1..{MAX_SLOTS} {{name, type, query?}}")
    out = []
    for slot in raw:
        if not isinstance(slot, dict) or slot.get("type") not in SLOT_TYPES:
            raise ValueError(f"each slot needs a type among {', '.join(SLOT_TYPES)}")
        if any(slot.get(k) is not None and not isinstance(slot[k], str) for k in ("name", "query")):
            raise ValueError("a slot's name and query must be strings")
        name = str(slot.get("name") or slot["type"])[:60]
        out.append({"name": name, "type": slot["type"],
                    "query": str(slot.get("query") or name)[:200]})
    return out


def fits(slot_type: str, ref: refs_mod.Ref, tz: tzinfo | None = None) -> bool:
    """Whether a ref can fill a slot: exactly one date / amount; any text for names."""
    try:
        if slot_type == "date":
            return len({d.day for d in find_dates(ref.quote, ref.said_at, tz)}) == 1
        if slot_type == "amount":
            return len(find_amounts(ref.quote)) == 1
    except ValueError:
        return False
    return bool(ref.quote.strip())


def retrieve(question: str, raw_slots: Any, search: Search, load: Callable[[int], dict],
             db: Database, session_id: str, computation: dict | None,
             tz: tzinfo | None = None) -> dict:
    """Fill the slots with exact observed refs, run the computation, store the view
    (relative dates count from the local day, ``tz``, a message was said)."""
    slots = _slots(raw_slots)
    queries = list(dict.fromkeys(s["query"] for s in slots))[:MAX_CALLS]
    observed: dict[str, list[dict]] = {q: search(q) for q in queries}
    used_chars, calls = 0, [{"tool": "trove_grep", "query": q,
                             "hits": len(observed[q])} for q in queries]
    filled, taken = [], set()
    for slot in slots:
        refs, unsure = [], 0
        for raw in observed.get(slot["query"], []):
            if (raw.get("store_id"), raw.get("start")) in taken:
                continue      # one quote fills one slot
            if len(refs) == REFS_PER_SLOT or used_chars + len(raw["quote"]) > CONTEXT_MAX_CHARS:
                break
            try:
                ref = refs_mod.verify(raw, load)
            except refs_mod.RefError:
                continue
            if fits(slot["type"], ref, tz):
                sign = polarity(ref.quote)
                if sign.negations or sign.uncertain:
                    unsure += 1      # "we did not fly on May 3" never fills a date slot
                    continue
                if not refs:   # the first fitting ref fills the slot; the rest are alternatives
                    taken.add((ref.store_id, ref.start))
                refs.append(ref.as_dict())
                used_chars += len(ref.quote)
        entry = {**slot, "refs": refs, "filled": bool(refs)}
        if not refs:
            entry["note"] = ("no observed ref fits this slot"
                             if slot["query"] in observed else "over the call budget")
            if unsure:
                entry["note"] += (f"; {unsure} that fit negate, hedge or ask (not used: "
                                  "check them with trove_evidence_pack)")
        filled.append(entry)
    body: dict = {"question": question[:300], "slots": filled, "calls": calls,
                  "context_chars": used_chars}
    if computation is not None:
        inputs = [s["refs"][0] for s in filled if s["refs"]]
        body["computation"] = run_computation({**computation, "inputs": inputs}, None, load,
                                              tz)
    body["trace_hash"] = compute_mod.trace_hash(body)
    body["view_id"] = store_view(db, session_id, body)
    return body


def store_view(db: Database, session_id: str, body: dict) -> int:
    """Keep one evidence view (one transaction); its id.

    The body is written by ``codec.dump_json``, the store's one rule for JSON it keeps: a
    slot's name or query comes from the model's nested arguments, which no schema
    cleans, and a lone surrogate in it failed the INSERT ("surrogates not allowed").
    ``load_view`` reads the escaped text back to the same strings, so the hash holds."""
    with db.transaction() as conn:
        cursor = conn.execute(
            "INSERT INTO evidence_views(session_id, question, body, trace_hash, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (session_id, codec.safe_text(body["question"]), codec.dump_json(body),
             body["trace_hash"], time.time()))
        return int(cursor.lastrowid)


def delete_sessions_in(conn, session_ids: Sequence[str]) -> dict:
    """Remove deleted sessions' evidence views inside the caller's transaction (their
    quotes are copies of the deleted messages)."""
    ids = list(dict.fromkeys(session_ids))
    if not ids:
        return {"evidence_views": 0}
    gone = sum(conn.execute(f"DELETE FROM evidence_views WHERE session_id IN"
                            f" ({','.join('?' * len(chunk))})", chunk).rowcount
               for chunk in chunked(ids))
    return {"evidence_views": gone}


def load_view(db: Database, view_id: int, session_ids: tuple[str, ...] | None) -> dict:
    """A stored view of the given sessions (None = any), with its hash re-checked."""
    with db.reading() as conn:
        row = conn.execute("SELECT session_id, body, trace_hash FROM evidence_views"
                           " WHERE view_id = ?", (view_id,)).fetchone()
    if row is None or (session_ids is not None and row[0] not in session_ids):
        raise ValueError(f"view_id {view_id} not found in this scope")
    body = json.loads(row[1])
    stored_hash = body.pop("trace_hash")
    body.pop("view_id", None)
    body["trace_hash_ok"] = compute_mod.trace_hash(body) == stored_hash == row[2]
    body.update(trace_hash=stored_hash, view_id=view_id)
    return body
