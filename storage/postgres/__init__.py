"""The PostgreSQL engine of the trove store (``TROVE_DATABASE_URL=postgresql://...``).

SQLite stays the embedded default; this package is the one home of everything
PostgreSQL needs and SQLite does not: the connection (psycopg 3, imported only
when a URL is used), the dialect (placeholders, upserts, the writer lock), the
schema and its numbered migrations, and full-text search (tsvector + GIN, pg_trgm).
Store, DAG, identity and the other SQL owners run the same statements on both
engines; only what has no common SQL (FTS, PRAGMAs, file operations) branches on
``Database.dialect``.
"""
