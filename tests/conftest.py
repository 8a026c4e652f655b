"""Test bootstrap: import the repository root as the package ``hermes_trove``.

The host imports the plugin folder as a package (``hermes_plugins.hermes_trove``)
whose modules use relative imports; the tests do the same under a short name.
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_package(name: str = "hermes_trove"):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_load_package()
