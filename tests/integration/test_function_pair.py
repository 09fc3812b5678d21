"""Issue: the framework-agnostic pair. A job whose state is plain Python (a dict of floats, a
list, a ``random.Random``), saved by the user's ``save_fn`` as files and read back by
``restore_fn``, is interrupted (signal, crash), resumes in a fresh process, and ends byte
for byte where the uninterrupted run ends: final value, every per-step record, the private
generator and the global ``random`` stream."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from trainrun import env_for, run

pytestmark = pytest.mark.integration
EXIT_CHECKPOINTED = 85
SCRIPT = "train_functions.py"
FILES = ("value.txt", "steps.txt")
STEPS = 40


def assert_same(reference: Path, resumed: Path) -> None:
    for name in FILES:
        ref, got = (reference / name).read_text(), (resumed / name).read_text()
        if ref != got:
            a, b = ref.splitlines(), got.splitlines()
            first = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
            )
            raise AssertionError(
                f"{name} differs at line {first + 1} ({len(a)} vs {len(b)} lines):\n"
                f"  reference: {a[first] if first < len(a) else '<end>'}\n"
                f"  resumed:   {b[first] if first < len(b) else '<end>'}"
            )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("function-pair-ref")
    env = env_for(tmp / "home", FERRY_DIR=str(tmp / "ck"))
    proc = run(SCRIPT, tmp / "out", ["--steps", str(STEPS)], env)
    assert proc.returncode == 0, proc.stderr
    assert len((tmp / "out" / "steps.txt").read_text().splitlines()) == STEPS
    return tmp / "out"


# (id, interruption args, extra env, the step the resumed run starts from: None for a crash
# during asynchronous saves, where it is the newest checkpoint that had committed)
CASES = [
    ("signal-mid-run", ["--signal-at", "17"], {}, 18),
    ("signal-at-step-0", ["--signal-at", "0"], {}, 1),
    ("signal-at-last-step", ["--signal-at", str(STEPS - 1)], {}, STEPS),
    ("every-6-steps-async-then-crash", ["--kill-at", "23"], {"FERRY_EVERY_STEPS": "6"}, None),
    (
        "every-3-steps-sync-then-crash",
        ["--kill-at", "31"],
        {"FERRY_EVERY_STEPS": "3", "FERRY_ASYNC_SAVE": "0"},
        30,
    ),
    ("every-7-steps-async-then-signal", ["--signal-at", "29"], {"FERRY_EVERY_STEPS": "7"}, 30),
]


def newest_step(root: Path) -> int:
    return max(int(p.name.split("-")[1]) for p in root.iterdir() if p.name.startswith("step-"))


@pytest.mark.parametrize(("case", "interrupt", "extra", "resume_step"), CASES, ids=[c[0] for c in CASES])
def test_interrupted_pair_resumes_exactly(
    case: str,
    interrupt: list[str],
    extra: dict[str, str],
    resume_step: int | None,
    tmp_path: Path,
    reference: Path,
) -> None:
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"), **extra)
    args = ["--steps", str(STEPS)]
    first = run(SCRIPT, tmp_path / "run", args + interrupt, env, new_session=True)
    crashed = "--kill-at" in interrupt
    if crashed:
        assert first.returncode == -signal.SIGKILL, first.stderr
    else:
        assert first.returncode == EXIT_CHECKPOINTED, first.stderr
        assert first.stderr.count("exiting with 85") == 1, first.stderr
    assert not (tmp_path / "run").exists(), "the interrupted run must not have finished"
    if resume_step is None:
        resume_step = newest_step(tmp_path / "ck")
    else:
        assert newest_step(tmp_path / "ck") == resume_step
    second = run(SCRIPT, tmp_path / "run", args, env)
    assert second.returncode == 0, second.stderr
    assert f"resumed at step {resume_step} (restored_step {resume_step})" in second.stdout, second.stdout
    assert "ferry: resumed from" in second.stderr
    assert_same(reference, tmp_path / "run")


def test_the_files_of_save_fn_are_part_of_the_checkpoint(tmp_path: Path) -> None:
    """Every file ``save_fn`` wrote, subfolders included, sits in the committed checkpoint under
    ``user/`` and is listed with its size and checksum in the manifest."""
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    proc = run(SCRIPT, tmp_path / "run", ["--steps", str(STEPS), "--signal-at", "9"], env)
    assert proc.returncode == EXIT_CHECKPOINTED, proc.stderr
    (ckpt,) = (tmp_path / "ck").iterdir()
    assert ckpt.name == "step-000000000010"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    user = {name: meta for name, meta in manifest["files"].items() if name.startswith("user/")}
    assert set(user) == {"user/state.json", "user/rng/private.json", "user/records.txt"}
    for name, meta in user.items():
        assert (ckpt / name).stat().st_size == meta["size"] > 0
        assert meta["xxh3_64"]
    records = (ckpt / "user" / "records.txt").read_text().splitlines()
    assert [int(r.split()[0]) for r in records] == list(range(10))


def test_two_interruptions_in_a_row(tmp_path: Path, reference: Path) -> None:
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    args = ["--steps", str(STEPS)]
    assert run(SCRIPT, tmp_path / "run", [*args, "--signal-at", "5"], env).returncode == EXIT_CHECKPOINTED
    assert run(SCRIPT, tmp_path / "run", [*args, "--signal-at", "26"], env).returncode == EXIT_CHECKPOINTED
    last = run(SCRIPT, tmp_path / "run", args, env)
    assert last.returncode == 0, last.stderr
    assert "resumed at step 27" in last.stdout
    assert_same(reference, tmp_path / "run")


def test_the_comparison_sees_the_global_stream(tmp_path: Path, reference: Path) -> None:
    """The check is sharp enough to see the global ``random`` stream: the same resume with the
    global stream reseeded after ``restore`` (everything else restored) differs from the
    reference from the first resumed step on, and not before."""
    env = env_for(tmp_path / "home", FERRY_DIR=str(tmp_path / "ck"))
    args = ["--steps", str(STEPS)]
    assert run(SCRIPT, tmp_path / "run", [*args, "--signal-at", "17"], env).returncode == EXIT_CHECKPOINTED
    broken = run(SCRIPT, tmp_path / "run", [*args, "--reseed-after-restore"], env)
    assert broken.returncode == 0, broken.stderr
    ref = (reference / "steps.txt").read_text().splitlines()
    got = (tmp_path / "run" / "steps.txt").read_text().splitlines()
    assert got[:18] == ref[:18]
    assert got[18].split()[2] != ref[18].split()[2]  # the global draw of step 18
    assert got[18].split()[3] == ref[18].split()[3]  # the private generator still continues


def test_a_periodic_save_in_flight_at_exit_commits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = env_for(home, FERRY_DIR=str(tmp_path / "ck"), FERRY_EVERY_STEPS="5", FERRY_JOB_ID="pair")
    proc = run(SCRIPT, tmp_path / "run", ["--steps", str(STEPS)], env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert newest_step(tmp_path / "ck") == STEPS
    status = json.loads((home / "jobs" / "pair" / "status.json").read_text())
    assert status["state"] == "finished", status
