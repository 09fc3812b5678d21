"""Weights out of a checkpoint: a tracked model's ``state_dict``, by the name ``ferry inspect``
shows (``model:Sequential:0`` in zero-code mode, the keyword given to ``ferry.track`` or the
key given to ``ferry.save`` otherwise), and written for deployment as safetensors or as a
torch file that ``torch.load(weights_only=True)`` reads.

The checkpoint is read (verified) as a whole; the tensors come back bitwise as saved, on
the CPU, with their dtypes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ferry.engine import Loaded, load
from ferry.errors import ConfigError

Format = Literal["safetensors", "pt"]
FORMATS: tuple[Format, ...] = ("safetensors", "pt")
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
"""File names that mean a torch file; any other is written as safetensors."""
INSTALL = "pip install 'gpuferry[safetensors]'"


def tracked_objects(state: Any) -> dict[str, Any]:
    """The tracked objects of a checkpoint's state tree: a session's ``objects`` (zero-code or
    ``ferry.track``), or the top level of a tree saved with ``ferry.save``."""
    if isinstance(state, dict) and isinstance(state.get("objects"), dict) and "ferry" in state:
        return dict(state["objects"])
    return dict(state) if isinstance(state, dict) else {}


def is_model_state(value: object) -> bool:
    """A module's ``state_dict``: a non-empty mapping of names to tensors, nothing else
    (an optimizer's holds ``state`` and ``param_groups``; a scheduler's, numbers)."""
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    )


def model_names(state: Any) -> list[str]:
    """The names of the tracked models in a checkpoint's state tree, in their order."""
    return [name for name, value in tracked_objects(state).items() if is_model_state(value)]


def pick(loaded: Loaded, model: str | None) -> tuple[str, dict[str, torch.Tensor]]:
    """The name and the ``state_dict`` of the model ``model`` (None: the only one) of a
    loaded checkpoint; ConfigError naming the models there when it is not one of them."""
    objects = tracked_objects(loaded.state)
    models = model_names(loaded.state)
    listed = ", ".join(models) or "none"
    if model is None:
        if len(models) != 1:
            raise ConfigError(
                f"{loaded.url} holds {len(models)} models ({listed}): name one with --model "
                "(`ferry inspect` lists the tracked objects)"
            )
        model = models[0]
    sharded = (
        (loaded.state.get("ferry") or {}).get("sharded_optimizers")
        if isinstance(loaded.state, dict)
        else None
    )
    if isinstance(sharded, dict) and model in sharded:
        raise ConfigError(
            f"{model} in {loaded.url} is sharded (FSDP): its state is the checkpoint's DCP folder, "
            "which torch.distributed.checkpoint.format_utils.dcp_to_torch_save gathers into one file"
        )
    if model not in objects:
        raise ConfigError(f"{loaded.url} tracks no object {model!r}; its models: {listed}")
    if model not in models:
        raise ConfigError(f"{model!r} in {loaded.url} is no model's state_dict (its models: {listed})")
    return model, dict(objects[model])


def state_dict(checkpoint: str, model: str | None = None) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a model tracked in ``checkpoint`` (a checkpoint, or a root: its
    newest good one), by the name ``ferry inspect`` shows; ``model=None``: the only model
    there. Tensors are on the CPU, bitwise as saved; ``model.load_state_dict(...)`` takes it.
    """
    return pick(load(checkpoint), model)[1]


def format_for(out: str, given: str | None) -> Format:
    """The format to write: ``given``, else from OUT's name (``.pt``/``.pth``/``.bin``: a
    torch file; anything else: safetensors)."""
    if given is not None:
        if given not in FORMATS:
            raise ConfigError(f"--format {given!r}: use safetensors or pt")
        return "pt" if given == "pt" else "safetensors"
    return "pt" if out.endswith(TORCH_SUFFIXES) else "safetensors"


@dataclass(frozen=True)
class Exported:
    model: str
    out: str
    format: Format
    step: int
    source: str
    tensors: int
    bytes: int


def export(checkpoint: str, out: str, *, fmt: Format, model: str | None) -> Exported:
    """Write the model's ``state_dict`` from ``checkpoint`` to the file ``out`` (replaced
    whole, never left half-written)."""
    if fmt == "safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ConfigError(
                f"writing safetensors needs the safetensors package: {INSTALL} (or --format pt)"
            ) from None
    loaded = load(checkpoint)
    name, tensors = pick(loaded, model)
    tensors = unshared(tensors)
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        if fmt == "safetensors":
            meta = {"format": "pt", "ferry_model": name, "ferry_step": str(loaded.step)}
            save_file(tensors, tmp, metadata=meta)
        else:
            torch.save(tensors, tmp)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    return Exported(name, out, fmt, loaded.step, loaded.url, len(tensors), size)


def unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor with memory of its own, contiguous: tensors that shared bytes in the
    checkpoint (tied weights) share a buffer when loaded, which safetensors refuses."""
    seen: set[int] = set()
    out = {}
    for key, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        if (
            ptr in seen
            or not t.is_contiguous()
            or t.storage_offset()
            or t.untyped_storage().nbytes() != t.numel() * t.element_size()
        ):
            t = t.contiguous().clone()
        seen.add(t.untyped_storage().data_ptr())
        out[key] = t
    return out
