"""Full-text search on PostgreSQL: the store's FTS5 expressions as tsqueries.

``recall/query_plan`` builds FTS5 expressions (quoted words and phrases, AND, OR,
NOT, parentheses, ``tags :`` / ``body :`` column filters, a ``*`` prefix). This
module parses that grammar and builds the equivalent tsquery in SQL: a phrase
becomes ``phraseto_tsquery`` over the same word split the index uses (so both
sides agree on tokens), a scope tag becomes a weight-D lexeme. Ranking of
candidates stays in ``recall/search`` (its own BM25 over document frequencies),
so both engines rank the same candidates the same way; the rank returned here
(``-ts_rank``, lower is better like FTS5's ``rank``) only orders the ranked arm.
"""

from __future__ import annotations

import re
from typing import Sequence

from .schema import WORDS

_TOKEN = re.compile(r'\s*(?:("(?:[^"]|"")*")|(\()|(\))|(\*)|(:)|([^\s()":*]+))')
_TAG = re.compile(r"^[a-z0-9]+$")


class _Parser:
    """Recursive descent over FTS5's precedence: NOT binds tighter than AND, AND than OR."""

    def __init__(self, expr: str):
        self.tokens = _tokens(expr)
        self.pos = 0
        self.params: list = []

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else (None, None)

    def take(self):
        token = self.peek()
        self.pos += 1
        return token

    def parse(self) -> str:
        sql = self.or_expr(None)
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected {self.peek()[1]!r} in a search expression")
        return sql

    def or_expr(self, column):
        parts = [self.and_expr(column)]
        while self.peek() == ("word", "OR"):
            self.take()
            parts.append(self.and_expr(column))
        return parts[0] if len(parts) == 1 else "(" + " || ".join(parts) + ")"

    def and_expr(self, column):
        parts = [self.not_expr(column)]
        while True:
            kind, value = self.peek()
            if kind is None or kind == "close" or value == "OR":
                break
            if value == "AND":
                self.take()
            parts.append(self.not_expr(column))
        return parts[0] if len(parts) == 1 else "(" + " && ".join(parts) + ")"

    def not_expr(self, column):
        sql = self.primary(column)
        while self.peek() == ("word", "NOT"):
            self.take()
            sql = f"({sql} && !!{self.primary(column)})"
        return sql

    def primary(self, column):
        kind, value = self.take()
        if kind == "word" and self.peek()[0] == "colon":
            self.take()
            return self.primary(value)
        if kind == "open":
            sql = self.or_expr(column)
            if self.take()[0] != "close":
                raise ValueError("unbalanced parenthesis in a search expression")
            return sql
        if kind == "string":
            text = value[1:-1].replace('""', '"')
        elif kind == "word" and value not in ("AND", "OR", "NOT"):
            text = value
        else:
            raise ValueError(f"unexpected {value!r} in a search expression")
        prefix = self.peek()[0] == "star"
        if prefix:
            self.take()
        return self.term(text, column, prefix)

    def term(self, text: str, column: str | None, prefix: bool) -> str:
        if column == "tags":  # a scope tag: one hex token, weight D
            if not _TAG.match(text):
                return "''::tsquery"
            self.params.append(f"'{text}':D")
            return "?::tsquery"
        self.params.append(text)
        words = WORDS.format("?")
        if prefix:  # the phrase's last word as a prefix: 'a' <-> 'b':*
            # a text with no word at all ("+++"*) matches nothing, as in FTS5: a bare
            # ':*' would be a tsquery syntax error
            return (f"to_tsquery('simple', COALESCE(NULLIF(array_to_string(array(SELECT"
                    f" quote_literal(w) FROM unnest(string_to_array(trim({words}), ' ')) w),"
                    f" ' <-> '), '') || ':*', ''))")
        return f"phraseto_tsquery('simple', {words})"


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
    parser = _Parser(expr)
    sql = parser.parse()
    return sql, parser.params


def match_ids(conn, table: str, key: str, expr: str, *, limit: int, ranked: bool,
              where: Sequence[str] = (), params: Sequence = (), session: bool = False) -> list:
    """``(id, rank)`` of ``table`` rows matching ``expr``: ranked best first, or newest
    first with rank None; ``where`` holds extra terms on the row alias ``m``; with
    ``session`` each row's session id comes instead of the rank."""
    # The tsquery is written inline (not in a subquery): its functions are immutable, so
    # the planner folds it with the bound values and estimates from the column's
    # statistics: the GIN index for rare words, the newest rows first for common ones.
    query, query_params = tsquery(expr)
    rank = ranked and not session
    second = "m.session_id" if session else (f"-ts_rank(m.fts, {query})" if rank else "NULL")
    order = "2" if rank else f"m.{key} DESC"
    terms = " AND ".join([f"m.fts @@ {query}", *where])
    if not rank and (conn.schema, table, expr) not in _COMMON:
        # A bounded candidate set first: up to FEW_MATCHES matches through the GIN index
        # (one query, where a count and then a fetch were two). Fewer than that is every
        # match: the newest come from it. (Left to itself the planner walks the newest
        # rows testing each tsvector, which reads the whole table when the words are
        # rare: it cannot see how rare they are.)
        with conn.index_first():
            found = conn.execute(f"SELECT m.{key}, {second} FROM {table} m WHERE {terms}"
                                 f" LIMIT ?", [*query_params, *params, FEW_MATCHES]).fetchall()
        if len(found) < FEW_MATCHES:
            found.sort(key=lambda r: r[0], reverse=True)
            return [(r[0], r[1]) for r in found[:limit]]
        _remember_common(conn, table, expr)
    bound = [*query_params] * (2 if rank else 1) + [*params, limit]
    sql = f"SELECT m.{key}, {second} FROM {table} m WHERE {terms} ORDER BY {order} LIMIT ?"
    return [(r[0], r[1]) for r in conn.execute(sql, bound)]


def substring_ids(conn, session_id: str | None, needles: Sequence[str], *, limit: int) -> list:
    """store_ids (newest first) whose text contains every needle, case folded, through
    the pg_trgm index (every row, not only the newest: the index finds them)."""
    terms = ["COALESCE(search_text, content) LIKE ? ESCAPE '\\'" for _ in needles]
    params: list = ["%" + re.sub(r"([\\%_])", r"\\\1", n) + "%" for n in needles]
    if session_id:
        terms.insert(0, "session_id = ?")
        params.insert(0, session_id)
    return [r[0] for r in conn.execute(
        f"SELECT store_id FROM messages WHERE {' AND '.join(terms)}"
        " ORDER BY store_id DESC LIMIT ?", [*params, limit])]


def count_matches(conn, table: str, key: str, expr: str, *, cap: int,
                  where: Sequence[str] = (), params: Sequence = ()) -> int:
    """How many rows match ``expr``, counting no further than ``cap``."""
    query, query_params = tsquery(expr)
    terms = " AND ".join([f"m.fts @@ {query}", *where])
    with conn.index_first():   # the GIN bitmap, not a scan testing tsvectors (index_first)
        count = conn.execute(
            f"SELECT count(*) FROM (SELECT m.{key} FROM {table} m WHERE {terms} LIMIT ?) found",
            [*query_params, *params, cap]).fetchone()[0]
    if count >= FEW_MATCHES:
        _remember_common(conn, table, expr)
    return count
