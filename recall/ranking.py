"""Ranking rules that decide which rows take the few result slots.

Two things full-text scores alone get wrong in conversations:

- **Names.** People ask about people ("when did Caroline start the pottery
  class?"). The turns *by* Caroline hold the answer; the turns that address
  her ("wow Caroline, that's great!") repeat her name but not the fact. So the
  sender's name is a field of its own, read from the ``[Name] `` prefix
  Hermes's gateway puts on shared-chat turns or from the message's ``name``
  field (stored as ``tool_name`` on a user/assistant row). ``speaker_of``
  splits it off the text; the scorer then counts a query word that names the
  sender as a field match and gives that row a bonus, while the same name in
  the text of a row someone else sent weighs half (and makes no phrase).
  Plain turns (``user``/``assistant``, no name anywhere) still name people:
  the other person, addressing them ("hey Caroline", "thanks, Caroline!"). A
  name the query writes capitalized that one role's turns address and the
  other's almost never do is read as the other role's name
  (``addressed_roles``; a place one person talks about is no address), so that
  role's turns count as spoken by it and the addressing turns as mentions.
  People are often addressed by a short form ("hey Mel!" to Melanie): when the
  full name settles no role, its leading letters written capitalized as an
  address are read the same way (``short_forms``).
- **Names are who, not what, for the vectors.** A query vector of "What is
  Melanie's favorite food?" lands near every turn that names or is signed by
  Melanie, not near "I love pizza" (real chats whose questions name people:
  the vector arm fell from 0.37 to 0.17-0.23 R@5, bench/README.md). The vector
  arms embed the question without the names of people (``without_names``); the
  full-text scorer still uses them as the field above.
- **Slots.** A result slot is precious and raw turns are the evidence. A
  summary repeats the words of the turns under it, so it scores as well as
  they do and used to crowd them out. ``place_summaries`` keeps raw hits first
  and lets a summary take a slot only when it adds something the listed raw
  hits do not: a query concept none of them matched, and no listed raw hit
  under it. Summaries that add nothing move after the raw hits, and so does a
  raw hit that repeats a better one word for word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from ..dag import Dag
from .query_plan import STOP_WORDS

SPEAKER_BONUS = 0.5           # a query word names the row's sender
MENTION_WEIGHT = 0.5          # the same name in a row someone else sent (an address, a mention)
_PREFIX = re.compile(r"\[([^\[\]\n]{1,64})\] ")
_SPEAKER_ROLES = ("user", "assistant")


def speaker_of(row: dict, text: str) -> tuple[str | None, str]:
    """The row's sender name (or None) and its text without a ``[Name] `` prefix.

    The prefix wins over the ``name`` field because it is what the host
    showed; a tool row's ``tool_name`` is a tool, never a speaker.
    """
    match = _PREFIX.match(text)
    if match:
        return match.group(1).strip() or None, text[match.end():]
    if row.get("role") in _SPEAKER_ROLES and row.get("tool_name"):
        return row["tool_name"], text
    return None, text


ADDRESS_MIN = 3               # a role's turns address someone at least this often ...
ADDRESS_SHARE = 0.8           # ... and hold this share of the addresses: the other role is them
ADDRESS_SAMPLE = 100          # newest turns naming someone read for addresses
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z]+)\b")
_GREETING = (r"(?:hey|hi|hello|thanks|thank you|bye|goodbye|morning|good morning|night|"
             r"good night|wow|oh|congrats|congratulations|sorry|dear|aww|welcome|yes|no)")
ROLES = ("user", "assistant")


def proper_names(text: str) -> set[str]:
    """Lower-cased words the query writes capitalized, not at the start of a sentence
    ("When did Caroline go ..." gives ``{"caroline"}``): candidates for a person's name."""
    return {m.group(1).lower() for m in _NAME.finditer(text.strip())}


_ACTOR = re.compile(r"\b(?i:is|was|are|were|do|does|did|has|have|had|can|could|would|will|"
                    r"should|might|may)\s+([A-Z][a-z]+)\b|\b([A-Z][a-z]+)['\u2019]s\b")


def subject_names(text: str) -> set[str]:
    """Lower-cased capitalized words a question asks about as its actor or owner:
    after an auxiliary ("did Caroline go", "does Melanie have") or with a
    possessive ("Caroline's dog"). A place or title rarely stands there."""
    return {(m.group(1) or m.group(2)).lower() for m in _ACTOR.finditer(text)}


