"""The example files under examples/ that ferry generates: each from a pure function.

``EXAMPLES`` maps a path under examples/ to the function that writes it; the unit tests
check each recorded file against its function, and ``python -m ferry.schedulers.templates
EXAMPLES_DIR`` rewrites them after a deliberate change.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ferry.schedulers import htcondor, kubernetes, slurm


def _sbatch() -> str:
    spec = slurm.SbatchSpec(
        command=["python", "train.py", "--out", "run"],
        time_limit="04:00:00",
        extra=["--gres=gpu:1", "--cpus-per-task=8"],
        ferry_options=["--every-seconds", "1800"],
    )
    return slurm.sbatch_script(spec)


def _sbatch_array() -> str:
    spec = slurm.SbatchSpec(
        # sweep.py picks its settings by SLURM_ARRAY_TASK_ID; each task is its own ferry job,
        # slurm-<array id>_<task id>, with its own checkpoints.
        command=["python", "sweep.py"],
        job_name="ferry-sweep",
        output="%x-%A_%a.out",
        time_limit="02:00:00",
        extra=["--array=0-7", "--gres=gpu:1"],
    )
    return slurm.sbatch_script(spec)


def _sbatch_nodes() -> str:
    spec = slurm.SbatchSpec(
        # srun starts ferry run on each of the 4 nodes; torchrun runs train.py on 8 GPUs of each.
        command=["train.py", "--out", "run"],
        job_name="ferry-train-nodes",
        time_limit="04:00:00",
        extra=["--gres=gpu:8", "--cpus-per-task=64"],
        nodes=4,
        procs_per_node=8,
    )
    return slurm.sbatch_script(spec)


def _condor_wrapper() -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "# HTCondor runs this in the job's scratch folder, where the checkpoint folder comes back",
            "# on a restart; ferry reads the checkpoint exit code from the job ad (_CONDOR_JOB_AD).",
            "exec ferry run -- python train.py --out run",
            "",
        ]
    )


def _pod() -> str:
    spec = kubernetes.ManifestSpec()
    return kubernetes.render(kubernetes.pvc_manifest(spec), kubernetes.pod_manifest(spec))


def _pytorchjob() -> str:
    spec = kubernetes.ManifestSpec()
    return kubernetes.render(kubernetes.pvc_manifest(spec), kubernetes.pytorchjob_manifest(spec))


def _pytorchjob_nodes() -> str:
    spec = kubernetes.ManifestSpec(command=("train.py",), nodes=4, gpus=8)
    return kubernetes.render(kubernetes.pvc_manifest(spec), kubernetes.pytorchjob_manifest(spec))


EXAMPLES: dict[str, Callable[[], str]] = {
    "slurm/train.sbatch": _sbatch,
    "slurm/sweep-array.sbatch": _sbatch_array,
    "slurm/train-nodes.sbatch": _sbatch_nodes,
    "htcondor/train.sub": lambda: htcondor.submit_file(),
    "htcondor/run-ferry.sh": _condor_wrapper,
    "kubernetes/pod.yaml": _pod,
    "kubernetes/pytorchjob.yaml": _pytorchjob,
    "kubernetes/pytorchjob-nodes.yaml": _pytorchjob_nodes,
}


def write_all(examples_dir: str) -> list[str]:
    written = []
    for rel, make in EXAMPLES.items():
        path = os.path.join(examples_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(make())
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    print("\n".join(write_all(sys.argv[1] if len(sys.argv) > 1 else "examples")))
