"""``ferry process``: ``suspend``, ``wake``, ``state`` (CUDA driver) and ``dump``, ``restore`` (CRIU).

Process-level checkpoint of a running process the operator names by PID; the script
does not cooperate. Errors are ``ProcessCheckpointError`` (exit 9) or ``ConfigError``
(exit 2) and say what is missing. Their names before the group (``ferry suspend``,
``ferry process-state``, ...) are hidden aliases, ``ferry.cli.RENAMED``.
"""

from __future__ import annotations

from typing import Any

import click

from ferry.cli import suggest_command
from ferry.cli.output import emit_json, human_bytes, json_option, table
from ferry.cli.params import Seconds, Whole, checked
from ferry.knobs import SUSPEND_LOCK_SECONDS
from ferry.process import criu, nvml
from ferry.process.cuda import CudaProcess, Outcome
from ferry.process.driver import ProcessState
from ferry.process.pids import check_pid, require_alive
from ferry.process.record import load_record
from ferry.process.uuids import GpuMapping, parse_mapping_items

PID = Whole(1, 2**22, what="")
"""A process id: Linux's pid_max is at most 2**22."""


def _warn(messages: list[str]) -> None:
    for m in messages:
        click.echo(f"ferry: warning: {m}", err=True)


def _gpu_text(doc: dict[str, Any]) -> str:
    name = f" ({doc['name']}, {human_bytes(doc['used_bytes'])})" if doc.get("name") else ""
    return f"{doc['uuid']}{name}"


def _print_outcome(out: Outcome, as_json: bool) -> None:
    if as_json:
        emit_json(out.to_dict())
        return
    _warn(out.warnings)
    doc = out.to_dict()
    done = "suspended" if out.action == "suspend" else "woken"
    if not out.steps:
        click.echo(f"pid {out.pid} is already {out.state.value}: nothing to do")
        return
    steps = ", ".join(f"{s['step']} {s['seconds']:.3f} s" for s in doc["steps"])
    click.echo(f"pid {out.pid} {done} in {out.seconds:.3f} s ({steps}); now {out.state.value}")
    if out.action == "suspend" and doc["gpus"]:
        click.echo("released " + "; ".join(_gpu_text(g) for g in doc["gpus"]))
    if out.mapping:
        click.echo("moved " + ", ".join(f"{k} -> {v}" for k, v in doc["mapping"].items()))


