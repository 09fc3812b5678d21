#!/usr/bin/env bash
# The CPU benchmarks of issue 31 in one run, each under its own timeout, figures to $OUT:
#
#   OUT=/some/folder bash benchmarks/cpu_figures.sh     (from anywhere; ferry runs from src/)
#
# engine.py --many-only (many small tensors), stall.py (a zero-code save's blocked time
# against a memcpy), overhead.py (step time under ferry run against plain python), peers.py
# (ferry beside torch.save, DCP and a memcpy; 512 MiB, then 4 GiB when CPU_FIGURES_BIG=1),
# loop_peers.py (what a background save blocks a training loop: ferry's against dcp.async_save's).
# Each writes OUT/NAME.txt (what it printed: its report comes last). Settings:
# CPU_FIGURES_ROUNDS (5), CPU_FIGURES_OVERHEAD_ROUNDS (the same), CPU_FIGURES_PART_SECONDS
# (150: each part's limit, twice that for overhead.py and the 4 GiB peers). Meant
# for a quiet machine (the benchmarks are ratios within one run, but a busy 2-core host
# moves them a lot). Without a `ferry` command beside the python (ferry from source), the
# benchmarks run `python -m ferry`.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
OUT=${OUT:-$(mktemp -d /tmp/cpu-figures.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LIMIT=${CPU_FIGURES_PART_SECONDS:-150}
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

part() { # part NAME SECONDS ARGS...: one benchmark and what it printed
    local name=$1 seconds=$2
    shift 2
    echo "== $name ($(date +%H:%M:%S)): $*"
    timeout -k 10 "$seconds" "$PY" "$@" >"$OUT/$name.txt" 2>&1
    echo "   exit $? ($(date +%H:%M:%S))"
    tail -n 40 "$OUT/$name.txt"
}

ROUNDS=${CPU_FIGURES_ROUNDS:-5}
part engine_many "$LIMIT" benchmarks/engine.py --many-only --rounds "$ROUNDS"
part stall "$LIMIT" benchmarks/stall.py --rounds "$ROUNDS"
part overhead "$((LIMIT * 2))" benchmarks/overhead.py --rounds "${CPU_FIGURES_OVERHEAD_ROUNDS:-$ROUNDS}"
part peers_512 "$LIMIT" benchmarks/peers.py --sizes 512 --rounds "$ROUNDS"
part loop_peers "$LIMIT" benchmarks/loop_peers.py --mib 512 --rounds "$ROUNDS"
if [ "${CPU_FIGURES_BIG:-0}" = 1 ]; then
    part peers_4096 "$((LIMIT * 2))" benchmarks/peers.py --sizes 4096 --rounds 3
fi
