#!/usr/bin/env bash
# Proof of ferry's GPU paths on one real NVIDIA GPU, in one run of at most 8 minutes.
#
#   OUT=/some/folder bash benchmarks/gpu_proof.sh        (from anywhere; ferry runs from src/)
#
# Parts, in order, each under its own timeout (a hang costs that part only; the whole run
# ends by GPU_PROOF_DEADLINE seconds, 460 by default, summary included):
#   env        the machine: GPU, driver, CUDA, runtime (gVisor or not), package versions
#   tests/gpu  pytest tests/gpu, a row per test                (benchmarks/gpu_proof/gputests.py)
#   engine     a ~1B-parameter model + AdamW (17 GB on the GPU): async save blocked <= 0.5 s,
#              snapshot / pinned copy_ >= 0.7, save and load bitwise (CPU, GPU), overlap_snapshot's
#              blocked time beside the default's, and it refuses a .data write (engine.py)
#   process    ferry process suspend / wake of a process holding ~15 GB: each <= 10 s, its state
#              in every state, the preflight's messages; UNAVAILABLE where the driver cannot (suspend.py)
#   zero-code  ferry run of a GPU script (AMP, GradScaler, torch.compile), SIGTERM, resume:
#              bitwise the plain uninterrupted run (zerocode.py, zc_gpu_train.py)
# Everything it writes lands in $OUT (at most 5 files): summary.md (the table: check, figure,
# goal, PASS / FAIL / UNAVAILABLE / SKIPPED), proof.log (every line, with times), results.jsonl,
# env.json, parts.tsv. Checkpoints and caches go to a fresh folder under GPU_PROOF_WORK (/tmp),
# removed at the end. Nothing is skipped in silence: a part that cannot run says why in a
# SKIPPED row, a check its part never reached is a FAIL row.
#
# Settings: GPU_PROOF_SIZE=small (tiny sizes), GPU_PROOF_DRY=1 (run the parts that can on the
# CPU, to try the script without a GPU: their rows say SKIPPED, "would be PASS"),
# GPU_PROOF_DEADLINE (seconds), GPU_PROOF_WORK (where checkpoints go), PYTHON (python3),
# GPU_PROOF_PARTS=engine,process (only those parts, and env: a second run of what broke).
# Without pytest on the machine, the tests part installs wheels found in .whl/ (made on a
# machine with pip: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
# -d .whl pytest iniconfig pluggy packaging), else its row says SKIPPED and why.

