"""Process-level checkpoint: freeze a running CUDA process and release its GPU (driver API), or
dump the whole process to disk (CRIU). Needs no cooperation from the script; ties the
checkpoint to the GPU model and driver, which is checked before anything starts.

Install with ``pip install 'gpuferry[process]'`` (cuda-bindings, nvidia-ml-py).
"""

from __future__ import annotations

from ferry.process.cuda import CudaProcess, Outcome
from ferry.process.driver import Driver, DriverCallError, DriverInfo, ProcessState, load_driver
from ferry.process.nvml import GpuInfo, GpuUsage, NvmlUnavailable
from ferry.process.preflight import Finding, Report, check_remap, scan_process
from ferry.process.record import SuspendRecord, load_record
from ferry.process.states import PLANS, TRANSITIONS, check_transition, plan
from ferry.process.uuids import GpuUuid, complete_mapping, normalize_mapping, parse_mapping_items

__all__ = [
    "PLANS",
    "TRANSITIONS",
    "CudaProcess",
    "Driver",
    "DriverCallError",
    "DriverInfo",
    "Finding",
    "GpuInfo",
    "GpuUsage",
    "GpuUuid",
    "NvmlUnavailable",
    "Outcome",
    "ProcessState",
    "Report",
    "SuspendRecord",
    "check_remap",
    "check_transition",
    "complete_mapping",
    "load_driver",
    "load_record",
    "normalize_mapping",
    "parse_mapping_items",
    "plan",
    "scan_process",
]
