"""Search: staged retrieval over FTS5, ranking, snippets and fusion.

Agents ask questions ("what did we decide about the retry backoff?"), not
keyword lists. A strict AND of those words finds nothing and a ranked OR of
all of them is slow on a big store, so a query is handled like a search
engine would:

1. ``query_plan.parse_query`` turns the text into concepts, identifiers,
   phrases, exclusions and substring needles, each already safe FTS5.
2. ``ranked_search`` narrows before it ranks: exact identifier/phrase queries
   and the AND of all strong concepts first; only when those give too few
   hits does it collect capped, newest-first candidates per concept and the
   ANDs of the rarest concept pairs. The scope (session, role, source tags)
   is part of every FTS expression, so FTS5 intersects posting lists instead
   of filtering afterwards (except for a session holding most of the store:
   see ``MessageCorpus``). Every FTS5 query is *unranked* (``ORDER BY rowid
   DESC LIMIT n``, under a millisecond at 1M rows): FTS5's own bm25 first
   counts the documents of every phrase in the query, which for a session
   tag or a common word means reading its whole posting list on every query.
3. Candidates are scored in Python: BM25 over the concepts (document
   frequencies from capped counts), scaled by coverage (the weighted share of
   the query's concepts present), with bonuses for adjacent query words found
   as a phrase and for an identifier found exactly as written.

Fusing arms (messages, summaries, vectors) and choosing which rows take the
result slots is ``ranking``'s job.

This module never formats tool output and holds no SQL: corpora reach the
database through ``Store``/``Dag`` methods.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

from ..storage import codec
from ..dag import Dag
from . import ranking
from .query_plan import (
    Concept,
    QueryPlan,
    any_of,
    concept_expr,
    fold,
    fold_tokens,
    fts_tokens,
    identifier_expr,
    quote,
    scope_split,
    scoped,
    tag_scope,
)
from ..store import Store, decode_row

STAGE_CAP = 100               # newest matches kept from each precise stage
CONCEPT_CAP = 200             # newest-first candidates collected per concept
DF_CAP = 5000                 # document frequencies are counted up to this many
MIN_CANDIDATES = 20           # fewer precise candidates than this widens the search
PAIR_CONCEPTS = 4             # the rarest this-many concepts are paired in stage 4
SCORE_MAX_CHARS = 100_000     # a candidate's text is scored on its first this-many chars
RESCORE_MIN = 40              # at least this many pre-ranked candidates are fully scored
SUBSTRING_MAX_ROWS = 20_000   # rows the substring fallback may scan
DENSE_SHARE = 0.5             # sessions holding this share of the newest rows: filter after matching
SHARE_WINDOW = 5000           # newest store_ids the session share is measured on
SNIPPET_CHARS = 200
SNIPPET_MARKS = 100           # places of one query word looked at when placing a snippet
BM25_K1 = 1.2
BM25_B = 0.75

# ---------------------------------------------------------------- scoring
@dataclass
class Candidate:
    """One retrieved row on its way to a score."""

    key: int
    row: dict
    text: str
    known: set[str] = field(default_factory=set)   # concept keys FTS already proved present
    speaker: frozenset[str] = frozenset()          # tokens of the sender's name (ranking.speaker_of)


@dataclass
class Hit:
    """A scored result: the row, its score and (for explain) the score's parts."""

    key: int
    row: dict
    text: str
    score: float
    parts: dict


def _term_pattern(alternatives: Iterable[str]) -> re.Pattern:
    """A regex finding any of the words as whole words (used for snippets only)."""
    body = "|".join(re.escape(a) for a in sorted(set(alternatives), key=len, reverse=True))
    return re.compile(rf"(?<![^\W_])(?:{body})(?![^\W_])")


