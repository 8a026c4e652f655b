"""The offline demo end to end, and its HTML DAG view in a real headless browser."""

import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    db = folder / "trove.db"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--db", str(db)],
                            capture_output=True, text=True, timeout=300)
    return result, db


def test_demo_stores_everything_and_prints_the_dag(demo_run):
    result, db = demo_run
    assert result.returncode == 0, result.stderr
    samples = sum(1 for line in (ROOT / "samples" / "coding-session.jsonl").open() if line.strip())
    assert f"Stored {samples} of {samples} messages" in result.stdout
    assert "Summary DAG" in result.stdout and "turn 160/160" in result.stderr
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == samples
    assert conn.execute("SELECT max(depth) FROM nodes").fetchone()[0] >= 1  # a condensation
    compactions = int(re.search(r"\((\d+) compactions", result.stdout).group(1))
    assert compactions >= 3
    # The recovery step finds a detail that compaction took out of the prompt.
    recovery = result.stdout.split("Recovering a compacted detail", 1)[1]
    assert "summarized into node" in recovery
    assert "exact text:\n    Note for later: The staging database listens on port 6543" in recovery


def test_demo_refuses_to_reuse_a_database(demo_run):
    _, db = demo_run
    again = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--db", str(db)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "refusing" in again.stderr


def test_dag_view_renders_every_node_in_a_browser(demo_run, tmp_path):
    _, db = demo_run
    page = db.parent / "dag.html"
    assert page.exists()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (scripts/ci_system_deps.sh installs it)")
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    conn = sqlite3.connect(db)
    nodes = conn.execute("SELECT count(*) FROM nodes").fetchone()[0]
    assert nodes > 0
    rendered = re.findall(r'<span class="node(?: live)?" data-node-id="(\d+)"', dom)
    assert len(rendered) == nodes
    live = len(re.findall(r'<span class="node live"', dom))
    assert live >= 1
