"""The work the engine starts off the turn's path (a mixin of ``TroveEngine``):
operator-requested rotation, the scheduled FTS check and empty-session GC, background
rollups, opt-in assertion extraction and transcript GC after a compaction.

Pure moves out of ``engine.py``; the methods read the engine's own attributes
(``store``, ``dag``, ``config``, ``policy``, ``_compactor``, ``_compaction_lock``...).
"""

from __future__ import annotations

import logging
import time

from ..binding.session import live_engines
from ..compaction import assemble, prepare, rollups
from ..compaction.compactor import PassReport
from ..evidence import assertions
from ..storage import integrity, lifecycle, timekeys
from ..storage.backup import backup_database, backup_dir
from ..storage.payloads import encode_text, ref_for, tool_output_placeholder
from ..store import decode_row

log = logging.getLogger(__name__)

# Rotation looks at most this many raw rows after the replay floor.
ROTATE_SCAN_LIMIT = 20_000
ROTATE_BACKUP_NAME = "trove-rotate-latest.db"


class Maintenance:
    """Rotation and the background housekeeping of ``TroveEngine``."""

    def rotate(self, apply: bool = False) -> dict:
        """Compact the bound session in place, keeping its id: the fresh tail stays,
        every older raw message is summarized and no longer replayed (still stored,
        still reachable with trove_load_session / trove_expand).

        Preview unless ``apply``; apply writes the rolling ``*-rotate-latest``
        backup first, and the host receives the rotated prompt at its next check.
        """
        if not self.canonical_id:
            return {"status": "refused", "reason": "no session is bound to this engine"}
        if not self.stores:
            return {"status": "refused", "reason": f"this session is {self.session_mode} "
                    f"(matched {self.session_filter_match!r}): trove does not store it"}
        if not apply:
            return self._rotate(apply=False)
        with self._compaction_lock():  # rows are read after any running compaction
            return self._rotate(apply=True)

    def _rotate(self, apply: bool) -> dict:
        """Rotate's plan, and with ``apply`` its writes (under the compaction lock)."""
        session, cfg = self.canonical_id, self.config
        floor = (self.store.get_session(self.canonical_id) or {}).get("replay_floor", 0)
        rows = self.store.session_messages(session, after_store_id=floor, limit=ROTATE_SCAN_LIMIT)
        covered = self.dag.covered_store_ids(r["store_id"] for r in rows)
        live = [(decode_row(r), r["store_id"]) for r in rows if r["store_id"] not in covered]
        messages = [m for m, _ in live]
        keep, _ = assemble.choose_tail(messages, assemble.group_units(messages),
                                       max_count=cfg.fresh_tail_count, max_tokens=None,
                                       count=self.count_message)
        older = [(live[i][1], messages[i], None, self.count_message(messages[i]))
                 for i in range(len(messages)) if i not in keep]
        kept_ids = [live[i][1] for i in sorted(keep)]
        new_floor = (min(kept_ids) - 1) if kept_ids else (older[-1][0] if older else floor)
        report = {"session_id": self.session_id, "older_messages": len(older),
                  "older_tokens": sum(r[3] for r in older), "tail_messages": len(kept_ids),
                  "replay_floor": max(floor, new_floor)}
        if not older:
            return {"status": "noop", "reason": "already rotated: only the fresh tail is live",
                    **report}
        backup_path = backup_dir(cfg.resolved_database_path) / ROTATE_BACKUP_NAME
        if not apply:
            return {"status": "preview", "backup": str(backup_path), **report}
        written = backup_database(cfg.database_target, backup_path)
        passes = PassReport()
        compactor = self._compactor(max(4_000, self.threshold_tokens))
        compactor.leaf_pass(session, older, chunk_tokens=cfg.leaf_chunk_tokens, focus=None,
                            deterministic_only=False, report=passes)
        compactor.condense(session, fanout=cfg.condense_fanout,
                           max_depth=cfg.incremental_max_depth, focus=None,
                           deterministic_only=False, report=passes)
        self.store.set_replay_floor(self.canonical_id, report["replay_floor"])
        self.store.update_session_state(self.canonical_id, {
            "last_rotate_at": time.time(), "last_rotate_backup": str(written)})
        self._rotate_pending = True
        return {"status": "rotated", "backup": str(written), "leaf_nodes": passes.leaf_ids,
                "condensed_nodes": passes.condensed_ids, **report}

    # ------------------------------------------------------------------ off the turn's path
    def _start_background_checks(self) -> None:
        """Schedule the deep FTS check when due; it runs on its own thread and connection."""
        try:
            store = self.store
            integrity.start_if_due(store.db.path, store.get_meta(integrity.CHECKED_AT_KEY),
                                   self.config.fts_integrity_check_interval_hours)
        except Exception as exc:  # maintenance must never block or break a session
            self.errors.append(f"fts check scheduling: {exc}")
        cfg = self.config
        if cfg.empty_lifecycle_gc_enabled:
            try:
                bound = {v for e in live_engines() for v in (e.session_id, e.canonical_id) if v}
                result = lifecycle.prune_if_due(
                    self.store.db, threshold=cfg.empty_lifecycle_gc_threshold,
                    max_age_hours=cfg.empty_lifecycle_gc_max_age_hours, keep=tuple(bound))
                self.lifecycle_gc = result or getattr(self, "lifecycle_gc", None)
            except Exception as exc:  # pruning is housekeeping, never a reason to fail
                self.errors.append(f"empty session gc: {exc}")

    def _maybe_prepare(self, current: int) -> None:
        """Past TROVE_BACKGROUND_PREPARE_SHARE of the trigger (and below it), let a
        background worker summarize the oldest chunks ahead; never waits for it."""
        cfg = self.config
        share = cfg.background_prepare_share
        if not (share and self.stores and self.canonical_id
                and share * self.threshold_tokens <= current < self.threshold_tokens):
            return
        try:
            if prepare.running(self.store.db.path, self.canonical_id):
                return  # the worker already runs: no job to build on this turn
            budget = (int(self.threshold_tokens * (1 - assemble.TARGET_MARGIN))
                      - self.overhead_estimate([], None))
            compactor = self._compactor(budget)
            prepare.start(prepare.Job(
                db_path=self.store.db.path, session_id=self.canonical_id,
                fresh_tail_count=cfg.fresh_tail_count, chunk_tokens=cfg.leaf_chunk_tokens,
                leaf_budget=compactor.leaf_budget, summarizer=self.summarizer(),
                lease_seconds=3 * cfg.summary_timeout_ms / 1000 + 60,
                tail_max_tokens=assemble.tail_token_cap(budget, cfg.fresh_tail_max_tokens),
                headroom_tokens=self.threshold_tokens - current,
                condensed_budget=compactor.condensed_budget, fanout=cfg.condense_fanout,
                max_depth=cfg.incremental_max_depth))
        except Exception as exc:  # preparation is an optimization, never a failure
            self.errors.append(f"background prepare: {exc}")

    def _start_rollups(self) -> None:
        """A background rollup pass when rollups are on (never on the turn's path)."""
        if not self.config.rollups_enabled or not self.stores:
            return
        try:
            rollups.start_background(self.store, self.dag, self.summarizer(),
                                     self.counter.count_text, rollups.settings_of(self.config),
                                     self.policy.feeds_rollups, self.clock)
        except Exception as exc:  # rollups must never break a turn
            self.errors.append(f"rollups: {exc}")

    def _extract_assertions(self, session: str, upto_store_id: int) -> None:
        """Opt-in (TROVE_ASSERTIONS_ENABLED): read assertions out of what was just compacted;
        a failure is logged and never stops the compaction. The model's answer has its
        secrets replaced when redaction is on (``IngestPolicy.redacting``, as a summary's):
        its subjects and values are stored and shown by trove_query_state, and a model
        can repeat or invent a secret its redacted prompt never held."""
        if not self.config.assertions_enabled:
            return
        try:
            assertions.extract_pending(self.store, session, upto_store_id,
                                       llm_call=self.policy.redacting(
                                           self.llm_call("compression")),
                                       model=self.config.summary_model or None,
                                       timeout_s=self.config.summary_timeout_ms / 1000,
                                       tz=timekeys.zone_or_utc(self.config.timezone))
        except Exception:
            log.exception("hermes-trove: assertion extraction failed")

    def _collect_transcript_garbage(self, store_ids: list[int]) -> int:
        """Transcript GC (opt-in): summarized tool rows whose exact text is already safe
        in a payload file (e.g. from the backfill script) shrink to their placeholder.

        Fails closed: the payload file is read back and must hash to its ref and decode
        to the row's exact text (``_payload_holds``). A file that is merely present (cut
        short by a full disk, altered, unreadable) keeps the row as it is: the row would
        otherwise be the only copy left and the placeholder would point at garbage."""
        cfg = self.config
        if not cfg.large_output_transcript_gc_enabled:
            return 0
        payloads, rewritten = self.policy.payloads, 0
        for store_id, row in self.store.get_messages(store_ids).items():
            content = row.get("content")
            if (row["role"] != "tool" or row["pinned"] or row["content_format"] != "text"
                    or len(content or "") <= cfg.large_output_externalization_threshold_chars):
                continue
            ref = ref_for(encode_text(content))
            if _payload_holds(payloads, ref, content) and self.store.replace_with_placeholder(
                    store_id, content, tool_output_placeholder(content, ref)):
                rewritten += 1
        return rewritten


def _payload_holds(payloads, ref: str, content: str) -> bool:
    """Whether the payload file of ``ref`` holds exactly ``content`` (read back and
    verified); any doubt (missing, corrupt, unreadable) is False."""
    try:
        return payloads.exists(ref) and payloads.get_text(ref) == content
    except Exception:  # a damaged or unreadable payload: keep the row
        return False