def _phrase_pattern(positions: Sequence[str | Sequence[str]]) -> re.Pattern:
    """Tokens in a row, separated only by non-word characters, as FTS5 phrases match;
    a position may list alternatives (a word and its plural). Used for snippets."""
    def alternatives(position):
        options = [position] if isinstance(position, str) else list(position)
        return "(?:" + "|".join(re.escape(o) for o in sorted(options, key=len, reverse=True)) + ")"
    body = r"[\W_]+".join(alternatives(p) for p in positions)
    return re.compile(rf"(?<![^\W_]){body}(?![^\W_])")


class _Tokens:
    """A text as FTS5 sees it: its tokens, how often each wanted word occurs and a
    joined form for phrases (only the query's words are counted: cheaper)."""

    def __init__(self, text: str, wanted: frozenset[str]):
        self.folded = fold(text[:SCORE_MAX_CHARS])
        self.tokens = fold_tokens(self.folded)
        self.counts = Counter([t for t in self.tokens if t in wanted])
        self._joined: str | None = None

    def has_phrase(self, tokens: Sequence[str]) -> bool:
        """True when the tokens occur in a row (an FTS5 phrase match)."""
        if self._joined is None:
            self._joined = " " + " ".join(self.tokens) + " "
        return (" " + " ".join(tokens) + " ") in self._joined


class Scorer:
    """Scores texts against one plan: BM25 x coverage + phrase and identifier bonuses.

    Texts are tokenized once (one C-level regex pass) and everything is read
    from the token counts, so scoring a candidate costs about one pass over it.
    """

    PHRASE_BONUS = 0.25       # per adjacent pair of query words found as a phrase
    IDENTIFIER_BONUS = 1.0    # an identifier found exactly as written
    QUOTED_BONUS = 1.0        # a quoted phrase found

    def __init__(self, plan: QueryPlan, doc_freq: dict[str, int], total_docs: int):
        self.plan = plan
        self.idf = {c.key: _idf(doc_freq.get(c.key, 1), total_docs) for c in plan.concepts}
        self.weight_total = sum(c.weight for c in plan.concepts) or 1.0
        strong = [c for c in plan.concepts if c.weight == 1.0]
        self.pairs = list(zip(strong, strong[1:]))
        self.people: frozenset[str] = frozenset()   # concepts naming a sender (see _score_all)
        self.needles = [n.lower() for n in plan.needles]
        self.wanted = frozenset(v for c in plan.concepts for v in c.variants)

    def prescore(self, known: set[str]) -> float:
        """Cheap score from what FTS already proved (no text needed): the idf mass covered."""
        return sum(c.weight * self.idf[c.key] for c in self.plan.concepts if c.key in known)

    def score(self, cand: Candidate, seen: "_Tokens", avg_terms: float) -> Hit:
        """One candidate's score and its parts (for ``explain``); ``seen`` is its text
        tokenized, ``avg_terms`` the mean token count of the candidates (BM25's avgdl)."""
        norm = BM25_K1 * (1 - BM25_B + BM25_B * max(1, len(seen.tokens)) / max(avg_terms, 1.0))
        bm25, covered, matched, spoke = 0.0, 0.0, [], False
        for concept in self.plan.concepts:
            tf = sum(seen.counts.get(v, 0) for v in concept.variants)
            weight = concept.weight
            if any(v in cand.speaker for v in concept.variants):
                spoke, tf = True, max(tf, 1)   # the sender's name: a field of its own
            elif tf == 0 and concept.key in cand.known:
                tf = 1
            elif concept.key in self.people:
                weight *= ranking.MENTION_WEIGHT   # a person named, not speaking
            if tf:
                matched.append(concept.key)
                covered += weight
                bm25 += weight * self.idf[concept.key] * tf * (BM25_K1 + 1) / (tf + norm)
        coverage = covered / self.weight_total if self.plan.concepts else 0.0
        if self.needles:
            lowered = cand.text[:SCORE_MAX_CHARS].lower()
            found = sum(1 for n in self.needles if n in lowered)
            coverage = max(coverage, found / len(self.needles))
            bm25 += 2.0 * found
        phrase = self.PHRASE_BONUS * sum(
            1 for first, second in self.pairs
            if not {first.key, second.key} & self.people
            and _adjacent(seen, first.variants, second.variants))
        ident = self.IDENTIFIER_BONUS * sum(1 for i in self.plan.identifiers
                                            if _exact_identifier(seen.folded, fold(i.raw)))
        quoted = self.QUOTED_BONUS * sum(1 for p in self.plan.phrases if seen.has_phrase(p))
        speaker = ranking.SPEAKER_BONUS if spoke else 0.0
        total = bm25 * coverage * (1.0 + phrase + ident + quoted + speaker)
        parts = {"bm25": round(bm25, 4), "coverage": round(coverage, 3),
                 "phrase_bonus": phrase, "identifier_bonus": ident, "quoted_bonus": quoted,
                 "speaker_bonus": speaker, "matched": matched}
        return Hit(cand.key, cand.row, cand.text, total, parts)


