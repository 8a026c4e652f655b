"""Whose session this is, from what the host says.

The owner key, in order of precedence:

0. no platform known yet (agent init binds the session with
   ``bind_session_state`` before ``on_session_start`` names the platform):
   the session alone, provisionally (``session:<id>``), whatever ids are
   known: the gateway builds its agents inside the chat's task context, so a
   user id is there at that bind, and a key made of it alone would be real
   (never replaced) and the same for that person's DM and every group chat
   they opened a session in;
1. the gateway's conversation key (``conversation_id``: the gateway's own unit
   of isolation, one per DM chat, per user in a per-user group, per shared
   chat otherwise): ``<platform>:conversation:<key>``;
2. a gateway user id (``HERMES_SESSION_USER_ID`` of the gateway's task
   context, or ``sender_id`` of ``pre_llm_call``) when there is no key:
   ``<platform>:user:<id>``;
3. a local platform (the CLI, the TUI, an editor, cron) without either: the
   profile's one local owner, so every CLI session of the profile is shared;
   except a cron run of a job scheduled from a gateway chat (``cron_job_owner``):
   ``cron:job:<job id>``;
4. otherwise (a gateway platform without ids) the session alone,
   provisionally, replaced by the first real key the host gives for it.

What the gateway's task context says (``gateway_identity``: the platform,
session key and user id of the message being handled) completes what the host
passes: the gateway's hygiene agent is built without a platform or key (the
host then says "cli"), yet it serves that chat. Ids are text: blank ones
(only whitespace) are no id at all.
"""

from __future__ import annotations

import os
import sys

from ..storage.owners import LOCAL_OWNER, PROVISIONAL_PREFIX
from . import cron

# Platforms of the profile's own user. An unknown platform is not one of them: the
# host may bind a session before saying where it comes from (agent init calls
# ``bind_session_state`` before ``on_session_start``), so it stays provisional.
LOCAL_PLATFORMS = frozenset({"cli", "tui", "local", "acp", "cron"})


def _text(value) -> str:
    """An id as text, "" for none or blank."""
    return "" if value is None else str(value).strip()


def owner_key(*, session_id: str, platform: str | None, conversation_id: str | None,
              user_id: str | None) -> str:
    """The owner key of a session (see the module doc for the precedence)."""
    platform = _text(platform).lower()
    conversation, user = _text(conversation_id), _text(user_id)
    if not platform:
        return f"{PROVISIONAL_PREFIX}{session_id}"
    if conversation:
        return f"{platform}:conversation:{conversation}"
    if user:
        return f"{platform}:user:{user}"
    if platform in LOCAL_PLATFORMS:
        return LOCAL_OWNER
    return f"{PROVISIONAL_PREFIX}{session_id}"


def session_owner(*, session_id: str, platform: str | None, conversation_id: str | None,
                  sender_id=None) -> tuple[str, dict]:
    """The owner key of a session and the facts it was made of (platform, user_id,
    chat_id, conversation_id: what ``Owners.record`` keeps): what the host said,
    completed by the gateway's task context (see the module doc)."""
    identity = gateway_identity()
    task = identity.get("platform") and identity.get("session_key")
    # A gateway task (it names both its platform and its session key) is the truth:
    # the host's own platform there may be its "cli" default (the hygiene agent is
    # built without one). A key alone is not a gateway task (the TUI's slash worker
    # exports its session id as HERMES_SESSION_KEY).
    platform = (identity["platform"] if task else _text(platform)) or None
    conversation = _text(conversation_id) or (identity["session_key"] if task else None)
    user = _text(sender_id) or identity.get("user_id") or None
    facts = {"platform": platform, "user_id": user, "chat_id": identity.get("chat_id"),
             "conversation_id": conversation}
    job = cron_job_owner(session_id) if (platform or "").lower() == "cron" else None
    if job and not conversation and not user:
        return job, facts
    return owner_key(session_id=session_id, platform=platform, conversation_id=conversation,
                     user_id=user), facts


def cron_job_owner(session_id: str) -> str | None:
    """The owner of a cron run's session when it is not the profile's own user's:
    ``cron:job:<job id>`` for a job scheduled from a gateway chat (its ``origin``
    names a platform), and for a job the scheduler of this process does not know.

    cron/scheduler.py runs every job as ``platform="cron"`` under
    ``cron_<job id>_<YYYYmmdd_HHMMSS>`` (``binding.cron``) with no user in the task
    context, so every run was the local owner's: one gateway user's job read
    another's (its prompt, its results) and the CLI user's sessions. A job made in
    the CLI has no origin and stays the local owner's; each run of a job stays its
    own session."""
    job_id = cron.job_of(session_id)
    if job_id is None:
        return None
    jobs = sys.modules.get("cron.jobs")   # loaded by the scheduler that runs the job
    try:
        job = jobs.get_job(job_id) if jobs is not None else None
    except Exception:
        job = None
    origin = job.get("origin") if isinstance(job, dict) else None
    if job is not None and not (isinstance(origin, dict) and _text(origin.get("platform"))):
        return None   # the profile's own job: the local owner
    return f"cron:job:{job_id}"


def local_operator() -> bool:
    """Whether the person typing an operator command (``/trove``) is the profile's own
    operator, who may read every owner's sessions.

    A messaging gateway serves other people: whoever types ``/trove`` there is one of
    its users, so the command runs as them (their session and its owner, the rule
    ``toolkit.scope.Access`` applies to the tools) and never reads another owner's
    sessions. The process is a gateway when its runner is alive (``gateway/run.py``
    keeps ``_gateway_runner_ref``; 0.19 dispatches a plugin command before it binds
    the message's session, so nothing else names the caller there) or when the task
    names a gateway platform. Everywhere else (the CLI, the TUI, ``scripts/trove.py``)
    the caller is the profile's operator."""
    platform = gateway_identity().get("platform")
    if platform and platform not in LOCAL_PLATFORMS:
        return False
    run = sys.modules.get("gateway.run")   # loaded only inside the host
    if run is None:
        return True
    try:
        return run._gateway_runner_ref() is None
    except Exception:  # a different host: a loaded gateway module is a gateway (fail closed)
        return False


def gateway_identity() -> dict:
    """The gateway's platform, session key, user and chat id for the current task
    ({} outside a gateway task: the CLI and cron set none)."""
    context = sys.modules.get("gateway.session_context")
    found = {}
    for key, name in (("platform", "HERMES_SESSION_PLATFORM"),
                      ("session_key", "HERMES_SESSION_KEY"),
                      ("user_id", "HERMES_SESSION_USER_ID"), ("chat_id", "HERMES_SESSION_CHAT_ID")):
        value = ""
        if context is not None:
            try:
                value = context.get_session_env(name, "")
            except Exception:
                value = ""
        else:
            value = os.environ.get(name, "")
        value = _text(value)
        if value:
            found[key] = value.lower() if key == "platform" else value
    return found
