"""``/trove embed warmup | backfill [apply] | prune [apply]`` and ``scripts/trove.py embed``.

Operators prepare semantic search ahead of time, never inside a turn:
``warmup`` loads (for fastembed: downloads) the configured model; ``backfill``
counts what the index lacks (dry run) and with ``apply`` embeds it in bounded
batches, one transaction each, for at most ``max_seconds``. Run it again to
resume; rows already embedded are never redone (see ``recall.semantic``).
``prune`` lists the vectors other models left (never searched by this one) and
with ``apply`` deletes them. ``status`` says how far the index is and whether the
model still answers as the one that made its vectors (``recall.probe``).
"""

from __future__ import annotations

from ..ingest.redaction import redact_for
from ..recall import embeddings, semantic
from ..storage.database import get_database
from ..storage.vectors import GENERATION_MARK
from .actions import OperatorError, Target

BACKFILL_SECONDS = 300.0      # one backfill call runs at most this long (resumable)


def _provider(target: Target):
    """The configured provider, or an operator error saying why there is none."""
    state = embeddings.open_provider(target.config)
    if state.provider is None:
        raise OperatorError(f"embeddings are not available: {state.reason}")
    return state.provider


def warmup(target: Target) -> dict:
    """Load the model once (fastembed downloads it here, never in a turn)."""
    provider = _provider(target)
    return {"status": "ready", "provider": target.config.embedding_provider,
            "identity": vars(provider.identity) if provider.identity.dim else None,
            "detail": provider.warmup()}


def status(target: Target) -> dict:
    """The embedding status with the probe's verdict: the live engine's (its worker
    probes), else the configured model loaded and probed now (an operator asked, so
    the model is called; ``/trove status`` never calls it)."""
    from .families import embeddings_status
    from .search import open_semantic
    if target.engine is not None or not target.config.embeddings_enabled:
        return {"embed_status": embeddings_status(target)}
    found = open_semantic(target)
    found.space()             # the probe (a failure is the verdict: it says why)
    return {"embed_status": found.status()}


def backfill(target: Target, apply: bool = False,
             max_seconds: float = BACKFILL_SECONDS, progress=None) -> dict:
    """Dry run: what is pending; ``apply``: embed it (bounded, resumable, idempotent);
    ``progress(done, total)`` hears of every batch (``operators.progress``)."""
    provider = _provider(target)
    return semantic.backfill(get_database(target.config.database_target), provider,
                             target.config, apply=apply, max_seconds=max_seconds,
                             progress=progress, redact=redact_for(target.config))


def prune(target: Target, apply: bool = False) -> dict:
    """Dry run: the vectors of models other than the configured one; ``apply``: delete
    them (switching back to such a model then embeds everything again)."""
    provider = _provider(target)
    return semantic.prune(get_database(target.config.database_target), provider,
                          target.config, apply=apply)


def _prune_report(report: dict) -> str:
    """``trove embed prune``: each other model's vectors, and what apply does or did."""
    lines = [f"  {s['provider']} {s['model']} ({s['dim']} dimensions"
             + (f", generation {s['revision'].rsplit(GENERATION_MARK, 1)[1]}"
                if GENERATION_MARK in s["revision"] else "")
             + f"): {s['vectors']:,} vectors" for s in report["spaces"]]
    if not lines:
        return "trove embed prune: no vectors of other models"
    if report["status"] == "preview":
        head = f"trove embed prune: {report['vectors']:,} vectors of other models, never searched"
        tail = "apply: /trove embed prune apply (deletes them; switching back embeds again)"
    else:
        head, tail = f"trove embed prune: deleted {report['vectors']:,} vectors of other models", ""
    return "\n".join([head, *lines] + ([tail] if tail else []))


def format_report(report: dict) -> str:
    """One or two lines for the chat and the command line."""
    if "detail" in report:
        return f"trove embed warmup: {report['detail']}"
    if "embed_status" in report:
        from .families import embeddings_line
        state = report["embed_status"]
        check = state.get("model_check") or {}
        return "\n".join(["trove " + embeddings_line(state)]
                         + ([f"model check ({check['state']}): {check['detail']}"]
                            if check.get("detail") else []))
    if "spaces" in report:
        return _prune_report(report)
    identity = report.get("identity") or {}
    head = (f"trove embed backfill ({identity.get('provider')} {identity.get('model')}): "
            f"{report['indexed']:,} indexed, {report['pending']:,} pending")
    if report.get("other_vectors"):
        head += (f"\n{report['other_vectors']:,} vectors of other models (or of a model the "
                 "endpoint replaced) are kept, never searched: /trove embed prune lists them")
    if report["status"] == "preview":
        return head + "\napply: /trove embed backfill apply (resumable; run again to continue)"
    rate = report["rows"] / report["seconds"] if report.get("seconds") else 0.0
    state = ("done: the index is caught up" if report["status"] == "done" else
             "stopped at the time limit: run it again to continue")
    return (head + f"\nthis run: {report['rows']:,} rows, {report['texts_embedded']:,} texts "
            f"embedded, {report['texts_reused']:,} reused, {report['seconds']} s"
            + (f" ({rate:.1f} rows/s)" if rate else "") + f"; {state}")
