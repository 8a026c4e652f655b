"""Search finds the same rows on SQLite and on PostgreSQL: a differential test.

The same messages go into a SQLite file and a PostgreSQL schema (one in the test
server's database, one in a database made with the C locale, where lower(), ILIKE
and regex classes know no letter beyond ASCII). Queries built from those messages
(single words in any case, quoted phrases, identifiers with punctuation, long
queries of many words) then run through the search pipeline trove_grep, trove_recall
and /trove grep share (``recall/search.ranked_search``) and through the store's FTS
expressions; each must find the same set of rows on both engines (ranking may
differ) and never raise. The texts mix emoji, accented Latin, Cyrillic, Greek,
Turkish dotted and dotless i, CJK, NUL and control characters; a seeded generator
keeps each run bounded and repeatable.
"""
import random

import pytest

from hermes_trove.recall import query_plan, search
from hermes_trove.storage import database
from hermes_trove.store import Store

from pgkit import PgSchema, c_locale_url, require_pg

WORDS = [
    # ASCII and identifiers with punctuation
    "alpha", "Beta", "GAMMA", "retry_backoff_ms", "retryBackoffMs", "HTTPServer",
    "src/app/main.py", "v1.2.3", "3.14", "my-proxy", "don't", "foo.bar.baz", "I", "i",
    # accented Latin (precomposed and decomposed)
    "café", "NAÏVE", "Ångström", "Straße", "ÉCOLE", "e\u0301cole", "ệ", "Łódź", "Ærø", "œuvre",
    # Cyrillic, Greek (with accents, final sigma), Turkish
    "Привет", "МИР", "ёлка", "ЁЛКА", "йогурт", "ΣΟΦΙΑ", "λόγος", "ΛΌΓΟΣ", "Ωμέγα", "σοφίας", "ω\u0301ρα",
    "İstanbul", "ısı", "IŞIK", "iyi",
    # CJK and emoji (substring needles). Not emoji newer than Unicode 7 ("🦀", "🥲") or
    # skin tones: SQLite's unicode61 tables predate them and read them as letters, the
    # server as the symbols they are (a known difference: a phrase spanning one, a word
    # glued to one)
    "東京タワー", "数据库", "한국어", "👍", "🚀", "🎉party", "✅done", "❤",
]
SEPARATORS = [" ", " ", " ", ", ", "\n", "\t", "\0", "\x01", " / ", " — "]


def _messages(rng: random.Random, count: int) -> list[str]:
    out = []
    for _ in range(count):
        words = rng.sample(WORDS, rng.randint(2, 6))
        text = words[0]
        for word in words[1:]:
            text += rng.choice(SEPARATORS) + word
        out.append(text)
    return out


def _queries(rng: random.Random, texts: list[str]) -> list[str]:
    """Single words in three cases, quoted phrases of two neighbouring words, and two
    long queries (every word; many quoted phrases)."""
    queries = []
    for word in rng.sample(WORDS, 18):
        queries += [word, word.upper(), word.lower()]
    for text in rng.sample(texts, 10):
        words = [w for w in text.replace("\0", " ").replace("\x01", " ").split() if w not in "/—"]
        if len(words) >= 2:
            at = rng.randrange(len(words) - 1)
            queries.append(f'"{words[at]} {words[at + 1]}"')
    queries.append(" ".join(WORDS))
    queries.append(" ".join(f'"{a} {b}"' for a, b in zip(WORDS, WORDS[1:])))
    return queries


def _found(store: Store, query: str) -> list[int]:
    corpus = search.MessageCorpus(store, search.MessageScope(("A",), current_session="A"))
    return sorted(h.key for h in search.ranked_search(corpus, query_plan.parse_query(query),
                                                      200).hits)


def _matched(store: Store, expr: str) -> list[int]:
    return sorted(i for i, _ in store.match_message_ids(expr, limit=200, ranked=False))


@pytest.fixture(params=["server", "c_locale"])
def pg_url(request):
    """A throw-away schema in the test server's database, or in a C-locale one."""
    require_pg()
    created = PgSchema(c_locale_url() if request.param == "c_locale" else None)
    try:
        yield created.url
    finally:
        database.forget_database(created.url)
        created.drop()


@pytest.mark.parametrize("seed", [1, 2])
def test_both_engines_find_the_same_rows(pg_url, tmp_path, seed):
    rng = random.Random(seed)
    texts = _messages(rng, 40)
    sqlite_db = str(tmp_path / "trove.db")
    try:
        stores = [Store(database.get_database(sqlite_db)), Store(database.get_database(pg_url))]
        ids = [s.ingest("A", [{"role": "user", "content": t} for t in texts]).store_ids
               for s in stores]
        assert ids[0] == ids[1]
        diverged = []
        for query in _queries(rng, texts):
            found = [_found(s, query) for s in stores]
            if found[0] != found[1]:
                diverged.append(("search", query, *found))
            plan = query_plan.parse_query(query)
            exprs = [query_plan.quote(c.variants[0]) for c in plan.concepts]
            exprs += [query_plan.quote(" ".join(p)) for p in plan.phrases]
            for expr in exprs:
                matched = [_matched(s, expr) for s in stores]
                if matched[0] != matched[1]:
                    diverged.append(("match", expr, *matched))
        assert not diverged, "\n".join(map(repr, diverged))
    finally:
        database.forget_database(sqlite_db)
