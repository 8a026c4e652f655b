"""The second engine for the contract tests: a throw-away schema on a real PostgreSQL.

``.ci/run`` starts a server and exports ``PG_TROVE_TEST_URL``; each test that asks
for the ``backend`` fixture runs once on SQLite and once on PostgreSQL, in a schema
of its own (dropped afterwards). Without a server the PostgreSQL pass skips with
the reason, except where ``PG_TROVE_REQUIRE=1`` (CI), where it fails: CI must run it.
"""
from __future__ import annotations

import contextlib
import os
import urllib.parse
import uuid
from typing import Dict, Iterator

import pytest

PG_URL = os.environ.get("PG_TROVE_TEST_URL", "")
BACKENDS = ("sqlite", "postgresql")


def pg_unavailable() -> str | None:
    """Why the PostgreSQL pass cannot run here (None when it can)."""
    if not PG_URL:
        return "no PostgreSQL server: set PG_TROVE_TEST_URL (.ci/run starts one)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -r requirements-extras.txt)"
    return None


def require_pg() -> None:
    """Skip (or, in CI, fail) a test that needs the server."""
    reason = pg_unavailable()
    if reason:
        if os.environ.get("PG_TROVE_REQUIRE") == "1":
            pytest.fail(f"PG_TROVE_REQUIRE=1 but {reason}")
        pytest.skip(reason)


def schema_url(schema: str, base: str | None = None) -> str:
    """The test server's URL (or ``base``) with ``schema`` alone on the search path (a
    table missing from it must never be found in ``public``)."""
    base = base or PG_URL
    options = urllib.parse.quote(f"-csearch_path={schema}")
    return base + ("&" if "?" in base else "?") + f"options={options}"


C_LOCALE_DATABASE = "trove_test_c_locale"


def c_locale_url() -> str:
    """The URL of a database on the test server created with the C locale (made once,
    kept): lower(), ILIKE and regex classes know no letter beyond ASCII there, a
    server's database may well be made so, and search must find the same rows on it.
    Skips (fails under PG_TROVE_REQUIRE=1) when the server cannot make one."""
    require_pg()
    import psycopg
    parts = urllib.parse.urlsplit(PG_URL)
    url = urllib.parse.urlunsplit(parts._replace(path="/" + C_LOCALE_DATABASE))
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                              (C_LOCALE_DATABASE,)).fetchone()
        if not exists:
            try:
                conn.execute(f"CREATE DATABASE {C_LOCALE_DATABASE} TEMPLATE template0"
                             " ENCODING 'UTF8' LOCALE 'C'")
            except psycopg.errors.DuplicateDatabase:  # another test process made it
                pass
            except psycopg.Error as exc:
                reason = f"cannot create a C-locale database on the test server: {exc}"
                if os.environ.get("PG_TROVE_REQUIRE") == "1":
                    pytest.fail(reason)
                pytest.skip(reason)
    return url


class PgSchema:
    """A fresh schema on the test server (in the database of ``base``, the test
    server's URL by default), created now and dropped by ``drop``."""

    def __init__(self, base: str | None = None):
        import psycopg
        self.base = base or PG_URL
        self.name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.base, autocommit=True) as conn:
            # pg_trgm once per database, in public (no test schema's drop takes it along)
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA public")
            conn.execute(f"CREATE SCHEMA {self.name}")
        self.url = schema_url(self.name, self.base)

    def drop(self) -> None:
        """Close this process's connection to it and drop it with everything in it."""
        import psycopg
        from hermes_trove.storage import database
        database.forget_database(self.url)
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '30s'")  # a leaked connection fails, never hangs
            conn.execute(f"DROP SCHEMA IF EXISTS {self.name} CASCADE")


@contextlib.contextmanager
def store_env(postgres: bool) -> Iterator[Dict[str, str]]:
    """The environment a host needs for its store: ``{}`` (the SQLite file under its
    HERMES_HOME), or with ``postgres`` a ``TROVE_DATABASE_URL`` naming a fresh schema,
    dropped afterwards. Why: each walk (tests/test_host_walk.py, bench/soak.py) must
    start from an empty store, on the server as in a fresh home."""
    if not postgres:
        yield {}
        return
    reason = pg_unavailable()
    if reason:
        raise RuntimeError(reason)
    schema = PgSchema()
    try:
        yield {"TROVE_DATABASE_URL": schema.url}
    finally:
        schema.drop()


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    """``(name, target)``: where a test's database lives, once per engine (a SQLite
    file under ``tmp_path``, or a PostgreSQL URL of a throw-away schema); its shared
    connection is closed and forgotten after the test."""
    from hermes_trove.storage import database
    if request.param == "sqlite":
        target = str(tmp_path / "trove.db")
        try:
            yield "sqlite", target
        finally:
            database.forget_database(target)
        return
    require_pg()
    schema = PgSchema()
    try:
        yield "postgresql", schema.url
    finally:
        database.forget_database(schema.url)
        schema.drop()


@pytest.fixture
def engines_on_backend(backend, monkeypatch):
    """``backend``, with the engines ``enginekit.make_engine`` makes on its database
    (a module opts in with ``pytestmark = pytest.mark.usefixtures(...)``); yields
    the engine's name."""
    import enginekit
    monkeypatch.setattr(enginekit, "DATABASE_URL",
                        backend[1] if backend[0] == "postgresql" else None)
    yield backend[0]
