"""Move a job: in place to other devices (``migrate``), or out as a bundle (``export``) that
``resume`` starts again elsewhere.

Migration is a ``restart`` control request (docs/jobs.md): the worker commits a checkpoint,
leaves its state in host memory and exits, and the new worker, on the new
``CUDA_VISIBLE_DEVICES``, restores it. Warm (``warmmove``), the new worker was started
beside the old one and waits at its restore point; cold, the supervisor starts it after
the old one exited.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypedDict

from ferry.autotrack import BOOT_DIR
from ferry.errors import ConfigError, JobError, NoCheckpointError
from ferry.knobs import PROCESS_POLL_SECONDS
from ferry.ops import devices, warmmove
from ferry.ops.jobs import JobRecord, command_of, process_env, require_alive, send, wait_answer
from ferry.ops.warmcheck import cold_reason
from ferry.progress import Meter
from ferry.runtime.jobfiles import Event, Response
from ferry.storage import FileRecord, Storage, Transaction, open_storage
from ferry.storage.atomic import MANIFEST
from ferry.supervisor.options import SUPERVISOR_OWNED, check_command
from ferry.typedjson import SchemaError, parse

Progress = Callable[[str], None]


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


@dataclass
class Migration:
    job: str
    source: str | None
    target: str
    step: int
    url: str
    pid: int
    drain: float
    """From the request to the old worker's next safe point (it trains meanwhile)."""
    save: float
    """The old worker's checkpoint, committed."""
    restart: float
    """Cold: from the commit to the new worker's restore (a process start). Warm: 0."""
    restore: float
    """The new worker's restore, its load included."""
    first_step: float | None = None
    """How much longer the new worker's first step took than its second: its warm-up (caches,
    lazy initialization, CUDA kernels); the steps themselves train (None: no two steps came)."""
    warm: bool = False
    """The target worker was started beside the old one (docs/jobs.md, "Warm migration")."""
    handover: float = 0.0
    """Warm: from the old worker's save to the warm worker's restore: the save, the state left in
    host memory, the old worker's exit, the release of the warm one."""
    warm_startup: float = 0.0
    """Warm: the warm worker's start-up to its restore point, while the old one trained."""
    cold_reason: str | None = None
    """Why the migration restarted cold (None: it went warm)."""

    @property
    def downtime(self) -> float:
        if self.warm:
            return self.drain + self.handover + self.restore + (self.first_step or 0.0)
        return self.drain + self.save + self.restart + self.restore

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "downtime": self.downtime}


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


def migrate(
    record: JobRecord,
    target: str,
    timeout: float,
    progress: Progress,
    *,
    unchecked: bool = False,
    cold: bool = False,
    meter: Meter | None = None,
) -> Migration:
    """Move the job to ``target`` devices and return once its new worker resumed and took a step.

    Warm (docs/jobs.md): the new worker starts beside the old one and waits at its restore
    point; the old one then checkpoints, hands its state over and exits. Cold, where the
    preflight (``warmcheck``) says the job cannot run twice at once, or ``cold`` asks for it:
    the old worker checkpoints and exits, and the supervisor starts the new one.

    Where the devices cannot be checked (no NVML), CUDA would start the worker on whatever
    it finds, or on no GPU at all, and the job would train somewhere else than asked:
    refused unless ``unchecked`` (``--unchecked-devices``) says to go on. ``meter`` draws
    the old worker's save while it is waited for."""
    require_alive(record, "migrate")
    if not record.supervised:
        raise JobError(
            f"job {record.id} runs without `ferry run`: nobody can restart it in place; use "
            "`ferry export` and `ferry resume`, or start it as `ferry run --restarts N -- ...`"
        )
    allowed = record.status.get("max_restarts")
    done = int(record.status.get("restarts") or 0)
    if allowed is not None and done >= int(allowed):
        raise JobError(
            f"job {record.id} has no in-place restart left ({done} of {allowed} used): start it with "
            "`ferry run --restarts N` to migrate it, or use `ferry export` and `ferry resume`"
        )
    current = record.devices()
    target, warning = devices.check(target)
    if devices.same(current, target):
        raise ConfigError(f"job {record.id} already runs on CUDA_VISIBLE_DEVICES={target}: nothing to move")
    if warning and not unchecked:
        raise ConfigError(
            f"refused: {warning}; a device that does not exist is silently ignored by CUDA, so the "
            "job could resume on other GPUs or on the CPU: check with nvidia-smi, then pass "
            "--unchecked-devices to move it anyway"
        )
    if warning:
        progress(f"warning: {warning}")
    reason = "asked for (--cold)" if cold else cold_reason(warmmove.facts(record, target))
    if reason is None:
        return _migrate_warm(record, current, target, timeout, progress, meter)
    progress(f"job {record.id}: cold migration (the worker restarts): {reason}")
    t0 = time.time()
    rid = send(record, "restart", {"CUDA_VISIBLE_DEVICES": target})
    progress(
        f"job {record.id}: checkpointing at its next safe point (devices {current or 'all'} -> {target})"
    )
    answer = wait_answer(record, rid, timeout, progress, meter)
    then = f"restarting on {target}"
    moved, _, _ = _committed(record, current, target, answer, t0, then, timeout, progress)
    return replace(moved, cold_reason=reason)


