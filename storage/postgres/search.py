"""Full-text search on PostgreSQL: the store's FTS5 expressions as tsqueries.

``recall/query_plan`` builds FTS5 expressions (quoted words and phrases, AND, OR,
NOT, parentheses, ``tags :`` / ``body :`` column filters, a ``*`` prefix). This
module parses that grammar and builds the equivalent tsquery in SQL: a phrase
becomes ``trove_phrase`` (``phraseto_tsquery``, also past a tsvector's last position)
over the same word split the index uses (so both sides agree on tokens), a scope tag
becomes a weight-D lexeme. Ranking of
candidates stays in ``recall/search`` (its own BM25 over document frequencies),
so both engines rank the same candidates the same way; the rank returned here
(``-ts_rank``, lower is better like FTS5's ``rank``) only orders the ranked arm.
"""

from __future__ import annotations

import re
from typing import Sequence

from .schema import FTS_CHARS, MESSAGE_BODY, WORDS

# Each searchable table's text, as its tsvector reads it (schema: MESSAGE_FTS, NODE_FTS).
_BODIES = {"messages": MESSAGE_BODY, "nodes": "text"}

_TOKEN = re.compile(r'\s*(?:("(?:[^"]|"")*")|(\()|(\))|(\*)|(:)|([^\s()":*]+))')
_TAG = re.compile(r"^[a-z0-9]+$")


class _Parser:
    """Recursive descent over FTS5's precedence: NOT binds tighter than AND, AND than OR.
    Builds a tree: ``("or"|"and", [nodes])``, ``("not", node, node)``, ``("tag", text)``,
    ``("text", text, prefix)``."""

    def __init__(self, expr: str):
        self.tokens = _tokens(expr)
        self.pos = 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else (None, None)

    def take(self):
        token = self.peek()
        self.pos += 1
        return token

    def parse(self) -> tuple:
        tree = self.or_expr(None)
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected {self.peek()[1]!r} in a search expression")
        return tree

    def or_expr(self, column):
        parts = [self.and_expr(column)]
        while self.peek() == ("word", "OR"):
            self.take()
            parts.append(self.and_expr(column))
        return parts[0] if len(parts) == 1 else ("or", parts)

    def and_expr(self, column):
        parts = [self.not_expr(column)]
        while True:
            kind, value = self.peek()
            if kind is None or kind == "close" or value == "OR":
                break
            if value == "AND":
                self.take()
            parts.append(self.not_expr(column))
        return parts[0] if len(parts) == 1 else ("and", parts)

    def not_expr(self, column):
        tree = self.primary(column)
        while self.peek() == ("word", "NOT"):
            self.take()
            tree = ("not", tree, self.primary(column))
        return tree

    def primary(self, column):
        kind, value = self.take()
        if kind == "word" and self.peek()[0] == "colon":
            self.take()
            return self.primary(value)
        if kind == "open":
            tree = self.or_expr(column)
            if self.take()[0] != "close":
                raise ValueError("unbalanced parenthesis in a search expression")
            return tree
        if kind == "string":
            text = value[1:-1].replace('""', '"')
        elif kind == "word" and value not in ("AND", "OR", "NOT"):
            text = value
        else:
            raise ValueError(f"unexpected {value!r} in a search expression")
        prefix = self.peek()[0] == "star"
        if prefix:
            self.take()
        return ("tag", text) if column == "tags" else ("text", text, prefix)


def _render(tree: tuple, params: list, leaf, ops: dict, negated: bool = False) -> str:
    """An expression tree rendered with ``ops`` joining its ``or``/``and``/``not`` nodes
    and ``leaf(tree, params, negated)`` rendering the rest; ``negated`` is true under
    the right side of a NOT. Parameters are appended in the order the SQL reads them."""
    kind = tree[0]
    if kind in ("or", "and"):
        return "(" + ops[kind].join(_render(t, params, leaf, ops, negated) for t in tree[1]) + ")"
    if kind == "not":
        left = _render(tree[1], params, leaf, ops, negated)
        return ops["not"].format(left, _render(tree[2], params, leaf, ops, not negated))
    return leaf(tree, params, negated)


_TSQUERY_OPS = {"or": " || ", "and": " && ", "not": "({} && !!{})"}
_RECHECK_OPS = {"or": " OR ", "and": " AND ", "not": "({} AND NOT {})"}


