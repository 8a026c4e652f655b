"""Another process's view of cron runs' claims (``storage.locks.claim_run``): a
child Python that claims ids of a database and keeps them while it lives, so a test
sees what a second gateway or ``hermes cron run`` would find."""
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Claims each id once ``go`` exists, prints each answer, and keeps its claims until
# ``done`` exists (or it is killed).
CLAIMER = """
import os, sys, time
sys.path[:0] = [{scripts!r}]
from _bootstrap import load_package
load_package()
from hermes_trove.storage import locks
db, go, done, ids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
print(" ".join(str(locks.claim_run(db, i)) for i in ids), flush=True)
while not os.path.exists(done):
    time.sleep(0.01)
"""


def claimer(db: str, go: Path, done: Path, *ids: str) -> subprocess.Popen:
    """Start another process that claims ``ids`` of ``db`` once ``go`` exists and
    holds them until ``done`` does (see CLAIMER)."""
    code = CLAIMER.format(scripts=str(TESTS.parent / "scripts"))
    child = subprocess.Popen([sys.executable, "-c", code, db, str(go), str(done), *ids],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()
    return child


def answers(child: subprocess.Popen) -> list[bool]:
    """The claims' outcomes a claimer printed."""
    line = child.stdout.readline().split()
    assert line, child.stderr.read()
    return [word == "True" for word in line]


def claimed_elsewhere(db: str, folder: Path, *ids: str) -> list[bool]:
    """Whether another process could claim each of ``ids`` right now (it lets them go
    as it exits). ``folder``: where its go/done files may be made."""
    (folder / "go-now").touch()
    (folder / "done-now").touch()
    child = claimer(db, folder / "go-now", folder / "done-now", *ids)
    try:
        return answers(child)
    finally:
        child.communicate(timeout=30)
