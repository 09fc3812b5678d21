"""Issue 30: the CLI as a new user meets it. Every bad option value is one kind of error,
click's usage error (exit 2), naming the option as typed and the range in words; checkpoint
roots are checked before anything starts (memory:// refused under ``ferry run``, a missing
backend named with the package to install); ``ferry inspect`` of what is no checkpoint says
so; ``python -m ferry``, ``ferry help TOPIC`` from the installed pages, ``ferry list`` with
an ellipsis and ``-o wide``; and the default job id, from the folder and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from ferry.cli import main
from ferry.runtime.identity import choose_identity, local_job_id
from ferry.runtime.jobdir import JobDir


def ferry(home: Path, *args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FERRY_")}
    return CliRunner().invoke(main, list(args), env={**env, "FERRY_HOME": str(home)}, prog_name="ferry")


# (argv, the option as click names it, words of the message)
BAD = [
    (["run", "--every-steps", "-5"], "--every-steps", "-5: must be a whole number of steps, 1 or more"),
    (["run", "--every-steps", "2.5"], "--every-steps", "'2.5' is not a whole number of steps"),
    (["run", "--every-seconds", "nan"], "--every-seconds", "a number of seconds, above 0, up to a year"),
    (["run", "--keep-last", "0"], "--keep-last", "a whole number of checkpoints, 1 or more"),
    (["run", "--exit-code", "0"], "--exit-code", "must be from 1 to 255 and not 86"),
    (["run", "--exit-code", "86"], "--exit-code", "must be from 1 to 255 and not 86"),
    (["run", "--grace", "-1"], "--grace", "0 or more, up to a year (0: never)"),
    (["run", "--max-restarts", "-1"], "--max-restarts", "a whole number, from 0 to 1,000,000"),
    (["run", "--restarts", "-1"], "--max-restarts", "a whole number, from 0 to 1,000,000"),
    (["run", "--max-failures", "2000000"], "--max-failures", "from 0 to 1,000,000"),
    (["run", "--backoff", "inf"], "--backoff", "a number of seconds, 0 or more"),
    (["run", "--env", "NOVALUE"], "--env", "'NOVALUE' is not NAME=VALUE"),
    (["run", "--env", "FERRY_DIR=x"], "--env", "FERRY_DIR would be overridden by ferry run; use --dir"),
    (["run", "--job-id", "a/b"], "--job-id", "names a folder"),
    (["run", "--dir", "memory://x/ck"], "--dir", "the job could never resume from it"),
    (["run", "--dir", "gs://bucket/ck"], "--dir", "not installed (no gcsfs module): pip install gcsfs"),
    (["run", "--dir", "nosuch://x"], "--dir", "no storage backend knows the scheme nosuch://"),
    (["checkpoint", "j", "--wait", "--timeout", "0"], "--timeout", "above 0"),
    (["stop", "j", "--timeout", "nan"], "--timeout", "above 0"),
    (["migrate", "j", "--to", "cuda:1"], "--to", "not a device list"),
    (["resume", "b", "--gpus", "1,1"], "--gpus", "names a device twice"),
    (["resume", "b", "--max-restarts", "-1"], "--max-restarts", "from 0 to 1,000,000"),
    (["resume", "b", "--dir", "memory://x"], "--dir", "memory://"),
    (["resume", "b", "--job-id", ".."], "--job-id", "names a folder"),
    (["prune", "--older-than", "soon"], "--older-than", "'soon' is not an age"),
    (["prune", "--older-than", "-3d"], "--older-than", "is negative"),
    (["chaos", "--events", "-1", "--", "true"], "--events", "a whole number of faults, 0 or more"),
    (["chaos", "--every-steps", "0", "--", "true"], "--every-steps", "1 or more"),
    (["chaos", "--kinds", "stop,bogus", "--", "true"], "--kinds", "unknown fault kind(s) bogus"),
    (["chaos", "--pause", "2", "1", "--", "true"], "--pause", "MIN must be above 0 and at most MAX"),
    (["process", "suspend", "1", "--timeout", "-1"], "--timeout", "0 or more, up to a year (0: no limit)"),
    (["list", "-o", "tall"], "-o", "'tall' is not 'wide'"),
    (["export-weights", "ck", "out", "--format", "onnx"], "--format", "'onnx' is not one of"),
    (["help", "jbos"], "TOPIC", "Did you mean 'jobs'?"),
]


@pytest.mark.parametrize(("argv", "option", "words"), BAD, ids=[" ".join(b[0][:3]) for b in BAD])
def test_every_bad_option_is_a_usage_error_naming_it(
    tmp_path: Path, argv: list[str], option: str, words: str
) -> None:
    result = ferry(tmp_path, *argv)
    assert result.exit_code == 2, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: Invalid value for '{option}'"), result.stderr
    for word in words.split("; "):
        assert word in last, last
    assert "ferry: error" not in result.stderr and not os.path.exists(tmp_path / "jobs")


@pytest.mark.parametrize("verb", ["run", "resume"])
def test_max_restarts_is_shown_and_the_old_restarts_still_parses(tmp_path: Path, verb: str) -> None:
    """Issue 32: ``--restarts`` (a limit, beside the supervisor's count of restarts) is now
    ``--max-restarts`` in ``--help``; the old name still works, hidden, for older scripts."""
    shown = ferry(tmp_path, verb, "--help").output
    assert "--max-restarts" in shown and "--restarts" not in shown.replace("--max-restarts", "")
    command = main.get_command(click.Context(main), verb)
    assert command is not None
    for name in ("--max-restarts", "--restarts"):
        argv = [*(["b"] if verb == "resume" else []), name, "3", "--", "true"]
        assert command.make_context(verb, argv).params["max_restarts"] == 3


def test_a_missing_backend_is_named_with_its_extra_before_any_worker() -> None:
    """s3fs hidden from this interpreter: the s3 extra, and no suggestion of it for gs://."""
    code = (
        "import sys; sys.modules['s3fs'] = None\n"
        "from ferry.cli import main\n"
        "main(['run', '--dir', sys.argv[1], '--', 'true'], prog_name='ferry')\n"
    )
    s3 = subprocess.run([sys.executable, "-c", code, "s3://b/ck"], capture_output=True, text=True, timeout=60)
    assert s3.returncode == 2 and "pip install 'gpuferry[s3]'" in s3.stderr, s3.stderr
    gs = subprocess.run([sys.executable, "-c", code, "gs://b/ck"], capture_output=True, text=True, timeout=60)
    assert gs.returncode == 2 and "gcsfs" in gs.stderr and "[s3]" not in gs.stderr, gs.stderr


def test_inspect_of_what_is_no_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "folder").mkdir()
    for target, words in (("notes.txt", "is a file, not a checkpoint"), ("folder", "is no checkpoint")):
        for command in ("inspect", "verify"):
            result = ferry(tmp_path, command, str(tmp_path / target))
            assert result.exit_code == 4, result.output
            assert result.stderr.startswith("ferry: error: ") and words in result.stderr, result.stderr


