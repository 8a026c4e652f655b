#!/usr/bin/env bash
# Every benchmark, one after the other (the machines are shared: never two at once).
# Builds the cached synthetic stores under /tmp/trove-bench on first use (the two
# 1M-row stores take about 5 minutes each). Logs go to bench/results/<name>.log,
# figures to bench/results/<name>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p bench/results
run() {
    local name=$1; shift
    echo "== $name: $*"
    "$PY" "$@" 2>&1 | tee "bench/results/$name.log"
}
run ingest bench/ingest.py
run turn_overhead bench/turn_overhead.py 1000 10000 100000 1000000
run search bench/search.py 100000 1000000
run open_time bench/open_time.py 1000000
run compaction bench/compaction.py
run recall_vs_builtin bench/recall_vs_builtin.py
run prepare bench/prepare.py
run evidence bench/evidence.py 100
run request_overhead bench/request_overhead.py --per-tool
run rollups bench/rollups.py 62 10 100
run grep_contention bench/grep_contention.py
