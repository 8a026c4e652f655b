"""Docs that are true (issue 26): the import examples write the database Hermes reads,
and every repository file the docs cite exists."""
import re
from pathlib import Path

from hermes_trove.config import load_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_import_examples_target_the_database_the_engine_reads():
    home = Path("~/.hermes").expanduser()        # Hermes's default HERMES_HOME
    engine_reads = load_config({}, hermes_home=home).resolved_database_path
    targets = re.findall(r"--target-db (~/\S+)", (ROOT / "docs" / "import.md").read_text())
    assert len(targets) >= 3
    assert all(Path(t).expanduser() == engine_reads for t in targets), (targets, engine_reads)


def test_every_repository_file_the_docs_cite_exists():
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    missing = []
    for doc in DOCS:
        for path in re.findall(r"`([^`\s*]+\.(?:md|py|txt|sh|yaml|jsonl|html))`", doc.read_text()):
            if path.startswith("../") or path.split("/")[0] in folders:
                base = doc.parent if path.startswith("../") else ROOT
                if not (base / path).exists():
                    missing.append(f"{doc.name}: {path}")
    assert not missing, missing
