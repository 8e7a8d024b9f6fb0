#!/usr/bin/env bash
# Runs the test suite. pytest's exit code 5 (no tests collected) means the suite went missing:
# it fails loudly instead of passing silently.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pytest -q "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "[tests] pytest collected no tests: the test suite is missing or every file failed to import" >&2
  exit 1
fi
exit "$status"
