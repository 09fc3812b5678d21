"""What the Hugging Face Trainer tests share (test_compat_hf.py, test_exact_hf.py): the job
(``scripts/hf_clm.py`` and its command line), its environment, what differs between two
plain runs (wall-clock figures), and the plain reference runs, made once per test session
(and pytest-xdist worker set) under a lock and reused."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import compat
from reference import shared_root
from trainrun import SCRIPTS

SCRIPT = str(SCRIPTS / "hf_clm.py")
TORCHRUN = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2")
ARGS = (
    "--output_dir", "out", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
    "--num_train_epochs", "3", "--eval_strategy", "steps", "--eval_on_start", "true",
    "--save_total_limit", "2", "--load_best_model_at_end", "true", "--metric_for_best_model", "eval_loss",
    "--logging_steps", "2", "--disable_tqdm", "true", "--report_to", "none", "--use_cpu", "true",
    "--learning_rate", "1e-3", "--seed", "0", "--patience", "5", "--mask_prob", "0.2",
    "--train_sampling_strategy", "group_by_length",
)  # fmt: skip
"""40 blocks of 16 tokens, 4 a batch, 2 batches a step: 5 steps an epoch on one process, 3
on each of 2 ranks (the last of 1 batch); an evaluation before training and at the end of
each epoch (``eval_strategy="steps"``, every 5 or 3 steps: ``argv``), a checkpoint folder
after each, the best model loaded at the end, early stopping watching, a collator that
draws random numbers (in the main process: ``num_workers`` is 0) and a sampler that draws
each epoch's order from the global stream (``group_by_length``). Like run_clm.py, the
script resumes from the newest checkpoint folder it finds."""
JIT = ("--enable_jit_checkpoint", "true")

_WALL_CLOCK = re.compile(r"""(["']\w*(?:_runtime|_per_second)["']: )'?[0-9.e+-]+'?""")
_TORCH_STAMP = re.compile(r"^(\[rank\d+\]:\[[WIE])\d{4} [0-9:.]+ ", re.M)


def scrub(name: str, text: str) -> str:
    """What differs between two plain runs: wall-clock figures (in the printed logs and in
    ``trainer_state.json``, and torch's timestamps on its warnings), the order in which two
    ranks' warnings reach stderr, and the Trainer's notice about a filesystem's mtime, which
    it gives when checkpoint folders were written within its clock's resolution."""
    text = _TORCH_STAMP.sub(r"\1<t> ", _WALL_CLOCK.sub(r"\1<t>", text))
    lines = [line for line in text.split("\n") if "mtime may not be reliable" not in line]
    return "\n".join(sorted(lines) if name == "stderr" else lines)


def env(home: Path, **extra: str) -> dict[str, str]:
    return compat.env_for(
        home, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", OMP_NUM_THREADS="1", **extra
    )


def argv(*extra: str, torchrun: bool = False) -> list[str]:
    every = "3" if torchrun else "5"  # steps an epoch
    launcher = TORCHRUN if torchrun else (sys.executable,)
    return [*launcher, SCRIPT, *ARGS, "--eval_steps", every, "--save_steps", every, *extra]


def reference(factory: pytest.TempPathFactory, command: Sequence[str]) -> compat.Outcome:
    """``command`` run plain, to its end; made by the first test that asks, then reused."""
    key = hashlib.sha256(json.dumps(list(command)).encode()).hexdigest()[:16]
    base = shared_root(factory) / "hf-references" / key
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = base / "outcome.json"
        if not saved.exists():
            ref = compat.plain(command, base / "run", env(base / "home"), scrub=scrub)
            assert ref.returncode == 0, "\n".join(ref.log[-40:])
            saved.write_text(json.dumps(dataclasses.asdict(ref)))
        return compat.Outcome(**json.loads(saved.read_text()))


def lineage(
    cwd: Path, home: Path, runs: Sequence[Sequence[str]], **extra: str
) -> tuple[compat.Outcome, list[int]]:
    """Each of ``runs`` under ``ferry run`` in turn, in ``cwd`` (a stopped job, then its
    resumptions): the last run's outcome with everything the runs printed, and the exit
    codes."""
    codes, out, err, ferry = [], [], [], []
    got = None
    for command in runs:
        got = compat.under_ferry(command, cwd, env(home, **extra), scrub=scrub)
        codes.append(got.returncode)
        out += got.stdout
        err += got.stderr
        ferry += got.ferry
    assert got is not None
    return dataclasses.replace(got, stdout=out, stderr=err, ferry=ferry), codes
