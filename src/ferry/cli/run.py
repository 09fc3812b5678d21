"""``ferry run``: start a training command under ferry's supervisor (see ferry.supervisor)."""

from __future__ import annotations

import os

import click

from ferry.cli.events import events_on_stdout
from ferry.cli.output import json_option
from ferry.cli.params import GRACE, POSITIVE_SECONDS, SECONDS, Checked, OldNamesHidden, Whole
from ferry.cli.preflight import check_places, refuse_bare_script, refuse_nested
from ferry.errors import ConfigError
from ferry.knobs import (
    BACKOFF_CAP_SECONDS,
    BACKOFF_SECONDS,
    CHECKPOINT_EXIT_CODE,
    FAILURE_EXIT_CODE,
    GRACE_SECONDS,
)
from ferry.runtime.jobdir import jobs_root
from ferry.state.usercode import ROOTS_VARIABLE
from ferry.supervisor import RunOptions, Supervisor
from ferry.supervisor.options import MAX_RESTARTS, SUPERVISOR_OWNED, check_job_id, check_root


def env_pair(pair: str) -> tuple[str, str]:
    """``--env NAME=VALUE``: ConfigError for what is no pair, or a variable ferry run sets."""
    key, eq, value = pair.partition("=")
    if not eq or not key:
        raise ConfigError(f"{pair!r} is not NAME=VALUE")
    if key in SUPERVISOR_OWNED:
        raise ConfigError(
            f"{key} would be overridden by ferry run, which sets it for the worker; use "
            f"{SUPERVISOR_OWNED[key]} instead"
        )
    return key, value


def exit_code(text: str) -> int:
    """``--exit-code``: a status the supervisor can tell from "finished" and "failed"."""
    try:
        code = int(text, 10)
    except ValueError:
        raise ConfigError(f"{text!r} is not a whole number") from None
    if not 0 < code < 256 or code == FAILURE_EXIT_CODE:
        raise ConfigError(
            f"{code}: must be from 1 to 255 and not {FAILURE_EXIT_CODE} (a stop whose checkpoint "
            "failed): 0 reads as finished, and statuses above 255 wrap around"
        )
    return code


ENV_PAIR = Checked("NAME=VALUE", env_pair)
ROOT = Checked("URL", check_root)
JOB_ID = Checked("ID", check_job_id)


