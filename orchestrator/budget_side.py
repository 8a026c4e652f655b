"""How big things are for a compaction (a mixin of ``TroveEngine``): the room a
result has in both units, the host's overhead and how it counted the request,
whether the host will take a result, the tail's per-message cost, the leaf chunk
size and critical pressure. The rules live in ``compaction/budget``; this side
feeds them the engine's samples.

Pure moves out of ``engine.py``; the methods read the engine's own attributes
(``config``, ``context_length``, ``_overhead_tokens``, ``_real_overhead``,
``_provider_prompt_tokens``...).
"""

from __future__ import annotations

from typing import Callable

from ..compaction import assemble, tokens
from ..compaction.budget import (DEFAULT_OVERHEAD_TOKENS, Budget, as_counted,
                                 bounded_real_overhead, host_overhead_floor, host_sees_progress)
from ..ingest.policy import NEVER_STUBBED
from ..storage import codec

# What a replay stub costs (header + 1,500 characters of preview), for tail sizing.
STUB_TOKENS_ESTIMATE = 600
# The learned real overhead is kept in the session's state under this key, written
# again only when it moved by more than the larger of these (tokens, share of it).
# A compaction the host asks for on its overflow path brings the list to this share of
# what it holds (``_host_overflow_trigger``).
OVERFLOW_SHARE = 0.75
OVERHEAD_KEY = "real_overhead"
OVERHEAD_KEPT_SLACK = 256
OVERHEAD_KEPT_SHARE = 0.05


