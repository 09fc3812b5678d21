#!/usr/bin/env bash
# The test suite as `make test` (full) and `make check` (the edit loop) run it.
#   full:  ruff, import contracts and mypy --strict run beside the suite but its long tier (on
#          three pytest-xdist workers)
#          (they need about one core for a minute; the tests spend much of their time
#          waiting on the subprocesses they start), then the 20 slowest tests are listed.
#   check: unit tests and the core integration tests (neither slow nor long), no static checks.
#   long:  the long tier alone (soaks, fuzzers, every framework lineage, many nodes):
#          tests/conftest.py says which; about 25 minutes on 2 cores.
# Extra arguments go to pytest. Exit status: non-zero if the tests or a static check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
mode=${1:-full}
shift || true
# Three workers on two cores: the integration tests spend much of their time waiting on the
# processes they start (sleeps in training scripts, grace periods, servers), and a third
# worker fills those waits (measured: 6 min 54 s with 3, 8 min 44 s with 2).
JOBS=${FERRY_TEST_JOBS:-3}
PYTEST=("$BIN/python" -m pytest -q -n "$JOBS" --dist loadgroup --durations=20)

if [[ $mode == check ]]; then
    exec "${PYTEST[@]}" -m "not slow and not long" "$@"
fi
if [[ $mode == long ]]; then
    exec "${PYTEST[@]}" -m long "$@"
fi
MARK=(-m "not long")

static_log=$(mktemp)
start=$SECONDS
(
    set -e
    "$BIN/ruff" check src tests benchmarks examples
    "$BIN/ruff" format --check src tests benchmarks examples
    "$BIN/lint-imports"
    "$BIN/mypy"
) >"$static_log" 2>&1 &
static_pid=$!

pytest_log=$(mktemp)
"${PYTEST[@]}" "${MARK[@]}" "$@" 2>&1 | tee "$pytest_log"
tests_rc=${PIPESTATUS[0]}

wait "$static_pid"
static_rc=$?
echo
echo "---- static checks (ruff, import contracts, mypy --strict), run beside the tests"
cat "$static_log"
[[ $static_rc -eq 0 ]] && echo "static checks: ok" || echo "static checks: FAILED (exit $static_rc)"
echo "suite wall time: $((SECONDS - start)) s"
# pytest's own closing line last, so that it is the verdict a reader (or CI) sees.
tail -n 1 "$pytest_log"
rm -f "$static_log" "$pytest_log"
if [[ $tests_rc -ne 0 ]]; then exit "$tests_rc"; fi
exit "$static_rc"