def _code_roots(env: dict[str, str], roots: tuple[str, ...]) -> dict[str, str]:
    """``--code-root`` folders, made absolute, before those FERRY_CODE_ROOTS names already."""
    if roots:
        given = env.get(ROOTS_VARIABLE, os.environ.get(ROOTS_VARIABLE, ""))
        env[ROOTS_VARIABLE] = os.pathsep.join([*(os.path.abspath(r) for r in roots), *filter(None, [given])])
    return env


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    help=f"""Run COMMAND as a preemptible job: ferry run [OPTIONS] -- COMMAND [ARGS]...

    The command runs in its own process group. Every signal ferry run receives is
    forwarded to that whole group; SIGTERM, SIGINT and SIGUSR1 make the training
    checkpoint at its next safe point and exit {CHECKPOINT_EXIT_CODE}. SIGUSR2 takes a checkpoint and goes on.
    Without --no-autotrack, a script in the usual PyTorch idiom needs no change.
    """,
    epilog=f"""\b
Exit status:
  0      the command finished (or had finished before: nothing to do)
  {CHECKPOINT_EXIT_CODE}     checkpointed and stopped (a stop signal or request): run the
         same command again, in the same folder, to resume
  {FAILURE_EXIT_CODE}     a stop was requested but its checkpoint could not be committed
  2      usage error: no command, a command that cannot run, a bad option, a checkpoint
         root or FERRY_HOME that cannot be written, ferry run inside ferry run
  8      the job is already running (its lock is held)
  other  the command's own failure status (128+N: killed by signal N)

\b
Examples:
  ferry run -- python train.py --lr 3e-4
  ferry run --job-id exp1 --every-seconds 600 --max-failures 3 -- torchrun --nproc-per-node 4 train.py

With --json, stdout carries the job's events, one JSON object a line (run_start,
worker_start, checkpoint, stop, worker_exit, restart, run_end, ...: `ferry help cli`),
and the command's own stdout goes to stderr.

The job's identity, its directory and the restart rules: `ferry help jobs`.""",
)
@click.option(
    "--dir",
    "checkpoint_dir",
    type=ROOT,
    envvar="FERRY_DIR",
    show_envvar=True,
    help="Checkpoint root, a path or an fsspec URL (s3://, root://).  [default: ./ferry-checkpoints/JOB_ID]",
)
@click.option(
    "--job-id",
    type=JOB_ID,
    help="The job's id; names its job directory.  [default: the scheduler's job id, else NAME-HASH "
    "of the working directory and the command line: the same command run here again resumes]",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Start over: delete the job's checkpoints (and its record that it finished) instead of resuming.",
)
@click.option(
    "--every-steps", type=Whole(1, what="steps"), metavar="N", help="Also checkpoint every N training steps."
)
@click.option("--every-seconds", type=POSITIVE_SECONDS, metavar="S", help="Also checkpoint every S seconds.")
@click.option(
    "--keep-last",
    type=Whole(1, what="checkpoints"),
    metavar="N",
    help="Committed checkpoints to keep.  [default: 3]",
)
@click.option(
    "--exit-code",
    type=Checked("CODE", exit_code),
    default=CHECKPOINT_EXIT_CODE,
    show_default=True,
    help='The "checkpointed, resume me" exit status, of the worker and of ferry run.',
)
@click.option(
    "--grace",
    type=GRACE,
    default=GRACE_SECONDS,
    show_default=True,
    metavar="S",
    help="After a stop signal, SIGKILL the command if it has not exited within S seconds (0: never).",
)
@click.option(
    "--max-restarts",
    "--restarts",
    cls=OldNamesHidden,
    type=Whole(0, MAX_RESTARTS),
    default=0,
    show_default=True,
    help="In-place restarts allowed (a `restart` control request, e.g. to change CUDA_VISIBLE_DEVICES).",
)
@click.option(
    "--max-failures",
    type=Whole(0, MAX_RESTARTS),
    default=0,
    show_default=True,
    help="Restart a crashed command from its last checkpoint up to this many times.",
)
@click.option(
    "--backoff",
    type=SECONDS,
    default=BACKOFF_SECONDS,
    show_default=True,
    metavar="S",
    help=f"Wait before the n-th restart after a failure: S * 2**(n-1), at most {BACKOFF_CAP_SECONDS:g} s.",
)
@click.option("--env", "env_pairs", type=ENV_PAIR, multiple=True, help="Set a variable for the command.")
@click.option(
    "--allow-changed-inputs",
    is_flag=True,
    envvar="FERRY_ALLOW_CHANGED_INPUTS",
    show_envvar=True,
    help="Resume even when a loader's batch size, dataset length, sampler or drop_last changed "
    "since the checkpoint (refused otherwise: the saved position would mean other samples).",
)
@click.option(
    "--overlap-snapshot",
    is_flag=True,
    envvar="FERRY_OVERLAP_SNAPSHOT",
    show_envvar=True,
    help="Copy the parameters an optimizer updates, and its state, while the next forward and "
    "backward run; its next step() waits for the copies. For scripts that change those only in "
    "step() (a checkpoint that finds otherwise fails, and the overlap turns off).",
)
@click.option(
    "--code-root",
    "code_roots",
    multiple=True,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Count the files under DIR as your own code (zero-code mode captures the training "
    "loop's state in them) even inside a site-packages folder; repeatable. Sets FERRY_CODE_ROOTS.",
)
@click.option(
    "--no-autotrack",
    is_flag=True,
    help="No zero-code hooks: for scripts that use ferry's explicit API, or none at all.",
)
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_cmd(
    ctx: click.Context,
    checkpoint_dir: str | None,
    job_id: str | None,
    fresh: bool,
    every_steps: int | None,
    every_seconds: float | None,
    keep_last: int | None,
    exit_code: int,
    grace: float,
    max_restarts: int,
    max_failures: int,
    backoff: float,
    env_pairs: tuple[tuple[str, str], ...],
    allow_changed_inputs: bool,
    overlap_snapshot: bool,
    code_roots: tuple[str, ...],
    no_autotrack: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    # The help text is the command's help= above: it names the exit code by its constant.
    options = RunOptions(
        dir=checkpoint_dir,
        job_id=job_id,
        fresh=fresh,
        every_steps=every_steps,
        every_seconds=every_seconds,
        keep_last=keep_last,
        exit_code=exit_code,
        grace_seconds=None if grace == 0 else grace,
        max_restarts=max_restarts,
        max_failures=max_failures,
        backoff_seconds=backoff,
        autotrack=not no_autotrack,
        allow_changed_inputs=allow_changed_inputs,
        overlap_snapshot=overlap_snapshot,
        env=_code_roots(dict(env_pairs), code_roots),
    )
    refuse_nested("ferry run", command)
    refuse_bare_script(command, options.env.get("PATH", os.environ.get("PATH")))
    supervisor = Supervisor(command, options)
    check_places(supervisor.checkpoint_dir)
    if not as_json:
        ctx.exit(supervisor.run())
    with events_on_stdout(os.path.join(jobs_root(), supervisor.job_id, "events.jsonl")):
        code = supervisor.run()
    ctx.exit(code)


COMMANDS = [run_cmd]
