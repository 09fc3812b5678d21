"""``ferry migrate``, ``ferry export`` and ``ferry resume``: move a job to other devices in
place, or out of this machine as a bundle, and start it again from a bundle or checkpoint.
Exit codes: `ferry help cli`."""

from __future__ import annotations

import os

import click

from ferry.cli.complete import complete_job
from ferry.cli.jobs import EPILOG
from ferry.cli.output import emit_json, json_option
from ferry.cli.params import GRACE, POSITIVE_SECONDS, Checked, OldNamesHidden, Whole, check_timeout
from ferry.cli.places import URL, check_writable, local_path
from ferry.cli.preflight import check_places, refuse_nested
from ferry.cli.run import JOB_ID, ROOT
from ferry.errors import ConfigError, NoCheckpointError
from ferry.knobs import GRACE_SECONDS, REQUEST_TIMEOUT_SECONDS
from ferry.ops import bundle as bundles
from ferry.ops import devices
from ferry.ops import migrate as ops
from ferry.ops.jobs import find_job
from ferry.ops.warmresume import BundleGate
from ferry.progress import Progress, meter_for
from ferry.runtime.finished import clear_finished
from ferry.runtime.identity import default_job_id
from ferry.supervisor import RunOptions, Supervisor
from ferry.supervisor.options import MAX_RESTARTS, check_command

DEVICES = Checked("DEVICES", lambda text: ",".join(devices.parse(text)))
"""A device list as CUDA_VISIBLE_DEVICES takes it, checked for its form here (whether the
devices exist is the command's check, where NVML can tell)."""


def _progress(as_json: bool) -> Progress:
    def note(message: str) -> None:
        click.echo(f"ferry: {message}", err=True)

    return (lambda message: None) if as_json else note


timeout_option = click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=REQUEST_TIMEOUT_SECONDS,
    show_default=True,
    metavar="S",
    help="Give up after S seconds (exit 8).",
)


@click.command("migrate", epilog=EPILOG)
@click.argument("job", shell_complete=complete_job)
@click.option(
    "--to",
    "target",
    type=DEVICES,
    required=True,
    help="The target CUDA_VISIBLE_DEVICES: GPU indices or UUIDs, comma-separated.",
)
@click.option(
    "--unchecked-devices",
    is_flag=True,
    help="Move even where the target devices cannot be checked (no NVML here).",
)
@click.option(
    "--cold",
    is_flag=True,
    help="Restart the worker instead of starting the target worker beside the old one first.",
)
@timeout_option
@json_option
def migrate_cmd(
    job: str, target: str, unchecked_devices: bool, cold: bool, timeout: float, as_json: bool
) -> None:
    """Move JOB to other GPUs of this machine: checkpoint, hand over, resume on DEVICES.

    Warm by default: the worker on DEVICES starts beside the running one and waits at its
    restore point; the old worker then checkpoints at its next safe point, hands its state
    over in host memory and exits, and the new one restores it and trains on. Cold (--cold,
    or where the preflight finds too little host or GPU memory for a second copy, or a
    multi-rank job): the old worker checkpoints and exits, then the new one starts.

    Returns once the new worker resumed at the saved step and took two steps, and prints the
    downtime: warm, drain (to the next safe point), hand-over (save included), restore and
    the first step's warm-up (beyond the second step's length); cold, drain, save, restart,
    restore. The job must run under
    `ferry run --max-restarts N`.
    """
    result = ops.migrate(
        find_job(job),
        target,
        check_timeout(timeout),
        _progress(as_json),
        unchecked=unchecked_devices,
        cold=cold,
        meter=meter_for(as_json),
    )
    if as_json:
        emit_json(result.to_dict())
        return
    moved = (
        f"job {result.job} moved from {result.source or 'all devices'} to {result.target} at step "
        f"{result.step}, worker pid {result.pid}; "
    )
    if result.warm:
        click.echo(
            f"{moved}downtime {result.downtime:.2f} s (drain {result.drain:.2f} s, hand-over "
            f"{result.handover:.2f} s of which save {result.save:.2f} s, restore {result.restore:.2f} s, "
            f"first step {result.first_step or 0.0:.2f} s); warm start-up {result.warm_startup:.2f} s "
            "while the job trained"
        )
        return
    click.echo(
        f"{moved}downtime {result.downtime:.2f} s (drain {result.drain:.2f} s, save {result.save:.2f} s, "
        f"restart {result.restart:.2f} s, restore {result.restore:.2f} s); cold: {result.cold_reason}"
    )


@click.command("export", epilog=EPILOG)
@click.argument("job", shell_complete=complete_job)
@click.argument("dest_url", type=URL)
@timeout_option
@json_option
def export_cmd(job: str, dest_url: str, timeout: float, as_json: bool) -> None:
    """Checkpoint and stop JOB, leaving a bundle at DEST_URL that `ferry resume` starts again.

    The bundle is a folder (a path or an fsspec URL): bundle.json (command, working
    directory, the environment that matters, versions) and checkpoints/<name>/.
    A job that is not running gets its newest committed checkpoint exported.
    """
    record = find_job(job)
    # before the job is stopped: a bundle that cannot be written must leave it training
    check_writable(dest_url, "the bundle's folder", "give DEST_URL a folder you can write")
    bundle = bundles.export(record, dest_url, check_timeout(timeout), _progress(as_json), meter_for(as_json))
    if as_json:
        emit_json(bundle)
        return
    click.echo(
        f"job {bundle['job']} exported at step {bundle['step']} to {bundle['url']}; "
        f"start it again with: ferry resume {bundle['url']}"
    )


