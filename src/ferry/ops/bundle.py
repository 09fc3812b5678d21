"""Move a job out as a bundle (``export``) that ``resume`` starts again elsewhere: another
node, another cluster, another job.

A bundle is a folder (any fsspec URL): ``bundle.json``, what the job needs to run again
(its command, working folder, ferry's settings, the step), and ``checkpoints/<name>/``, a
copy of its newest committed checkpoint. ``export`` stops a running job with a checkpoint
first; ``resume`` copies the checkpoint into the new job's root and starts it there.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import time
from typing import TypedDict

from ferry.autotrack import BOOT_DIR
from ferry.errors import ConfigError, JobError, NoCheckpointError
from ferry.knobs import PROCESS_POLL_SECONDS
from ferry.ops import devices
from ferry.ops.jobs import JobRecord, command_of, process_env
from ferry.ops.requests import send, wait_answer
from ferry.progress import Meter, Progress
from ferry.runtime.finished import clear_finished
from ferry.storage import FileRecord, Storage, Transaction, open_storage
from ferry.storage.atomic import MANIFEST
from ferry.supervisor.options import SUPERVISOR_OWNED, check_command
from ferry.typedjson import SchemaError, parse

BUNDLE = "bundle.json"
_JOB_SPECIFIC = (
    "FERRY_JOB_ID",
    "FERRY_JOB_DIR",
    "FERRY_DIR",
    "FERRY_HOME",
    "FERRY_AUTOTRACK",
    "FERRY_HANDOFF_DIR",
    "FERRY_SUPERVISOR_PID",
    "FERRY_WARM",
)
"""Variables that belong to the old job (its ids, its folders, its supervisor): a resumed
job gets its own, and an old one would point it at the old job's host memory or process."""


class _BundleBase(TypedDict):
    checkpoint: str
    """The checkpoint's folder, relative to the bundle: ``checkpoints/<name>``."""


class Bundle(_BundleBase, total=False):
    """``bundle.json``: what ``export`` wrote, for ``resume`` to start the job elsewhere."""

    format: int
    job: str
    command: list[str]
    cwd: str | None
    env: dict[str, str]
    autotrack: bool
    step: int
    source_checkpoint: str
    python_executable: str | None
    torch_version: str
    ferry_version: str
    host: str | None
    exporter: dict[str, str]
    created: float
    stop_requested: float
    """When ``export`` asked the running job to stop (absent: it was not running)."""
    committed: float
    """When the stop's checkpoint committed; ``save_seconds``: how long its save took."""
    save_seconds: float


def copy_checkpoint(src_url: str, dest: Storage, progress: Progress, meter: Meter | None = None) -> str:
    """Copy one committed checkpoint into ``dest`` under its own folder name, as one commit
    transaction there (committed the way ``dest`` commits: rename or marker), each file
    checked against the manifest's checksum before it is made durable. Returns its URL.
    ``meter`` follows the bytes; ``progress`` gets the summary (size, time, throughput)."""
    from ferry.engine import list_checkpoints, split_url
    from ferry.format.manifest import decode_manifest

    src, name = split_url(src_url)
    if name is None:
        refs = list_checkpoints(src)
        if not refs:
            raise NoCheckpointError(f"no committed checkpoint under {src_url}")
        name = refs[-1].name
    raw = src.read_bytes(f"{name}/{MANIFEST}")
    files = decode_manifest(raw, src.child_url(name))["files"]
    total, t0 = 0, time.monotonic()
    if meter is not None:
        meter.start(f"copying {name}", sum(meta["size"] for meta in files.values()))
    try:
        with Transaction.begin(dest, name) as txn:
            for rel, meta in files.items():
                expect = FileRecord(meta["size"], meta["xxh3_64"])
                counted = None if meter is None else meter.advance
                total += txn.add_copy(src, f"{name}/{rel}", rel, expect, counted=counted).size
            txn.commit(raw)
    finally:
        if meter is not None:
            meter.finish()
    seconds = max(time.monotonic() - t0, 1e-6)
    progress(
        f"copied {name} ({total / 2**20:.1f} MiB in {seconds:.1f} s, {total / 2**20 / seconds:.1f} MiB/s) "
        f"to {dest.child_url(name)}"
    )
    return dest.child_url(name)


