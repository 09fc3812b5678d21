"""Zero-code mode: unmodified scripts (they never import ferry) run under `ferry run`, are
interrupted by a signal to the supervisor, resumed by `ferry run` again, and must match
the uninterrupted plain-python run bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainrun import SCRIPTS, env_for, pid_of_rank, run
from trainrun import job_status as status

pytestmark = pytest.mark.integration
FERRY = str(Path(sys.executable).parent / "ferry")


def plain(script: str, out: Path, args: list[str], home: Path) -> None:
    """The uninterrupted run, plain python without ferry (forked: see forkserver.py)."""
    proc = run(script, out, args, env_for(home))
    assert proc.returncode == 0, proc.stderr


def under_ferry(
    script: str,
    out: Path,
    args: list[str],
    tmp: Path,
    *,
    stop_after_lines: int = 0,
    options: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    cmd = [
        FERRY,
        "run",
        "--dir",
        str(tmp / "ck"),
        "--job-id",
        "zc",
        *options,
        "--",
        sys.executable,
        str(SCRIPTS / script),
        "--out",
        str(out),
        *args,
    ]
    proc = subprocess.Popen(
        cmd, env=env_for(tmp / "home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if stop_after_lines:
        log = out / "log.txt"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and log.read_text().count("\n") >= stop_after_lines:
                proc.send_signal(signal.SIGUSR1)
                break
            time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=180)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def training_record(out: Path) -> tuple[list[str], str]:
    """Every line the runs wrote, evaluations included (the resumed run continues the saved
    epoch in place: no epoch is run again or fast-forwarded, docs/zero-code.md), and the
    final parameters."""
    return (out / "log.txt").read_text().splitlines(), (out / "params.txt").read_text()


CASES = [
    ("epochs-train-test-steplr", "zc_epochs.py", [], 30),
    ("epochs-workers2", "zc_epochs.py", ["--workers", "2"], 40),
    ("step-budget-iter-next", "zc_steps.py", [], 25),
    ("torch-compile", "zc_steps.py", ["--compile"], 25),
    ("amp-grad-scaler", "zc_steps.py", ["--amp"], 25),
]


@pytest.mark.parametrize(("case", "script", "args", "stop_after"), CASES, ids=[c[0] for c in CASES])
def test_unmodified_script_resumes_bitwise(
    case: str, script: str, args: list[str], stop_after: int, tmp_path: Path
) -> None:
    plain(script, tmp_path / "ref", args, tmp_path / "home-ref")
    first = under_ferry(
        script, tmp_path / "run", [*args, "--sleep", "0.03"], tmp_path, stop_after_lines=stop_after
    )
    assert first.returncode == 85, first.stderr
    assert "checkpointed at step" in first.stderr
    second = under_ferry(script, tmp_path / "run", args, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr
    ref_steps, ref_params = training_record(tmp_path / "ref")
    run_steps, run_params = training_record(tmp_path / "run")
    assert run_steps == ref_steps
    assert run_params == ref_params


@pytest.mark.parametrize(
    ("args", "options", "warned"),
    [
        (["--numpy-generator"], (), True),  # training draws from it
        ([], (), False),  # the global exists, but training never draws from it
        (["--numpy-generator"], ("--env", "FERRY_IGNORE_GENERATORS=SPLIT,RNG"), False),  # silenced
    ],
)
def test_untracked_global_generator_is_reported_when_training_uses_it(
    tmp_path: Path, args: list[str], options: tuple[str, ...], warned: bool
) -> None:
    proc = under_ferry("zc_steps.py", tmp_path / "run", [*args, "--steps", "12"], tmp_path, options=options)
    assert proc.returncode == 0, proc.stderr
    assert ("global RNG (a numpy Generator) is not captured" in proc.stderr) is warned, proc.stderr
    assert "SPLIT" not in proc.stderr  # drawn from only while setting up, before the first safe point


def test_existing_sitecustomize_keeps_working(tmp_path: Path) -> None:
    """ferry's start-up hook goes first on PYTHONPATH and chains to the user's own."""
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    probe = "import os, sys; print(os.environ.get('USER_SITE_RAN'), 'ferry.autotrack.hooks' in sys.modules)"
    env = env_for(tmp_path / "home", PYTHONPATH=str(user_site))
    proc = subprocess.run(
        [FERRY, "run", "--dir", str(tmp_path / "ck"), "--", sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "True"]


def test_a_worker_with_a_bad_ferry_setting_never_trains_unprotected(tmp_path: Path) -> None:
    """The start-up hook in a worker whose FERRY_* variable is bad (ferry run checks its own;
    torchrun or a wrapper may change them) ends the process with one line, before the script
    runs, instead of Python's "Error in sitecustomize" and a run without checkpoints."""
    from ferry.autotrack import BOOT_DIR

    env = env_for(tmp_path / "home", FERRY_AUTOTRACK="1", PYTHONPATH=BOOT_DIR, FERRY_EVERY_SECONDS="1m")
    proc = subprocess.run(
        [sys.executable, "-c", "print('trained')"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert (
        proc.stderr
        == "ferry: error: FERRY_EVERY_SECONDS='1m' is not a number: set it to a number (or empty, for none)\n"
    )


def stop_rank_one_after_13_steps(cmd: list[str], env: dict[str, str], out: Path, script: str) -> None:
    """Run ``cmd`` (ferry run -- torchrun ...) and SIGUSR1 rank 1 alone once rank 0 logged 13
    steps; the whole job must then checkpoint and exit 85. The ranks hold after step 13 until
    the signal is sent, so a busy machine cannot let training end first. The ranks agree
    every few steps (at most 0.5 s apart), so the stop lands from step 13 to 23: mid-epoch
    (an epoch is 12 steps)."""
    release = out.parent / "release-ranks"
    cmd = [*cmd, "--hold-at", "13", "--release", str(release)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "rank0" / "log.txt"
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and first.poll() is None:
            if log.exists() and log.read_text().count("\n") >= 13:
                pid = pid_of_rank(script, 1, out)
                assert pid is not None
                os.kill(pid, signal.SIGUSR1)
                break
            time.sleep(0.02)
    finally:
        release.touch()
    _, err = first.communicate(timeout=240)
    assert first.returncode == 85, err[-3000:]


def test_torchrun_two_ranks_signal_one_rank_then_resume_on_two_and_one(tmp_path: Path) -> None:
    """DDP + DistributedSampler under `ferry run -- torchrun`: SIGUSR1 to rank 1 alone; both
    ranks save the same step; the resumed run equals the uninterrupted one bit for bit (every
    rank's losses, the weights). The mid-epoch 2-rank checkpoint is refused on 1 rank; an
    epoch-boundary one resumes there. Each rank looks torch up before importing it (as
    `datasets` does), which once left every rank without ferry's hooks."""
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node"]
    script = str(SCRIPTS / "zc_ddp_lookup.py")
    env = env_for(tmp_path / "home", OMP_NUM_THREADS="1")
    ref = subprocess.run(
        [*torchrun, "2", script, "--out", str(tmp_path / "ref")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]

    cmd = [
        FERRY,
        "run",
        "--dir",
        str(tmp_path / "ck"),
        "--job-id",
        "ddp",
        "--",
        *torchrun,
        "2",
        script,
        "--out",
        str(tmp_path / "run"),
    ]
    stop_rank_one_after_13_steps([*cmd, "--sleep", "0.05"], env, tmp_path / "run", script)
    (saved,) = [p for p in (tmp_path / "ck").iterdir() if p.name.startswith("step-")]
    assert sorted(f.name for f in saved.iterdir()) == [
        "data-0.bin",
        "manifest.json",
        "rank-1.bin",
        "rank-1.json",
    ]
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "run" / "params.txt").read_text() == (tmp_path / "ref" / "params.txt").read_text()
    for rank in (0, 1):
        got = training_record_lines(tmp_path / "run" / f"rank{rank}" / "log.txt")
        assert got == training_record_lines(tmp_path / "ref" / f"rank{rank}" / "log.txt")

    one_rank = [
        FERRY,
        "run",
        "--dir",
        str(tmp_path / "ck"),
        "--job-id",
        "ddp1",
        "--",
        *torchrun,
        "1",
        script,
        "--out",
        str(tmp_path / "one"),
    ]
    # the checkpoint left by the finished run is mid-epoch: refused on another number of ranks
    (tmp_path / "ck2").mkdir()
    import shutil

    shutil.copytree(saved, tmp_path / "ck2" / saved.name)
    one_rank[3] = str(tmp_path / "ck2")
    refused = subprocess.run(one_rank, env=env, capture_output=True, text=True, timeout=240)
    assert refused.returncode != 0
    assert "taken mid-epoch by 2 ranks" in refused.stderr


def training_record_lines(path: Path) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line for line in path.read_text().splitlines()}


def test_fsdp_sharded_state_goes_through_dcp_and_reshards(tmp_path: Path) -> None:
    """FSDP2 (DTensor parameters) under `ferry run -- torchrun`: the sharded model and its
    optimizer are saved through torch.distributed.checkpoint inside ferry's checkpoint; a
    signal to rank 1 alone stops both ranks at one step; the resumed run is bitwise equal;
    the last (epoch-boundary) checkpoint then resumes on 1 rank, resharded by DCP."""
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node"]
    script = str(SCRIPTS / "zc_fsdp.py")
    env = env_for(tmp_path / "home", OMP_NUM_THREADS="1")
    ref = subprocess.run([*torchrun, "2", script, "--out", str(tmp_path / "ref")], env=env,
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert ref.returncode == 0, ref.stderr[-3000:]
    cmd = [FERRY, "run", "--dir", str(tmp_path / "ck"), "--job-id", "fsdp", "--every-steps", "8", "--",
           *torchrun, "2", script, "--out", str(tmp_path / "run")]  # fmt: skip
    stop_rank_one_after_13_steps([*cmd, "--sleep", "0.05"], env, tmp_path / "run", script)
    newest = sorted(p for p in (tmp_path / "ck").iterdir() if p.name.startswith("step-"))[-1]
    assert {f.name for f in (newest / "dcp").iterdir()} == {"metadata.json", "shards-0.bin", "shards-1.bin"}
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "run" / "params.txt").read_text() == (tmp_path / "ref" / "params.txt").read_text()
    for rank in (0, 1):
        got = training_record_lines(tmp_path / "run" / f"rank{rank}" / "log.txt")
        assert got == training_record_lines(tmp_path / "ref" / f"rank{rank}" / "log.txt")
    one = [FERRY, "run", "--dir", str(tmp_path / "ck"), "--job-id", "fsdp1", "--", *torchrun, "1", script,
           "--out", str(tmp_path / "one"), "--epochs", "4"]  # fmt: skip
    resharded = subprocess.run(one, env=env, capture_output=True, text=True, timeout=240)
    assert resharded.returncode == 0, resharded.stderr[-3000:]
    assert "resumed from" in resharded.stderr and "at step 24" in resharded.stderr
    assert len((tmp_path / "one" / "rank0" / "log.txt").read_text().splitlines()) == 16  # epoch 4, 1 rank


@pytest.mark.parametrize("style", ["module", "shebang"])
def test_bootstrap_reaches_python_m_and_shebang_scripts(style: str, tmp_path: Path) -> None:
    """`ferry run -- python -m pkg` and `ferry run -- ./script` (a shebang) get zero-code mode too."""
    probe = "import sys\nprint('ferry.autotrack.hooks' in sys.modules)\n"
    if style == "module":
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        (tmp_path / "pkg" / "__main__.py").write_text(probe)
        command = [sys.executable, "-m", "pkg"]
    else:
        script = tmp_path / "probe.py"
        script.write_text(f"#!{sys.executable}\n{probe}")
        script.chmod(0o755)
        command = [str(script)]
    proc = subprocess.run(
        [FERRY, "run", "--dir", str(tmp_path / "ck"), "--", *command],
        cwd=tmp_path,
        env=env_for(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_killed_torchrun_agent_leaves_no_rank_behind(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own: when the agent is SIGKILLed, ferry
    run must still end the ranks (found by the FERRY_SUPERVISOR_PID they inherit)."""
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2"]
    script = str(SCRIPTS / "zc_ddp.py")
    job = tmp_path / "home" / "jobs" / "orphans"
    cmd = [FERRY, "run", "--dir", str(tmp_path / "ck"), "--job-id", "orphans", "--", *torchrun, script,
           "--out", str(tmp_path / "run"), "--sleep", "0.05", "--epochs", "50"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env_for(tmp_path / "home", OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    log = tmp_path / "run" / "rank1" / "log.txt"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [pid_of_rank(script, r, tmp_path / "run") for r in (0, 1)]
    assert None not in ranks
    agent = int(status(job)["worker_pid"])
    os.kill(agent, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "outlived the worker outside its group" in err
    assert not any(Path(f"/proc/{pid}").exists() and "zc_ddp" in Path(f"/proc/{pid}/cmdline").read_text()
                   for pid in ranks if pid is not None)  # fmt: skip
