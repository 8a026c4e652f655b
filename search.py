"""Search: natural-language queries to safe FTS5, staged retrieval, ranking, fusion.

Agents ask questions ("what did we decide about the retry backoff?"), not
keyword lists. A strict AND of those words finds nothing and a ranked OR of
all of them is slow on a big store, so a query is handled like a search
engine would:

1. ``parse_query`` turns the text into *concepts* (one per content word; a
   plural and its singular are one concept), identifiers (``retry_backoff_ms``,
   ``retryBackoffMs``, ``my-proxy``: kept whole as an FTS phrase of their
   parts), quoted phrases, ``-excluded`` terms and substring needles for text
   FTS5 cannot tokenize (CJK runs, emoji). Every FTS term is emitted as a
   quoted string built from word characters only, so nothing the model writes
   is ever FTS syntax.
2. ``ranked_search`` narrows before it ranks: exact identifier/phrase queries
   and the AND of all strong concepts first; only when those give too few
   hits does it collect capped, newest-first candidates per concept and the
   ANDs of the rarest concept pairs. The scope (session, role, source tags)
   is part of every FTS expression, so FTS5 intersects posting lists instead
   of filtering afterwards. Every FTS5 query is *unranked* (``ORDER BY rowid
   DESC LIMIT n``, under a millisecond at 1M rows): FTS5's own bm25 first
   counts the documents of every phrase in the query, which for a session
   tag or a common word means reading its whole posting list on every query.
3. Candidates are scored in Python: BM25 over the concepts (document
   frequencies from capped counts), scaled by coverage (the weighted share of
   the query's concepts present), with bonuses for adjacent query words found
   as a phrase and for an identifier found exactly as written.

``fuse`` combines ranked lists (arms) by weighted reciprocal rank fusion; a
vector arm can be added later as one more list.

This module never formats tool output and holds no SQL: corpora reach the
database through ``Store``/``Dag`` methods.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Protocol, Sequence

from . import codec
from .dag import Dag
from .store import Store, decode_row, role_tag, session_tag, source_tag

MAX_QUERY_CHARS = 1000        # longer queries are cut (reported by the caller)
MAX_CONCEPTS = 12             # more words add cost, not precision
FILLER_WEIGHT = 0.3           # weight of question words like "decide", "use"
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
SNIPPET_MARKS = 200           # matches of one query word looked at when placing a snippet
BM25_K1 = 1.2
BM25_B = 0.75
RRF_K = 60

STOP_WORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
don't down during each few for from further had hadn't has hasn't have haven't having he he'd
he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only or
other ought our ours ourselves out over own same shan't she she'd she'll she's should shouldn't so
some such than that that's the their theirs them themselves then there there's these they they'd
they'll they're they've this those through to too under until up very was wasn't we we'd we'll
we're we've were weren't what what's when when's where where's which while who who's whom why
why's with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves
also just any anything something please hey hi ok okay yes yeah us got get gets
""".split())

# Words typical of a question about earlier work but rare in the answer itself:
# kept (a hit containing them is a little better) but weighted down.
FILLER_WORDS = frozenset("""
decide decided decision decisions remember recall mention mentioned said say says tell told
talk talked discuss discussed earlier before previously ago last again use used uses using
set value thing things know find found show look looked kind sort way happened happen
""".split())

