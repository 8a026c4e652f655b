#!/usr/bin/env bash
# Link this checkout into a Hermes home (see scripts/install_plugin.py --help).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/install_plugin.py" "$@"
