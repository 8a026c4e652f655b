"""One search's arms, fused: full text over raw messages and summaries, and vectors.

``trove_grep``, ``trove_recall`` and ``trove_expand_query`` all search the
same way; this module runs the arms for them and hands back one fused list
plus every hit by key (``("m", store_id)`` / ``("n", node_id)``), the stage
notes and stages for ``explain``. ``placed`` then applies the slot rules of
``ranking.place_summaries``. The caller passes its tool context (``store``,
``dag``, ``semantic``) and the scopes it already checked.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..dag import Dag
from . import answer_type, callmemo, ranking, search, semantic
from ..storage import timekeys
from . import periods, query_plan
from .query_plan import QueryPlan

FULL_TEXT_DEPTH = 30          # full-text hits fused per arm at least, whatever the tool shows:
                              # the context arm can lift a reply ranked below the first page
                              # (real chats: grep full text R@5 0.225 -> 0.241; bench/README.md)
CONTEXT_TOP = 20              # hits whose neighbouring turns the context arm scores
CONTEXT_WEIGHT = 0.5          # that arm's weight beside the full-text arms' (0 = off)
VECTOR_CONTEXT = True         # the same for the vector arms' best hits
DATE_BOOST = 3.0              # a hit inside a date the question names scores (1 + this) times
DATE_SLACK = 86400.0          # ... a window widened by this much on each side
CLAUSE_WEIGHT = 0.5           # a question of several sentences: each one's own vector arm,
MAX_CLAUSES = 4               # ... sharing this much of the vector weight (0 = off)
INTERLEAVE = True             # ... and each sentence searched alone, its best hits dealt into
                              # the list in turn with the whole question's (see _interleave)
SESSION_ARMS = ("vector_session",)  # this session's vector arm, scaled on its own rows
                              # (ranking.fuse_arms' scales): other chats' near-paraphrases set
                              # the all-session cosine maximum and pushed this session's best
                              # vector hit under it, so trove_recall ranked it below where
                              # trove_grep does (real chats hybrid recall 0.352 -> 0.381, grep
                              # 0.389). The full-text session arm is not: scaled apart it took
                              # the two-session suite's other-session facts' slots (hit@1 0.81
                              # < 0.88, tests/test_recall_quality.py).
VECTOR_SPEAKER = 1.0          # a vector hit sent by a person the question names: cosine x (1 + this)
                              # (real chats asked by name, [Name] turns, grep/recall R@5: 0.1
                              # 0.399/0.401, 0.3 0.403/0.413, 0.6 0.411/0.417, 1.0 0.419/0.429,
                              # 2.0 0.425/0.443; 1.0 is about full text's own preference:
                              # the name counted as covered and SPEAKER_BONUS)
ASKING_TURN = 0.7             # a question's hit that itself only asks ("What did you make?") scores
                              # x this: it is the question again, not its answer (bench/README.md)
ANSWER_TYPE = 0.3             # a question that asks when / how many / where: a raw turn telling
                              # a time, number or place scores x (1 + this) (recall/answer_type.py,
                              # bench/README.md; 0 = off)
LEXICAL_POWER = 1.0           # hybrid: the full-text arms' weight times (the best coverage of
                              # the question among the top 5 full-text hits) ** this: when no
                              # turn holds most of the question's words, the vectors decide
                              # more (real chats: grep hybrid plain 0.389 -> 0.407, open-domain
                              # 0.194 -> 0.236; `[Name] text` 0.354 -> 0.375; 0 = off)
LEXICAL_EXEMPT = ("session",) # ... except trove_recall's this-session full-text arm, whose
                              # coverage sets the factor: shrunk too, it let other chats'
                              # vector near-paraphrases take this session's slots (recall
                              # plain 0.377 with it, 0.381 without)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def search_arms(ctx: Any, plan: QueryPlan, limit: int, *,
                message_scope: search.MessageScope, summaries: search.SummaryCorpus | None,
                session_scope: search.MessageScope | None = None,
                choice: semantic.ModeChoice | None = None, _alone: bool = False):
    """Ranked raw-message hits and summary hits (and vector hits), fused by score.

    ``session_scope`` adds an arm over this session's raw messages alone, so a
    search over every session still finds what a search of this one would.
    ``choice`` (``semantic.choose_mode``) adds the vector arms when it carries
    a query vector; in ``semantic`` mode only they rank.
    """
    vectors = choice is not None and choice.vector is not None
    dated = _dated(ctx, plan) if DATE_BOOST > 0 else None
    if dated is not None:
        window, plan = dated
    depth = max(limit, FULL_TEXT_DEPTH)
    messages = _full_text(ctx, message_scope, plan, depth, limit)
    arms = {"messages": [(("m", h.key), h.score) for h in messages.hits]}
    hits = {("m", h.key): h for h in messages.hits}
    notes, stages = list(messages.notes), {"messages": messages.stages}
    if messages.roles:      # who plain turns are, read from how they address each other
        stages["speakers"] = {role: sorted(names) for role, names in messages.roles.items()}
    if session_scope is not None:
        own = _full_text(ctx, session_scope, plan, depth, limit)
        arms["session"] = [(("m", h.key), h.score) for h in own.hits]
        hits.update({("m", h.key): h for h in own.hits if ("m", h.key) not in hits})
        stages["session"] = own.stages
    if CONTEXT_WEIGHT > 0:
        # the turns around the best hits (this session's best too, so recall sees
        # what grep sees)
        sources = messages.hits[:CONTEXT_TOP] + (own.hits[:CONTEXT_TOP] if session_scope else [])
        around = search.context_hits(search.MessageCorpus(ctx.store, message_scope),
                                     sorted(sources, key=lambda h: -h.score), 2 * CONTEXT_TOP)
        if not vectors:     # full text lists only what matches: context re-ranks it
            around = [h for h in around if ("m", h.key) in hits]
        arms["context"] = [(("m", h.key), h.score) for h in around]
        hits.update({("m", h.key): h for h in around if ("m", h.key) not in hits})
    if summaries is not None:
        found = search.ranked_search(summaries, plan, limit)
        # a summary and its own child both matching say much the same: list the better
        # scored of the two (the child on a tie: it is more precise). Folded overviews
        # nest, so a chain of them would otherwise fill every slot.
        score = {h.key: h.score for h in found.hits}
        weaker = {child if score[parent] > score[child] else parent
                  for parent, child in ctx.dag.edges_among(score)}
        kept = [h for h in found.hits if h.key not in weaker]
        arms["summaries"] = [(("n", h.key), h.score) for h in kept]
        hits.update({("n", h.key): h for h in kept})
        notes += [n for n in found.notes if n not in notes]
        stages["summaries"] = found.stages
    if vectors:
        people = messages.people | (own.people if session_scope is not None else frozenset())
        names = _people_named(plan, people, messages.absent)
        if names:
            text = _vector_text(plan.text, names)
            stages["vector_query"] = {"text": text, "left_out": sorted(names)}
            vector = ctx.semantic.query_vector(text)
            if vector is not None:
                choice = dataclasses.replace(choice, vector=vector)
        own_corpus = search.MessageCorpus(ctx.store, session_scope) if session_scope else None
        found_arms, found_hits = semantic.vector_arms(
            ctx.semantic, choice.vector, search.MessageCorpus(ctx.store, message_scope),
            summaries, limit, own_corpus)
        clauses = _clauses(plan.text) if CLAUSE_WEIGHT > 0 else []
        for index, clause in enumerate(clauses):
            vector = ctx.semantic.query_vector(_vector_text(clause, names))
            if vector is None:
                continue
            more_arms, more_hits = semantic.vector_arms(
                ctx.semantic, vector, search.MessageCorpus(ctx.store, message_scope), None, limit)
            found_arms[f"vector_clause{index}"] = more_arms["vector_messages"]
            for key, hit in more_hits.items():
                found_hits.setdefault(key, hit)
        if names and VECTOR_SPEAKER > 0:
            roles = {**messages.roles, **(own.roles if session_scope is not None else {})}
            for arm, listed in found_arms.items():
                found_arms[arm] = _by_speaker(listed, found_hits, names, roles)
        for key, hit in found_hits.items():
            hits.setdefault(key, hit).parts["cosine"] = hit.parts["cosine"]
        if choice.mode == "semantic":
            arms = {}
        arms.update(found_arms)
        if CONTEXT_WEIGHT > 0 and VECTOR_CONTEXT:
            best = sorted((found_hits[k] for arm in ("vector_messages", "vector_session")
                           for k, _ in found_arms.get(arm, [])), key=lambda h: -h.score)
            around = search.context_hits(search.MessageCorpus(ctx.store, message_scope),
                                         best, 2 * CONTEXT_TOP)
            arms["vector_context"] = [(("m", h.key), h.score) for h in around]
            hits.update({("m", h.key): h for h in around if ("m", h.key) not in hits})
    weights = {arm: semantic.WEIGHTS[_method(arm)] for arm in arms}
    for arm in ("context", "vector_context"):
        if arm in arms:
            weights[arm] *= CONTEXT_WEIGHT
    if vectors and LEXICAL_POWER > 0:
        factor = _lexical_confidence(own.hits if session_scope is not None else messages.hits)
        for arm in weights:
            if _method(arm) == "full_text" and arm not in LEXICAL_EXEMPT:
                weights[arm] *= factor
    clause_arms = [arm for arm in arms if arm.startswith("vector_clause")]
    for arm in clause_arms:
        weights[arm] *= CLAUSE_WEIGHT / len(clause_arms)
    fused = ranking.fuse_arms(arms, families={arm: _family(arm) for arm in arms},
                              weights=weights, scales={arm: f"{_family(arm)}:own"
                                                       for arm in arms if arm in SESSION_ARMS})
    if dated is not None:
        start, end = window.start - DATE_SLACK, window.end + DATE_SLACK
        inside = {key for key, hit in hits.items() if _overlaps(hit.row, start, end)}
        fused = _scaled(fused, 1 + DATE_BOOST, lambda k: k in inside)
        notes.append(f"read {window.label!r} in the query as a preference for that time "
                     f"(pass period to filter by it)")
    if ASKING_TURN != 1.0 and plan.text.rstrip().endswith("?"):
        fused = _scaled(fused, ASKING_TURN, lambda k: k[0] == "m" and _only_asks(hits[k].text))
    kinds = answer_type.expected(plan.text) if ANSWER_TYPE else frozenset()
    if kinds:
        fused = _scaled(fused, 1 + ANSWER_TYPE, lambda k: k[0] == "m" and any(
            answer_type.holds(kind, hits[k].text) for kind in kinds))
    result = [ranking.Fused(*f) for f in fused]
    if INTERLEAVE and not _alone:
        result = _interleave(ctx, plan, limit, result, hits, message_scope=message_scope,
                             summaries=summaries, session_scope=session_scope, choice=choice)
    return result, hits, notes, stages


def _full_text(ctx: Any, scope: search.MessageScope, plan: QueryPlan, depth: int,
               limit: int) -> search.SearchOutcome:
    """The full-text search of raw messages in ``scope``, done once per tool call
    (``callmemo``): trove_recall's session arm and the grep list it orders this
    session by are the same search."""
    key = ("full_text", id(ctx.store), dataclasses.astuple(scope), plan, depth, limit)
    return callmemo.kept(key, lambda: search.ranked_search(
        search.MessageCorpus(ctx.store, scope), plan, depth, scored=limit))


def _interleave(ctx: Any, plan: QueryPlan, limit: int, fused: list, hits: dict, **scopes) -> list:
    """A question of several sentences ("Where did she go? Also, what did she buy?"):
    each sentence searched on its own, and the lists dealt in turn (the whole
    question's first, then each sentence's first, then the seconds, ...).

    Why: every sentence is answered by a different turn. Fused by weight, one
    sentence's strong hits (or the whole question's blend) fill the first page and the
    other sentence's answer falls below it (real chats: asked alone, each sentence
    finds 23 of its 94 replies in its top 5, the fused question 14; bench/README.md).
    Dealing in turn gives every sentence a slot near the top. The dealt keys take the
    whole list's scores in order, so a caller that rescales scores (trove_recall's
    session preference) keeps their scale.
    """
    clauses = _clauses(plan.text)
    if not clauses:
        return fused
    lists = [[f.key for f in fused]]
    by_key = {f.key: f for f in fused}
    for clause in clauses:
        choice = scopes["choice"]
        if choice is not None and choice.vector is not None:
            vector = ctx.semantic.query_vector(clause)
            choice = dataclasses.replace(choice, vector=vector) if vector is not None else None
        found, more, _, _ = search_arms(ctx, query_plan.parse_query(clause), limit,
                                        **{**scopes, "choice": choice}, _alone=True)
        for key, hit in more.items():
            hits.setdefault(key, hit)
        for f in found:
            by_key.setdefault(f.key, f)
        lists.append([f.key for f in found])
    order: list = []
    seen: set = set()
    for rank in range(max(len(keys) for keys in lists)):
        for keys in lists:
            if rank < len(keys) and keys[rank] not in seen:
                seen.add(keys[rank])
                order.append(keys[rank])
    scores = sorted((f.score for f in by_key.values()), reverse=True)
    return [ranking.Fused(key, score, by_key[key].ranks) for key, score in zip(order, scores)]


def _people_named(plan: QueryPlan, people: frozenset[str],
                  absent: frozenset[str] = frozenset()) -> set[str]:
    """The people the question names, to leave out of the vector arms' text: the
    words it writes capitalized (``ranking.proper_names``) that full text knows as
    a sender (``SearchOutcome.people``: a ``[Name]``, a ``name`` field, a role the
    other addresses by it), and the capitalized words no row of the scope holds
    (``absent``) that the question asks about as its actor or owner ("did
    Caroline go", "Caroline's dog": ``ranking.subject_names``), as plain turns
    of people who never write each other's names.

    Why: see ``ranking``'s module docstring. A place or a title ("Halloween",
    "Harry Potter", "go back to Korea") stays in: it is what the question is about."""
    def keys(words: set[str], among: frozenset[str]) -> set[str]:
        return {word for word in words for concept in plan.concepts
                if concept.key in among and word in concept.variants}
    return keys(ranking.proper_names(plan.text), people) | keys(
        ranking.subject_names(plan.text), absent)


def _by_speaker(listed: list, found_hits: dict, names: set[str],
                roles: dict[str, frozenset[str]]) -> list:
    """A vector arm's ``(key, cosine)`` list with the turns sent by a person the
    question names scored ``1 + VECTOR_SPEAKER`` times, best first.

    Why: the vector arms embed the question without its people (``_people_named``),
    so they no longer know who; full text gives the sender's turns its speaker
    bonus, and this is the same preference on the vector side (real chats asked by
    name, ``[Name] text``: hybrid 0.368 -> 0.403 R@5, bench/README.md)."""
    def spoken(key) -> bool:
        hit = found_hits.get(key)
        if hit is None:
            return False
        name, _ = ranking.speaker_of(hit.row, hit.text)
        return bool(names & search.sender_names(hit.row, name, roles))
    boost = 1.0 + VECTOR_SPEAKER
    return sorted(((key, cos * boost if spoken(key) else cos) for key, cos in listed),
                  key=lambda kc: -kc[1])


def _vector_text(text: str, names: set[str]) -> str:
    """The text a vector arm embeds: ``text`` without ``names``, unless nothing
    searchable would be left ("Caroline?" stays as it is)."""
    if not names:
        return text
    stripped = ranking.without_names(text, names)
    return stripped if query_plan.parse_query(stripped).concepts else text


def _scaled(fused: list, factor: float, applies) -> list:
    """``(key, score, reasons)`` with the score of every key ``applies`` accepts
    multiplied by ``factor``, best first again (a stable sort: ties keep their order).
    Why: the date, asking-turn and answer-type preferences act after fusion alike."""
    return sorted(((k, s * factor if applies(k) else s, r) for k, s, r in fused),
                  key=lambda f: -f[1])


def _only_asks(text: str) -> bool:
    """Every sentence of ``text`` is a question ("Any trail near Moab you'd recommend?").

    Why: asked a question, full text and the vectors both rank highest the turns that
    ask the same thing, which in a conversation is the partner asking it, not the
    answer; the context arm already lifts the turn after such a match, so the asking
    turn itself scores less (``ASKING_TURN``). A turn that also tells something
    ("We went to Moab. Any trail you'd recommend?") is not only asking."""
    parts = [p for p in _SENTENCE.split(text.strip()) if p.strip()]
    return bool(parts) and all(p.rstrip().endswith("?") for p in parts)


def _lexical_confidence(found: list) -> float:
    """How far full text can be trusted for this question: the best share of the
    question's words (``coverage``) among the first five full-text hits, raised to
    ``LEXICAL_POWER``.

    Why: a question whose answer shares its words ("which pottery class did she
    take?") is found by full text; one whose answer does not ("what does she do for
    fun?") draws full-text hits that hold one common word of it, and those crowd
    out the vector arms' better guesses when both weigh the same.
    """
    best = max((h.parts.get("coverage", 0.0) for h in found[:5]), default=0.0)
    return best ** LEXICAL_POWER


def _clauses(text: str) -> list[str]:
    """The sentences of a question that asks several things ("Where did she go? Also,
    what did she buy?"), each with two words or more; none for a one-sentence query."""
    found = [c for c in _SENTENCE.split(text.strip())
             if len(query_plan.parse_query(c).concepts) >= 2]
    return found[:MAX_CLAUSES] if len(found) >= 2 else []


def _dated(ctx: Any, plan: QueryPlan):
    """``(window, plan without the date phrase)`` when the query names a date."""
    try:
        found = periods.mentioned(plan.text, ctx.now(), timekeys.zone_or_utc(ctx.config.timezone))
    except (OSError, OverflowError, ValueError):
        return None
    if found is None:
        return None
    rest = query_plan.parse_query(found[1])
    return found[0], (rest if not rest.empty else plan)


def _overlaps(row: dict, start: float, end: float) -> bool:
    """A message's time, or a summary's span, meets ``[start, end)``."""
    first = row.get("time_from") if "time_from" in row else None
    last = row.get("time_to") if "time_to" in row else None
    if first is None:
        first = last = row.get("message_at") if row.get("message_at") is not None \
            else row.get("created_at")
    return first is not None and first < end and (last or first) >= start


def placed(dag: Dag, fused: list, hits: dict, limit: int) -> list:
    """Raw evidence first: a summary keeps its slot only when it adds (ranking)."""
    by_key = {f.key: f for f in fused}
    matched = {key: hit.parts["matched"] for key, hit in hits.items()}
    texts = {key: hit.text for key, hit in hits.items()}
    return [by_key[k] for k in ranking.place_summaries(list(by_key), matched, limit, dag, texts)]


def _method(arm: str) -> str:
    """``vector`` or ``full_text``: which weight of ``semantic.WEIGHTS`` an arm gets."""
    return "vector" if arm.startswith("vector") else "full_text"


def _family(arm: str) -> str:
    """Arms normalised together: one method over one corpus. A summary's BM25 is
    several times a turn's (it holds many turns' words), so raw and summary arms are
    scaled apart; otherwise the summaries' maximum squashes every turn's full-text
    score below the vector arm's (measured: bench/README.md)."""
    corpus = "summaries" if arm.endswith("summaries") else "messages"
    if arm.endswith("context"):
        corpus = "context"           # added to a turn's own score, not a rival for its maximum
    if arm.startswith("vector_clause"):
        corpus = arm                 # each sentence's best counts beside the whole question's
    return f"{_method(arm)}:{corpus}"
