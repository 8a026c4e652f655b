#!/usr/bin/env bash
# Fast-forward this checkout to its upstream. Refuses when there are local
# changes or the branches have diverged, so an update never rewrites your work.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "update refused: $repo has uncommitted changes (commit or stash them first)" >&2
  exit 2
fi
before="$(git rev-parse HEAD)"
git fetch --quiet
if ! git merge --ff-only --quiet '@{upstream}' 2>/dev/null; then
  echo "update refused: $repo cannot be fast-forwarded to its upstream (diverged or no upstream)" >&2
  exit 2
fi
after="$(git rev-parse HEAD)"
if [ "$before" = "$after" ]; then
  echo "already up to date at ${after:0:12}"
else
  echo "updated ${before:0:12} -> ${after:0:12}:"
  git log --oneline "$before..$after"
  echo "restart Hermes (or the gateway) to load the new version"
fi