set -uo pipefail
START=$(date +%s)
DEADLINE=${GPU_PROOF_DEADLINE:-460}
RESERVE=15 # seconds kept for the summary
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
HERE=benchmarks/gpu_proof
OUT=${OUT:-$(mktemp -d /tmp/gpu-proof-out.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d "${GPU_PROOF_WORK:-/tmp}/ferry-gpu-proof.XXXXXX") || exit 2
RUN_ID=$(basename "$WORK")
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 FERRY_HOME="$WORK/home"
export GPU_PROOF_RESULTS="$OUT/results.jsonl" TORCHINDUCTOR_CACHE_DIR="$WORK/inductor"
: >"$GPU_PROOF_RESULTS"
: >"$OUT/parts.tsv"
exec > >(tee -a "$OUT/proof.log") 2>&1
TEE=$!

say() { echo "[$(date +%H:%M:%S)] +$(($(date +%s) - START))s $*"; }

row() { # row PART CHECK STATUS NOTE: a row written by this script (a part that died or never ran)
    "$PY" -c 'import json, sys; print(json.dumps(dict(zip(("part", "check", "status", "note"), sys.argv[1:]), figure="-", goal="-")))' \
        "$@" >>"$GPU_PROOF_RESULTS"
}

reap() { # processes of the last part that outlived it (a new session escapes timeout's group kill)
    local d pid
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [[ $pid == "$$" || $pid == "$TEE" ]] && continue
        if tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qx "GPU_PROOF_RUN=$RUN_ID"; then
            say "killing pid $pid, left by the part: $(tr '\0' ' ' <"$d/cmdline" 2>/dev/null | head -c 160)"
            kill -KILL "$pid" 2>/dev/null
        fi
    done
}

finish() {
    reap
    rm -rf "$WORK"
    "$PY" "$HERE/summary.py" "$OUT" || {
        echo "# gpu_proof: the summary could not be written; see proof.log and results.jsonl" >"$OUT/summary.md"
    }
    say "done: $OUT/summary.md"
    cat "$OUT/summary.md"
    exec >&- 2>&-
    wait "$TEE" 2>/dev/null # the log's last lines are written before the run returns
}
trap finish EXIT

part() { # part NAME TIMEOUT COMMAND...: run it under its timeout, within the deadline
    local name=$1 budget=$2 left rc t0
    shift 2
    if [[ -n ${GPU_PROOF_PARTS:-} && $name != env && ",$GPU_PROOF_PARTS," != *",$name,"* ]]; then
        say "part $name: not run, not in GPU_PROOF_PARTS=$GPU_PROOF_PARTS"
        row "$name" "(the whole part)" SKIPPED "not run: not in GPU_PROOF_PARTS=$GPU_PROOF_PARTS"
        return
    fi
    left=$((DEADLINE - RESERVE - ($(date +%s) - START)))
    if ((left < 20)); then
        say "part $name: not run, ${left}s left before the deadline"
        row "$name" "(the whole part)" SKIPPED "not run: the run's deadline (${DEADLINE}s) was near"
        return
    fi
    ((budget > left)) && budget=$left
    say "part $name: start, timeout ${budget}s: $*"
    t0=$(date +%s)
    GPU_PROOF_RUN=$RUN_ID timeout --kill-after=10 "$budget" "$@"
    rc=$?
    reap
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$budget" "$*" >>"$OUT/parts.tsv"
    if ((rc == 124 || rc == 137)); then
        row "$name" "(the part, timed out)" FAIL "killed after its timeout of ${budget}s"
    elif ((rc != 0)); then
        row "$name" "(the part, crashed)" FAIL "exited $rc: see proof.log"
    fi
    say "part $name: exit $rc after $(($(date +%s) - t0))s"
}

pytest_here() {
    "$PY" -c 'import pytest' 2>/dev/null && return
    if compgen -G ".whl/pytest-*.whl" >/dev/null; then
        say "pytest is missing: installing the wheels in .whl/ into $WORK/site"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl &&
            export PYTHONPATH="$PYTHONPATH:$WORK/site"
    else
        say "pytest is missing and .whl/ holds no pytest wheel: the tests part will say SKIPPED"
    fi
}

say "gpu_proof: repo $REPO, out $OUT, work $WORK, deadline ${DEADLINE}s, size ${GPU_PROOF_SIZE:-full}${GPU_PROOF_DRY:+, dry run}"
git -C "$REPO" log -1 --format='commit %H %s' 2>/dev/null || say "(no git here: commit unknown)"
nvidia-smi 2>&1 | head -20
part env 45 "$PY" "$HERE/env.py" "$OUT/env.json"
GVISOR=$("$PY" -c 'import json, sys; print("--gvisor" if "gVisor" in json.load(open(sys.argv[1])).get("runtime", "") else "")' "$OUT/env.json" 2>/dev/null)
pytest_here
part tests/gpu 120 "$PY" "$HERE/gputests.py" "$WORK/tests" $GVISOR
DEVICE=cuda
[[ -n ${GPU_PROOF_DRY:-} ]] && DEVICE=cpu
part engine 170 "$PY" "$HERE/engine.py" "$WORK/engine-ck" --device "$DEVICE"
part process 90 "$PY" "$HERE/suspend.py"
part zero-code 150 "$PY" "$HERE/zerocode.py" "$WORK/zero-code" --device "$DEVICE"
