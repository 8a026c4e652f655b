"""What the host shows the engine, stored once (a mixin of ``TroveEngine``): the
ingest entry points, the turn's user message (``pre_llm_call`` / ``post_llm_call``),
the engine's own blocks in a shown list, per-message counts in both units and the
real overhead learned after a turn. Which shown message is which row is
``storage/identity``'s decision; this side prepares what it reads.

Pure moves out of ``engine.py``; the methods read the engine's own attributes
(``store``, ``policy``, ``config``, ``_memo``, ``counter``...).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace

from ..binding import forks
from ..binding import session as session_binding
from ..compaction import assemble, fallback, known_tails, tokens
from ..compaction.budget import api_form, host_estimator, host_kept_text
from ..compaction.message_memo import NOT_STORED
from ..storage import codec, identity
from ..store import KnownTail

log = logging.getLogger(__name__.rsplit(".", 2)[0] + ".engine")  # the engine's own log


def _user_sent(message: dict) -> bool:
    """A user message with text that is not the engine's: a real user turn, or a copy
    of a block that identity read as the user's (the caller checks that)."""
    return assemble.is_real_user(message) or assemble.is_block_candidate(message)


@dataclass(frozen=True)
class _LastIngest:
    """This copy's last ingest of its own session: what it read (the messages'
    ``Facts`` and timestamps, and the reading given to identity), the view it wrote
    and its answer. The next turn's list goes on from it (``_read_after``)."""

    key: tuple
    facts: list
    stamps: list
    view: object
    db: object
    answer: tuple           # (store_ids, engine flags)
    read: tuple             # what ``_read_whole`` (or ``_read_after``) gave identity
    simple: bool            # no repeated block, no timed copies (rules 5 and 7 idle)


