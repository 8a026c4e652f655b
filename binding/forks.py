"""Which shown messages belong to a host fork, and which session the host is in.

Hermes 0.19 runs a background skill/memory review after busy turns: a fork
agent that SHARES the user's session id, replays the user's conversation and
adds a harness prompt ("Review the conversation above and update the skill
library ...") plus its own reply. Those turns are not the user's conversation
(the host strips them from its own state.db too), so when the newest user
message is a harness prompt, nothing from it on is stored. The host marks the fork agent
(``_persist_disabled``), but the engine never sees the agent: what it does see
is the harness prompt in the messages, so that is what is recognised here.

``host_session_hint`` reads the session id the host last announced to this
thread of execution (``HERMES_SESSION_ID``: the gateway's per-task context
variable, else the process environment); the engine uses it only as the
lowest-precedence signal of a session switch nobody told it about.
"""

from __future__ import annotations

import os
import sys
import threading

# The distinctive openings of the host's review prompts (agent/background_review.py:
# skill, memory and combined review; hermes_state._REVIEW_HARNESS_PREFIXES lists the
# first two). Matched case-sensitively against the start of a user/system message.
REVIEW_HARNESS_PREFIXES = (
    "Review the conversation above and update the skill library",
    "Review the conversation above and consider saving to memory",
    "Review the conversation above and update two things",
)

_thread = threading.local()


def is_review_harness(message) -> bool:
    """True for the host's background-review harness prompt (a user/system message
    whose text starts with one of the review prompts)."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "system"):
        return False
    content = message.get("content")
    if isinstance(content, list):  # a list of parts: the first text part decides
        content = next((p.get("text") for p in content
                        if isinstance(p, dict) and isinstance(p.get("text"), str)), None)
    if not isinstance(content, str):
        return False
    head = content.lstrip()
    return head.startswith(REVIEW_HARNESS_PREFIXES)


def review_start(messages) -> int | None:
    """Index of the review fork's harness prompt when it is the newest user message of
    ``messages`` (a fork's turn: its prompt, tool calls and replies follow), or None.

    Only the newest user message counts: a conversation that merely contains such
    text earlier (a user who typed it, then went on) is the user's, and is stored."""
    messages = messages or ()
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            return index if is_review_harness(message) else None
    return None


def user_part(messages: list) -> list:
    """``messages`` without the review fork's turns (the same list when there are none)."""
    start = review_start(messages)
    return messages if start is None else messages[:start]


def note_review_session(session_id: str | None) -> None:
    """Remember, for this thread, the user session a review fork's hook named.

    The fork's own engine copy was bound to a throwaway id at the fork's start;
    its tool calls (same thread) read this to answer read-only from the user's
    session instead."""
    _thread.review_session = session_id or None


def review_session() -> str | None:
    """The user session a review fork running on this thread belongs to (or None)."""
    return getattr(_thread, "review_session", None)


def host_session_hint() -> str:
    """``HERMES_SESSION_ID`` as the host scopes it: the context variable the gateway
    (and the CLI on /new, /resume, /branch) sets, else the environment; "" if none.

    Not the environment in a process that serves several sessions at once (the
    messaging gateway, the TUI, cron: ``session_context_engaged``) when this task
    bound none: there the variable in ``os.environ`` is whichever agent started
    last, in any chat (the gateway resets a message's variables before it
    dispatches a slash command, so ``/trove`` read another user's session and
    ``/trove rotate apply`` rotated it). The host's own subprocess bridge draws
    the same line."""
    context = sys.modules.get("gateway.session_context")  # loaded only inside the host
    if context is not None:
        try:
            if _unbound_in_shared_process(context):
                return ""
            value = context.get_session_env("HERMES_SESSION_ID", "")
            return (value or "").strip()
        except Exception:  # an older or different host: the environment decides
            pass
    return os.environ.get("HERMES_SESSION_ID", "").strip()


def _unbound_in_shared_process(context) -> bool:
    """Whether this task bound no session id in a process serving several sessions
    (the host's private sentinel; an older host without it: False)."""
    var = getattr(context, "_VAR_MAP", {}).get("HERMES_SESSION_ID")
    unset = getattr(context, "_UNSET", None)
    engaged = getattr(context, "session_context_engaged", None)
    return (var is not None and unset is not None and callable(engaged)
            and var.get() is unset and bool(engaged()))