def _resume_target(checkpoint_dir: str | None, job_id: str) -> str:
    """Where a resumed job's checkpoints go: --dir, or ./ferry-checkpoints/<job>; absolute."""
    target = checkpoint_dir or os.path.join("ferry-checkpoints", job_id)
    return target if "://" in target else os.path.abspath(target)


def _refuse_file(source: str) -> None:
    """NoCheckpointError for a SOURCE that is a local file (a script, a log): it would otherwise
    end in a storage error that cannot list it."""
    path = local_path(source)
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise NoCheckpointError(
            f"{source} is a file, not a bundle or a checkpoint: give the folder `ferry export` "
            "wrote, or a checkpoint (or its root) and the command after --"
        )


@click.command("resume")
@click.argument("source", type=URL)
@click.option("--gpus", type=DEVICES, help="CUDA_VISIBLE_DEVICES for the job (default: the bundle's).")
@click.option("--job-id", type=JOB_ID, help="The new job's id.  [default: HOST-PID]")
@click.option(
    "--dir",
    "checkpoint_dir",
    type=ROOT,
    help="Checkpoint root of the new job; the checkpoint is copied there. [default: ./ferry-checkpoints/ID]",
)
@click.option(
    "--max-restarts",
    "--restarts",
    cls=OldNamesHidden,
    type=Whole(0, MAX_RESTARTS),
    default=0,
    show_default=True,
    help="In-place restarts allowed (migrate).",
)
@click.option(
    "--grace", type=GRACE, default=GRACE_SECONDS, show_default=True, metavar="S", help="As for ferry run."
)
@click.option(
    "--warm",
    is_flag=True,
    help="Start the worker now, before the bundle exists; it takes over once `ferry export` wrote it.",
)
@click.option(
    "--no-autotrack",
    is_flag=True,
    help="Explicit mode (as for ferry run); default: the bundle's mode, else zero-code.",
)
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def resume_cmd(
    ctx: click.Context,
    source: str,
    gpus: str | None,
    job_id: str | None,
    checkpoint_dir: str | None,
    max_restarts: int,
    grace: float,
    warm: bool,
    no_autotrack: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Start a job from a bundle (ferry export) or a checkpoint URL: ferry resume SOURCE [-- COMMAND].

    Runs it under ferry run's supervisor, in the foreground, with the bundle's command,
    working directory and environment unless given; exit codes as for ferry run.

    With --warm, SOURCE is where `ferry export` on the job's node will write the bundle:
    the worker (COMMAND, required, with this shell's environment and working directory)
    starts now and waits at its restore point; once the bundle is there and holds the same
    command, its checkpoint is copied here and the worker takes over, and the downtime of
    the move is printed.
    """
    refuse_nested("ferry resume", command)
    _refuse_file(source)
    job_id = job_id or default_job_id()
    target = _resume_target(checkpoint_dir, job_id)
    check_places(target)
    progress = _progress(as_json)
    if warm and bundles.load_bundle(source) is None:
        _resume_warm(
            ctx, source, gpus, job_id, target, max_restarts, grace, no_autotrack, list(command), as_json
        )
        return
    argv, env, cwd, autotrack = bundles.prepare_resume(
        source, target, list(command), gpus, progress, meter_for(as_json)
    )
    autotrack = autotrack and not no_autotrack
    if cwd is not None:
        os.chdir(cwd)
    again = bundles.resume_command(
        job_id=job_id,
        checkpoint_dir=target,
        command=argv,
        env=env,
        cwd=cwd or os.getcwd(),
        autotrack=autotrack,
        max_restarts=max_restarts,
    )
    options = RunOptions(
        dir=target,
        job_id=job_id,
        env=env,
        autotrack=autotrack,
        max_restarts=max_restarts,
        grace_seconds=None if grace == 0 else grace,
        resume_command=again,
    )
    code = Supervisor(argv, options).run()
    if as_json:
        emit_json({"job": job_id, "dir": target, "command": argv, "env": env, "exit_code": code})
    ctx.exit(code)


def _resume_warm(
    ctx: click.Context,
    source: str,
    gpus: str | None,
    job_id: str,
    target: str,
    max_restarts: int,
    grace: float,
    no_autotrack: bool,
    command: list[str],
    as_json: bool,
) -> None:
    progress = _progress(as_json)
    if not command:
        raise ConfigError(
            f"there is no bundle at {source} yet: `ferry resume --warm` starts the worker before it "
            "exists, so give its command after --"
        )
    check_command(command, os.environ.get("PATH"))
    env: dict[str, str] = {}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"], warning = devices.check(gpus)
        if warning:
            progress(f"warning: {warning}")
    again = bundles.resume_command(
        job_id=job_id,
        checkpoint_dir=target,
        command=command,
        env=env,
        cwd=os.getcwd(),
        autotrack=not no_autotrack,
        max_restarts=max_restarts,
    )
    options = RunOptions(
        dir=target,
        job_id=job_id,
        env=env,
        autotrack=not no_autotrack,
        max_restarts=max_restarts,
        grace_seconds=None if grace == 0 else grace,
        resume_command=again,
    )
    clear_finished(target)  # started again on purpose: an older run's end does not stand
    gate = BundleGate(source, target, command, progress)
    code = Supervisor(command, options, gate=gate).run()
    if as_json:
        move = None if gate.move is None else {**gate.move.__dict__, "downtime": gate.move.downtime}
        emit_json(
            {"job": job_id, "dir": target, "command": command, "env": env, "exit_code": code, "move": move}
        )
    ctx.exit(code)


COMMANDS = [migrate_cmd, export_cmd, resume_cmd]
