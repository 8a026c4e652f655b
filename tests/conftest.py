"""Test bootstrap: import the repository root as the package ``hermes_trove``.

The host imports the plugin folder as a package (``hermes_plugins.hermes_trove``)
whose modules use relative imports; the tests do the same under a short name.
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# ``python -m pytest`` puts the working directory on sys.path; from the repo root
# that would make our ``tools.py`` shadow the host's top-level ``tools`` package.
# The plugin is only ever imported as a package, so the root must not be a path entry.
sys.path[:] = [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != ROOT]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "scripts"))
from _bootstrap import load_package  # noqa: E402  (the same loader the scripts use)


def _isolate_environment() -> None:
    """Never touch the developer's ~/.hermes or inherit their TROVE_* settings."""
    for key in [k for k in os.environ if k.startswith("TROVE_")]:
        del os.environ[key]
    os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix="trove-test-home-")
    os.environ.pop("HERMES_SESSION_ID", None)


_isolate_environment()
load_package()

from pgkit import backend, engines_on_backend  # noqa: E402,F401  (the two-engine fixtures)


@pytest.fixture
def process_zone(monkeypatch):
    """Set this process's local zone (``TZ``), as a host machine's; ``time.tzset`` is
    run again after the test so later tests read the zone they started with."""
    import time

    def set_zone(name):
        monkeypatch.setenv("TZ", name)
        time.tzset()
    yield set_zone
    monkeypatch.undo()
    time.tzset()
