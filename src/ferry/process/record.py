"""The suspend record: which GPUs a process held when ``suspend`` froze it.

The GPUs are known only while the process holds them, so ``suspend`` writes them (through
NVML) to ``<FERRY_HOME>/process/<pid>.json``; a later ``wake`` with a GPU mapping, possibly
in another process, checks the mapping against them, then removes the record. A record
whose process start time differs from the live process with that PID is ignored.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ferry.errors import ConfigError
from ferry.process.nvml import GpuUsage
from ferry.process.pids import start_time
from ferry.process.uuids import GpuUuid
from ferry.runtime.atomicjson import write_json_atomic
from ferry.runtime.jobdir import ferry_home, read_json
from ferry.typedjson import parse


class GpuUsageDoc(TypedDict):
    uuid: str
    name: str
    used_bytes: int


class _RecordPid(TypedDict):
    pid: int


class SuspendRecordDoc(_RecordPid, total=False):
    """``<FERRY_HOME>/process/<pid>.json`` as ``SuspendRecord.to_dict`` writes it."""

    start_time: int | None
    suspended_at: float
    gpus: list[GpuUsageDoc] | None
    opened: list[str]
    warnings: list[str]


@dataclass
class SuspendRecord:
    """What ``suspend`` knew about the process, for a later ``wake`` (possibly another ferry)."""

    pid: int
    start_time: int | None
    gpus: list[GpuUsage] | None
    """GPUs the process held when it was locked; None when NVML was unavailable."""
    opened: list[GpuUuid] = field(default_factory=list)
    """GPUs whose device files it had open (a mapping must place these too)."""
    suspended_at: float = field(default_factory=time.time)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": self.start_time,
            "suspended_at": self.suspended_at,
            "gpus": None if self.gpus is None else [g.to_dict() for g in self.gpus],
            "opened": [str(g) for g in self.opened],
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, raw: object) -> SuspendRecord:
        """The record in decoded JSON, parsed whole (``SuspendRecordDoc``); ValueError, naming
        the field, when it is not one (ConfigError for a GPU UUID that is not one)."""
        doc = parse(raw, SuspendRecordDoc)
        gpus = doc.get("gpus")
        return cls(
            doc["pid"],
            doc.get("start_time"),
            None
            if gpus is None
            else [GpuUsage(GpuUuid.parse(g["uuid"]), g["name"], g["used_bytes"]) for g in gpus],
            [GpuUuid.parse(g) for g in doc.get("opened", [])],
            doc.get("suspended_at", 0.0),
            doc.get("warnings", []),
        )


def record_path(pid: int) -> str:
    return os.path.join(ferry_home(), "process", f"{pid}.json")


def save_record(record: SuspendRecord) -> str:
    path = record_path(record.pid)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_json_atomic(path, record.to_dict())
    return path


def load_record(pid: int) -> SuspendRecord | None:
    """The record of ``pid``'s suspend, unless it is missing or belongs to an earlier process."""
    try:
        record = SuspendRecord.from_dict(read_json(record_path(pid)))
    except (OSError, ValueError, ConfigError):  # missing, or not a record ferry wrote
        return None
    if record.start_time is not None and record.start_time != start_time(pid):
        return None
    return record


def drop_record(pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(pid))
