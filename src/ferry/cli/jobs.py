"""``ferry list``, ``status``, ``checkpoint`` and ``stop``: see and control running jobs.

JOB is a job id or a PID (the worker's, the session's or the supervisor's). Errors are
one line with an exit code: 2 for bad input, 8 for a job that cannot be found, reached
or controlled (docs/cli.md).
"""

from __future__ import annotations

import os
import shlex
import time
from typing import TypedDict

import click

from ferry.cli.complete import complete_job
from ferry.cli.output import clip, clock, emit_json, human_bytes, json_option, table
from ferry.cli.params import POSITIVE_SECONDS
from ferry.errors import ConfigError, FerryError, JobError
from ferry.knobs import CHECKPOINT_EXIT_CODE, REQUEST_TIMEOUT_SECONDS
from ferry.ops.jobs import JobRecord, JobSummary, find_job, job_nodes, list_jobs, process_name
from ferry.ops.requests import save_in_flight, send, wait_answer
from ferry.process import nvml
from ferry.progress import meter_for

EPILOG = """\b
Exit status:
  0  done
  2  bad input: not a job id or PID, a malformed option, a bad device list
  8  the job cannot be found, reached or controlled: unknown, not running,
     another user's, or it failed, refused or did not answer the request
     in --timeout
Every exit code: `ferry help cli`."""


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _note(message: str) -> None:
    click.echo(message, err=True)


def _pgid(pid: int) -> int:
    """A worker runs in a process group of its own: its ranks and helpers share its pgid."""
    try:
        return os.getpgid(pid)
    except OSError:  # gone, or in another PID namespace
        return -1


class GpuProcess(TypedDict):
    pid: int
    name: str
    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    memory_bytes: int
    job: str | None


class _Asked(TypedDict):
    job: str
    request: str


class Asked(_Asked, total=False):
    """One job's outcome in ``ferry checkpoint``."""

    step: int | None
    url: str | None
    seconds: float | None
    error: str


def gpu_processes(job_pids: dict[int, str]) -> tuple[list[GpuProcess], str | None]:
    """Every compute process NVML sees, marked with its ferry job; or the reason there are none."""
    why = nvml.status()
    if why is not None:
        return [], why
    nv = nvml._nvml()
    rows: list[GpuProcess] = []
    for gpu in nvml.gpus():
        handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
        try:
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
        except nv.NVMLError:
            continue
        for p in procs:
            pid = int(p.pid)
            rows.append(
                {
                    "pid": pid,
                    "name": process_name(pid)[:60],
                    "gpu_index": gpu.index,
                    "gpu_uuid": str(gpu.uuid),
                    "gpu_name": gpu.name,
                    "memory_bytes": int(p.usedGpuMemory or 0),
                    "job": job_pids.get(pid) or job_pids.get(_pgid(pid)),
                }
            )
    return rows, None


COMMAND_WIDTH = 50
"""Characters of a job's command line in ``ferry list`` (``-o wide``: all of them)."""


def _job_rows(jobs: list[JobSummary], wide: bool) -> str:
    headers = ["JOB", "HOST", "PID", "STATE", "START", "STEP", "DEVICES", "CKPT", "AGE", "COMMAND"]
    rows = []
    for j in jobs:
        command = shlex.join(j["command"])
        row = [
            j["id"] if j["node"] is None else f"{j['id']} ({j['node']} of {j['nodes']})",
            j["host"] or "-",
            j["pid"] or "-",
            j["state"],
            clock(j["started"]),
            j["step"] if j["step"] is not None else "-",
            j["devices"] or ("-" if not j["alive"] else "(all)"),
            j["last_checkpoint_step"] if j["last_checkpoint_step"] is not None else "-",
            _age(j["last_checkpoint_age"]),
            command if wide else clip(command, COMMAND_WIDTH),
        ]
        if wide:
            row.insert(-1, j["checkpoint_dir"] or "-")
        rows.append(row)
    if wide:
        headers.insert(-1, "CHECKPOINTS")
    return table(headers, rows)


