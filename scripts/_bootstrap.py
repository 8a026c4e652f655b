"""Import the repository root as the package ``hermes_trove`` for the scripts in this folder.

The plugin's modules use relative imports, so they only load as a package; the
host imports the folder as one, and so do the tests (tests/conftest.py). Scripts
call ``load_package()`` first and then import ``hermes_trove.<module>``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "hermes_trove"


def load_package(name: str = PACKAGE) -> ModuleType:
    """The repository root imported as package ``name`` (once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