class IngestSide:
    """The engine's ingest methods."""

    # ------------------------------------------------------- the turn in progress
    # ``_pending_turn``: (message, fingerprint, session) that ``pre_llm_call`` named;
    # ``_turn_inserted``: (session, fingerprint) a compaction before it stored;
    # ``_noop_at_tokens``: the figure of this turn's hopeless compaction (see
    # ``should_compress``). Kept per session for every copy of the engine in this
    # process (``binding.session``): the hooks that end them reach one copy.
    def _turn_key(self) -> tuple[str, str] | None:
        canonical = self.__dict__.get("canonical_id")
        return (self.config.database_display, canonical) if canonical else None

    def _turn_field(self, field: str):
        key = self._turn_key()
        return None if key is None else session_binding.turn_state(key, field)

    def _set_turn_field(self, field: str, value) -> None:
        key = self._turn_key()
        if key is not None:
            session_binding.set_turn_state(key, field, value)

    _pending_turn = property(lambda self: self._turn_field("pending"),
                             lambda self, value: self._set_turn_field("pending", value))
    _turn_inserted = property(lambda self: self._turn_field("inserted"),
                              lambda self, value: self._set_turn_field("inserted", value))
    _noop_at_tokens = property(lambda self: self._turn_field("noop"),
                               lambda self, value: self._set_turn_field("noop", value))

    # ------------------------------------------------------------------ ingest
    def ingest(self, messages: list, into: str | None = None) -> list[int | None]:
        """Store every shown message once; return store_ids aligned with ``messages``.

        ``into`` names the host session the messages belong to when the host says so
        (``on_session_end``): a session this copy is not bound to gets them, never
        the bound one. A review fork's turns (from its harness prompt on) are never
        stored."""
        return self._ingest(messages, into=into)[0]

    def _ingest(self, messages: list, *, into: str | None = None, system_prompt: bool = True,
                handover: bool = False) -> tuple[list[int | None], list[bool]]:
        """Store every shown message once: store_ids aligned with ``messages`` and which
        of them the engine itself inserted. Only those, a leading system prompt
        (``system_prompt``) and messages the ignore patterns match are not stored.
        Which shown message is which row is ``storage/identity``'s decision."""
        canonical = self._ensure_bound()
        own = into is None or self.store.canonical_session(into) == canonical
        if self.review_fork or not (self.stores if own else self._stores_session(into)):
            # ignored, stateless or a fork: nothing is written
            return [None] * len(messages), [False] * len(messages)
        if not own:
            canonical = self.store.ensure_session(into, conversation_id=self.conversation_id,
                                                  source=self.platform)
        user_part = forks.user_part(messages)
        if user_part is not messages:
            ids, inserted = self._ingest(user_part, into=into, system_prompt=system_prompt,
                                         handover=handover)
            rest = len(messages) - len(user_part)
            return ids + [None] * rest, inserted + [False] * rest
        messages = [m if isinstance(m, dict) else {} for m in messages]
        system_prompt, facts = self._facts(messages, system_prompt)
        stamps = [m.get("timestamp") for m in messages]
        store = self.store
        key = (canonical, system_prompt, handover)
        last = self._last_read(store, key, own, facts, stamps)
        if last is not None and len(facts) == len(last.facts) and self._pending_turn is None:
            # the very list again (``compress`` and a tool call show the list the turn
            # just stored): identity would give the same rows, so it is not read again
            ids, engine = last.answer
            return list(ids), list(engine)
        read = self._read_after(last, messages, facts, stamps, canonical) if last else None
        if read is None:
            read = self._read_whole(messages, facts, stamps, canonical, own, system_prompt,
                                    handover)
        encoded, shown, known = read
        result = store.ingest(canonical, messages, skip=[e is None for e in encoded],
                              encoded=encoded, conversation_id=self.conversation_id,
                              source=self.platform, count_tokens=self.count_message,
                              known=known, shown=shown, hint=self._view if own else None)
        self._after_ingest(canonical, messages, shown.fps, shown, result, own)
        answer = result.store_ids, list(result.engine or [False] * len(messages))
        if own and result.view is not None and result.view is self._view:
            self._last_ingest = _LastIngest(key, facts, stamps, result.view, store.db, answer,
                                            read, simple=not shown.copies
                                            and len(shown.block_fps) <= 1)
        found = self._semantic()
        if found is not None and found.worker is not None:
            found.worker.poke()   # embedding happens on the worker's thread, never here
        return answer

    def _facts(self, messages: list, system_prompt: bool) -> tuple[bool, list]:
        """Whether the list opens with a system prompt not to store, and each message's
        ``Facts`` as an ingest reads them (``NOT_STORED`` for what is never stored)."""
        # a leading system prompt is not stored (nor prepared): only then does
        # ``system_prompt`` matter
        system_prompt = system_prompt and bool(messages) and messages[0].get("role") == "system"
        facts = self._memo.facts_of(messages[1:] if system_prompt else messages,
                                    self.policy.prepare)
        if system_prompt:
            facts.insert(0, NOT_STORED)
        # the notice of a fallback trim (``fallback.is_trim_notice``) is the engine's own
        # text, never conversation: stored, it read as a user message and the turns
        # after it were taken for new ones once the database worked again
        return system_prompt, [NOT_STORED if fallback.is_trim_notice(m) else f
                               for m, f in zip(messages, facts)]

    def _read_whole(self, messages: list, facts: list, stamps: list, canonical: str, own: bool,
                    system_prompt: bool, handover: bool) -> tuple:
        """What identity is given of a list: each message's encoding (None: not stored),
        the ``Shown`` reading and the known tail after the list's block."""
        legacy, known = self._read_blocks(
            messages, {i: f.tail_key for i, f in enumerate(facts) if f.tail_key is not None})
        if not own:
            known = None  # the known tails are this copy's own session's
        block_fps = {i: f.block_fp for i, f in enumerate(facts) if f.block_fp is not None}
        turn_index = self._turn_index(messages, facts, canonical)
        last = len(facts) - 1 if facts and facts[-1].encoded is not None else None
        for i in identity.user_sent(block_fps, turn_index, last):
            legacy[i] = False  # a block's text the user sent is a message, whatever was known
        encoded = [None if legacy[i] or (system_prompt and i == 0) else f.encoded
                   for i, f in enumerate(facts)]
        fps = [None if e is None else f.fp for e, f in zip(encoded, facts)]
        shown = identity.Shown(
            fps=fps, block_fps=block_fps,
            ack_at=frozenset(i for i, f in enumerate(facts) if f.ack),
            preinserted=frozenset(i for i, flag in enumerate(legacy) if flag),
            origin=self._view_origin(), turn_index=turn_index,
            copy_from=self._copy_from if own else None, earlier=self._earlier,
            roles=tuple(str(m.get("role") or "") for m in messages), handover=handover,
            copies=identity.timed_copies(
                [None if i in block_fps else fp for i, fp in enumerate(fps)], stamps),
            stamps=tuple(stamps))
        return encoded, shown, known

    def _read_after(self, last: "_LastIngest", messages: list, facts: list, stamps: list,
                    canonical: str) -> tuple | None:
        """``_read_whole`` for the next turn's list: it goes on from the list this copy
        read last, so that reading is reused and only the new messages are read. None
        (read it whole) unless what follows is plain conversation: no block or
        acknowledgement, no timed copy, the turn's message (if named) among it, after
        a list without a repeated block or copies."""
        k = len(last.facts)
        added = facts[k:]
        if not last.simple or not k or any(f.block_fp is not None or f.ack for f in added):
            return None
        turn_index = self._turn_index(messages, facts, canonical)
        if turn_index is not None and turn_index < k:
            return None
        encoded, shown, known = last.read
        fps = shown.fps + [f.fp for f in added]
        if any(s not in (None, "") for s in stamps[k:]) and identity.timed_copies(fps, stamps):
            return None
        shown = replace(
            shown, fps=fps, turn_index=turn_index,
            origin=self._view_origin(), copy_from=self._copy_from, earlier=self._earlier,
            roles=shown.roles + tuple(str(m.get("role") or "") for m in messages[k:]),
            settled=last.answer, stamps=tuple(stamps))
        return encoded + [f.encoded for f in added], shown, known

    def _last_read(self, store, key: tuple, own: bool, facts: list,
                   stamps: list) -> "_LastIngest | None":
        """This copy's last ingest when this list starts with that very list (the same
        message objects, unchanged, with the same timestamps) and nothing since
        changed what identity would read: the view it wrote is still this copy's
        newest (a compaction, a rebinding or another ingest replaces it)."""
        last = self._last_ingest
        k = len(last.facts) if last is not None else 0
        if (last is None or not own or last.view is not self._view or last.db is not store.db
                or last.key != key or len(facts) < k or last.stamps != stamps[:k]
                or any(a is not b for a, b in zip(last.facts, facts))):
            return None
        return last

    def _after_ingest(self, canonical: str, messages: list, fps: list, shown, result,
                      own: bool) -> None:
        """What one ingest tells this copy: its newest view, the turn's user row, and
        a list that was another session's (said once)."""
        if own and result.view is not None:
            self._view = result.view
        if result.foreign_of and (canonical, result.foreign_of) not in self._foreign_noted:
            self._foreign_noted.add((canonical, result.foreign_of))
            log.info("hermes-trove: a list handed over for session %s is session %s's "
                     "transcript; nothing of it was stored again", canonical,
                     result.foreign_of)
        engine_own = result.engine or [False] * len(messages)
        sent = [not own_ and _user_sent(m) for m, own_ in zip(messages, engine_own)]
        newest = next((i for i in range(len(messages) - 1, -1, -1) if sent[i]), None)
        if shown.turn_index is not None:
            self._pending_turn = None  # the turn's user message has its row now
        elif newest is not None and newest == len(messages) - 1 \
                and newest in result.new_positions:
            # the host's preflight compaction, before ``pre_llm_call``, stored the
            # turn's message: the list ends with it. A list whose newest user message
            # was answered (a /compress, a /branch between turns) stored an old one.
            self._turn_inserted = (canonical, fps[newest])
        if own:
            for sid, user in zip(reversed(result.store_ids), reversed(sent)):
                if sid is not None and user:
                    self.current_turn_store_id = sid
                    break

    def _view_origin(self) -> str:
        """This copy's name in the views table (a new one per copy and binding)."""
        if not self._origin:
            self._origin = uuid.uuid4().hex[:12]
        return self._origin

    def _turn_index(self, messages: list, facts: list, canonical: str) -> int | None:
        """Where the turn's user message (``note_user_turn``) stands in this list,
        while it has no row yet: the very object, else the newest user message with
        its fingerprint. A message whose text is one of the engine's blocks counts: the
        user sent it (pasted from a log, an earlier prompt), so it is the user's."""
        pending = self._pending_turn
        if pending is None or pending[2] != canonical:
            return None
        obj, fp = pending[0], pending[1]
        users = [i for i, f in enumerate(facts) if f.real_user or f.block_fp is not None]
        for i in reversed(users):
            if messages[i] is obj:
                return i
        if users and facts[users[-1]].fp == fp:
            return users[-1]
        return None

    def note_user_turn(self, message: dict | None) -> None:
        """``pre_llm_call``: the user just sent ``message``. It is a new message even
        when its text equals an undone or retried one, so the first list showing it
        stores it as a new row (``storage/identity`` rule 2), unless this turn's
        compaction already did. The no-op guard a /compress left between turns ends
        here (see ``turn_done``)."""
        self._noop_at_tokens = self._declined_at = None
        if isinstance(message, dict):
            try:  # the list grew by this message since the provider counted it
                self._real_projection.grew(self.sent_count(message))
            except Exception:  # bookkeeping must never break the turn
                self._real_projection.forget()
        if not isinstance(message, dict) or not self.canonical_id or not self.stores:
            return
        try:
            fp = self._memo.fingerprint(message, self.policy.prepare)
        except Exception:  # bookkeeping must never break the turn
            return
        done, self._turn_inserted = self._turn_inserted, None
        if fp is None or done == (self.canonical_id, fp):
            self._pending_turn = None
            return
        self._pending_turn = (message, fp, self.canonical_id)

    def note_tool_result(self, result, tool_call_id: str = "", tool_name: str = "") -> None:
        """``post_tool_call``: a tool result joined the host's list since the provider
        counted it, so the real tokens the list holds grew by it (``RealProjection``).

        Why: the host checks the request before its next model call on chars/4, which
        counts CJK and emoji text about five times low; a 60K-character Chinese tool
        output stayed under its figure of the trigger and the request went out at
        110K real tokens in a 64K window (tests/test_budget_promises.py seed 12)."""
        try:
            text = host_kept_text(result if isinstance(result, str) else str(result),
                                  str(tool_name or ""), self.context_length)
            self._real_projection.grew(self.counter.count_message(
                {"role": "tool", "content": text,
                 "tool_call_id": str(tool_call_id or ""), "name": str(tool_name or "")}))
        except Exception:  # bookkeeping must never break the turn
            self._real_projection.forget()

    def turn_done(self) -> None:
        """``post_llm_call``: the turn is over; the next user message is a new turn.

        The no-op guard (``should_compress``) ends with the turn: it keeps the host from
        retrying a compaction that could do nothing at this size within the turn, but
        the next turn's list is another list, and its figure may be counted otherwise
        (the host counts the current turn's message once before an API call, older
        ones twice before a turn), so a figure under the old guard can still be over
        with work to do (host walk seed 30004)."""
        self._turn_inserted = None
        self._noop_at_tokens = self._declined_at = None

    def stored_form(self, message: dict) -> dict:
        """The message as its row holds it (redacted, payloads externalized): what
        summaries are made from, so no secret or inline payload reaches them."""
        encoded = self._memo.encoded(message, self.policy.prepare)
        return message if encoded is None else codec.decode_encoded(encoded)

    def count_message(self, message: dict) -> int:
        """Tokens of one message, counted once per message object."""
        return self._memo.tokens(message, self.counter.count_message)

    def count_messages(self, messages: list) -> int:
        """Tokens of a list of messages (memoized per message)."""
        return self._memo.total_tokens(messages, self.counter.count_message)

    def sent_count(self, message: dict) -> int:
        """Tokens of one message as the provider receives it: its ``api_content``
        sidecar (the text and what was injected for its turn: a memory provider's
        prefetch, a context plugin's block, trove's own recall note) in place of its
        content (``budget.api_form``). The one per-message count of the budget: the
        learned overhead, the projection of the list, the tail and the result's size
        all use it.

        Why: the host replays every historical user message's sidecar, not only the
        current turn's (``agent/conversation_loop.py``), and the provider's prompt
        tokens count them. The note on a session's first message counted only in the
        overhead kept room for it once a compaction had summarized that message
        (host walk 120004); sidecars counted only there let a memory provider's
        1.5K-token prefetch per turn go out uncounted for every user message kept,
        and requests went over the trigger by 6.5K in a 32K window
        (tests/test_host_sidecars.py). Memoized per object and sidecar string: the
        host stamps the sidecar on a message after trove has first counted it."""
        form = api_form(message) if isinstance(message, dict) else message
        if form is message:
            return self.count_message(message)
        return self._memo.sidecar_tokens(message, message["api_content"],
                                         lambda: self.counter.count_message(form))

    def sent_tokens(self, messages: list) -> int:
        """Tokens of a list as the provider receives it (``sent_count`` of each)."""
        total = self.count_messages(messages)
        for message in messages or ():
            if isinstance(message, dict) and api_form(message) is not message:
                total += self.sent_count(message) - self.count_message(message)
        return total

    def _engine_own(self, messages: list) -> list[bool]:
        """Which shown messages are the engine's own block and acknowledgement, as an
        ingest of the list reads them (a block a view of the session holds, or one an
        older version remembered; a copy of one the user sent is a message:
        ``identity.user_sent``, ``own_flags``), storing nothing."""
        if not any(assemble.is_block_candidate(m) for m in messages) or not self.canonical_id:
            return self._read_blocks(messages)[0]
        canonical = self.canonical_id
        system_prompt, facts = self._facts(messages, True)
        _, shown, _ = self._read_whole(messages, facts, [m.get("timestamp") for m in messages],
                                       canonical, True, system_prompt, False)
        return self.store.engine_elements(canonical, shown)

    def _read_blocks(self, messages: list, candidates: dict[int, str] | None = None
                     ) -> tuple[list[bool], KnownTail | None]:
        """Which shown messages the engine inserted, and what it returned after the
        block the list carries (see ``known_tails.read``; ``candidates`` as there)."""
        def state() -> dict:
            if not self.canonical_id:
                return {}
            return (self.store.get_session(self.canonical_id) or {}).get("state", {})
        self._known_tails, inserted, known = known_tails.read(messages, self._known_tails, state,
                                                              candidates)
        return inserted, known

    def rough_message(self, message: dict) -> int:
        """The host's own rough estimate of one message (memoized per object)."""
        return self._memo.rough(message, host_estimator())

    def learn_overhead(self, history: list) -> None:
        """After a turn: the provider's real prompt tokens minus trove's exact count of
        what was sent (everything before the final reply, each message as the provider
        got it: ``sent_tokens``) is the real overhead.

        The count is the turn's own (``update_from_response`` keeps it per session for
        every copy): ``post_llm_call`` reaches the copy bound last, and with two CLIs
        on one session in one process that copy's own last count was of another list
        (host walk 170003: the other CLI's turn paired with this copy's count set the
        overhead to 27K, and the summary block had no room left)."""
        prompt = tokens.as_count(self._turn_field("prompt") or self.last_prompt_tokens)
        self._set_turn_field("prompt", None)
        if not prompt or prompt <= 0 or not history:
            return
        sent = history[:-1] if history[-1].get("role") == "assistant" else history
        self._real_overhead = max(0, prompt - self.sent_tokens(sent))
        self._keep_overhead()

    def _remember_returned(self, result: list, tail: list, frontier_ids: list | None, *,
                           has_block: bool) -> None:
        """The list ``compress`` returns is what the host shows next: remember it as a
        view (its block, acknowledgement and each tail message's row), and the newest
        row it was shown: rows it dropped (an empty reply, an orphan result) are not
        what the host appends next."""
        seen = max((sid for _, sid in (self._view.entries if self._view else ())), default=0)
        body = result[1:] if result and result[0].get("role") == "system" else result
        entries = []
        if has_block and body:
            entries.append((identity.fingerprint_block(body[0].get("content")),
                            identity.BLOCK_ID))
            if len(body) > len(tail) + 1:
                entries.append((identity.ACK_FP, identity.ACK_ID))
        for message, (_, sid) in zip(body[len(body) - len(tail):], tail):
            facts = self._memo.facts(message, self.policy.prepare)
            fp = identity.held_fp(facts.fp, facts.block_fp)  # as the ingest's views hold it
            if sid is not None and fp is not None:
                entries.append((fp, int(sid)))
        try:
            view = self.store.save_view(self.canonical_id, self._view_origin(), entries,
                                        meta={"frontier": frontier_ids or [],
                                              "seen": seen})
        except Exception as exc:  # the next list is then read against the stored history
            self.errors.append(f"view: {exc}")
            return
        if view is not None:
            self._view = view

    def _replay_stubs(self, tail: list, store_ids: list[int]) -> list:
        """Active-replay stubbing (opt-in): textual tool results over the stub threshold
        are replayed as their externalized placeholder; everything else unchanged."""
        cfg = self.config
        if not cfg.large_output_active_replay_stubbing_effective:
            return tail
        limit = cfg.large_output_active_replay_stub_threshold_tokens
        big = [i for i, m in enumerate(tail) if store_ids[i] is not None
               and m.get("role") == "tool" and self.count_message(m) > limit]
        if not big:
            return tail
        rows = self.store.get_messages(store_ids[i] for i in big)
        out = list(tail)
        for i in big:
            row = rows.get(store_ids[i]) or {}
            stub = self.policy.stub_for(tail[i], row.get("content"))
            if stub is not None:
                out[i] = stub
        return out
