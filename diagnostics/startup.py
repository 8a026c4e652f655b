"""What the user must hear when the agent starts: setting typos and a misplaced database.

A typo in a setting, or a ``database_path`` that makes a new empty database
while ``$HERMES_HOME/trove.db`` holds the history, used to show only in doctor,
``/trove status`` and the log. Hermes 0.19 has no channel for plugin warnings
in its banner (it logs them to agent.log and clears the screen before the
banner), so the engine shows them once per process, when an interactive
(``cli``) session starts, through the CLI's own printer (stderr outside it), and
logs them on every platform. Each problem is said once per process, with its fix.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

from ..config import DEFAULT_DATABASE_FILE, TroveConfig
from ..storage.payloads import human_size

log = logging.getLogger(__name__)

INTERACTIVE_PLATFORMS = ("cli",)
_said: set[str] = set()


def unused_default_database(config: TroveConfig, created: bool = False) -> str | None:
    """When the configured database is not ``$HERMES_HOME/trove.db`` but that file exists:
    the sentence that says so and how to use it; else None. ``created``: the engine
    has just created the configured file (it did not exist at the session's start)."""
    default = config.hermes_home / DEFAULT_DATABASE_FILE
    chosen = Path(config.resolved_database_path)
    try:
        if chosen.resolve() == default.resolve() or not default.is_file():
            return None
        size = human_size(default.stat().st_size)
    except OSError:
        return None
    state = ("a new empty database was just created there" if created else
             "a new empty database is created there" if not chosen.exists() else
             "that database is used")
    return (f"TROVE_DATABASE_PATH points at {chosen} ({state}), while {default} ({size}) "
            f"exists and is not used; if it holds your history, remove the setting "
            f"(or point it at {default})")


def startup_problems(config: TroveConfig, fault: dict | None = None,
                     created: bool = False) -> list[str]:
    """Everything the user should know at start: an unusable database first (with its
    repair), then a default database left unused, then the setting warnings."""
    problems = []
    if fault:
        problems.append(f"the trove database cannot be used, so nothing is stored: "
                        f"{fault.get('problem')}. Repair: {fault.get('repair')}")
    beside = unused_default_database(config, created)
    if beside:
        problems.append(beside)
    return problems + list(config.warnings)


def announce(config: TroveConfig, platform: str | None, fault: dict | None = None,
             stream: TextIO | None = None, created: bool = False) -> list[str]:
    """Say each new start-up problem once per process: logged always, and on an
    interactive platform written to the terminal too. Returns what was said now."""
    new = [p for p in startup_problems(config, fault, created) if p not in _said]
    if not new:
        return []
    _said.update(new)
    for problem in new:
        if problem not in config.warnings:   # register() logged the setting warnings
            log.warning("hermes-trove: %s", problem)
    if platform in INTERACTIVE_PLATFORMS:
        text = ("⚠ hermes-trove at start:\n" + "".join(f"  - {p}\n" for p in new)
                + "  (details: /trove status, scripts/trove.py doctor)")
        try:
            show(text, stream)
        except Exception:  # a closed terminal must not stop the session
            pass
    return new


def show(text: str, stream: TextIO | None = None) -> None:
    """Put ``text`` in front of the CLI user: through the host CLI's own printer when it
    runs (prompt_toolkit swallows a bare write while its input line is live; the agent
    starts at the first message, inside it), else on ``stream`` (stderr by default)."""
    host_cli = sys.modules.get("cli") if stream is None else None
    printer = getattr(host_cli, "_cli_visible_print", None)
    if callable(printer) and hasattr(host_cli, "HermesCLI"):
        printer(text)
        return
    out = stream if stream is not None else sys.stderr
    out.write(text + "\n")
    out.flush()


def forget() -> None:
    """Forget what was said (tests; a new process starts empty anyway)."""
    _said.clear()