def _adjacent(seen: "_Tokens", first: Sequence[str], second: Sequence[str]) -> bool:
    """True when some form of ``first`` is directly followed by some form of ``second``
    (only forms present in the text are tried as phrases)."""
    counts = seen.counts
    lefts = [a for a in first if a in counts]
    if not lefts:
        return False
    rights = [b for b in second if b in counts]
    return any(seen.has_phrase((a, b)) for a in lefts for b in rights)


def _exact_identifier(folded_text: str, ident: str) -> bool:
    """True when the identifier occurs as written, not inside a longer word."""
    at = folded_text.find(ident)
    while at >= 0:
        before = folded_text[at - 1] if at else " "
        after_at = at + len(ident)
        after = folded_text[after_at] if after_at < len(folded_text) else " "
        if not (before.isalnum() or after.isalnum()):
            return True
        at = folded_text.find(ident, at + 1)
    return False


def _idf(doc_freq: int, total_docs: int) -> float:
    total = max(total_docs, doc_freq, 1)
    return math.log(1.0 + (total - doc_freq + 0.5) / (doc_freq + 0.5))


# ---------------------------------------------------------------- corpora
class Corpus(Protocol):
    """What ``ranked_search`` needs from a searchable table (raw messages or summaries)."""

    def match(self, expr: str, *, limit: int) -> list[int]:
        """Row ids matching a scoped FTS expression, newest first (unranked)."""

    def scope_expr(self) -> str | None:
        """The tags part every expression on this corpus carries."""

    def count(self, expr: str, *, cap: int) -> int:
        """How many rows match (counting stops at ``cap``)."""

    def load(self, keys: Sequence[int]) -> dict[int, tuple[dict, str]]:
        """Rows and their searchable text, dropping rows outside the scope."""

    def substring(self, needles: Sequence[str], *, limit: int) -> list[int]:
        """Bounded, scoped substring scan for text FTS5 cannot tokenize."""

    def total_docs(self) -> int:
        """About how many rows the corpus holds (for idf)."""


@dataclass
class MessageScope:
    """Which raw messages a search may return."""

    session_ids: tuple[str, ...] | None            # None = every session
    role: str | None = None
    source: str | None = None
    time_from: float | None = None
    time_to: float | None = None
    current_session: str | None = None
    current_turn_store_id: int | None = None       # rows of current_session at/after it are hidden


