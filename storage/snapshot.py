"""Snapshot tokens: the store as it was at a list's first page, for paging that list while
writes go on (``trove_recent``, ``trove_query_state``). One codec for every such tool.

A snapshot is a frozen dataclass of non-negative integers (``Snapshot`` subclasses):
the highest ids of the tables a tool's list grows by, and the time it resolved its
period at. Each tool declares its own snapshot beside the SQL it bounds and reads its
own maxima: ``storage.timeline.Pin`` (messages, nodes, rollups) and
``evidence.assertions.StatePin`` (assertions, nodes).

Why a module of its own, knowing no table: the token's format, its check and its
bounds are one rule, which both tools must keep alike (an edited, cut or carried token
refused the same way, a future one harmless); while the maxima each reads belong to
its own tables. Putting ``assertion_id`` on ``Pin`` would have had ``storage/timeline``
read the evidence sidecar's table, a higher layer's (evidence imports storage, never
the reverse), and made every ``trove_recent`` first page read it for nothing.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, fields
from typing import Callable, ClassVar, TypeVar

MAX_ID = 2**63 - 1                      # the largest id a BIGINT / INTEGER column holds
MAX_MS = 253_402_300_799_000            # 9999-12-31T23:59:59Z
MILLISECONDS = {"ceiling": MAX_MS}      # ``field(metadata=MILLISECONDS)``: a pinned time
_FORMAT = "p1"

S = TypeVar("S", bound="Snapshot")


@dataclass(frozen=True)
class Snapshot:
    """A pinned store (subclass it with int fields). ``KIND`` names the tool's snapshot and
    is folded into the check, so one tool's token never decodes as another's."""

    KIND: ClassVar[str] = ""

    @property
    def now(self) -> float:
        """The pinned time in seconds (a snapshot with a ``now_ms`` field), what a period
        is resolved against so a rolling one keeps its window."""
        return getattr(self, "now_ms") / 1000

    def below(self, column: str, kind: str) -> tuple[str, list]:
        """`` AND <column> <= ?`` with this snapshot's bound for ``kind`` (its ``<kind>_id``)."""
        return f" AND {column} <= ?", [getattr(self, f"{kind}_id")]

    def encode(self, about: str) -> str:
        """A short opaque token; ``about`` (the query it pins) is folded into its check,
        so a token edited, cut, or carried to another query is refused by ``decode``."""
        body = ".".join([_FORMAT, *(str(getattr(self, f.name)) for f in fields(self))])
        return f"{body}.{zlib.crc32(f'{body}|{self.KIND}|{about}'.encode()):08x}"

    @classmethod
    def decode(cls: type[S], text: str, about: str) -> S:
        """The snapshot a token holds; ValueError for anything ``encode`` did not make for
        this kind and ``about``, or bounds no database column could hold."""
        count = len(fields(cls))
        pattern = rf"{_FORMAT}((?:\.[0-9]{{1,19}}){{{count}}})\.[0-9a-f]{{8}}"
        match = re.fullmatch(pattern, text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError("not a snapshot this tool returned")
        snapshot = cls(*(int(g) for g in match.group(1)[1:].split(".")))
        if snapshot.encode(about) != match.group(0):
            raise ValueError("it was returned for another query, or was altered")
        if any(getattr(snapshot, f.name) > f.metadata.get("ceiling", MAX_ID)
               for f in fields(cls)):
            raise ValueError("out of range")
        return snapshot

    @classmethod
    def resume(cls: type[S], text: str | None, about: str, fresh: Callable[[], S]) -> S:
        """The snapshot a later page passes (``decode``), else ``fresh()``, the store now,
        for a first page: no token, or a blank one, as models pass for an optional
        argument. ValueError as ``decode``."""
        if not (text or "").strip():
            return fresh()
        return cls.decode(text, about)
