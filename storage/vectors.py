"""SQL of the embedding index: spaces, pending rows, vectors in and out.

The index lives in the same database as the messages (tables of migration
``m003_embedding_vectors``). Vectors are float32 blobs; this module never
imports numpy, so the plugin loads without it (``recall.semantic`` turns the
blobs into arrays). Every statement binds its parameters; each write is one
transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from .database import Database, chunked
from .sessionset import session_filter

EMBEDDED_ROLES = ("user", "assistant")    # tool output is searched by full text only
_OWNERS = {"m": ("messages", "store_id"), "n": ("nodes", "node_id")}   # fixed names, never input
GENERATION_MARK = "#"     # revision#2: the same model name answering as another model


@dataclass(frozen=True)
class SpaceIdentity:
    """The exact identity that produced a set of vectors."""

    provider: str
    model: str
    revision: str
    dim: int


@dataclass(frozen=True)
class VectorRow:
    """One vector to write (``vector`` None: the row had nothing to embed)."""

    kind: str            # "m" raw message, "n" summary node
    ref_id: int
    chunk: int
    text_hash: str
    vector: bytes | None


class VectorStore:
    """Reads and writes of the embedding tables through one ``Database``."""

    def __init__(self, db: Database):
        self.db = db

    def space_id(self, identity: SpaceIdentity, *, create: bool = True) -> int | None:
        """The id of an identity's space (created on first use unless ``create`` is False)."""
        key = (identity.provider, identity.model, identity.revision, identity.dim)
        query = ("SELECT space_id FROM embedding_spaces WHERE provider = ? AND model = ? "
                 "AND revision = ? AND dim = ?")
        with self.db.reading() as conn:
            row = conn.execute(query, key).fetchone()
        if row or not create:
            return row[0] if row else None
        with self.db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO embedding_spaces(provider, model, revision, dim, "
                         "created_at) VALUES (?, ?, ?, ?, ?)", (*key, time.time()))
            return conn.execute(query, key).fetchone()[0]

    def latest_space(self, provider: str, model: str, revision: str) -> int | None:
        """The newest space of a provider/model/revision (or a later generation of it,
        ``revision#n``) whatever its dimension: an endpoint's dimension is known only
        from its first answer, and a status read must not call the endpoint to learn it."""
        with self.db.reading() as conn:
            row = conn.execute("SELECT MAX(space_id) FROM embedding_spaces WHERE provider = ? "
                               "AND model = ? AND (revision = ? OR substr(revision, 1, "
                               "length(?)) = ?)", (provider, model, revision,
                                                   *[revision + GENERATION_MARK] * 2)).fetchone()
        return row[0] if row else None

    def generations(self, identity: SpaceIdentity) -> list[tuple[int, str, bytes | None]]:
        """``(space_id, revision, probe)`` of every space of the identity's provider,
        model and dimension whose revision is the identity's or a later generation of
        it (``revision#n``: the same name answered as another model), oldest first.
        ``probe`` is the vector the model gave ``recall.probe.PROBE_TEXT`` (None: not
        probed yet, a space made before probes were kept)."""
        rev = identity.revision
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT space_id, revision, probe FROM embedding_spaces WHERE provider = ? AND "
                "model = ? AND dim = ? AND (revision = ? OR substr(revision, 1, length(?)) "
                "= ?) ORDER BY space_id", (identity.provider, identity.model, identity.dim, rev,
                                           *[rev + GENERATION_MARK] * 2)).fetchall()
        return [(row[0], row[1], None if row[2] is None else bytes(row[2])) for row in rows]

    def set_probe(self, space_id: int, probe: bytes) -> bool:
        """Keep a space's probe vector unless it has one already; whether it was set
        (two processes probing at once: the first one's vector stays)."""
        with self.db.transaction() as conn:
            return conn.execute("UPDATE embedding_spaces SET probe = ? WHERE space_id = ? AND "
                                "probe IS NULL", (probe, space_id)).rowcount == 1

    def other_spaces(self, keep: int | None) -> list[dict]:
        """Every space but ``keep`` that still holds rows, with its identity and how many
        vectors it has (``vectors``) and rows in all (``rows``, the empty ones too): what
        a model switch left behind, never searched again until switched back."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT s.space_id, s.provider, s.model, s.revision, s.dim, COUNT(e.vector), "
                "COUNT(*) FROM embedding_spaces s JOIN embedding_vectors e ON e.space_id = "
                "s.space_id WHERE s.space_id <> ? GROUP BY s.space_id, s.provider, s.model, "
                "s.revision, s.dim ORDER BY s.space_id", (-1 if keep is None else keep,)
            ).fetchall()
        names = ("space_id", "provider", "model", "revision", "dim", "vectors", "rows")
        return [dict(zip(names, row)) for row in rows]

    def drop_space(self, space_id: int) -> int:
        """Delete every row of one space in one transaction; how many went. The space's
        own row stays (a process still using it keeps a valid id and embeds again)."""
        with self.db.transaction() as conn:
            return conn.execute("DELETE FROM embedding_vectors WHERE space_id = ?",
                                (space_id,)).rowcount

    def pending_messages(self, space_id: int, limit: int, after: int = 0) -> list[dict]:
        """Oldest raw messages above ``after`` with no row in this space yet (any role:
        others are recorded as having nothing to embed). ``after`` is the caller's
        cursor, so a catch-up does not re-walk the rows it already did."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT m.store_id, m.role, m.content, m.content_format, m.search_text, "
                "m.tool_name FROM messages m WHERE m.store_id > ? AND NOT EXISTS (SELECT 1 "
                "FROM embedding_vectors e WHERE e.space_id = ? AND e.kind = 'm' AND "
                "e.ref_id = m.store_id) ORDER BY m.store_id LIMIT ?",
                (after, space_id, limit)).fetchall()
        return [dict(r) for r in rows]

    def pending_nodes(self, space_id: int, limit: int, after: int = 0) -> list[dict]:
        """Oldest summary nodes above ``after`` with no row in this space yet."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT n.node_id, n.text FROM nodes n WHERE n.node_id > ? AND NOT EXISTS "
                "(SELECT 1 FROM embedding_vectors e WHERE e.space_id = ? AND e.kind = 'n' AND "
                "e.ref_id = n.node_id) ORDER BY n.node_id LIMIT ?",
                (after, space_id, limit)).fetchall()
        return [dict(r) for r in rows]

    def known_vectors(self, space_id: int, hashes: Iterable[str]) -> dict[str, bytes]:
        """Vectors already computed in this space for some of these text hashes."""
        wanted = list(dict.fromkeys(hashes))
        found: dict[str, bytes] = {}
        with self.db.reading() as conn:
            for chunk in chunked(wanted):
                marks = ",".join("?" * len(chunk))
                for text_hash, vector in conn.execute(
                        f"SELECT text_hash, vector FROM embedding_vectors WHERE space_id = ? "
                        f"AND text_hash IN ({marks}) AND vector IS NOT NULL", (space_id, *chunk)):
                    found.setdefault(text_hash, vector)
        return found

    def write(self, space_id: int, rows: Sequence[VectorRow]) -> None:
        """Store one batch of vectors in one transaction (a row already there is kept).

        Only vectors of rows that still exist are written: a ``doctor clean`` that
        removes a session while its rows are being embedded left their vectors behind
        (never searched, but counted by ``count_vectors``, so the prescreen found its
        count wrong and reloaded every vector of the space each recheck, for good)."""
        with self.db.transaction() as conn:
            for kind, (table, key) in _OWNERS.items():
                conn.executemany(
                    "INSERT OR IGNORE INTO embedding_vectors(space_id, kind, ref_id, chunk, "
                    f"text_hash, vector) SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM "
                    f"{table} WHERE {key} = ?)",
                    [(space_id, r.kind, r.ref_id, r.chunk, r.text_hash, r.vector, r.ref_id)
                     for r in rows if r.kind == kind])

    def counts(self, space_id: int | None) -> dict:
        """How many messages and nodes are indexed in a space and how many wait."""
        with self.db.reading() as conn:
            messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
            nodes = conn.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
            done_m = done_n = 0
            if space_id is not None:   # only vectors of rows that still exist count
                done_m, done_n = (conn.execute(
                    f"SELECT COUNT(DISTINCT e.ref_id) FROM embedding_vectors e JOIN {table} t"
                    f" ON t.{key} = e.ref_id WHERE e.space_id = ? AND e.kind = ?",
                    (space_id, kind)).fetchone()[0]
                    for kind, (table, key) in _OWNERS.items())
        return {"indexed": done_m + done_n, "pending": messages - done_m + nodes - done_n}

    @staticmethod
    def delete_sessions_in(conn, session_ids: Sequence[str]) -> int:
        """Delete the vectors of these sessions' messages and summary nodes inside the
        caller's transaction, before the rows themselves go (``doctor clean``): a
        removed row leaves no vector behind to be searched or counted."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return 0
        removed = 0
        for chunk in chunked(ids):
            marks = ",".join("?" * len(chunk))
            for kind, (table, key) in _OWNERS.items():
                removed += conn.execute(
                    f"DELETE FROM embedding_vectors WHERE kind = ? AND ref_id IN"
                    f" (SELECT {key} FROM {table} WHERE session_id IN ({marks}))",
                    (kind, *chunk)).rowcount
        return removed

    @staticmethod
    def drop_placeholder_vectors_in(conn) -> int:
        """Delete every space's vectors of raw messages whose text holds a payload
        placeholder, a payload ref or an image part, inside the caller's transaction
        (a migration); how many went.

        Why: such rows were embedded with the placeholder as their words
        (``payloads.without_placeholders`` now keeps it out); with no row in a space
        they are pending again, and the worker or ``embed backfill`` embeds their
        words alone (a row of placeholders only gets the NULL vector)."""
        roles = ",".join("?" * len(EMBEDDED_ROLES))
        return conn.execute(
            "DELETE FROM embedding_vectors WHERE kind = 'm' AND ref_id IN (SELECT store_id "
            f"FROM messages WHERE role IN ({roles}) AND (COALESCE(search_text, content) "
            "LIKE ? OR COALESCE(search_text, content) LIKE ?))",
            (*EMBEDDED_ROLES, "%trove-payload:%", "%[image]%")).rowcount

    def scope_counts(self, space_id: int, sessions: Sequence[str] | None,
                     hidden: tuple[str, int] | None = None) -> tuple[int, int]:
        """(embeddable messages in the sessions, how many of them have a row in the space).

        ``hidden`` = (session, store_id): that session's rows from store_id on are
        not counted (the current turn, which no search returns anyway)."""
        roles = ",".join("?" * len(EMBEDDED_ROLES))
        where, params = f"m.role IN ({roles})", list(EMBEDDED_ROLES)
        if sessions is not None:
            term, bound = session_filter("m.session_id", sessions)
            where += f" AND {term}"
            params += bound
        if hidden is not None:
            where += " AND NOT (m.session_id = ? AND m.store_id >= ?)"
            params += list(hidden)
        with self.db.reading() as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM messages m WHERE {where}",
                                 params).fetchone()[0]
            done = conn.execute(
                f"SELECT COUNT(*) FROM messages m WHERE {where} AND EXISTS (SELECT 1 FROM "
                "embedding_vectors e WHERE e.space_id = ? AND e.kind = 'm' AND e.ref_id = "
                "m.store_id)", (*params, space_id)).fetchone()[0]
        return total, done

    def vectors(self, space_id: int, kind: str,
                sessions: Sequence[str] | None) -> list[tuple[int, bytes]]:
        """(id, vector) of every embedded chunk of the sessions' messages (``kind`` "m")
        or summary nodes ("n"), joined to the live rows so a re-filed row is found
        in its session now."""
        table, key = _OWNERS[kind]
        sql = (f"SELECT e.ref_id, e.vector FROM embedding_vectors e JOIN {table} t ON "
               f"t.{key} = e.ref_id WHERE e.space_id = ? AND e.kind = ? AND e.vector IS "
               "NOT NULL")
        params: list = [space_id, kind]
        if sessions is not None:
            term, bound = session_filter("t.session_id", sessions)
            sql += f" AND {term}"
            params += bound
        with self.db.reading() as conn:
            return conn.execute(sql, params).fetchall()

    def scan(self, space_id: int, kind: str, after: int,
             limit: int) -> list[tuple[int, int, str, bytes]]:
        """The next ``limit`` embedded chunks with ref_id > ``after``, in order:
        (ref_id, chunk, session_id, vector) (loads the in-memory prescreen)."""
        table, key = _OWNERS[kind]
        with self.db.reading() as conn:
            return conn.execute(
                f"SELECT e.ref_id, e.chunk, t.session_id, e.vector FROM embedding_vectors e "
                f"JOIN {table} t ON t.{key} = e.ref_id WHERE e.space_id = ? AND e.kind = ? "
                "AND e.ref_id > ? AND e.vector IS NOT NULL ORDER BY e.ref_id, e.chunk LIMIT ?",
                (space_id, kind, after, limit)).fetchall()

    def count_vectors(self, space_id: int, kind: str) -> int:
        """How many non-empty vectors of a kind the space holds."""
        with self.db.reading() as conn:
            return conn.execute("SELECT COUNT(*) FROM embedding_vectors WHERE space_id = ? AND "
                                "kind = ? AND vector IS NOT NULL", (space_id, kind)).fetchone()[0]

    def vectors_of(self, space_id: int, kind: str,
                   refs: Sequence[int]) -> list[tuple[int, bytes]]:
        """(ref_id, vector) of every chunk of these rows (exact rescoring)."""
        found: list[tuple[int, bytes]] = []
        with self.db.reading() as conn:
            for chunk in chunked(refs):
                found += conn.execute(
                    f"SELECT ref_id, vector FROM embedding_vectors WHERE space_id = ? AND kind = ?"
                    f" AND ref_id IN ({','.join('?' * len(chunk))}) AND vector IS NOT NULL",
                    (space_id, kind, *chunk)).fetchall()
        return found
