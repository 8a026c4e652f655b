"""The package layout: imports run one way, and no name shadows the host's packages.

Layers, lowest first (a module may import a lower layer or its own package, never
a higher layer or a sibling concern of the same layer):

    config, storage/          settings; the database file and what is in it
    store.py                  messages and their FTS
    dag.py                    summary nodes and lineage
    ingest/ compaction/ recall/ diagnostics/ binding/
    schemas.py                the tool schemas and argument checks
    evidence/                 exact refs, values, verified computation, evidence tool handlers
    toolkit/                  the agent tools' handlers: scope, rendering, search and reading
    tools.py                  the agent tools' context, dispatcher and handler table
    orchestrator/             parts of TroveEngine by concern (tool side, maintenance mixins)
    engine.py                 the orchestrator the host calls
    operators/ openclaw/      what operators run
    command.py, __init__.py   /trove and registration
"""

from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "config": 0, "storage": 0,
    "store": 1,
    "dag": 2,
    "ingest": 3, "compaction": 3, "recall": 3, "diagnostics": 3, "binding": 3,
    "schemas": 4, "evidence": 4.5, "toolkit": 4.8, "tools": 5, "orchestrator": 5.5,
    "engine": 6,
    "operators": 7, "openclaw": 7,
    "command": 8, "": 9,
}
CARD_FILES = {"__init__.py", "engine.py", "store.py", "dag.py", "config.py", "tools.py",
              "schemas.py", "command.py"}
HOST_TOP_LEVEL = {"agent", "tools", "plugins", "providers", "gateway", "cron", "utils", "cli",
                  "toolsets", "run_agent", "model_tools", "hermes_cli", "hermes_constants",
                  "hermes_state"}


def plugin_modules() -> dict[str, Path]:
    """Every module of the plugin package by dotted name ('' for the root __init__)."""
    found = {}
    for path in ROOT.glob("*.py"):
        found["" if path.name == "__init__.py" else path.stem] = path
    for package in (p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        for path in package.rglob("*.py"):  # subpackages too (storage/postgres/)
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if path.name == "__init__.py" else parts)
            found[name] = path
    return found


def imported_modules(name: str, path: Path) -> set[str]:
    """Plugin modules (dotted, from the root) that ``name`` imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    parts = name.split(".") if name else []
    package = parts if is_package else parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package[: len(package) - (node.level - 1)]
        prefix = base + (node.module.split(".") if node.module else [])
        out.update(".".join(prefix + [alias.name]) for alias in node.names)
    return out


def layer_of(module: str) -> tuple[str, int]:
    """The concern a module belongs to (its package, or its own name at the root) and its layer."""
    concern = module.split(".")[0]
    assert concern in LAYERS, f"module {module!r} has no layer: add its package to LAYERS"
    return concern, LAYERS[concern]


def test_every_import_runs_downward():
    modules = plugin_modules()
    wrong = []
    for name, path in modules.items():
        concern, layer = layer_of(name)
        for target in imported_modules(name, path):
            if target not in modules:
                target = target.rsplit(".", 1)[0]  # ``from .mod import name``: the module
            target_concern, target_layer = layer_of(target)
            if target_concern == concern:
                continue
            if target_layer >= layer:
                wrong.append(f"{name or '__init__'} (layer {layer}) imports {target} (layer {target_layer})")
    assert not wrong, "imports that run upward or sideways:\n" + "\n".join(wrong)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The walker is not vacuous: a store importing the engine is seen as upward."""
    fake = tmp_path / "store.py"
    fake.write_text("from .engine import TroveEngine\nfrom .storage import codec\n")
    assert imported_modules("store", fake) == {"engine.TroveEngine", "storage.codec"}
    nested = tmp_path / "health.py"
    nested.write_text("def f():\n    from ..engine import x\n")
    assert imported_modules("diagnostics.health", nested) == {"engine.x"}
    assert layer_of("engine")[1] > layer_of("store")[1]


def test_root_holds_only_the_design_card_modules():
    assert {p.name for p in ROOT.glob("*.py")} == CARD_FILES


def test_no_name_collides_with_the_hosts_packages():
    host_names = set(HOST_TOP_LEVEL)
    try:
        dist = metadata.distribution("hermes-agent")
        host_names |= {f.parts[0].removesuffix(".py") for f in dist.files or []
                       if f.parts and not f.parts[0].endswith((".dist-info", ".data"))}
    except metadata.PackageNotFoundError:
        pass
    ours = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir()
                                                 if p.is_dir() and not p.name.startswith(("_", "."))}
    assert "tools" in ours  # tools.py exists; it is only ever imported inside the package
    clashes = (ours & host_names) - {"tools"}
    assert not clashes, f"plugin names that shadow host packages: {sorted(clashes)}"


def test_tests_and_scripts_never_put_the_plugin_root_on_sys_path():
    import sys
    assert all(Path(p or ".").resolve() != ROOT for p in sys.path)
