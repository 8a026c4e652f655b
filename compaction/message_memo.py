"""Per-engine memo of what is computed per message: its row encoding, token counts
and identity fingerprint.

The host shows the engine the same message objects turn after turn. Encoding
a message (canonical JSON + SHA-256) and counting its tokens are the only
per-message costs of a turn, so each is done once per object. An entry is
reused only while the object still holds the very same role, content and
tool-call objects (held here, so their ids cannot be recycled), which makes a
stale hit impossible without an in-place edit of a list inside the message.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..storage import codec, identity
from . import assemble

MEMO_LIMIT = 8192


class Facts(NamedTuple):
    """What identity reads of one message, worked out once per message object: an
    ingest of a 1,000-message list is then one memo lookup per message."""

    encoded: codec.EncodedMessage | None   # the row it would be (None: never stored)
    fp: str | None                         # its identity fingerprint (None: never stored)
    block_fp: str | None                   # a block candidate's fingerprint (identity's)
    tail_key: str | None                   # a block candidate's key in the known tails
    ack: bool                              # an assistant message reading as the block's ack
    real_user: bool                        # a user turn with text the engine did not insert


# The facts of a message that is never stored (a leading system prompt).
NOT_STORED = Facts(encoded=None, fp=None, block_fp=None, tail_key=None, ack=False,
                   real_user=False)


def _holds(entry: list, message: dict) -> bool:
    """Whether a memo entry is still this message's: the very object, holding the
    very same role, content, tool calls and tool call id."""
    return (entry[0] is message and entry[1] is message.get("content")
            and entry[2] is message.get("tool_calls") and entry[3] == message.get("role")
            and entry[4] is message.get("tool_call_id"))


class MessageMemo:
    """Encodings and token counts keyed by message object."""

    def __init__(self, limit: int = MEMO_LIMIT):
        self.limit = limit
        self._entries: dict[int, tuple] = {}

    def __deepcopy__(self, memo):
        return MessageMemo(self.limit)  # a copy of the engine starts with an empty memo

    def _lookup(self, message: dict) -> list | None:
        entry = self._entries.get(id(message))
        return entry if entry is not None and _holds(entry, message) else None

    def _entry(self, message: dict) -> list:
        entry = self._lookup(message)
        if entry is None:
            if len(self._entries) >= self.limit:
                self._entries.clear()
            entry = [message, message.get("content"), message.get("tool_calls"),
                     message.get("role"), message.get("tool_call_id"), None, None, None, None,
                     None, None]
            self._entries[id(message)] = entry
        return entry

    def encoded(self, message: dict,
                prepare: Callable[[dict], codec.EncodedMessage | None]) -> codec.EncodedMessage | None:
        """The row encoding ``prepare`` gives for a message (None: not to be stored)."""
        entry = self._entry(message)
        if entry[5] is None:
            entry[5] = (prepare(message),)
        return entry[5][0]

    def tokens(self, message: dict, count: Callable[[dict], int]) -> int:
        """The token count of a message, counted once."""
        entry = self._entry(message)
        if entry[6] is None:
            entry[6] = count(message)
        return entry[6]

    def fingerprint(self, message: dict,
                    prepare: Callable[[dict], codec.EncodedMessage | None]) -> str | None:
        """The identity fingerprint of a message's stored form (None: not stored)."""
        entry = self._entry(message)
        if entry[7] is None:
            encoded = self.encoded(message, prepare)
            entry[7] = (None if encoded is None else identity.fingerprint_encoded(encoded),)
        return entry[7][0]

    def sidecar_tokens(self, message: dict, sidecar: str, count: Callable[[], int]) -> int:
        """The token count of a message as sent with its ``api_content`` sidecar, once
        per object and sidecar: the host stamps the sidecar after the message was
        first counted, so the entry holds the very string it was counted from."""
        entry = self._entry(message)
        if entry[10] is None or entry[10][0] is not sidecar:
            entry[10] = (sidecar, count())
        return entry[10][1]

    def rough(self, message: dict, estimate: Callable[[list], int]) -> int:
        """The host's rough estimate of a message (its own units), once per object.

        Keys the host adds later (``api_content``) change the estimate, so the
        entry is kept only while the message has the same keys."""
        entry = self._entry(message)
        keys = len(message)
        if entry[8] is None or entry[8][0] != keys:
            entry[8] = (keys, estimate([message]))
        return entry[8][1]

    def facts(self, message: dict,
              prepare: Callable[[dict], codec.EncodedMessage | None]) -> Facts:
        """Everything an ingest reads of a message (see ``Facts``), once per object.

        The same ``Facts`` object comes back while the message is unchanged, so a
        list whose facts are all the very ones an earlier list had is that list."""
        entry = self._entry(message)
        if entry[9] is None:
            candidate = assemble.is_block_candidate(message)
            content = message.get("content")
            entry[9] = Facts(
                encoded=self.encoded(message, prepare),
                fp=self.fingerprint(message, prepare),
                block_fp=identity.fingerprint_block(content) if candidate else None,
                tail_key=assemble.block_fingerprint(content) if candidate else None,
                ack=message.get("role") == "assistant" and assemble.is_trove_message(message),
                real_user=assemble.is_real_user(message))
        return entry[9]

    def facts_of(self, messages: list,
                 prepare: Callable[[dict], codec.EncodedMessage | None]) -> list[Facts]:
        """``facts`` of each message of a list: the memo's hits checked inline (an
        ingest asks this for every shown message, several times a turn)."""
        entries = self._entries
        out = []
        for message in messages:
            entry = entries.get(id(message))
            if entry is not None and entry[9] is not None and _holds(entry, message):
                out.append(entry[9])
            else:
                out.append(self.facts(message, prepare))
        return out

    def total_tokens(self, messages: list, count: Callable[[dict], int]) -> int:
        """The summed ``tokens`` of a list, the memo's hits checked inline (the turn's
        hook counts the whole history once per turn)."""
        entries = self._entries
        total = 0
        for message in messages:
            entry = entries.get(id(message))
            if entry is not None and entry[6] is not None and _holds(entry, message):
                total += entry[6]
            else:
                total += self.tokens(message, count)
        return total
