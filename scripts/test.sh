#!/usr/bin/env bash
# Run the test suite in a project virtualenv (created and kept in sync with the
# requirements files on first use). Extra arguments go to pytest. The tests run in
# TROVE_TEST_WORKERS processes (pytest-xdist, default 2, whole files per process so a
# module's fixtures are built once); TROVE_TEST_WORKERS=0 or a -n of your own runs
# them your way.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TROVE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.trove-requirements.sha256"
want="$(cat requirements.txt requirements-extras.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r requirements-dev.txt
  echo "$want" > "$stamp"
fi
workers="${TROVE_TEST_WORKERS:-2}"
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses*|no:xdist) workers=0 ;; esac
done
if [ "$workers" != "0" ]; then
  set -- -n "$workers" --dist loadfile "$@"
fi
exec "$VENV/bin/python" -m pytest "$@"