def without_names(text: str, names: Iterable[str]) -> str:
    """``text`` with each of ``names`` (lower-cased words, and their possessive
    "'s") taken out, as the vector arms embed a question that names people."""
    names = sorted({n for n in names if n}, key=len, reverse=True)
    if not names:
        return text
    pattern = re.compile(r"(?<![^\W_])(?:" + "|".join(re.escape(n) for n in names)
                         + r")(?:['\u2019]s)?(?![^\W_])", re.IGNORECASE)
    return re.sub(r"\s+", " ", pattern.sub(" ", text)).strip()


SHORT_MIN = 3                 # a short form of a name has at least this many letters


def short_forms(name: str) -> list[str]:
    """The forms a person named ``name`` (lower-cased) may be addressed by for short:
    its leading letters, at least ``SHORT_MIN`` and fewer than all, never a stop
    word ("mel", "mela", "melan", "melani" for "melanie"; "and" is no short Andrew).
    Read only as written capitalized in an address (``addresses(..., cased=True)``)."""
    return [name[:end] for end in range(SHORT_MIN, len(name))
            if name[:end].isalpha() and name[:end] not in STOP_WORDS]


def addresses(name: str, text: str, *, cased: bool = False) -> bool:
    """True when ``text`` speaks *to* ``name``: "Hey Caroline", "Caroline, ...",
    "..., Caroline!". A name merely told about ("I love Japan") is not an address.
    ``cased``: the name must be written capitalized ("Hey Mel!", not "hey mel").
    """
    if cased:
        n = re.escape(name[:1].upper() + name[1:].lower())
        greeting = f"(?i:\\b{_GREETING})"
    else:
        n, greeting, text = re.escape(name), rf"\b{_GREETING}", text.lower()
    return re.search(rf"(?:{greeting}[ ,]+{n}\b|^\W*{n}\s*[,!]|,\s*{n}\s*(?:[,.!?]|$))",
                     text) is not None


def addressed_roles(uses: dict[str, tuple[str | Sequence[str], list[tuple[str, str]]]], *,
                    cased: bool = False) -> dict[str, set[str]]:
    """``role -> names`` read from how plain turns address people.

    ``uses`` maps a key to ``(name or its forms, [(role, text), ...])``: the turns
    that use the name. A name one role addresses at least ``ADDRESS_MIN`` times, in
    at least ``ADDRESS_SHARE`` of all addresses to it, is the *other* role's name:
    people address the one they talk to and rarely address themselves.
    ``cased`` as in ``addresses`` (short forms are read only capitalized).
    """
    found: dict[str, set[str]] = {}
    for key, (name, rows) in uses.items():
        forms = (name,) if isinstance(name, str) else tuple(name)
        counts = {role: 0 for role in ROLES}
        for role, text in rows:
            if role in counts and any(addresses(f, text, cased=cased) for f in forms):
                counts[role] += 1
        total = sum(counts.values())
        for role in ROLES:
            other = ROLES[1 - ROLES.index(role)]
            if counts[other] >= ADDRESS_MIN and counts[other] >= ADDRESS_SHARE * total:
                found.setdefault(role, set()).add(key)
    return found


def place_summaries(order: Sequence[Hashable], matched: dict[Hashable, Iterable[str]],
                    limit: int, dag: Dag, texts: dict[Hashable, str]) -> list[Hashable]:
    """Fused keys (``("m", store_id)`` / ``("n", node_id)``) in their final order.

    Raw hits keep their fused order, except that a raw hit whose text repeats
    a better one word for word moves to the end (it adds nothing but a slot).
    A summary keeps its place only when it matched a query concept that no
    raw hit in the first ``limit`` results matched and none of those raw hits
    lies under it; otherwise it moves after the raw hits.
    """
    seen_texts: set[str] = set()
    repeats = []
    for key in order:
        if key[0] == "m":
            text = " ".join(texts.get(key, "").split())
            if text in seen_texts:
                repeats.append(key)
            seen_texts.add(text)
    if repeats:
        gone = set(repeats)
        order = [key for key in order if key not in gone]
    shown_raw = [key for key in order if key[0] == "m"][:limit]
    raw_concepts: set[str] = set()
    for key in shown_raw:
        raw_concepts.update(matched.get(key, ()))
    above = ancestors(dag, [key[1] for key in shown_raw]) if len(shown_raw) < len(order) else set()
    kept, demoted = [], []
    for key in order:
        if key[0] == "m":
            kept.append(key)
            continue
        adds = set(matched.get(key, ())) - raw_concepts
        if adds and key[1] not in above:
            kept.append(key)
            raw_concepts |= adds
        else:
            demoted.append(key)
    return kept + demoted + repeats