class MessageCorpus:
    """Raw messages of a scope, searched through ``Store`` (implements ``Corpus``).

    A session scope is normally a tag inside every FTS expression. When the
    sessions hold most of the store (the live session usually does), that tag's
    posting list is nearly the whole index and intersecting it costs more than
    the query itself; such a *dense* scope is applied after matching instead:
    the newest matches are read with their ``messages.session_id`` and kept
    only when in scope, falling back to the tagged expression when a bounded
    scan does not find enough. Either way the rows are exactly the newest
    in-scope matches.

    Document frequencies of a dense scope are those of the whole store, like
    ``total_docs``: global statistics, as search engines use for a filtered
    query. Counting inside the scope exactly costs an intersection with the
    other sessions' tags (10-20 ms a question at 1M rows) and moves an idf by a
    few percent at most, since the scope holds most rows.

    A scope of more than ``query_plan.TAG_SESSIONS`` sessions (an owner's, with a cron job's
    run a session) is never written as tags: an OR of thousands of tags is slow to
    parse and merge, and on PostgreSQL binds a parameter per tag. Its matches are
    joined to their rows and filtered by ``session_filter`` (the owner as a
    subquery) in the same statement; its document frequencies are global, as a
    dense scope's.
    """

    def __init__(self, store: Store, scope: MessageScope):
        self.store = store
        self.scope = scope
        only_current = scope.session_ids == (scope.current_session,)
        self.below = scope.current_turn_store_id if only_current else None
        self.share = 1.0
        self.dense = False
        self.joined = scope_split(scope.session_ids)[1] is not None
        if scope.session_ids:
            self.share = store.recent_share(scope.session_ids, SHARE_WINDOW)
            self.dense = self.share >= DENSE_SHARE

    def scope_expr(self) -> str | None:
        sessions = None if self.dense or self.joined else self.scope.session_ids
        return tag_scope(sessions, role=self.scope.role, source=self.scope.source)

    def _tagged(self, expr: str) -> str:
        """A dense-scope expression with the session tags put back in."""
        return f"{tag_scope(self.scope.session_ids)} AND ({expr})"

    def count(self, expr, *, cap):
        return self.store.count_message_matches(expr, cap=cap, below_store_id=self.below)

    def match(self, expr, *, limit):
        s = self.scope
        if self.dense:
            scan = math.ceil(limit / self.share) + 20
            rows = self.store.match_message_sessions(
                expr, limit=scan, below_store_id=self.below,
                time_from=s.time_from, time_to=s.time_to)
            keys = [k for k, session in rows if session in s.session_ids]
            if len(keys) >= limit or len(rows) < scan:
                return keys[:limit]
            if not self.joined:
                expr = self._tagged(expr)
        return [r[0] for r in self.store.match_message_ids(
            expr, limit=limit, ranked=False, below_store_id=self.below,
            time_from=s.time_from, time_to=s.time_to,
            sessions=s.session_ids if self.joined else None)]

    def _visible(self, row: dict) -> bool:
        s = self.scope
        if s.session_ids is not None and row["session_id"] not in s.session_ids:
            return False
        if s.role and row["role"] != s.role:
            return False
        if s.source and row["source"] != s.source:
            return False
        when = row["message_at"] if row["message_at"] is not None else row["created_at"]
        if (s.time_from is not None and when < s.time_from) or (
                s.time_to is not None and when >= s.time_to):
            return False
        return not (s.current_turn_store_id is not None and row["session_id"] == s.current_session
                    and row["store_id"] >= s.current_turn_store_id)

    def load(self, keys):
        rows = self.store.get_messages(keys)
        return {k: (r, codec.message_text(decode_row(r))) for k, r in rows.items()
                if self._visible(r)}

    def neighbours(self, keys: Sequence[int]) -> dict[int, tuple]:
        """The turns before and after each key in its session (``Store.neighbour_ids``)."""
        return self.store.neighbour_ids(keys)

    def speaking_rows(self, body: str, limit: int) -> list[tuple[str, str]]:
        """``(role, text)`` of the newest user/assistant rows in scope matching ``body``
        (to read who a name in plain turns is: ``ranking.addressed_roles``)."""
        loaded = self.load(self.match(scoped(body, self.scope_expr()), limit=limit))
        return [(row["role"], text) for row, text in loaded.values()
                if row["role"] in ranking.ROLES]

    def substring(self, needles, *, limit):
        return self.store.substring_scan(self.scope.session_ids, needles, limit=limit + 8,
                                         max_rows=SUBSTRING_MAX_ROWS)

    def total_docs(self) -> int:
        return max(1, self.store.last_store_id())