_WORD = re.compile(r"[^\W_]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_CJK = re.compile("[\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
                  "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003ffff]+")
_QUOTED = re.compile(r'"([^"]*)"')
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_EDGE_PUNCT = "\"'`.,;:!?()[]{}<>"
_CONTRACTION = re.compile(r"([^\W\d_]+)['\u2019]([^\W\d_]{1,2})")


# ---------------------------------------------------------------- query parsing
@dataclass(frozen=True)
class Concept:
    """One idea of the query: a folded key and the FTS tokens that count as it."""

    key: str
    variants: tuple[str, ...]
    weight: float = 1.0


@dataclass(frozen=True)
class Identifier:
    """A code-like token of the query, kept whole for phrase matching and an exact bonus."""

    raw: str
    parts: tuple[str, ...]
    joined: str


@dataclass(frozen=True)
class QueryPlan:
    """Everything search needs from one query string, already made safe."""

    text: str
    concepts: tuple[Concept, ...] = ()
    identifiers: tuple[Identifier, ...] = ()
    phrases: tuple[tuple[str, ...], ...] = ()
    excluded: tuple[tuple[str, ...], ...] = ()
    needles: tuple[str, ...] = ()
    truncated: bool = False

    @property
    def empty(self) -> bool:
        """True when nothing in the query can be searched for."""
        return not (self.concepts or self.phrases or self.needles)


def fold(text: str) -> str:
    """Lower-case and strip diacritics the way the index (unicode61, remove_diacritics 2) does."""
    text = text.lower()
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def fts_tokens(text: str) -> list[str]:
    """The tokens FTS5 makes of ``text``: folded runs of letters and digits."""
    return fold_tokens(fold(text))


def singular(word: str) -> str:
    """Fold a simple English plural to its singular ("ports" -> "port", "retries" -> "retry")."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes", "zes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def plural(word: str) -> str:
    """The regular plural of a singular word (the inverse of ``singular`` for common cases)."""
    if len(word) < 3 or not word.isalpha():
        return word
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def verb_base(word: str) -> str:
    """Undo a regular -ing/-ed ending ("formatting" -> "format", "deployed" -> "deploy");
    short words are left alone so "string" and "need" stay themselves."""
    if not word.isalpha():
        return word
    if word.endswith("ing") and len(word) >= 7:
        stem = word[:-3]
    elif word.endswith("ied") and len(word) >= 6:
        return word[:-3] + "y"
    elif word.endswith("ed") and len(word) >= 6:
        stem = word[:-2]
    else:
        return word
    if len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
        stem = stem[:-1]
    return stem


def word_variants(word: str) -> tuple[str, ...]:
    """The surface forms that count as one word: singular and plural, and for a verb
    its base, -s, -ed and -ing forms (with and without a final e or doubled consonant).
    Forms that do not exist cost nothing: FTS5 finds no documents for them."""
    verb = verb_base(word)
    if verb != word:
        swapped = word[:-3] + "ed" if word.endswith("ing") else word[:-2] + "ing"
        forms = [word, swapped]
        for stem in ([verb] if verb.endswith("e") else [verb, verb + "e"]):
            forms += [stem, plural(stem), stem + ("d" if stem.endswith("e") else "ed"),
                      (stem[:-1] if stem.endswith("e") else stem) + "ing"]
        return tuple(dict.fromkeys(forms))
    base = singular(word)
    forms = [word, base, plural(base)]
    if base.isalpha() and len(base) >= 4 and not base.endswith(("ed", "ing")):
        root = base[:-1] if base.endswith("e") else base
        forms += [root + "ed" if root == base else base + "d", root + "ing"]
        if base[-1] not in "aeiouwxy" and base[-2] in "aeiou" and base[-3] not in "aeiou":
            forms += [base + base[-1] + "ed", base + base[-1] + "ing"]
    return tuple(dict.fromkeys(forms))


def clean_query(text: object) -> tuple[str, bool]:
    """Make any query value safe to process: text, valid UTF-8, no NUL/control chars, bounded."""
    text = "" if text is None else str(text)
    text = _CONTROL.sub(" ", codec.safe_text(text))
    truncated = len(text) > MAX_QUERY_CHARS
    return (text[:MAX_QUERY_CHARS] if truncated else text), truncated


def _camel_parts(token: str) -> list[str]:
    """Split one alphanumeric run at camelCase boundaries ("retryBackoffMs" -> 3 parts)."""
    return [p for p in _CAMEL_BOUNDARY.split(token) if p]


def _needles_of(chunk: str) -> list[str]:
    """Substring needles for text FTS5 cannot match as words: CJK runs and symbol-only chunks."""
    found = [m.group(0) for m in _CJK.finditer(chunk)]
    if not found and not _WORD.search(chunk) and not chunk.isascii():
        found.append(chunk)
    return found


class _PlanBuilder:
    """Accumulates concepts and identifiers while the query's chunks are read."""

    def __init__(self) -> None:
        self.concepts: dict[str, Concept] = {}
        self.stop_only: dict[str, Concept] = {}
        self.identifiers: dict[str, Identifier] = {}
        self.needles: list[str] = []

    def add_word(self, word: str, extra_variant: str | None = None) -> None:
        """Add one folded word as a concept (stop words are kept aside as a last resort)."""
        if word in STOP_WORDS or len(word) < 2:
            self.stop_only.setdefault(word, Concept(word, (word,)))
            return
        variants = word_variants(word)
        if extra_variant and extra_variant not in variants:
            variants += (extra_variant,)
        key = singular(word)
        weight = FILLER_WEIGHT if key in FILLER_WORDS or word in FILLER_WORDS else 1.0
        key = next((k for k, c in self.concepts.items() if word in c.variants), key)
        old = self.concepts.get(key)
        if old is not None:
            variants = tuple(dict.fromkeys(old.variants + variants))
            weight = max(weight, old.weight)
        self.concepts[key] = Concept(key, variants, weight)

    def add_chunk(self, chunk: str) -> None:
        """Read one whitespace-separated chunk of the query."""
        chunk = chunk.strip(_EDGE_PUNCT)
        self.needles += _needles_of(chunk)
        contraction = _CONTRACTION.fullmatch(chunk)
        if contraction:  # "don't" is a stop word, "user's" is "user"
            word = fold(chunk.replace("’", "'"))
            if word in STOP_WORDS:
                self.stop_only.setdefault(word, Concept(word, (fold(contraction.group(1)),)))
                return
            chunk = contraction.group(1)
        runs = _WORD.findall(chunk)
        parts: list[str] = []
        for run in runs:
            parts += [fold(p) for p in _camel_parts(run)]
        parts = [p for p in parts if p and not _CJK.fullmatch(p)]
        if len(parts) >= 2 and (len(runs) >= 2 or len(parts) > len(runs)):
            joined = "".join(parts)
            ident = Identifier(raw=chunk, parts=tuple(parts), joined=joined)
            self.identifiers.setdefault(ident.raw.lower(), ident)
            for part in parts:
                self.add_word(part, extra_variant=joined)
        else:
            for part in parts:
                self.add_word(part)

    def concepts_in_order(self) -> tuple[Concept, ...]:
        """Strong concepts first, then fillers; stop words only when nothing else is left."""
        chosen = list(self.concepts.values()) or list(self.stop_only.values())
        chosen.sort(key=lambda c: -c.weight)
        return tuple(chosen[:MAX_CONCEPTS])


def parse_query(text: object) -> QueryPlan:
    """Turn a query as the model wrote it into a safe ``QueryPlan`` (never raises)."""
    cleaned, truncated = clean_query(text)
    phrases: list[tuple[str, ...]] = []
    builder = _PlanBuilder()

    def take_phrase(match: re.Match) -> str:
        tokens = tuple(fts_tokens(match.group(1)))
        if len(tokens) >= 2:
            phrases.append(tokens)
        builder.needles.extend(_needles_of(match.group(1)))
        return " " + match.group(1) + " "

    rest = _QUOTED.sub(take_phrase, cleaned).replace('"', " ")
    excluded: list[tuple[str, ...]] = []
    for chunk in rest.split():
        if chunk.startswith("-") and len(chunk) > 1 and _WORD.match(chunk[1:]):
            tokens = tuple(fts_tokens(chunk[1:]))
            if tokens:
                excluded.append(tokens)
            continue
        builder.add_chunk(chunk)
    excluded_keys = {singular(t[0]) for t in excluded if len(t) == 1}
    concepts = tuple(c for c in builder.concepts_in_order() if c.key not in excluded_keys)
    return QueryPlan(text=cleaned, concepts=concepts,
                     identifiers=tuple(builder.identifiers.values()),
                     phrases=tuple(dict.fromkeys(phrases)), excluded=tuple(excluded),
                     needles=tuple(dict.fromkeys(n for n in builder.needles if n.strip())),
                     truncated=truncated)


# ---------------------------------------------------------------- FTS expressions
def quote(tokens: Sequence[str] | str) -> str:
    """One FTS5 string (a word or a phrase); embedded quotes are doubled, so it is always data."""
    text = tokens if isinstance(tokens, str) else " ".join(tokens)
    return '"' + text.replace('"', '""') + '"'


def any_of(terms: Iterable[Sequence[str] | str]) -> str:
    """``("a" OR "b c")``: matches when any of the terms (words or phrases) is present."""
    return "(" + " OR ".join(quote(t) for t in terms) + ")"


def concept_expr(concept: Concept) -> str:
    """The FTS expression matching any surface form of a concept."""
    return any_of(concept.variants)


def identifier_expr(ident: Identifier) -> str:
    """An identifier as a phrase of its parts, or as the single token camelCase makes."""
    return any_of([ident.parts, ident.joined])


def scoped(body: str, scope_expr: str | None, excluded: Sequence[tuple[str, ...]] = ()) -> str:
    """Put a body expression under the scope tags, minus excluded terms.

    The scope goes *inside* the FTS query so FTS5 intersects the posting lists.
    """
    expr = f"body : {body}" if body.startswith("(") else f"body : ({body})"
    if scope_expr:
        expr = f"{scope_expr} AND {expr}"
    if excluded:
        expr = f"{expr} NOT body : {any_of(excluded)}"
    return expr


def tag_scope(session_ids: Sequence[str] | None, *, role: str | None = None,
              source: str | None = None) -> str | None:
    """The ``tags`` part of an FTS expression: sessions, role and source tokens."""
    parts = []
    if session_ids is not None:
        parts.append("tags : " + any_of([session_tag(s) for s in session_ids]))
    if role:
        parts.append("tags : " + quote(role_tag(role)))
    if source:
        parts.append("tags : " + quote(source_tag(source)))
    return " AND ".join(parts) or None


# ---------------------------------------------------------------- scoring
@dataclass
class Candidate:
    """One retrieved row on its way to a score."""

    key: int
    row: dict
    text: str
    known: set[str] = field(default_factory=set)   # concept keys FTS already proved present


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


# every byte that is not an ASCII letter or digit becomes a space (text is folded first)
_ASCII_SEPARATORS = bytes(b if chr(b).isalnum() and b < 128 else 32 for b in range(256))


def fold_tokens(folded: str) -> list[str]:
    """The FTS5 tokens of already folded text. ASCII text (most of it) is split by a
    byte translation, about four times faster than the regex it equals there."""
    if folded.isascii():
        return folded.encode("ascii").translate(_ASCII_SEPARATORS).decode("ascii").split()
    return _WORD.findall(folded)


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
        strong = [c.variants for c in plan.concepts if c.weight == 1.0]
        self.pairs = list(zip(strong, strong[1:]))
        self.needles = [n.lower() for n in plan.needles]
        self.wanted = frozenset(v for c in plan.concepts for v in c.variants)

    def prescore(self, known: set[str]) -> float:
        """Cheap score from what FTS already proved (no text needed): the idf mass covered."""
        return sum(c.weight * self.idf[c.key] for c in self.plan.concepts if c.key in known)

    def score(self, cand: Candidate, seen: "_Tokens", avg_terms: float) -> Hit:
        """One candidate's score and its parts (for ``explain``); ``seen`` is its text
        tokenized, ``avg_terms`` the mean token count of the candidates (BM25's avgdl)."""
        norm = BM25_K1 * (1 - BM25_B + BM25_B * max(1, len(seen.tokens)) / max(avg_terms, 1.0))
        bm25, covered, matched = 0.0, 0.0, []
        for concept in self.plan.concepts:
            tf = sum(seen.counts.get(v, 0) for v in concept.variants)
            if tf == 0 and concept.key in cand.known:
                tf = 1
            if tf:
                matched.append(concept.key)
                covered += concept.weight
                bm25 += concept.weight * self.idf[concept.key] * tf * (BM25_K1 + 1) / (tf + norm)
        coverage = covered / self.weight_total if self.plan.concepts else 0.0
        if self.needles:
            lowered = cand.text[:SCORE_MAX_CHARS].lower()
            found = sum(1 for n in self.needles if n in lowered)
            coverage = max(coverage, found / len(self.needles))
            bm25 += 2.0 * found
        phrase = self.PHRASE_BONUS * sum(
            1 for first, second in self.pairs
            if _adjacent(seen, first, second))
        ident = self.IDENTIFIER_BONUS * sum(1 for i in self.plan.identifiers
                                            if _exact_identifier(seen.folded, fold(i.raw)))
        quoted = self.QUOTED_BONUS * sum(1 for p in self.plan.phrases if seen.has_phrase(p))
        total = bm25 * coverage * (1.0 + phrase + ident + quoted)
        parts = {"bm25": round(bm25, 4), "coverage": round(coverage, 3),
                 "phrase_bonus": phrase, "identifier_bonus": ident, "quoted_bonus": quoted,
                 "matched": matched}
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
    """

    def __init__(self, store: Store, scope: MessageScope):
        self.store = store
        self.scope = scope
        only_current = scope.session_ids == (scope.current_session,)
        self.below = scope.current_turn_store_id if only_current else None
        self.share = 1.0
        self.dense = False
        if scope.session_ids:
            self.share = store.recent_share(scope.session_ids, SHARE_WINDOW)
            self.dense = self.share >= DENSE_SHARE

    def scope_expr(self) -> str | None:
        sessions = None if self.dense else self.scope.session_ids
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
            expr = self._tagged(expr)
        return [r[0] for r in self.store.match_message_ids(
            expr, limit=limit, ranked=False, below_store_id=self.below,
            time_from=s.time_from, time_to=s.time_to)]

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

    def substring(self, needles, *, limit):
        sessions = self.scope.session_ids or (None,)
        found: list[int] = []
        for session in sessions:
            found += self.store.substring_scan(session, needles, limit=limit + 8,
                                               max_rows=SUBSTRING_MAX_ROWS)
        return found

    def total_docs(self) -> int:
        return max(1, self.store.last_store_id())


class SummaryCorpus:
    """Summary nodes of some sessions (all when ``session_ids`` is None), optionally
    limited by an acceptance test; searched through ``Dag`` (implements ``Corpus``)."""

    def __init__(self, dag: Dag, session_ids: Sequence[str] | None,
                 accept: Callable[[dict], bool] | None = None):
        self.dag = dag
        self.session_ids = None if session_ids is None else tuple(session_ids)
        self.accept = accept

    def scope_expr(self) -> str | None:
        return tag_scope(self.session_ids)

    def count(self, expr, *, cap):
        return self.dag.count_node_matches(expr, cap=cap)

    def match(self, expr, *, limit):
        return [r[0] for r in self.dag.match_node_ids(expr, limit=limit, ranked=False)]

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


def ranked_search(corpus: Corpus, plan: QueryPlan, limit: int) -> SearchOutcome:
    """Retrieve candidates in stages (narrow first) and rank them; see the module docstring."""
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
    hits = _score_all(corpus, plan, found, doc_freq, limit)
    return SearchOutcome(hits[:limit], found.stages, notes)


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
               doc_freq: dict[str, int], limit: int) -> list[Hit]:
    """Pre-rank candidates by what FTS proved, load the best ones' text and score them
    (best first, newest first on ties)."""
    scorer = Scorer(plan, doc_freq, corpus.total_docs())
    keep = max(limit * 4, RESCORE_MIN)
    order = sorted(found.known, key=lambda k: (-scorer.prescore(found.known[k]), -k))
    loaded = corpus.load(order[:keep])
    if not loaded:
        return []
    tokenized = {key: _Tokens(text, scorer.wanted) for key, (_, text) in loaded.items()}
    avg_terms = sum(len(t.tokens) for t in tokenized.values()) / len(tokenized)
    hits = []
    for key, (row, text) in loaded.items():
        cand = Candidate(key, row, text, found.known.get(key, set()))
        hit = scorer.score(cand, tokenized[key], avg_terms)
        if hit.score > 0:
            hits.append(hit)
    hits.sort(key=lambda h: (-h.score, -h.key))
    return hits


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
    marks = sorted((m.start(), concept.key, concept.weight) for concept in plan.concepts
                   for _, m in zip(range(SNIPPET_MARKS), _term_pattern(concept.variants)
                                   .finditer(haystack)))
    if marks:
        return _densest_window(marks, width * 3 // 4)
    for needle in plan.needles:
        at = haystack.find(needle.lower())
        if at >= 0:
            return at
    return 0


def _densest_window(marks: Sequence[tuple[int, str, float]], span: int) -> int:
    """The middle of the run of ``(position, concept, weight)`` marks, at most ``span``
    characters long, whose distinct concepts weigh most (the earliest such run)."""
    best, best_at, start = -1.0, marks[0][0], 0
    for end in range(len(marks)):
        while marks[end][0] - marks[start][0] > span:
            start += 1
        run = marks[start:end + 1]
        weight = sum({key: w for _, key, w in run}.values())
        if weight > best:
            best, best_at = weight, (run[0][0] + run[-1][0]) // 2
    return best_at


# ---------------------------------------------------------------- fusion
@dataclass(frozen=True)
class Fused:
    """One key after fusion: its fused score and its rank in each arm that found it."""

    key: Hashable
    score: float
    ranks: dict


def fuse(arms: dict[str, Sequence[Hashable]], weights: dict[str, float] | None = None,
         k: int = RRF_K, quality: dict[Hashable, float] | None = None) -> list[Fused]:
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