def test_python_m_ferry_is_the_ferry_command(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ferry", "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("Usage: ferry [OPTIONS] COMMAND"), out.stderr


def test_help_pages_are_the_installed_docs(tmp_path: Path) -> None:
    listed = ferry(tmp_path, "help")
    assert listed.exit_code == 0 and "cli " in listed.stdout and "coming-from" in listed.stdout
    page = ferry(tmp_path, "help", "jobs")
    assert page.exit_code == 0 and page.stdout.startswith("# Jobs:")
    command = ferry(tmp_path, "help", "stop")
    assert command.exit_code == 0 and command.stdout.startswith("Usage: ferry stop [OPTIONS] JOB")
    run = main.get_command(click.Context(main), "run")
    assert run is not None and "ferry help" in (run.epilog or "") and "docs/" not in (run.epilog or "")


def test_list_cuts_long_commands_with_an_ellipsis_and_wide_shows_them(tmp_path: Path) -> None:
    long = ["python", "train.py", *(f"--option-{i}" for i in range(12))]
    job = JobDir.create("j1", str(tmp_path / "jobs" / "j1"))
    job.write_identity(id="j1", command=long, checkpoint_dir="/ck/j1", worker_pid=None)
    job.update_status("finished", step=3)
    short = ferry(tmp_path, "list", "--all").stdout.splitlines()[1]
    assert short.endswith("...") and " ".join(long)[:47] in short and " ".join(long) not in short, short
    wide = ferry(tmp_path, "list", "--all", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-2:] == ["CHECKPOINTS", "COMMAND"], wide[0]
    assert wide[1].endswith(" ".join(long)) and "/ck/j1" in wide[1], wide[1]


def test_the_default_job_id_is_the_folder_and_the_command_line() -> None:
    argv = ["python", "train.py", "--lr", "3e-4"]
    same = local_job_id(argv, "/work/a")
    assert same == local_job_id(list(argv), "/work/a") and same.startswith("train-") and len(same) == 14
    assert local_job_id(argv, "/work/b") != same and local_job_id([*argv, "--x"], "/work/a") != same
    assert local_job_id(["torchrun", "--nproc-per-node", "2", "fit.py"], "/w").startswith("fit-")
    assert local_job_id(["python", "-m", "pkg.finetune"], "/w").startswith("finetune-")
    assert local_job_id(["./run it.sh"], "/w").startswith("run-it.sh-")
    mine = choose_identity(given=None, scheduler="local", scheduler_id=None, command=argv, cwd="/work/a")
    assert mine.id == same and "the working directory and the command line" in mine.why
    slurm = choose_identity(given=None, scheduler="slurm", scheduler_id="slurm-42", command=argv, cwd="/w")
    assert slurm.id == "slurm-42" and "slurm job" in slurm.why
    given = choose_identity(given="exp1", scheduler="slurm", scheduler_id="slurm-42", command=argv, cwd="/w")
    assert (given.id, given.why) == ("exp1", "named by --job-id")


def test_inspect_names_the_tracked_objects_as_export_weights_takes_them(tmp_path: Path) -> None:
    import torch

    from ferry.engine import save

    model = torch.nn.Linear(3, 2)
    save({"net": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}, str(tmp_path / "ck"), step=1)
    doc = json.loads(ferry(tmp_path, "inspect", str(tmp_path / "ck"), "--json").stdout)
    assert [(o["name"], o["tensors"]) for o in doc["objects"]] == [("net", 2), ("opt", 0)], doc["objects"]
