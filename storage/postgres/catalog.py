"""What the PostgreSQL server says about a trove schema: for status and doctor.

SQLite's answers come from PRAGMAs (page counts, journal mode, quick_check);
a server answers from its catalogue: its version, the schema's size and largest
relations, the extensions search uses (pg_trgm; pgvector when installed) and the
applied schema version. Read only, cheap (no table scans).
"""

from __future__ import annotations

from . import schema


def server_facts(db) -> dict:
    """Version, sizes, extensions and schema version of the database ``db`` uses."""
    with db.reading() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        relations = [(r[0], r[1]) for r in conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
            " ORDER BY 2 DESC")]
        extensions = {r[0]: r[1] for r in conn.execute(
            "SELECT e.name, e.installed_version FROM pg_available_extensions e"
            " WHERE e.name IN ('pg_trgm', 'vector')")}
        indexes = {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
        applied = schema.schema_version(conn)
    return {
        "server_version": version,
        "schema": conn.schema,
        "size_bytes": sum(size for _, size in relations),
        "largest_objects": dict(relations[:8]),
        "pg_trgm": extensions.get("pg_trgm"),
        "pgvector": extensions.get("vector"),
        "trigram_index": "messages_trgm" in indexes,
        "schema_version": applied,
        "schema_supported": schema.latest_version(),
    }