class SummaryCorpus:
    """Summary nodes of some sessions (all when ``session_ids`` is None), optionally
    limited by an acceptance test; searched through ``Dag`` (implements ``Corpus``)."""

    def __init__(self, dag: Dag, session_ids: Sequence[str] | None,
                 accept: Callable[[dict], bool] | None = None):
        self.dag = dag
        self.session_ids = None if session_ids is None else (
            session_ids if isinstance(session_ids, tuple) else tuple(session_ids))
        self.accept = accept
        self.joined = scope_split(self.session_ids)[1] is not None

    def scope_expr(self) -> str | None:
        return None if self.joined else tag_scope(self.session_ids)

    def count(self, expr, *, cap):
        return self.dag.count_node_matches(expr, cap=cap)

    def match(self, expr, *, limit):
        return [r[0] for r in self.dag.match_node_ids(
            expr, limit=limit, ranked=False, sessions=self.session_ids if self.joined else None)]

    def load(self, keys):
        nodes = self.dag.get_nodes(keys)
        return {k: (n, n["text"]) for k, n in nodes.items()
                if self.accept is None or self.accept(n)}

    def substring(self, needles, *, limit):
        return self.dag.substring_scan(self.session_ids, needles, limit=limit,
                                       max_rows=SUBSTRING_MAX_ROWS)

    def total_docs(self) -> int:
        return max(1, self.dag.last_node_id())


# ---------------------------------------------------------------- retrieval
@dataclass
class SearchOutcome:
    """Ranked hits of one corpus, plus notes on how they were found."""

    hits: list[Hit]
    stages: list[str]
    notes: list[str] = field(default_factory=list)
    people: frozenset[str] = frozenset()   # concept keys naming a sender of the candidates
    absent: frozenset[str] = frozenset()   # concept keys no row of the corpus holds
    roles: dict[str, frozenset[str]] = field(default_factory=dict)   # plain role -> its names


class _Collector:
    """Gathers candidate ids from the retrieval stages, remembering what each one proved."""

    def __init__(self) -> None:
        self.known: dict[int, set[str]] = {}
        self.stages: list[str] = []

    def add(self, stage: str, keys: Sequence[int], proves: Iterable[str] = ()) -> None:
        """Record one stage's rows and the concepts its FTS expression proved present."""
        proved = set(proves)
        for key in keys:
            self.known.setdefault(key, set()).update(proved)
        self.stages.append(f"{stage}:{len(keys)}")

    def __len__(self) -> int:
        return len(self.known)


def ranked_search(corpus: Corpus, plan: QueryPlan, limit: int,
                  scored: int | None = None) -> SearchOutcome:
    """Retrieve candidates in stages (narrow first) and rank them; see the module docstring.

    ``scored`` bounds how many pre-ranked candidates are read and fully scored (default:
    ``limit``'s share, see ``_score_all``): a caller that fuses a deeper list than it
    shows keeps the cost of the page it shows."""
    if plan.empty:
        return SearchOutcome([], [], ["the query has no searchable words"])
    found = _Collector()
    notes: list[str] = []
    retrieval = _Retrieval(corpus, plan, found)
    doc_freq = retrieval.run(limit, with_phrases=True)
    if plan.phrases and not len(found) and plan.concepts:
        notes.append("no hit contains the quoted phrase exactly; showing partial matches")
        doc_freq = retrieval.run(limit, with_phrases=False)
    if plan.needles:
        keys = corpus.substring(list(plan.needles), limit=max(limit * 2, 20))
        found.add("substring", keys)
    hits, people, roles = _score_all(corpus, plan, found, doc_freq,
                                     limit if scored is None else scored)
    absent = frozenset(key for key, count in doc_freq.items() if not count)
    return SearchOutcome(hits[:limit], found.stages, notes, people, absent, roles)


class _Retrieval:
    """The candidate stages of one search, cheapest and most precise first.

    1. document frequency of each concept, counted up to ``DF_CAP`` (a count
       of ``DF_CAP`` means "common": at least that many);
    2. identifiers and quoted phrases;
    3. the AND of all strong concepts;
    4. only when that is not enough: each concept's newest ``CONCEPT_CAP``
       matches (complete for rare concepts) and the AND of every pair among the
       rarest concepts, so a hit with two of five words is found without a
       ranked OR over every row that has any of them.

    Each stage keeps its newest matches (``STAGE_CAP``); ranking happens in
    ``Scorer`` on the union.
    """

    def __init__(self, corpus: Corpus, plan: QueryPlan, found: _Collector):
        self.corpus = corpus
        self.plan = plan
        self.found = found
        self.scope = corpus.scope_expr()
        self.required = ""

    def expr(self, body: str) -> str:
        """A body expression with the required phrases, the scope and the exclusions."""
        full = f"{self.required} AND {body}" if self.required and body else (self.required or body)
        return scoped(full, self.scope, self.plan.excluded)

    def fetch(self, stage: str, body: str, *, cap: int = STAGE_CAP, proves=()) -> list:
        """Run one stage and hand its rows to the collector."""
        rows = self.corpus.match(self.expr(body), limit=cap)
        self.found.add(stage, rows, proves)
        return rows

    def run(self, limit: int, *, with_phrases: bool) -> dict[str, int]:
        """All stages; returns the estimated document frequency of each concept."""
        plan = self.plan
        self.required = " AND ".join(quote(p) for p in plan.phrases) if with_phrases else ""
        doc_freq = {c.key: self.corpus.count(self.expr(concept_expr(c)), cap=DF_CAP)
                    for c in plan.concepts}
        for ident in plan.identifiers:
            self.fetch("identifier", identifier_expr(ident))
        if not plan.concepts:
            if self.required:
                self.fetch("phrase", "")
            return doc_freq
        strong = [c for c in plan.concepts if c.weight == 1.0] or list(plan.concepts)
        if min(doc_freq[c.key] for c in strong):
            self.fetch("all_terms", " AND ".join(concept_expr(c) for c in strong),
                       proves=[c.key for c in strong])
        if len(self.found) < max(limit, MIN_CANDIDATES) and len(plan.concepts) > 1:
            self.widen(doc_freq)
        return doc_freq

    def widen(self, doc_freq: dict[str, int]) -> None:
        """Stage 4: per-concept newest matches and the ANDs of the rarest pairs."""
        by_rarity = sorted((c for c in self.plan.concepts if doc_freq[c.key]),
                           key=lambda c: (doc_freq[c.key], -c.weight))
        for concept in by_rarity:
            self.fetch(f"term:{concept.key}", concept_expr(concept), cap=CONCEPT_CAP,
                       proves=[concept.key])
        pool = [c for c in by_rarity if c.weight == 1.0][:PAIR_CONCEPTS]
        for i, first in enumerate(pool):
            for second in pool[i + 1:]:
                if max(doc_freq[first.key], doc_freq[second.key]) <= CONCEPT_CAP:
                    continue  # both lists are complete: their overlap is already known
                self.fetch(f"pair:{first.key}+{second.key}",
                           f"{concept_expr(first)} AND {concept_expr(second)}",
                           proves=[first.key, second.key])