def _render_tsquery(tree: tuple, params: list, negated: bool = False) -> str:
    """The tsquery of a parsed expression (the GIN index answers it): every row that
    matches, and (only where a phrase lies past a tsvector's last position) a few that
    do not, which ``_render_recheck`` removes. So a phrase is ``trove_phrase``, which
    finds it past that position, except under a NOT (``negated``), where that form
    would drop rows holding the words there but not the phrase; a text that is surely
    one word stays a plain ``phraseto_tsquery`` (no phrase, no recheck)."""
    return _render(tree, params, _tsquery_leaf, _TSQUERY_OPS, negated)


def _tsquery_leaf(tree: tuple, params: list, negated: bool) -> str:
    if tree[0] == "tag":  # a scope tag: one hex token, weight D
        if not _TAG.match(tree[1]):
            return "''::tsquery"
        params.append(f"'{tree[1]}':D")
        return "?::tsquery"
    _, text, prefix = tree
    params.append(text)
    words = WORDS.format("?")
    if prefix:  # the phrase's last word as a prefix: 'a' <-> 'b':*
        # a text with no word at all ("+++"*) matches nothing, as in FTS5: a bare
        # ':*' would be a tsquery syntax error
        return (f"to_tsquery('simple', COALESCE(NULLIF(array_to_string(array(SELECT"
                f" quote_literal(w) FROM unnest(string_to_array(trim({words}), ' ')) w),"
                f" ' <-> '), '') || ':*', ''))")
    if negated or not _may_be_phrase(text):   # (one word: no phrase to look for)
        return f"phraseto_tsquery('simple', {words})"
    return f"trove_phrase({words})"  # a phrase past the last position too (schema)


def _render_recheck(tree: tuple, params: list, body: str) -> str:
    """A condition on the row ``m`` true exactly when the expression matches: as the
    tsquery, except that a phrase found only past the tsvector's last position
    (``schema.TROVE_PHRASE``, where any two words share one) is looked for in the
    row's words (``body``: its text column)."""
    def leaf(node: tuple, params: list, _negated: bool) -> str:
        if node[0] == "text" and not node[2] and _may_be_phrase(node[1]):
            # the row's words are read only where the loose form alone matched: a long row
            params += [node[1]] * 3
            words = WORDS.format("?")
            return (f"(m.fts @@ phraseto_tsquery('simple', {words}) OR (m.fts @@ trove_phrase("
                    f"{words}) AND strpos(' ' || {WORDS.format(f'left({body}, {FTS_CHARS})')}"
                    f" || ' ', ' ' || trim({words}) || ' ') > 0))")
        return f"m.fts @@ {_render_tsquery(node, params)}"
    return _render(tree, params, leaf, _RECHECK_OPS)


def _may_be_phrase(text: str) -> bool:
    """True unless ``text`` is surely one word (letters and digits only; the server's
    split may still cut what Python calls one word: the recheck then costs a little)."""
    return not text.isalnum() or not text.isascii()


def _has_phrase(tree: tuple) -> bool:
    kind = tree[0]
    if kind in ("or", "and"):
        return any(_has_phrase(t) for t in tree[1])
    if kind == "not":
        return _has_phrase(tree[1]) or _has_phrase(tree[2])
    return kind == "text" and not tree[2] and _may_be_phrase(tree[1])


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    names = ("string", "open", "close", "star", "colon", "word")
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if not match or match.end() == pos:
            if expr[pos:].strip():
                raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in a search expression")
            break
        pos = match.end()
        for name, value in zip(names, match.groups()):
            if value is not None:
                out.append((name, value))
    return out


# Up to this many matches a newest-first match reads them all from the GIN index.
FEW_MATCHES = 5000
# Expressions seen to match at least FEW_MATCHES rows of a table, per schema: a
# newest-first match of one goes straight to the newest-first walk (recall counts a
# word's matches before it fetches them; reading 5,000 candidates again to learn it is
# common cost as much as the count). Only a plan choice: were rows deleted since, the
# walk still returns the right rows. Bounded; cleared when full.
_COMMON: set[tuple[str, str, str]] = set()
_COMMON_MAX = 4096


def _remember_common(conn, table: str, expr: str) -> None:
    if len(_COMMON) >= _COMMON_MAX:
        _COMMON.clear()
    _COMMON.add((conn.schema, table, expr))