def ancestors(dag: Dag, store_ids: Iterable[int]) -> set[int]:
    """Every summary node above these raw messages (leaf, then up the lineage).

    Walks up from the few listed rows (a query per level), so it stays cheap
    however much a high node covers.
    """
    level: set[int] = set()
    for store_id in store_ids:
        level.update(dag.covering_nodes(store_id))
    seen: set[int] = set()
    while level - seen:
        fresh = level - seen
        seen |= fresh
        level = {parent for node in fresh for parent in dag.parents(node)}
    return seen


# ---------------------------------------------------------------- fusion
@dataclass(frozen=True)
class Fused:
    """One key after fusion: its fused score and its rank in each arm that found it."""

    key: Hashable
    score: float
    ranks: dict


def fuse(arms: dict[str, Sequence[Hashable]], weights: dict[str, float] | None = None,
         k: int = 60, quality: dict[Hashable, float] | None = None) -> list[Fused]:
    """Weighted reciprocal rank fusion: ``sum(weight * quality / (k + rank))`` over the arms.

    Arms are ranked key lists (best first) from any retriever (full text over
    messages, over summaries, and later vectors); their scores never need to
    be comparable. Plain RRF lets an arm whose best hit is poor (one word of
    six) tie with another arm's perfect hit, so ``quality`` (per key, 0..1,
    default 1; the full-text arms pass coverage) scales each contribution.
    Ties keep the order of first appearance.
    """
    weights = weights or {}
    quality = quality or {}
    scores: dict[Hashable, float] = {}
    ranks: dict[Hashable, dict] = {}
    for arm, keys in arms.items():
        weight = weights.get(arm, 1.0)
        for rank, key in enumerate(dict.fromkeys(keys), start=1):
            scores[key] = scores.get(key, 0.0) + weight * quality.get(key, 1.0) / (k + rank)
            ranks.setdefault(key, {})[arm] = rank
    order = sorted(scores, key=lambda key: -scores[key])
    return [Fused(key, scores[key], ranks[key]) for key in order]


FUSION = "score"              # "score" (normalised, weighted) or "rrf"; see fuse_arms


def fuse_arms(arms: dict[str, Sequence[tuple[Hashable, float]]], *,
              families: dict[str, str] | None = None,
              weights: dict[str, float] | None = None,
              scales: dict[str, str] | None = None) -> list[tuple[Hashable, float, dict]]:
    """Fuse ranked arms (``[(key, score), ...]``, best first) into ``(key, score, ranks)``.

    By score (the default, ``FUSION``): arms of one *family* (all full-text
    arms score alike, a vector arm is another family) are min-max normalised
    together, a key takes its best normalised score within a family, and the
    families are added with their weights. Measured on bench/recall_quality.py
    against reciprocal-rank fusion (``FUSION = "rrf"``, k = 60), which lets a
    weak row that shows up in several arms beat a strong row found by one, and
    so lost (bench/README.md has both figures).

    ``scales`` (arm -> name, default its family) sets which arms share one min-max
    scale inside a family: an arm over a narrower scope (this session's turns beside
    every session's) is scaled on its own rows, so its best row scores 1 as it
    would in a search of that scope alone, and a key still takes its family's best.
    """
    families = families or {}
    weights = weights or {}
    ranks: dict[Hashable, dict] = {}
    for arm, scored in arms.items():
        for rank, (key, _) in enumerate(scored, start=1):
            ranks.setdefault(key, {}).setdefault(arm, rank)
    if FUSION == "rrf":
        totals = {f.key: f.score for f in fuse({arm: [k for k, _ in scored]
                                                 for arm, scored in arms.items()}, weights)}
    else:
        totals = _score_fusion(arms, families, weights, scales or {})
    order = sorted(totals, key=lambda key: -totals[key])
    return [(key, totals[key], ranks[key]) for key in order]


def _score_fusion(arms, families, weights, scales) -> dict[Hashable, float]:
    """Weighted sum over families of each key's best min-max normalised score."""
    by_family: dict[str, list[str]] = {}
    for arm in arms:
        by_family.setdefault(families.get(arm, arm), []).append(arm)
    totals: dict[Hashable, float] = {}
    for family, members in by_family.items():
        bounds: dict[str, tuple[float, float]] = {}
        for scale in {scales.get(arm, family) for arm in members}:
            scores = [s for arm in members if scales.get(arm, family) == scale
                      for _, s in arms[arm]]
            if scores:
                bounds[scale] = (min(scores), max(scores))
        best: dict[Hashable, float] = {}
        for arm in members:
            weight = weights.get(arm, 1.0)
            if not arms[arm]:
                continue
            low, high = bounds[scales.get(arm, family)]
            for key, s in arms[arm]:
                norm = (s - low) / (high - low) if high > low else 1.0
                best[key] = max(best.get(key, 0.0), weight * norm)
        for key, value in best.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals
