"""HTCondor: the job ad says which exit code means "checkpointed, run me again".

A self-checkpointing HTCondor job (``checkpoint_exit_code`` in the submit file) exits with
that code after writing its checkpoint; HTCondor then transfers the files named by
``transfer_checkpoint_files`` (``TransferCheckpoint`` in the ad; ``WantFTOnCheckpoint``
must be true) to the submit side and starts the job again, in place or elsewhere, with
those files back in its scratch folder. On eviction HTCondor sends SIGTERM (the job's
``KillSig``) and SIGKILL ``JobMaxVacateTime`` seconds later.

ferry reads the ad from ``_CONDOR_JOB_AD``: the checkpoint exit code is
``SuccessCheckpointExitCode`` (what current HTCondor writes for ``checkpoint_exit_code``),
else ``CheckpointExitCode``. ferry exits with it only after a committed checkpoint (a stop
that could not save exits 86), and refuses a code of 0, the success code, which would make
HTCondor take a checkpoint for the job's end.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import ConfigError
from ferry.knobs import CHECKPOINT_EXIT_CODE, FAILURE_EXIT_CODE
from ferry.schedulers.base import AdapterDefaults

MAX_AD_BYTES = 1 << 20
"""A job ad is a few KiB of ``key = value`` lines."""

log = logging.getLogger("ferry.run")

AdValue = int | float | bool | str


def parse_job_ad(text: str) -> dict[str, AdValue]:
    """The ``Key = Value`` lines of a job ad file (``condor_q -l`` format): literals are
    typed (int, float, bool, string); an expression stays as its text."""
    ad: dict[str, AdValue] = {}
    for line in text.splitlines():
        key, eq, raw = line.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key or key.startswith("#"):
            continue
        ad[key] = _literal(raw)
    return ad


def _literal(raw: str) -> AdValue:
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return raw[1:-1].replace('\\"', '"')
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


@dataclass(frozen=True)
class HTCondorAdapter(AdapterDefaults):
    ad: Mapping[str, AdValue] = field(repr=False)
    name: str = "htcondor"
    stop_signal: str = "SIGTERM"

    @property
    def checkpoint_exit_code(self) -> int | None:
        for key in ("SuccessCheckpointExitCode", "CheckpointExitCode"):
            value = self.ad.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if value == 0:
                    raise ConfigError(
                        f"the job ad's {key} is 0, HTCondor's success code: a checkpoint would end the "
                        f"job; set checkpoint_exit_code = {CHECKPOINT_EXIT_CODE} in the submit file"
                    )
                return value
        return None

    @property
    def transfers_checkpoint(self) -> bool:
        return self.ad.get("WantFTOnCheckpoint") is True and bool(self.ad.get("TransferCheckpoint"))

    def job_id(self) -> str | None:
        cluster, proc = self.ad.get("ClusterId"), self.ad.get("ProcId")
        if cluster is None or proc is None:
            return None
        return f"condor-{cluster}.{proc}"

    def restart_count(self) -> int:
        starts = self.ad.get("NumJobStarts")
        return max(0, starts - 1) if isinstance(starts, int) else 0

    def exit_code(self, default: int) -> int:
        code = self.checkpoint_exit_code
        if code is None:
            log.warning(
                "ferry: HTCondor job without checkpoint_exit_code in its ad: a checkpointed stop exits "
                "%d, which HTCondor will take for the job's end; add checkpoint_exit_code = %d",
                default,
                default,
            )
            return default
        return code

    def worker_defaults(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        code = self.checkpoint_exit_code
        if code is not None:
            values["exit_code"] = code
        vacate = self.ad.get("JobMaxVacateTime")
        if isinstance(vacate, int) and vacate > 0:
            values["grace_seconds"] = float(vacate)
        return values

    def after_checkpoint(self, *, step: int | None, code: int, state_dir: str) -> int:
        if not self.transfers_checkpoint:
            log.warning(
                "ferry run: checkpointed at step %s, but the job ad has no TransferCheckpoint with "
                "WantFTOnCheckpoint = true: HTCondor will not carry the checkpoint to the next slot "
                "unless it is on shared storage; add transfer_checkpoint_files = ferry-checkpoints",
                step,
            )
        return code


def detect(env: Mapping[str, str]) -> HTCondorAdapter | None:
    path = env.get("_CONDOR_JOB_AD")
    if not path:
        return None
    return HTCondorAdapter(ad=parse_job_ad(_read_ad(path)))


def _read_ad(path: str) -> str:
    """The job ad's text. Only a regular file of at most ``MAX_AD_BYTES`` is read: a FIFO
    (which would hang ``ferry run`` at its start) or a huge file is refused, saying so."""
    fix = "ferry needs the job ad for its checkpoint exit code; unset _CONDOR_JOB_AD outside HTCondor"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"_CONDOR_JOB_AD={path!r} cannot be read ({exc.strerror}): {fix}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"_CONDOR_JOB_AD={path!r} is not a regular file: {fix}")
        data = f.read(MAX_AD_BYTES + 1)
    if len(data) > MAX_AD_BYTES:
        raise ConfigError(f"_CONDOR_JOB_AD={path!r} holds more than {MAX_AD_BYTES} bytes, no job ad: {fix}")
    return data.decode("utf-8", "replace")


def submit_file(
    *,
    executable: str = "run-ferry.sh",
    arguments: str = "",
    checkpoint_exit_code: int = CHECKPOINT_EXIT_CODE,
    checkpoint_dir: str = "ferry-checkpoints",
    request_gpus: int = 1,
    max_vacate_seconds: int = 120,
    extra: tuple[str, ...] = (),
) -> str:
    """A pure function: an HTCondor submit file for a self-checkpointing ferry job."""
    if checkpoint_exit_code in (0, FAILURE_EXIT_CODE):
        raise ValueError(
            f"checkpoint_exit_code must not be 0 (success) or {FAILURE_EXIT_CODE} (ferry's failed stop)"
        )
    lines = [
        "# Generated by ferry.schedulers.htcondor.submit_file.",
        "# The job checkpoints on SIGTERM (eviction) and exits with checkpoint_exit_code only",
        "# after a committed checkpoint; HTCondor then transfers the checkpoint folder and",
        "# starts the job again, which resumes from it.",
        "universe                 = vanilla",
        f"executable               = {executable}",
    ]
    if arguments:
        lines.append(f"arguments                = {arguments}")
    lines += [
        f"checkpoint_exit_code     = {checkpoint_exit_code}",
        f"transfer_checkpoint_files = {checkpoint_dir}",
        "+WantFTOnCheckpoint      = true",
        "should_transfer_files    = YES",
        "when_to_transfer_output  = ON_EXIT_OR_EVICT",
        f"transfer_output_files    = {checkpoint_dir}",
        "kill_sig                 = SIGTERM",
        f"job_max_vacate_time      = {max_vacate_seconds}",
        f"request_gpus             = {request_gpus}",
        "output                   = ferry-$(Cluster).$(Process).out",
        "error                    = ferry-$(Cluster).$(Process).err",
        "log                      = ferry-$(Cluster).log",
        *extra,
        "queue",
        "",
    ]
    return "\n".join(lines)