@click.command("list", epilog=EPILOG)
@click.option("--all", "show_all", is_flag=True, help="Also jobs that ended.")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["wide"]),
    help="wide: the whole command line, and each job's checkpoint root.",
)
@json_option
def list_cmd(show_all: bool, output: str | None, as_json: bool) -> None:
    """Ferry jobs, and the GPU processes NVML sees (marking which are ferry jobs). Also: ls, ps.

    Jobs are sorted by id, numbers by value (job2 before job10). START is when the job's
    current run started, AGE the age of its last checkpoint. A command line longer than
    50 characters ends in an ellipsis; -o wide shows it whole, with the checkpoint root.
    """
    records = [r for r in list_jobs() if show_all or r.alive]
    jobs = [r.summary() for r in records]
    job_pids = {pid: r.id for r in records if r.alive for pid in r.pids}
    procs, why = gpu_processes(job_pids)
    if as_json:
        emit_json({"jobs": jobs, "gpu_processes": procs, "gpu_unavailable": why})
        return
    if jobs:
        click.echo(_job_rows(jobs, output == "wide"))
    else:
        click.echo("no running ferry jobs" + ("" if show_all else " (--all shows ended ones)"))
    click.echo("")
    if why is not None:
        click.echo(f"GPU processes: not available: {why}")
    elif procs:
        rows = [
            [
                p["pid"],
                p["gpu_index"],
                p["gpu_uuid"],
                human_bytes(p["memory_bytes"]),
                p["job"] or "-",
                p["name"],
            ]
            for p in procs
        ]
        click.echo(table(["PID", "GPU", "UUID", "MEMORY", "FERRY JOB", "NAME"], rows))
    else:
        click.echo("GPU processes: none")


@click.command("status", epilog=EPILOG)
@click.argument("job", shell_complete=complete_job)
@json_option
def status_cmd(job: str, as_json: bool) -> None:
    """One job in detail: state, step, devices, checkpoint history with save times."""
    record = find_job(job)
    s = record.summary()
    history = record.status.get("checkpoints", [])
    saving = save_in_flight(record)
    nodes = job_nodes(record)
    if as_json:
        emit_json(
            {**s, "status": record.status, "identity": record.identity, "saving": saving, "job_nodes": nodes}
        )
        return
    node = "" if s["node"] is None else f" on {s['nodes']} nodes (this is {s['node']})"
    click.echo(f"job {s['id']}{node}: {s['state']} at step {s['step']}  (job directory {s['job_dir']})")
    click.echo(f"  command      {shlex.join(s['command'])}")
    click.echo(f"  host         {s['host'] or '-'}   started {clock(s['started'])}")
    click.echo(f"  worker pid   {s['pid']}   supervisor pid {s['supervisor_pid'] or '-'}")
    click.echo(f"  devices      {s['devices'] or ('-' if not s['alive'] else '(all visible)')}")
    click.echo(f"  checkpoints  {s['checkpoint_dir']}")
    for n in nodes:
        here = "  (this one)" if n["job_dir"] == record.dir.path else ""
        click.echo(
            f"  {n['node']:<12} {n['host'] or '?'}: {n['state'] or ('alive' if n['alive'] else 'gone')}, "
            f"supervisor pid {n['supervisor_pid'] or '-'}{here}"
        )
    error = record.status.get("error")
    if error:
        click.echo(f"  error        {error}")
    if saving is not None:
        click.echo(
            f"  saving       step {saving['step']}: {human_bytes(saving['bytes'])} of "
            f"{human_bytes(saving['total'])} in {saving['seconds']:.1f} s "
            f"({human_bytes(int(saving['bytes_per_second']))}/s)"
        )
    if history:
        rows = [
            [
                c["step"],
                time.strftime("%H:%M:%S", time.localtime(c["time"])),
                human_bytes(c["bytes"]),
                f"{c['seconds']:.3f}",
                f"{c['blocking_seconds']:.3f}",
                c["url"],
            ]
            for c in history
        ]
        click.echo(table(["STEP", "TIME", "SIZE", "SAVE S", "BLOCKED S", "URL"], rows))
        secs = [c["seconds"] for c in history]
        click.echo(f"save time: mean {sum(secs) / len(secs):.3f} s, max {max(secs):.3f} s")
    else:
        click.echo("no checkpoint yet")