class BudgetSide:
    """Token accounting for ``TroveEngine._compress`` (see the module docstring)."""

    def _budget(self, messages: list, system: dict | None, current_tokens: int | None,
                trigger: int, rough: Callable[[dict], int] | None = None) -> Budget:
        """Room for this compaction's result in both units (see ``compaction/budget``)."""
        host_overhead = self.overhead_estimate(messages, current_tokens, rough)
        return Budget(target=int(trigger * (1 - assemble.TARGET_MARGIN)),
                      host_overhead=host_overhead,
                      real_overhead=bounded_real_overhead(self._real_overhead, host_overhead),
                      system_rough=self.rough_message(system) if system is not None else 0,
                      system_exact=self.count_message(system) if system is not None else 0)

    def _tail_counter(self):
        """Token cost of a message in the fresh tail, as the provider gets it
        (``sent_count``): a result that active-replay stubbing will shrink is counted
        at its stub size, so stubbing keeps more turns raw instead of summarizing them."""
        cfg = self.config
        if not cfg.large_output_active_replay_stubbing_effective:
            return self.sent_count
        limit = cfg.large_output_active_replay_stub_threshold_tokens

        def count(message: dict) -> int:
            tokens = self.sent_count(message)
            if (tokens > limit and message.get("role") == "tool"
                    and isinstance(message.get("content"), str)
                    and codec.tool_name_of(message) not in NEVER_STUBBED):
                return min(tokens, STUB_TOKENS_ESTIMATE)
            return tokens
        return count

    def _chunk_tokens(self, backlog: list) -> int:
        """Leaf chunk size: fixed, or with dynamic chunking grown with the backlog."""
        cfg = self.config
        if not cfg.dynamic_leaf_chunk_enabled:
            return cfg.leaf_chunk_tokens
        total = sum(row[3] for row in backlog)
        return max(cfg.leaf_chunk_tokens, min(cfg.dynamic_leaf_chunk_max, total // 2))

    def _under_critical_pressure(self, current_tokens: int | None) -> bool:
        """Above the critical ratio of the window, summarize deterministically (fast)."""
        ratio = self.config.critical_budget_pressure_ratio
        current = current_tokens or self.last_prompt_tokens
        return bool(ratio and self.context_length and current
                    and current >= ratio * self.context_length)

    def _host_takes(self, messages: list, result: list, current_tokens: int | None,
                    force: bool = False) -> bool:
        """Whether the host takes ``result`` as the turn's history (``host_sees_progress``);
        a /compress (``force``) and a pass after a tool call (the provider's count, its
        history always taken) do."""
        return force or current_tokens == self._provider_prompt_tokens \
            or host_sees_progress(messages, result, current_tokens)

    def _host_overhead_of(self, messages: list, current_tokens: int | None) -> int | None:
        """The host's overhead around ``messages`` as its figure ``current_tokens``
        shows it (else the one remembered), for ``RealProjection.recount`` while the
        real overhead is not learned (system prompt and schemas are text, where
        chars/4 is close to real tokens).

        Why: before the first reply the list's real size was unknown, so a first turn
        of 60K Chinese characters (17K by the host's chars/4, 64K real in a 64K window)
        was taken as under the trigger, even on the host's retry after the provider
        refused it, and the host gave up: "cannot compress further"
        (tests/test_budget_promises.py seed 153)."""
        if current_tokens and current_tokens > 0 \
                and current_tokens != self._provider_prompt_tokens:
            return max(0, current_tokens - sum(self.rough_message(m) for m in messages))
        return self._overhead_tokens

    def _host_rough(self, messages: list, current_tokens: int | None) -> Callable[[dict], int]:
        """The host's estimate of a message as ``current_tokens`` counted it
        (``budget.as_counted``); a provider's real count says nothing of that."""
        if current_tokens == self._provider_prompt_tokens:
            return self.rough_message
        return as_counted(messages, current_tokens, self._overhead_tokens, self.rough_message)

    def overhead_estimate(self, messages: list, current_tokens: int | None,
                          rough: Callable[[dict], int] | None = None) -> int:
        """What the host adds around the messages (system prompt, tool schemas), in
        the host's own units: ``current_tokens`` is its rough estimate of the whole
        request, so the difference with its estimate of the messages is exact.
        Remembered from the last time without it, else the documented default.

        A sample below what this copy saw before is not believed (the host may
        estimate a list other than the one it hands over, e.g. without the message
        just re-sent): system prompt and schemas change rarely, and an overhead
        taken too small overflows the host's trigger, one taken too large only
        keeps a shorter tail. Once the provider's usage is known, the host's
        overhead is never taken below ``budget.host_overhead_floor`` of it.

        After a tool call the host hands over the provider's real prompt count
        instead (``approx_tokens=last_prompt_tokens``): real tokens of a request
        the list has grown past, not host units, so it is no sample (taken as one,
        it set the overhead 7K too high and starved the tail). ``rough``: a message
        as ``current_tokens`` counted it (``budget.as_counted``)."""
        if current_tokens and current_tokens > 0 \
                and current_tokens != self._provider_prompt_tokens:
            shown = sum((rough or self.rough_message)(m) for m in messages)
            limit = max(0, self.context_length // 2) or current_tokens
            sample = max(0, min(current_tokens - shown, limit))
            self._overhead_tokens = max(sample, self._overhead_tokens or 0)
        if self._overhead_tokens is None:
            return DEFAULT_OVERHEAD_TOKENS
        return max(self._overhead_tokens, host_overhead_floor(self._real_overhead))

    def _keep_overhead(self) -> None:
        """Keep the learned real overhead in the session's state when it moved by more
        than ``OVERHEAD_KEPT_SLACK`` / ``OVERHEAD_KEPT_SHARE`` since this copy kept it
        there (a write only then, not every turn; in each session the copy is bound
        to: one kept under another session says nothing of this one's state), so a copy bound to the session later (a restart, a /resume in a
        new process) knows it before its first reply (``recall_overhead``)."""
        learned, session = self._real_overhead, self.canonical_id
        kept_in, kept = self._kept_overhead or (None, None)
        if learned is None or not session or not self.stores or (
                kept_in == session and abs(learned - kept) <= max(
                    OVERHEAD_KEPT_SLACK, kept * OVERHEAD_KEPT_SHARE)):
            return
        self.store.update_session_state(session, {OVERHEAD_KEY: learned})
        self._kept_overhead = (session, learned)

    def recall_overhead(self) -> None:
        """At a bind: the real overhead the session learned in an earlier process,
        while this copy has learned none (a copy that has keeps its own: it is the
        same host's).

        Why: after a restart nothing knew the real size of the host's list until the
        first reply, and the host's overflow path (the provider refused the request
        as too long) hands ``compress`` its estimate of the messages without the tool
        schemas, so the refused request read as under the trigger: no compaction, and
        the host gave up on the turn (soak seed 1290001,
        tests/test_host_stepdown.py::test_a_step_down_right_after_a_restart_compacts_to_the_new_window).
        Never fails the bind: without it the overhead is learned at the next reply,
        as before."""
        if self._real_overhead is not None or not self.canonical_id or not self.stores:
            return
        try:
            state = (self.store.get_session(self.canonical_id) or {}).get("state") or {}
            kept = tokens.as_count(state.get(OVERHEAD_KEY))
        except Exception:  # noqa: BLE001 - a bookkeeping read must not fail a bind
            return
        if kept > 0:
            self._real_overhead, self._kept_overhead = kept, (self.canonical_id, kept)

    def _host_overflow_trigger(self, current_tokens: int) -> int | None:
        """The trigger for a ``compress`` the host asks for un-prompted below trove's own,
        or None (a no-op, as before).

        The host's overflow path: the provider refused the request as too long and
        named no limit (llama-server: "the request exceeds the available context
        size"), so the host kept its configured window and calls ``compress`` with its
        estimate of the messages alone (no tool schemas): a smaller figure than the
        request's, which ``should_compress`` declined this turn, and no reply came in
        between (``update_from_response`` clears it). Read as a no-op the
        host gave up on the turn, and on every turn after it, where its own compressor
        summarizes whatever it is handed (tests/test_host_stepdown.py). Such a call
        compacts to ``OVERFLOW_SHARE`` of what the list holds now (the larger of the
        two counts), each of the host's attempts a step smaller. Any other call
        (no figure declined this turn, or one as large) keeps the no-op."""
        declined = self._declined_at
        if not declined or current_tokens >= declined:
            return None
        self._declined_at = None
        return max(1, int(OVERFLOW_SHARE * self._real_projection.pressure(current_tokens)))
