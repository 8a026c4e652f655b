"""Whose session this is, from what the host says.

The owner key, in order of precedence:

1. the gateway's conversation key (``conversation_id``: the gateway's own unit
   of isolation, one per DM chat, per user in a per-user group, per shared
   chat otherwise): ``<platform>:conversation:<key>``;
2. a gateway user id (``HERMES_SESSION_USER_ID`` of the gateway's task
   context, or ``sender_id`` of ``pre_llm_call``) when there is no key:
   ``<platform>:user:<id>``;
3. a local platform (the CLI, the TUI, an editor, cron) without either: the
   profile's one local owner, so every CLI session of the profile is shared;
4. otherwise (a gateway platform without ids, or no platform known yet) the
   session alone, provisionally (``session:<id>``), replaced by the first
   real key the host gives for it.
"""

from __future__ import annotations

import os
import sys

from ..storage.owners import LOCAL_OWNER, PROVISIONAL_PREFIX

# Platforms of the profile's own user. An unknown platform is not one of them: the
# host may bind a session before saying where it comes from (agent init calls
# ``bind_session_state`` before ``on_session_start``), so it stays provisional.
LOCAL_PLATFORMS = frozenset({"cli", "tui", "local", "acp", "cron"})


def owner_key(*, session_id: str, platform: str | None, conversation_id: str | None,
              user_id: str | None) -> str:
    """The owner key of a session (see the module doc for the precedence)."""
    platform = (platform or "").strip().lower()
    if conversation_id:
        return f"{platform or 'gateway'}:conversation:{conversation_id}"
    if user_id:
        return f"{platform or 'gateway'}:user:{user_id}"
    if platform in LOCAL_PLATFORMS:
        return LOCAL_OWNER
    return f"{PROVISIONAL_PREFIX}{session_id}"


def gateway_identity() -> dict:
    """The gateway's user and chat id for the current task ({} outside a gateway)."""
    context = sys.modules.get("gateway.session_context")
    found = {}
    for key, name in (("user_id", "HERMES_SESSION_USER_ID"), ("chat_id", "HERMES_SESSION_CHAT_ID")):
        value = ""
        if context is not None:
            try:
                value = context.get_session_env(name, "")
            except Exception:
                value = ""
        else:
            value = os.environ.get(name, "")
        if value:
            found[key] = str(value)
    return found
