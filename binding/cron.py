"""Cron runs: which job a run's session belongs to, and one trove session per run.

cron/scheduler.py (``run_job``) runs every job as ``platform="cron"`` under
``cron_<job id>_<YYYYmmdd_HHMMSS>``: one AIAgent per run, one session id per
run, so a run's messages are its own session. The stamp has whole seconds, so
two runs of one job started in the same second (a scheduled tick and a manual
``hermes cron run``, a catch-up after a pause) get the same id, and their
messages landed in one session, interleaved. The host's id cannot change, so
the second run is stored under a session of its own, ``<id>-2`` (``-3`` ...),
that this engine copy keeps for the whole run (compaction boundaries included).
A run takes its session in the step that finds it free (``taken``: this process's
copies, and other processes through ``storage.locks.claim_run``), so two runs
bound at once, on two threads or in two processes, never both take one; the
hooks of both name the same host id and reach each run's own copy
(``binding.session.find_engine``).
"""

from __future__ import annotations

import re

# A run's session id as cron/scheduler.py makes it, or a second run's trove copy.
_RUN = re.compile(r"cron_(.+)_\d{8}_\d{6}(?:-\d+)?")
MAX_RUNS_PER_SECOND = 1_000   # past this many copies a run shares the last (never raises)


def job_of(session_id: str | None) -> str | None:
    """The job id of a cron run's session (a second run's copy included), else None."""
    match = _RUN.fullmatch(session_id or "")
    return match.group(1) if match else None


def run_session(store, dag, session_id: str, canonical: str, taken,
                bound: tuple[str | None, str | None] = (None, None)) -> str:
    """The canonical session a cron run that starts under ``session_id`` stores into.

    ``canonical`` is the one the host's id names. It is this run's when no earlier
    run used it: no messages, no summary nodes, and no other run has it
    (``taken(candidate)``: a run started in the same second that has stored nothing
    yet, in this process or another; when it answers False the candidate is this
    run's). Otherwise the first free ``<id>-N``. Not a
    cron run's id: ``canonical`` unchanged. ``bound``: the (host id, canonical) the
    engine copy is bound to now; a copy already bound to this id is this run (agent
    init binds, then ``on_session_start``; an in-place compaction) and keeps its own."""
    if job_of(session_id) is None or session_id != canonical:
        return canonical   # not a run, or an alias the store already decided
    if bound[0] == session_id and job_of(bound[1]):
        return bound[1]
    candidate = canonical
    for n in range(2, MAX_RUNS_PER_SECOND + 1):
        if not (store.count_messages(candidate) or dag.session_nodes(candidate)
                or taken(candidate)):
            break
        candidate = f"{session_id}-{n}"
    return store.ensure_session(candidate, source="cron")