def tsquery(expr: str) -> tuple[str, list]:
    """The SQL of the tsquery equivalent to an FTS5 expression, and its parameters."""
    params: list = []
    sql = _render_tsquery(_Parser(expr).parse(), params)
    return sql, params


def match_terms(table: str, expr: str) -> tuple[list[str], list]:
    """The WHERE terms on row ``m`` of ``table`` that match an FTS5 expression, and their
    parameters: the tsquery (through the GIN index) and, when the expression holds a
    phrase, the recheck that keeps a row matching it only past the tsvector's last
    position to those holding the phrase there (``_render_recheck``)."""
    tree = _Parser(expr).parse()
    params: list = []
    terms = [f"m.fts @@ {_render_tsquery(tree, params)}"]
    if _has_phrase(tree):
        terms.append(_render_recheck(tree, params, _BODIES[table]))
    return terms, params


def match_ids(conn, table: str, key: str, expr: str, *, limit: int, ranked: bool,
              where: Sequence[str] = (), params: Sequence = (), session: bool = False) -> list:
    """``(id, rank)`` of ``table`` rows matching ``expr``: ranked best first, or newest
    first with rank None; ``where`` holds extra terms on the row alias ``m``; with
    ``session`` each row's session id comes instead of the rank."""
    # The tsquery is written inline (not in a subquery): its functions are immutable, so
    # the planner folds it with the bound values and estimates from the column's
    # statistics: the GIN index for rare words, the newest rows first for common ones.
    matching, match_params = match_terms(table, expr)
    rank = ranked and not session
    rank_params: list = []
    if rank:
        query, rank_params = tsquery(expr)
    second = "m.session_id" if session else (f"-ts_rank(m.fts, {query})" if rank else "NULL")
    order = "2" if rank else f"m.{key} DESC"
    terms = " AND ".join([*matching, *where])
    if not rank and (conn.schema, table, expr) not in _COMMON:
        # A bounded candidate set first: up to FEW_MATCHES matches through the GIN index
        # (one query, where a count and then a fetch were two). Fewer than that is every
        # match: the newest come from it. (Left to itself the planner walks the newest
        # rows testing each tsvector, which reads the whole table when the words are
        # rare: it cannot see how rare they are.)
        with conn.index_first():
            found = conn.execute(f"SELECT m.{key}, {second} FROM {table} m WHERE {terms}"
                                 f" LIMIT ?", [*match_params, *params, FEW_MATCHES]).fetchall()
        if len(found) < FEW_MATCHES:
            found.sort(key=lambda r: r[0], reverse=True)
            return [(r[0], r[1]) for r in found[:limit]]
        _remember_common(conn, table, expr)
    bound = [*rank_params, *match_params, *params, limit]
    sql = f"SELECT m.{key}, {second} FROM {table} m WHERE {terms} ORDER BY {order} LIMIT ?"
    return [(r[0], r[1]) for r in conn.execute(sql, bound)]


def substring_ids(conn, scope: tuple[str, list], needles: Sequence[str], *,
                  limit: int) -> list:
    """store_ids (newest first) whose text contains every needle, case folded, through
    the pg_trgm index (every row, not only the newest: the index finds them); ``scope``
    is the sessions' term (``sessionset.session_filter``; "" for all) and its parameters."""
    terms = ["COALESCE(search_text, content) LIKE ? ESCAPE '\\'" for _ in needles]
    params: list = ["%" + re.sub(r"([\\%_])", r"\\\1", n) + "%" for n in needles]
    if scope[0]:
        terms.insert(0, scope[0])
        params[:0] = scope[1]
    return [r[0] for r in conn.execute(
        f"SELECT store_id FROM messages WHERE {' AND '.join(terms)}"
        " ORDER BY store_id DESC LIMIT ?", [*params, limit])]


def count_matches(conn, table: str, key: str, expr: str, *, cap: int,
                  where: Sequence[str] = (), params: Sequence = ()) -> int:
    """How many rows match ``expr``, counting no further than ``cap``."""
    matching, match_params = match_terms(table, expr)
    terms = " AND ".join([*matching, *where])
    with conn.index_first():   # the GIN bitmap, not a scan testing tsvectors (index_first)
        count = conn.execute(
            f"SELECT count(*) FROM (SELECT m.{key} FROM {table} m WHERE {terms} LIMIT ?) found",
            [*match_params, *params, cap]).fetchone()[0]
    if count >= FEW_MATCHES:
        _remember_common(conn, table, expr)
    return count