def _committed(
    record: JobRecord,
    current: str | None,
    target: str,
    answer: Response,
    t0: float,
    then: str,
    timeout: float,
    progress: Progress,
) -> tuple[Migration, Event, float]:
    """A move once the old worker answered (``answer``: its checkpoint committed) the
    request sent at ``t0``: says so and ``then``, waits for the new worker's resume and
    first steps, and returns the move as a cold restart counts it, the new worker's
    ``restart`` event, and the seconds from the commit to the new worker's restore (the
    ``restart`` part before it is clamped at 0)."""
    step, url, save = int(answer["step"]), str(answer["url"]), float(answer.get("seconds", 0))
    committed = float(answer.get("time", time.time()))
    progress(f"job {record.id}: checkpoint of step {step} committed ({save:.2f} s); {then}")
    restart, resume, first = warmmove.taken_over(record, t0, step, timeout)
    restore = float(resume.get("seconds", 0))
    gap = resume["time"] - restore - committed
    moved = Migration(
        job=record.id,
        source=current,
        target=target,
        step=step,
        url=url,
        pid=int(restart.get("pid") or 0),
        drain=max(0.0, committed - save - t0),
        save=save,
        restart=max(0.0, gap),
        restore=restore,
        first_step=warmmove.first_step(first),
    )
    return moved, restart, gap


def _migrate_warm(
    record: JobRecord,
    current: str | None,
    target: str,
    timeout: float,
    progress: Progress,
    meter: Meter | None = None,
) -> Migration:
    pid, startup, _ = warmmove.start_warm(record, target, timeout, progress)
    answer, t0 = warmmove.hand_over(record, target, timeout, progress, meter)
    then = f"handing over to pid {pid}"
    moved, restart, gap = _committed(record, current, target, answer, t0, then, timeout, progress)
    if not (restart.get("warm") and restart.get("pid") == pid):
        why = "the warm worker was gone at the hand-over: the worker restarted"
        return replace(moved, warm_startup=startup, cold_reason=why)
    return replace(
        moved,
        restart=0.0,
        warm=True,
        handover=max(0.0, moved.save + gap),  # from the start of the save to the restore
        warm_startup=startup,
    )


# ---------------------------------------------------------------------- bundles
def copy_checkpoint(src_url: str, dest: Storage, progress: Progress, meter: Meter | None = None) -> str:
    """Copy one committed checkpoint into ``dest`` under its own folder name, as one commit
    transaction there (committed the way ``dest`` commits: rename or marker), each file
    checked against the manifest's checksum before it is made durable. Returns its URL.
    ``meter`` follows the bytes; ``progress`` gets the summary (size, time, throughput)."""
    from ferry.engine import list_checkpoints, split_url
    from ferry.engine.manifest import decode_manifest

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
    else:
        root = record.identity.get("checkpoint_dir")
        if not root:
            raise NoCheckpointError(f"job {record.id} has no checkpoint directory recorded")
        url = str(root)
        progress(f"job {record.id} is not running: exporting its newest committed checkpoint")
    copied = copy_checkpoint(url, open_storage(dest.child_url("checkpoints")), progress, meter)
    name = copied.rstrip("/").rsplit("/", 1)[-1]
    from ferry.engine.manifest import decode_manifest  # torch: imported when needed

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
        progress(f"job {record.id}: bundle written; waiting for the job to exit")
        deadline = time.monotonic() + timeout
        while record.refresh().alive:
            if time.monotonic() > deadline:
                raise JobError(
                    f"job {record.id} did not exit within {timeout:g} s of its checkpoint (the bundle at "
                    f"{dest.url} is complete)"
                )
            time.sleep(PROCESS_POLL_SECONDS)
    return {**bundle, "url": dest.url}


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
    check_command(command, env.get("PATH", os.environ.get("PATH")))
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
    if cwd is not None and not os.path.isdir(cwd):
        progress(f"warning: the job's working directory {cwd} does not exist here; using {os.getcwd()}")
        cwd = None
    return command, env, cwd, autotrack


def resume_command(
    *,
    job_id: str,
    checkpoint_dir: str,
    command: list[str],
    env: dict[str, str],
    cwd: str | None,
    autotrack: bool,
    restarts: int,
) -> str:
    """The shell command that resumes a job started by ``ferry resume``: ``ferry run`` on its
    new checkpoint root. Running ``ferry resume BUNDLE`` again would start over from the
    bundle's checkpoint and silently drop every step taken since."""
    argv = ["ferry", "run", "--job-id", job_id, "--dir", checkpoint_dir]
    if restarts:
        argv += ["--restarts", str(restarts)]
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
    "Bundle",
    "Meter",
    "Migration",
    "copy_checkpoint",
    "export",
    "load_bundle",
    "migrate",
    "parse_bundle",
    "prepare_resume",
    "resume_command",
]
