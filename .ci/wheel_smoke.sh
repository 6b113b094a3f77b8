#!/usr/bin/env bash
# Build fedrec's wheel, install it (not editable, without the dev extras) into a fresh
# virtual environment, and run the product from it against the real PostgreSQL and Redis
# (.ci/wheel_smoke.py). Run by .ci/run from its environment (which has the dev extras).
set -euo pipefail
cd "$(dirname "$0")/.."

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS
# from the files git knows (tracked or new, not ignored): a left-over build/ folder would
# hand setuptools files the package data no longer names
mkdir "$WORK/src"
git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null \
  | tar -xf - -C "$WORK/src"
pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q -c constraints.txt "$WORK"/dist/fedrec-*.whl
echo "wheel smoke: built and installed $(basename "$WORK"/dist/fedrec-*.whl) in $((SECONDS - start)) s"
python .ci/wheel_smoke.py "$WORK/venv"
