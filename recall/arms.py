"""One search's arms, fused: full text over raw messages and summaries, and vectors.

``trove_grep``, ``trove_recall`` and ``trove_expand_query`` all search the
same way; this module runs the arms for them and hands back one fused list
plus every hit by key (``("m", store_id)`` / ``("n", node_id)``), the stage
notes and stages for ``explain``. ``placed`` then applies the slot rules of
``ranking.place_summaries``. The caller passes its tool context (``store``,
``dag``, ``semantic``) and the scopes it already checked.
"""

from __future__ import annotations

from typing import Any

from ..dag import Dag
from . import ranking, search, semantic
from .query_plan import QueryPlan


def search_arms(ctx: Any, plan: QueryPlan, limit: int, *,
                message_scope: search.MessageScope, summaries: search.SummaryCorpus | None,
                session_scope: search.MessageScope | None = None,
                choice: semantic.ModeChoice | None = None):
    """Ranked raw-message hits and summary hits (and vector hits), fused by score.

    ``session_scope`` adds an arm over this session's raw messages alone, so a
    search over every session still finds what a search of this one would.
    ``choice`` (``semantic.choose_mode``) adds the vector arms when it carries
    a query vector; in ``semantic`` mode only they rank.
    """
    messages = search.ranked_search(search.MessageCorpus(ctx.store, message_scope), plan, limit)
    arms = {"messages": [(("m", h.key), h.score) for h in messages.hits]}
    hits = {("m", h.key): h for h in messages.hits}
    notes, stages = list(messages.notes), {"messages": messages.stages}
    if session_scope is not None:
        own = search.ranked_search(search.MessageCorpus(ctx.store, session_scope), plan, limit)
        arms["session"] = [(("m", h.key), h.score) for h in own.hits]
        hits.update({("m", h.key): h for h in own.hits if ("m", h.key) not in hits})
        stages["session"] = own.stages
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
    if choice is not None and choice.vector is not None:
        own = search.MessageCorpus(ctx.store, session_scope) if session_scope else None
        found_arms, found_hits = semantic.vector_arms(
            ctx.semantic, choice.vector, search.MessageCorpus(ctx.store, message_scope),
            summaries, limit, own)
        for key, hit in found_hits.items():
            hits.setdefault(key, hit).parts["cosine"] = hit.parts["cosine"]
        if choice.mode == "semantic":
            arms = {}
        arms.update(found_arms)
    fused = ranking.fuse_arms(arms, families={arm: _family(arm) for arm in arms},
                              weights={arm: semantic.WEIGHTS[_method(arm)] for arm in arms})
    return [ranking.Fused(*f) for f in fused], hits, notes, stages


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
    return f"{_method(arm)}:{corpus}"