def _score_all(corpus: Corpus, plan: QueryPlan, found: _Collector,
               doc_freq: dict[str, int], limit: int) -> tuple[list[Hit], frozenset[str], dict]:
    """Pre-rank candidates by what FTS proved, load the best ``limit * 4`` (at least
    ``RESCORE_MIN``) and score them (best first, newest first on ties); with the
    concept keys that name a sender of the candidates and the names plain turns
    show to be a role's (``_plain_speakers``)."""
    scorer = Scorer(plan, doc_freq, corpus.total_docs())
    mass: dict[frozenset, float] = {}   # candidates share few distinct proved sets

    def rank(key: int) -> tuple[float, int]:
        proved = frozenset(found.known[key])
        if proved not in mass:
            mass[proved] = scorer.prescore(proved)
        return -mass[proved], -key

    loaded = corpus.load(heapq.nsmallest(max(limit * 4, RESCORE_MIN), found.known, key=rank))
    if not loaded:
        return [], frozenset(), {}
    speakers = {key: ranking.speaker_of(row, text) for key, (row, text) in loaded.items()}
    tokenized = {key: _Tokens(body, scorer.wanted) for key, (_, body) in speakers.items()}
    avg_terms = sum(len(t.tokens) for t in tokenized.values()) / len(tokenized)
    plain = any(name is None and loaded[key][0].get("role") in ranking.ROLES
                for key, (name, _) in speakers.items())
    roles = _plain_speakers(corpus, plan) if plain and hasattr(corpus, "speaking_rows") else {}
    names = {key: sender_names(loaded[key][0], name, roles)
             for key, (name, _) in speakers.items()}
    # a name plain turns show to be a role's names a person even when no candidate
    # is that role's turn (the answer shares no word with the question)
    senders = frozenset().union(*names.values(), *roles.values())
    scorer.people = frozenset(c.key for c in plan.concepts if senders.intersection(c.variants))
    hits = []
    for key, (row, text) in loaded.items():
        cand = Candidate(key, row, text, found.known.get(key, set()), names[key])
        hit = scorer.score(cand, tokenized[key], avg_terms)
        if hit.score > 0:
            hits.append(hit)
    hits.sort(key=lambda h: (-h.score, -h.key))
    return hits, scorer.people, roles


def sender_names(row: dict, name: str | None,
                 roles: dict[str, frozenset[str]]) -> frozenset[str]:
    """The name forms a row's sender goes by: the words of its own name
    (``ranking.speaker_of``), or for a plain turn the names its role is addressed
    by (``roles``, from ``_plain_speakers``). One rule for the full-text scorer
    and the vector arms' speaker preference (``arms._by_speaker``)."""
    if name is None:
        return roles.get(row.get("role"), frozenset())
    return frozenset(fts_tokens(name))


def _plain_speakers(corpus: "MessageCorpus", plan: QueryPlan) -> dict[str, frozenset[str]]:
    """``role -> name forms`` of the query's names that plain turns show to be that
    role's (``ranking.addressed_roles``), by the full name or, when that settles no
    role, by its short forms ("hey Mel!"); empty when the query names nobody."""
    wanted = ranking.proper_names(plan.text)
    concepts = [c for c in plan.concepts if wanted.intersection(c.variants)]
    if not concepts or corpus.scope.role:
        return {}
    uses = {c.key: (c.key, corpus.speaking_rows(concept_expr(c), ranking.ADDRESS_SAMPLE))
            for c in concepts}
    found = ranking.addressed_roles(uses)
    settled = set().union(*found.values())
    short = {c.key: ranking.short_forms(c.key) for c in concepts if c.key not in settled}
    short_uses = {key: (shorts, corpus.speaking_rows(any_of(shorts), ranking.ADDRESS_SAMPLE))
                  for key, shorts in short.items() if shorts}
    for role, keys in ranking.addressed_roles(short_uses, cased=True).items():
        found.setdefault(role, set()).update(keys)
    forms = {c.key: c.variants for c in concepts}
    return {role: frozenset(v for key in keys for v in forms[key])
            for role, keys in found.items()}


