#!/usr/bin/env bash
# Runs the test suite. pytest's exit code 5 (no tests collected) means the suite went missing:
# it fails loudly instead of passing silently.
#
# With pytest-xdist (the `test` extra) the tests run in TSPP_TEST_WORKERS processes (default: the
# core count, at most 8; 0 or 1 runs them in this process). Most tests are small and single-threaded,
# so two workers on CI's 2 cores take the suite from ~23 to ~14 min. Each worker keeps at least two
# torch threads so the multi-threaded kernel paths stay covered.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
cores=$(nproc 2>/dev/null || echo 1)
workers=${TSPP_TEST_WORKERS:-$(( cores < 8 ? cores : 8 ))}
parallel=()
if [ "$workers" -gt 1 ] && "$PYTHON" -c "import xdist" 2>/dev/null; then
  parallel=(-n "$workers" --dist worksteal)
  threads=$(( cores / workers ))
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 2 ? threads : 2 ))}
  echo "[tests] $workers pytest-xdist workers, $OMP_NUM_THREADS torch threads each"
fi
"$PYTHON" -m pytest -q --durations=25 "${parallel[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "[tests] pytest collected no tests: the test suite is missing or every file failed to import" >&2
  exit 1
fi
exit "$status"
