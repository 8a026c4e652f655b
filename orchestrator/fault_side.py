"""When the engine cannot or must not store (a mixin of ``TroveEngine``): what is
wrong with the database, and the prompt kept bounded without it, by Hermes's own
compressor for sessions trove never stores or a trim of the host's own messages.

Pure moves out of ``engine.py``; the methods read the engine's own attributes
(``config``, ``_faults``, ``_builtin``, ``_runtime``, ``context_length``...).
"""

from __future__ import annotations

import logging
import time

from ..compaction import fallback
from ..storage import faults

log = logging.getLogger(__name__.rsplit(".", 2)[0] + ".engine")  # the engine's own log


class FaultSide:
    """Database faults and the fallback compaction (see the module docstring)."""

    @property
    def database_fault(self) -> dict | None:
        """What is wrong with the database (problem, repair), or None."""
        return self._faults.fault

    def _note_fault(self, exc: BaseException, where: str = "") -> dict:
        """Note a database error met in ``where`` (a hook or tool) and return what is
        wrong. An outage is remembered: until the database works again the engine
        keeps the prompt bounded without it and every tool says why. A statement
        error (``faults.is_outage``) fails only the call that ran into it: it is
        reported (logged a bounded number of times, kept for status) and the next
        hook uses the store again, so later turns are still stored."""
        fault = self._faults.note(self.config.database_display, exc, where)
        if fault.get("kind") == "statement":
            faults.report(self, f"database ({where or 'engine'})",
                          f"{fault['problem']}; {fault['repair']}")
        else:
            self.errors.append(f"database: {fault['problem']}")
        return fault

    def _usable_database(self) -> bool:
        """Whether to use the database now (see ``faults.Tracker.usable``)."""
        return self._faults.usable()

    def _compress_without_database(self, messages: list, current_tokens: int | None,
                                   focus: str | None) -> list:
        """A stored session while its database is unusable: the prompt is kept bounded
        by a trim of the host's own messages, never raising (this runs in
        ``compress``'s error handler too: a failure here keeps the list unchanged).

        Not Hermes's compressor, as for sessions trove never stores: its list holds
        rewritten messages (a summary, old tool outputs pruned to one-line notes)
        that the host shows again once the database works, and each of them, with
        the unchanged replies beside them, was stored as a new row: the session's
        history held the same turns twice. A trim returns the host's own message
        objects (and a notice that is never stored), so each is the row it was."""
        try:
            return self._compress_unstored(messages, current_tokens, focus, trim_only=True)
        except Exception as exc:  # never break the agent: the list goes back unchanged
            log.exception("hermes-trove: compaction without the database failed")
            self._last_compress_aborted = True
            self._last_summary_error = f"hermes-trove compaction failed: {exc}"
            self.last_compaction = {"at": time.time(), "outcome": "error",
                                    "reason": str(exc)[:500]}
            return messages

    def _compress_unstored(self, messages: list, current_tokens: int | None,
                           focus: str | None, trim_only: bool = False) -> list:
        """Ignored and stateless sessions: Hermes's own compressor, else a trim
        (``trim_only``: always the trim, see ``_compress_without_database``)."""
        if self._builtin is None and not trim_only:
            self._builtin = fallback.builtin_compressor(self._runtime, self.context_length,
                                                        self.threshold_percent)
        system = messages[0] if messages and messages[0].get("role") == "system" else None
        budget = self._budget(messages, system, current_tokens, self.threshold_tokens)
        result, path = fallback.compress_unstored(
            messages, compressor=None if trim_only else self._builtin,
            current_tokens=current_tokens, focus=focus,
            budget_tokens=budget.real_room + budget.system_exact,
            count=lambda m: budget.cost(self.sent_count(m), self.rough_message(m)))
        changed = result != messages and self._host_takes(messages, result, current_tokens)
        if changed:
            self.compression_count += 1
            self._last_compression_made_progress = True
            self._real_projection.forget()
        self.last_compaction = {"at": time.time(), "outcome": "delegated" if changed else "noop",
                                "path": path, "session_mode": self.session_mode}
        return result if changed else messages
