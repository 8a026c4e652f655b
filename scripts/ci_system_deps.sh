#!/usr/bin/env bash
# System packages some tests need (headless Chromium for the DAG view check).
# Best effort: without them those tests skip with a reason, the rest still run.
# PostgreSQL (the second engine's pass) is installed and started by ci_postgres.sh.
set -uo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || echo "ci_system_deps: chromium could not be installed; browser checks will skip"
fi
exit 0
