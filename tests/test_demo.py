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


def chromium_or_skip():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (scripts/ci_system_deps.sh installs it)")
    return chromium


def browse(tmp_path, url, *flags):
    """Run headless Chromium on ``url`` with extra flags; its stdout."""
    return subprocess.run([chromium_or_skip(), *CHROMIUM_FLAGS,
                           f"--user-data-dir={tmp_path / 'profile'}", *flags, url],
                          capture_output=True, text=True, timeout=120).stdout


def test_dag_view_renders_every_node_and_edge_in_a_browser(demo_run, tmp_path):
    _, db = demo_run
    page = db.parent / "dag.html"
    assert page.exists()
    dom = browse(tmp_path, page.as_uri(), "--dump-dom")
    conn = sqlite3.connect(db)
    nodes = conn.execute("SELECT count(*) FROM nodes").fetchone()[0]
    edges = conn.execute("SELECT count(*) FROM node_edges e JOIN nodes p ON p.node_id ="
                         " e.parent_id JOIN nodes c ON c.node_id = e.child_node_id"
                         " WHERE p.session_id = c.session_id").fetchone()[0]
    covered = conn.execute("SELECT max(last_store_id) FROM nodes").fetchone()[0]
    tail = conn.execute("SELECT count(*) FROM messages WHERE store_id > ?", (covered,)).fetchone()[0]
    assert nodes > 0 and edges > 0 and tail > 0
    assert len(re.findall(r'<span class="node(?: live)?" data-node-id="(\d+)"', dom)) == nodes
    assert len(re.findall(r'<line class="edge" data-parent="\d+" data-child="\d+"', dom)) == edges
    assert len(re.findall(r'<span class="msg" data-ref="m\d+"', dom)) == min(tail, 200)
    assert len(re.findall(r'<span class="node live"', dom)) >= 1
    assert dom.count('<i style="background: rgb(') >= 2  # a legend swatch per depth


def test_dag_view_links_refs_filters_and_says_when_sources_are_cut(demo_run, tmp_path):
    _, db = demo_run
    page = db.parent / "dag.html"
    conn = sqlite3.connect(db)
    parent = conn.execute("SELECT parent_id FROM node_edges WHERE child_node_id IS NOT NULL"
                          " LIMIT 1").fetchone()[0]
    dom = browse(tmp_path, page.as_uri() + f"#n{parent}", "--dump-dom")
    assert f'<a class="ref-link" href="#n' in dom  # its child summaries are links
    assert re.search(rf'<span class="node(?: live)? selected" data-node-id="{parent}"', dom)
    assert '<line class="edge hot"' in dom
    word = "staging"
    hits = {r[0] for r in conn.execute("SELECT node_id FROM nodes WHERE lower(text) LIKE ?",
                                       (f"%{word}%",))}
    filtered = browse(tmp_path, page.as_uri() + f"?q={word}", "--dump-dom")
    dimmed = re.findall(r'<span class="node(?: live)? dim" data-node-id="(\d+)"', filtered)
    total = conn.execute("SELECT count(*) FROM nodes").fetchone()[0]
    assert f"of {total} nodes match" in filtered
    assert not hits & {int(d) for d in dimmed}  # a node whose text matches stays lit


def test_dag_view_screenshot_is_not_blank(demo_run, tmp_path):
    image = pytest.importorskip("PIL.Image")
    _, db = demo_run
    shot = tmp_path / "dag.png"
    browse(tmp_path, (db.parent / "dag.html").as_uri(), f"--screenshot={shot}",
           "--window-size=1400,1000", "--hide-scrollbars")
    assert shot.exists()
    with image.open(shot) as picture:
        colours = picture.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20  # text, node colours and edges, not one fill


def test_dag_view_says_when_a_source_list_is_cut(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from enginekit import make_engine
    from hermes_trove.dag import NewNode
    from hermes_trove.storage import database
    engine = make_engine(tmp_path, window=1_000_000, fts_integrity_check_interval_hours=0)
    ids = engine.store.ingest("sess", [{"role": "user", "content": f"message {i}"}
                                       for i in range(70)]).store_ids
    node = engine.dag.add_node(NewNode(session_id="sess", depth=0, text="seventy messages",
                                       token_count=5, source_token_count=700, level=1,
                                       model="det", child_store_ids=ids))
    engine.store.ingest("sess", [{"role": "user", "content": "fresh question"}])
    for key in list(database._registry):
        database.forget_database(key)
    page = tmp_path / "page.html"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "trove.py"), "--db",
                           str(tmp_path / "trove.db"), "dag", "sess", "--out", str(page)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    dom = browse(tmp_path, page.as_uri() + f"#n{node}", "--dump-dom")
    assert f"showing the first 60 of 70 sources; the rest: trove.py expand n{node} --offset 60" \
        in dom
    assert '<span class="msg" data-ref="m71"' in dom  # the raw fresh tail


def test_the_readme_demo_line_is_what_the_demo_prints(demo_run):
    """The README's figures for the demo are checked against a run, not remembered."""
    result, db = demo_run
    stored = re.search(r"Stored (\d+) of (\d+) messages .*\((\d+) compactions", result.stdout)
    conn = sqlite3.connect(db)
    leaves = conn.execute("SELECT count(*) FROM nodes WHERE depth = 0").fetchone()[0]
    condensed = conn.execute("SELECT count(*) FROM nodes WHERE depth > 0").fetchone()[0]
    conn.close()
    listed = re.search(r"Summary DAG \((\d+) nodes", result.stdout).group(1)
    assert int(listed) == leaves + condensed
    line = next(l for l in (ROOT / "README.md").read_text().splitlines()
                if l.startswith("| demo: "))
    assert f"{stored.group(2)}-message coding session" in line
    expected = (f"stored {stored.group(1)} of {stored.group(2)}, {stored.group(3)} compactions "
                f"({leaves} lea{'f' if leaves == 1 else 'ves'}, {condensed} condensed)")
    assert expected in line, f"README says {line!r}; the demo printed {expected!r}"
