"""CUDA_VISIBLE_DEVICES values for ``ferry migrate`` and ``ferry resume --gpus``.

A value is a comma-separated list of GPU indices (``0,1``), GPU UUIDs (``GPU-…``) or MIG
UUIDs (``MIG-…``). Where NVML works, each index must be below the GPU count and each UUID
must name a GPU of this machine. Without NVML (no driver, no GPU, no ``nvidia-ml-py``)
ferry can check only the format, and says so: existence is then left to CUDA, which
silently ignores the devices it cannot find.
"""

from __future__ import annotations

import re

from ferry.errors import ConfigError
from ferry.process import nvml

_ITEM = re.compile(r"^(\d+|GPU-[0-9A-Fa-f-]{8,}|MIG-[0-9A-Za-z/-]{8,})$")


def parse(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not _ITEM.match(v) for v in items):
        raise ConfigError(
            f"{value!r} is not a device list: give GPU indices or UUIDs, comma-separated, "
            "as CUDA_VISIBLE_DEVICES takes them (e.g. 1 or 0,1 or GPU-8f2c...)"
        )
    if len(set(items)) != len(items):
        raise ConfigError(f"{value!r} names a device twice")
    return items


def check(value: str) -> tuple[str, str | None]:
    """The normalized value, and a warning when existence could not be checked."""
    items = parse(value)
    why = nvml.status()
    if why is not None:
        return ",".join(items), f"cannot check that device(s) {','.join(items)} exist: {why}"
    gpus = nvml.gpus()
    uuids = {str(g.uuid).lower() for g in gpus}
    for item in items:
        if item.isdigit() and int(item) >= len(gpus):
            raise ConfigError(
                f"there is no GPU {item} on this machine: NVML sees {len(gpus)} GPU(s), "
                f"indices 0-{len(gpus) - 1}"
                if gpus
                else "there are no GPUs on this machine"
            )
        if item.startswith("GPU-") and item.lower() not in uuids:
            raise ConfigError(f"no GPU with UUID {item} on this machine: see `ferry list`")
    return ",".join(items), None


def same(a: str | None, b: str) -> bool:
    return a is not None and [x.strip() for x in a.split(",")] == [x.strip() for x in b.split(",")]