def parse_bundle(data: bytes, where: str) -> Bundle:
    """A bundle.json, checked; NoCheckpointError naming the field when it is not one."""
    try:
        bundle = parse(json.loads(data), Bundle)
    except (ValueError, RecursionError) as exc:  # SchemaError too
        why = str(exc) if isinstance(exc, SchemaError) else f"not JSON ({exc})"
        raise NoCheckpointError(f"{where} is not a ferry bundle: {why}") from None
    parts = bundle["checkpoint"].split("/")
    if bundle["checkpoint"].startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise NoCheckpointError(f"{where}: checkpoint {bundle['checkpoint']!r} points outside the bundle")
    return bundle


def relevant_env(env: dict[str, str]) -> dict[str, str]:
    """What a job needs again elsewhere: ferry's knobs, its devices, its import path."""
    out = {k: v for k, v in env.items() if k.startswith("FERRY_") and k not in _JOB_SPECIFIC}
    if "CUDA_VISIBLE_DEVICES" in env:
        out["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    if paths:
        out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def export(
    record: JobRecord, dest_url: str, timeout: float, progress: Progress, meter: Meter | None = None
) -> dict[str, object]:
    """Stop a running job with a checkpoint (or take a stopped job's newest one) and write a
    bundle at ``dest_url``: ``bundle.json`` and ``checkpoints/<name>/``."""
    dest = open_storage(dest_url)
    if dest.exists(BUNDLE):
        raise ConfigError(f"{dest_url} already holds a bundle: export to a new place")
    pid = record.worker_pid
    env = (process_env(pid) if pid and record.alive else None) or {}
    exe = _exe(pid) if record.alive and pid else None
    url, stopped = _final_checkpoint(record, timeout, progress, meter)
    copied = copy_checkpoint(url, open_storage(dest.child_url("checkpoints")), progress, meter)
    name = copied.rstrip("/").rsplit("/", 1)[-1]
    from ferry.format.manifest import decode_manifest  # torch: imported when needed

    copies = open_storage(dest.child_url("checkpoints"))
    manifest = decode_manifest(copies.read_bytes(f"{name}/{MANIFEST}"), copies.child_url(name))
    bundle: Bundle = {
        "format": 1,
        "job": record.id,
        "command": command_of(record),
        "cwd": record.identity.get("cwd"),
        "env": relevant_env(env),
        "autotrack": env.get("FERRY_AUTOTRACK", "1") != "0" if env else True,
        "checkpoint": f"checkpoints/{name}",
        "step": manifest["step"],
        "source_checkpoint": url,
        "python_executable": exe,
        "torch_version": manifest["torch_version"],
        "ferry_version": manifest["ferry_version"],
        "host": record.identity.get("host"),
        "exporter": {"python": platform.python_version(), "host": platform.node()},
        "created": time.time(),
    }
    if stopped:
        bundle["stop_requested"] = stopped["stop_requested"]
        bundle["committed"] = stopped["committed"]
        bundle["save_seconds"] = stopped["save_seconds"]
    # The bundle is whole once its checkpoint is: the job trains no further after the commit of
    # its stop, so a `ferry resume --warm` waiting for it starts while the job still exits.
    dest.write_bytes(BUNDLE, json.dumps(bundle, indent=1, sort_keys=True).encode())
    if stopped:
        _wait_exit(record, dest.url, timeout, progress)
    return {**bundle, "url": dest.url}


def _final_checkpoint(
    record: JobRecord, timeout: float, progress: Progress, meter: Meter | None
) -> tuple[str, dict[str, float]]:
    """The checkpoint to export: a running job's stop (and when it was asked for, committed,
    how long it took), or a stopped job's checkpoint root, whose newest one is copied."""
    stopped: dict[str, float] = {}
    if record.alive:
        stopped["stop_requested"] = time.time()
        rid = send(record, "stop")
        progress(f"job {record.id}: checkpointing and stopping at its next safe point")
        answer = wait_answer(record, rid, timeout, progress, meter)
        url = str(answer["url"])
        stopped["committed"] = float(answer.get("time", time.time()))
        stopped["save_seconds"] = float(answer.get("seconds", 0.0))
        progress(f"job {record.id}: checkpoint of step {answer['step']} committed; copying it")
        return url, stopped
    root = record.identity.get("checkpoint_dir")
    if not root:
        raise NoCheckpointError(f"job {record.id} has no checkpoint directory recorded")
    progress(f"job {record.id} is not running: exporting its newest committed checkpoint")
    return str(root), stopped


def _wait_exit(record: JobRecord, url: str, timeout: float, progress: Progress) -> None:
    """Wait for the job that stopped for the export to exit."""
    progress(f"job {record.id}: bundle written; waiting for the job to exit")
    deadline = time.monotonic() + timeout
    while record.refresh().alive:
        if time.monotonic() > deadline:
            raise JobError(
                f"job {record.id} did not exit within {timeout:g} s of its checkpoint (the bundle at "
                f"{url} is complete)"
            )
        time.sleep(PROCESS_POLL_SECONDS)


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def load_bundle(source: str) -> Bundle | None:
    storage = open_storage(source)
    if not storage.exists(BUNDLE):
        return None
    return parse_bundle(storage.read_bytes(BUNDLE), storage.child_url(BUNDLE))


def prepare_resume(
    source: str,
    dest_dir: str,
    command: list[str],
    gpus: str | None,
    progress: Progress,
    meter: Meter | None = None,
) -> tuple[list[str], dict[str, str], str | None, bool]:
    """Copy the checkpoint into ``dest_dir``; returns (command, env, cwd, autotrack)."""
    from ferry.engine.catalog import list_checkpoints, split_url

    bundle = load_bundle(source)
    env: dict[str, str] = {}
    cwd, autotrack = None, True
    if bundle is not None:
        ckpt = open_storage(source).child_url(bundle["checkpoint"])
        command = command or bundle.get("command", [])
        env = dict(bundle.get("env", {}))
        cwd = bundle.get("cwd")
        autotrack = bundle.get("autotrack", True)
    else:
        ckpt = source
        src = open_storage(source)
        if not src.exists(""):
            raise NoCheckpointError(
                f"{source} does not exist: give a bundle (`ferry export`) or a checkpoint URL"
            )
        if split_url(source)[1] is None and not list_checkpoints(src):
            raise NoCheckpointError(
                f"{source} holds neither a bundle ({BUNDLE}) nor a committed checkpoint: give a "
                "bundle written by `ferry export`, or a checkpoint (or checkpoint root) and the "
                "command after --"
            )
        if not command:
            raise ConfigError(
                f"{source} is a checkpoint, not a bundle (no {BUNDLE}): give the command after --, "
                "e.g. `ferry resume URL -- python train.py`"
            )
    if not command:
        raise ConfigError(f"the bundle at {source} records no command: give it after --")
    if cwd is not None and not os.path.isdir(cwd):
        progress(f"warning: the job's working directory {cwd} does not exist here; using {os.getcwd()}")
        cwd = None
    check_command(command, env.get("PATH", os.environ.get("PATH")), cwd)  # where it will run
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"], warning = devices.check(gpus)
        if warning:
            progress(f"warning: {warning}")
    dest = open_storage(dest_dir)
    _, name = split_url(ckpt)
    existing = {r.name for r in list_checkpoints(dest)}
    same_root = ckpt.rstrip("/") == dest_dir.rstrip("/")
    if not same_root and (name is None or name not in existing):
        copy_checkpoint(ckpt, dest, progress, meter)
    clear_finished(dest_dir)  # started again on purpose: an older run's end does not stand
    return command, env, cwd, autotrack


def resume_command(
    *,
    job_id: str,
    checkpoint_dir: str,
    command: list[str],
    env: dict[str, str],
    cwd: str | None,
    autotrack: bool,
    max_restarts: int,
) -> str:
    """The shell command that resumes a job started by ``ferry resume``: ``ferry run`` on its
    new checkpoint root. Running ``ferry resume BUNDLE`` again would start over from the
    bundle's checkpoint and silently drop every step taken since."""
    argv = ["ferry", "run", "--job-id", job_id, "--dir", checkpoint_dir]
    if max_restarts:
        argv += ["--max-restarts", str(max_restarts)]
    if not autotrack:
        argv.append("--no-autotrack")
    for key, value in sorted(env.items()):
        if key == "FERRY_EXIT_CODE":
            argv += ["--exit-code", value]
        elif key not in SUPERVISOR_OWNED:  # the rest ferry run sets from its own options
            argv += ["--env", f"{key}={value}"]
    line = shlex.join([*argv, "--", *command])
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


__all__ = [
    "BUNDLE",
    "Bundle",
    "copy_checkpoint",
    "export",
    "load_bundle",
    "parse_bundle",
    "prepare_resume",
    "relevant_env",
    "resume_command",
]
