"""GPU UUIDs and old-to-new GPU mappings, parsed and checked before the driver sees them.

NVML and ``nvidia-smi`` print a GPU as ``GPU-1a2b3c4d-...``; the CUDA driver's
``CUuuid`` is the same 16 bytes without the prefix. Both spellings are accepted, and
so is ``cuda-checkpoint --device-map``'s ``OLD=NEW,OLD=NEW`` form.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ferry.errors import ConfigError

_HEX32 = re.compile(r"[0-9a-f]{32}")
_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, order=True)
class GpuUuid:
    """One physical GPU's 16-byte UUID."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != 16:
            raise ConfigError(f"a GPU UUID is 16 bytes, got {self.raw!r}")

    @classmethod
    def parse(cls, text: str | GpuUuid) -> GpuUuid:
        """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, the same without ``GPU-``, or 32 hex digits."""
        if isinstance(text, GpuUuid):
            return text
        if not isinstance(text, str):
            raise ConfigError(f"a GPU UUID is a string like GPU-xxxxxxxx-xxxx-..., got {text!r}")
        s = text.strip().lower()
        if s.startswith("mig-"):
            raise ConfigError(
                f"{text!r} is a MIG instance: the CUDA driver checkpoints and remaps "
                "whole GPUs only; name the parent GPU (nvidia-smi -L)"
            )
        if s.startswith("gpu-"):
            s = s[4:]
        if not (_CANONICAL.fullmatch(s) or _HEX32.fullmatch(s)):
            raise ConfigError(
                f"{text!r} is not a GPU UUID: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                "xxxxxxxxxxxx as printed by `nvidia-smi -L`, or the same without "
                "'GPU-' (32 hex digits, hyphens optional)"
            )
        return cls(bytes.fromhex(s.replace("-", "")))

    @property
    def hex(self) -> str:
        h = self.raw.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def __str__(self) -> str:
        return f"GPU-{self.hex}"


GpuMapping = dict[GpuUuid, GpuUuid]
MappingInput = Mapping[str, str] | Mapping[GpuUuid, GpuUuid] | Mapping[str | GpuUuid, str | GpuUuid]
"""What callers may pass as a GPU mapping: old GPU to new, either spelling."""


def parse_mapping_items(items: Iterable[str]) -> GpuMapping:
    """``["OLD=NEW", "OLD=NEW,OLD=NEW"]`` (repeated ``--map`` options) to a mapping."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            old, sep, new = part.partition("=")
            if not sep or not old.strip() or not new.strip():
                raise ConfigError(
                    f"--map {part!r}: expected OLD=NEW, two GPU UUIDs (GPU-... as printed by `nvidia-smi -L`)"
                )
            pairs.append((old, new))
    return normalize_mapping(pairs)


def normalize_mapping(
    mapping: MappingInput | Iterable[tuple[str | GpuUuid, str | GpuUuid]],
) -> GpuMapping:
    """Parse both sides; refuse an old GPU given twice or two old GPUs sent to one new one."""
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    out: GpuMapping = {}
    for old_text, new_text in items:
        old, new = GpuUuid.parse(old_text), GpuUuid.parse(new_text)
        if old in out and out[old] != new:
            raise ConfigError(f"GPU {old} is mapped twice ({out[old]} and {new}): give one target per GPU")
        out[old] = new
    _require_injective(out)
    return out


def _require_injective(mapping: GpuMapping) -> None:
    seen: dict[GpuUuid, GpuUuid] = {}
    for old, new in mapping.items():
        if new in seen:
            raise ConfigError(
                f"GPUs {seen[new]} and {old} are both mapped to {new}: the driver "
                "restores each checkpointed GPU onto its own GPU"
            )
        seen[new] = old


def complete_mapping(
    mapping: GpuMapping, used: Collection[GpuUuid], opened: Collection[GpuUuid] = ()
) -> GpuMapping:
    """The pairs the driver gets: one for every GPU the process used or opened, in a stable order.

    ``used`` are the GPUs holding the process's memory: the operator must say where each
    goes (a typo must not silently leave one behind). ``opened`` are the GPUs whose device
    files it had open without memory on them; the driver counts them as checkpointed too,
    so ferry adds them: each stays on itself, or, if a moved GPU took its place, takes the
    place that GPU freed (``--map A=B`` on a process that also opened B becomes A=B, B=A).
    """
    if not used:
        raise ConfigError(
            "ferry does not know which GPUs the process used, so it cannot check that "
            "the mapping covers all of them: suspend it with `ferry process "
            "suspend` (which records them) or pass gpus= to CudaProcess"
        )
    used_set = set(used)
    every = used_set | set(opened)
    unknown = sorted(str(g) for g in mapping if g not in every)
    if unknown:
        raise ConfigError(
            f"--map names {', '.join(unknown)}, which the process did not use "
            f"(it used {', '.join(sorted(map(str, used_set)))})"
        )
    missing = sorted(str(g) for g in used_set if g not in mapping)
    if missing:
        raise ConfigError(
            f"--map must cover every GPU the process used; missing {', '.join(missing)} "
            "(map a GPU to itself to keep it)"
        )
    full = dict(mapping)
    taken = set(full.values())
    rest = sorted(every - set(mapping))
    for g in rest:
        if g not in taken:
            full[g] = g
            taken.add(g)
    displaced = [g for g in rest if g not in full]
    freed = sorted(g for g in every if g not in taken)
    if len(freed) < len(displaced):
        raise ConfigError(
            f"the process also opened {', '.join(map(str, displaced))}, and no GPU is left for it: "
            "map it explicitly"
        )
    full.update(zip(displaced, freed[: len(displaced)], strict=True))
    _require_injective(full)
    return {g: full[g] for g in sorted(every)}


def format_mapping(mapping: Mapping[GpuUuid, GpuUuid]) -> str:
    """The ``cuda-checkpoint --device-map`` spelling, for messages and logs."""
    return ",".join(f"{old}={new}" for old, new in mapping.items())