def _targets(job: str | None, all_jobs: bool) -> list[JobRecord]:
    if all_jobs == (job is not None):
        raise ConfigError("give either JOB or --all")
    if job is not None:
        return [find_job(job)]
    return [r for r in list_jobs() if r.alive and r.uid in (None, os.getuid())]


@click.command("checkpoint", epilog=EPILOG)
@click.argument("job", required=False, shell_complete=complete_job)
@click.option("--all", "all_jobs", is_flag=True, help="Every running job of this user (a preStop hook).")
@click.option("--stop", is_flag=True, help=f"Then stop the job (exit {CHECKPOINT_EXIT_CODE}, resume me).")
@click.option(
    "--wait", is_flag=True, help="Return only when the checkpoint is committed (after a save in flight)."
)
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=REQUEST_TIMEOUT_SECONDS,
    show_default=True,
    metavar="S",
    help="With --wait: give up after S seconds (exit 8).",
)
@json_option
def checkpoint_cmd(
    job: str | None, all_jobs: bool, stop: bool, wait: bool, timeout: float, as_json: bool
) -> None:
    """Ask JOB (an id or a PID) for a checkpoint at its next safe point."""
    _checkpoint(job, all_jobs=all_jobs, stop=stop, wait=wait, timeout=timeout, as_json=as_json)


@click.command("stop", epilog=EPILOG)
@click.argument("job", shell_complete=complete_job)
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=REQUEST_TIMEOUT_SECONDS,
    show_default=True,
    metavar="S",
    help="Give up after S seconds (exit 8).",
)
@json_option
def stop_cmd(job: str, timeout: float, as_json: bool) -> None:
    """Checkpoint JOB and stop it, once committed (checkpoint --stop --wait)."""
    _checkpoint(job, all_jobs=False, stop=True, wait=True, timeout=timeout, as_json=as_json)


def _checkpoint(
    job: str | None, *, all_jobs: bool, stop: bool, wait: bool, timeout: float, as_json: bool
) -> None:
    records = _targets(job, all_jobs)
    action = "stop" if stop else "checkpoint"
    sent: list[tuple[JobRecord, str]] = []
    errors: list[str] = []
    for record in records:
        try:
            sent.append((record, send(record, action)))
        except FerryError as exc:
            if not all_jobs:
                raise
            errors.append(str(exc))
    results: list[Asked] = []
    for record, rid in sent:
        entry: Asked = {"job": record.id, "request": rid}
        if wait:
            if not as_json:
                _note(f"job {record.id}: checkpoint requested; waiting for it to commit ...")
            try:
                doc = wait_answer(record, rid, timeout, None if as_json else _note, meter_for(as_json))
                entry["step"], entry["url"], entry["seconds"] = (
                    doc.get("step"),
                    doc.get("url"),
                    doc.get("seconds"),
                )
            except JobError as exc:
                if not all_jobs:
                    raise
                errors.append(str(exc))
                entry["error"] = str(exc)
        results.append(entry)
    if as_json:
        emit_json({"results": results, "errors": errors})
    else:
        for e in results:
            if "url" in e:
                what = "checkpointed and stopping" if stop else "checkpointed"
                click.echo(
                    f"{e['job']}: {what} at step {e['step']} in {e.get('seconds') or 0.0:.2f} s: {e['url']}"
                )
            elif "error" not in e:
                click.echo(f"{e['job']}: {action} requested (request {e['request']})")
        for message in errors:
            click.echo(f"ferry: error: {message}", err=True)
        if all_jobs and not records:
            click.echo("no running ferry jobs of this user")
    if errors:
        raise click.exceptions.Exit(JobError.exit_code)


COMMANDS = [list_cmd, status_cmd, checkpoint_cmd, stop_cmd]