def context_hits(corpus: MessageCorpus, hits: Sequence[Hit], top: int) -> list[Hit]:
    """The turns right before and after the best ``top`` hits, each scored with the best
    score of a hit beside it (its own score is not counted here).

    A reply rarely repeats the question's words; the turns around it (what was
    asked, the follow-up) often do. Fused as an arm of its own (``arms``), this
    adds a share of the neighbours' score to each turn's own.
    """
    best = hits[:top]
    around = corpus.neighbours([h.key for h in best]) if best else {}
    score: dict[int, float] = {}
    source: dict[int, int] = {}
    for hit in best:
        for key in around.get(hit.key, ()):
            if key is not None and hit.score > score.get(key, 0.0):
                score[key], source[key] = hit.score, hit.key
    loaded = corpus.load(list(score))
    found = [Hit(key, row, text, score[key], {"context_of": source[key], "matched": [],
                                              "coverage": 0.0})
             for key, (row, text) in loaded.items()]
    found.sort(key=lambda h: (-h.score, -h.key))
    return found


# ---------------------------------------------------------------- snippets
def snippet(plan: QueryPlan, text: str, width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``text`` centred on the best match of the query."""
    if len(text) <= width:
        return text
    at = _match_position(plan, text, width)
    start = max(0, min(at - width // 2, len(text) - width))
    piece = text[start:start + width]
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


def _match_position(plan: QueryPlan, text: str, width: int = SNIPPET_CHARS) -> int:
    """Where the most telling match is: an identifier or a phrase as written, else the
    middle of the ``width``-character window holding the most of the query's words."""
    window = text[:SCORE_MAX_CHARS]
    folded = fold(window)
    haystack = folded if len(folded) == len(window) else window.lower()
    patterns = [re.compile(rf"(?<![^\W_]){re.escape(fold(i.raw))}(?![^\W_])")
                for i in plan.identifiers]
    patterns += [_phrase_pattern(p) for p in plan.phrases]
    patterns += [_phrase_pattern(i.parts) for i in plan.identifiers]
    for pattern in patterns:
        found = pattern.search(haystack)
        if found:
            return found.start()
    if plan.concepts:
        at = _densest_window(plan.concepts, haystack, width * 3 // 4)
        if at is not None:
            return at
    for needle in plan.needles:
        at = haystack.find(needle.lower())
        if at >= 0:
            return at
    return 0


def _densest_window(concepts: Sequence[Concept], haystack: str, span: int) -> int | None:
    """The middle of the earliest run of at most ``span`` characters whose distinct query
    words weigh most (the first ``SNIPPET_MARKS`` places of each word form are looked
    at). None when no word occurs."""
    concept_of: dict[str, Concept] = {}
    for concept in concepts:
        for variant in concept.variants:
            concept_of.setdefault(variant, concept)
    marks = sorted((at, concept) for variant, concept in concept_of.items()
                   for at in _word_positions(haystack, variant, SNIPPET_MARKS))
    if not marks:
        return None
    inside: Counter = Counter()
    weight, best, best_at, start = 0.0, -1.0, marks[0][0], 0
    for position, concept in marks:
        if not inside[concept.key]:
            weight += concept.weight
        inside[concept.key] += 1
        while position - marks[start][0] > span:
            gone = marks[start][1]
            inside[gone.key] -= 1
            if not inside[gone.key]:
                weight -= gone.weight
            start += 1
        if weight > best + 1e-9:
            best, best_at = weight, (marks[start][0] + position) // 2
    return best_at


def _word_positions(haystack: str, word: str, cap: int) -> list[int]:
    """Where ``word`` occurs as a whole word, at most ``cap`` places. ``str.find`` runs in
    C and is several times faster here than a regex with look-arounds."""
    found: list[int] = []
    at, tries = haystack.find(word), 0
    while at >= 0 and len(found) < cap and tries < cap * 10:
        end = at + len(word)
        if not (at and haystack[at - 1].isalnum()) and not (
                end < len(haystack) and haystack[end].isalnum()):
            found.append(at)
        at, tries = haystack.find(word, at + 1), tries + 1
    return found
