#!/usr/bin/env bash
# Installs the Debian packages the integration tests use. Runs only as root (CI does);
# elsewhere it says so and the tests that need these packages skip with the reason.
set -euo pipefail
# xrootd-server: the daemon the storage tests run on loopback; xrootd-client: xrdfs/xrdcp to
# look at it by hand. The Python client is the `xrootd` wheel from pip (the `test` extra):
# fsspec-xrootd needs XRootD >= 6, Debian's python3-xrootd is 5.5.
# slurm-wlm, munge: the single-node SLURM cluster of tests/integration/slurm_cluster.py
# (slurmctld, slurmd, sbatch/scontrol/scancel; munged for its authentication), ~20 s to install.
PACKAGES=(e2fsprogs xrootd-server xrootd-client slurm-wlm munge)
if [[ $(id -u) -ne 0 ]]; then
    echo "system-deps: not root; skipping ${PACKAGES[*]} (tests that need them will skip)"
    exit 0
fi
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "system-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