class ProcessGroup(click.Group):
    """``ferry process``: its commands in the order of their work, by the tool that does it."""

    SECTIONS = {
        "CUDA driver (the process stays in memory; its GPU memory goes to host memory)": (
            "suspend",
            "wake",
            "state",
        ),
        "CRIU (the whole process tree to disk, as root)": ("dump", "restore"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for heading, names in self.SECTIONS.items():
            rows = [(name, self.commands[name].get_short_help_str(200)) for name in names]
            with formatter.section(heading):
                formatter.write_dl(rows)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        names = {name: name for name in self.list_commands(ctx)}
        suggest_command(ctx, args, self.get_command, names, "ferry process --help")
        return super().resolve_command(ctx, args)


@click.group("process", cls=ProcessGroup)
def process_group() -> None:
    """Act on a process by its PID (no ferry job needed): suspend, wake, state (CUDA driver);
    dump, restore (CRIU).

    PID is any process of this machine, of your user (or any, as root). It needs no change
    and does not cooperate, unlike a job under `ferry run`; the checkpoint is tied to the
    GPU model and the driver (a job's own checkpoint, `ferry checkpoint`, is the portable
    one). Every command takes --json; an error is one line, exit 9 (the process or the
    machine cannot) or 2 (a bad argument). More: `ferry help process`.
    """


@process_group.command("suspend")
@click.argument("pid", type=PID)
@click.option(
    "--timeout",
    type=Seconds(zero="0: no limit"),
    default=SUSPEND_LOCK_SECONDS,
    show_default=True,
    help="Seconds to wait for the lock (in-flight GPU work to finish); 0: no limit.",
)
@json_option
def suspend_cmd(pid: int, timeout: float, as_json: bool) -> None:
    """Freeze PID's CUDA state and release its GPU memory (lock, then checkpoint to host memory).

    The GPUs it held are recorded, for `ferry process wake --map`. What the driver cannot
    checkpoint and /proc shows (NCCL, CUDA IPC, RDMA, MPS) is warned about first; a GPU in
    MIG mode is refused. If the checkpoint fails after the lock, the process is unlocked
    again. A suspended process is left as it is.
    """
    out = CudaProcess(check_pid(pid)).suspend(timeout=timeout or None)
    _print_outcome(out, as_json)


@process_group.command("wake")
@click.argument("pid", type=PID)
@click.option(
    "--map",
    "maps",
    multiple=True,
    callback=checked(parse_mapping_items),
    metavar="OLD=NEW",
    help="Restore onto another GPU: old and new GPU UUIDs (GPU-..., see `nvidia-smi -L`); "
    "repeat, or comma-separate, to cover every GPU the process used.",
)
@json_option
def wake_cmd(pid: int, maps: GpuMapping, as_json: bool) -> None:
    """Bring PID's GPU memory back (onto other GPUs with --map) and let it continue.

    Where `ferry process suspend` recorded the GPUs it held, the GPUs it goes back to (its
    own, or those --map names) are checked first: on this machine, the same model as before,
    not in MIG mode, with the memory it held free. --map needs that record (map each GPU it
    held, a GPU to itself to keep it) and driver r580 or newer. A running process is left as
    it is.
    """
    mapping = maps
    out = CudaProcess(check_pid(pid)).wake(mapping or None)
    _print_outcome(out, as_json)


@process_group.command("state")
@click.argument("pid", type=PID)
@json_option
def process_state_cmd(pid: int, as_json: bool) -> None:
    """Show PID's CUDA checkpoint state, the GPUs it holds, and ferry's record of its suspend.

    The state is running, locked, checkpointed or failed (checkpointing and restoring while
    another tool moves its memory); also the driver's CUDA version, whether it can restore
    onto other GPUs, and the process's restore thread.
    """
    require_alive(check_pid(pid))
    process = CudaProcess(pid)
    state = process.state
    doc: dict[str, Any] = {
        "pid": pid,
        "state": state.value,
        "driver_cuda_version": process.driver.info.cuda_version,
        "can_remap": process.driver.info.can_remap,
    }
    doc["restore_thread_id"] = process.restore_thread_id if state != ProcessState.FAILED else None
    try:
        doc["gpus"] = [g.to_dict() for g in nvml.process_usage(pid)]
    except nvml.NvmlUnavailable as exc:
        doc["gpus"], doc["nvml"] = None, str(exc)
    record = load_record(pid)
    doc["suspend_record"] = record.to_dict() if record else None
    if as_json:
        emit_json(doc)
        return
    click.echo(
        f"pid {pid}: {state.value} (restore thread {doc['restore_thread_id']}, driver CUDA "
        f"{process.driver.info.cuda_version_text}, remap {'yes' if doc['can_remap'] else 'no'})"
    )
    if doc["gpus"]:
        click.echo(
            table(
                ["gpu", "model", "memory"],
                [(g["uuid"], g["name"], human_bytes(g["used_bytes"])) for g in doc["gpus"]],
            )
        )
    if record and record.gpus:
        click.echo("suspended from " + "; ".join(_gpu_text(g.to_dict()) for g in record.gpus))


@process_group.command("dump")
@click.argument("pid", type=PID)
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--leave-running", is_flag=True, help="Keep the process running after the dump (CRIU ends it otherwise)."
)
@json_option
def dump_cmd(pid: int, directory: str, leave_running: bool, as_json: bool) -> None:
    """Dump PID's whole process tree to DIRECTORY with CRIU (GPU state through its CUDA plugin).

    DIRECTORY is created and must hold no dump yet. Needs root and `criu check` passing; a
    GPU process needs CRIU 4.0 or newer with its CUDA plugin. CRIU's log is DIRECTORY/dump.log.
    """
    result = criu.dump(check_pid(pid), directory, leave_running=leave_running)
    if as_json:
        emit_json(result.to_dict())
        return
    after = "left running" if leave_running else "stopped"
    click.echo(
        f"pid {pid} dumped to {result.directory} in {result.seconds:.2f} s "
        f"({human_bytes(result.bytes)}{', with GPU state' if result.gpu else ''}); {after}"
    )


@process_group.command("restore")
@click.argument("directory", type=click.Path(file_okay=False))
@json_option
def restore_cmd(directory: str, as_json: bool) -> None:
    """Restore a process tree that `ferry process dump` wrote to DIRECTORY (under its old PID).

    The old PID must be free. The process runs on detached from ferry, which returns once it
    is restored. Needs root, as the dump did; CRIU's log is DIRECTORY/restore.log.
    """
    result = criu.restore(directory)
    if as_json:
        emit_json(result.to_dict())
        return
    click.echo(f"restored pid {result.pid} from {result.directory} in {result.seconds:.2f} s")


COMMANDS = [process_group]
