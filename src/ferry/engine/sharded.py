"""Sharded state (FSDP2 / DTensor parameters) through ``torch.distributed.checkpoint``.

Each sharded model is saved together with the optimizers that train it, as DCP state
dicts, into the ``dcp/`` folder of the checkpoint being staged; every rank writes its own
shards and rank 0 the description of them. DCP reshards on load, so such a checkpoint can
be restored on another number of ranks. A save is staged to host memory on the training
thread (``stage``) and written by the background save (``write``), whose collectives run on
a gloo group that only background saves use; loading is a collective on the training thread.

DCP plans; the bytes go through ferry's own storage writer and reader (dcpio.py): the
description is JSON (``dcp/metadata.json``), chunks are raw bytes, plain values (an
optimizer's hyperparameters) ferry's wire format. Nothing on this path is a pickle, so
loading a sharded checkpoint runs no code, whoever made it (docs/format.md, "Threat
model"). DCP's own ``.metadata`` (a pickle) is never read: a checkpoint holding one is
refused.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ferry.engine import dcpio
from ferry.engine.catalog import split_url
from ferry.errors import CorruptCheckpointError, FerryError, StorageError, UnsafeCheckpointError
from ferry.format.dcpdesc import METADATA, SHARDS, shards_file
from ferry.format.integrity import read_manifest

DCP_DIR = "dcp"


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def is_sharded(obj: Any) -> bool:
    return isinstance(obj, nn.Module) and any(_is_dtensor(p) for p in obj.parameters())


def split(objects: dict[str, Any]) -> tuple[dict[str, tuple[nn.Module, list[Any]]], dict[str, Any]]:
    """(sharded models with their optimizers, everything else), by tracked name."""
    sharded: dict[str, tuple[nn.Module, list[Any]]] = {
        n: (m, []) for n, m in objects.items() if is_sharded(m)
    }
    owned: set[str] = set()
    for name, obj in objects.items():
        if isinstance(obj, torch.optim.Optimizer):
            params = {id(p) for g in obj.param_groups for p in g["params"]}
            for model, opts in sharded.values():
                if params <= {id(p) for p in model.parameters()}:
                    opts.append(obj)
                    owned.add(name)
    rest = {n: o for n, o in objects.items() if n not in sharded and n not in owned}
    return {n: (m, opts) for n, (m, opts) in sharded.items()}, rest


def _state(sharded: dict[str, tuple[nn.Module, list[Any]]], with_optim: dict[str, bool]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = {}
    for name, (model, opts) in sharded.items():
        model_sd, optim_sd = get_state_dict(model, opts if with_optim.get(name) else [])
        state[name] = {"model": model_sd, **({"optim": optim_sd} if with_optim.get(name) else {})}
    return state


def optimizers_saved(sharded: dict[str, tuple[nn.Module, list[Any]]]) -> dict[str, bool]:
    """Per model, whether its optimizers are saved with it. An optimizer that has not stepped
    yet is left out: DCP would initialize its state with a step of its own, and the run would
    no longer be the one it was."""
    return {name: bool(opts) and all(o.state for o in opts) for name, (_, opts) in sharded.items()}


def stage(sharded: dict[str, tuple[nn.Module, list[Any]]]) -> dict[str, Any]:
    """The state ``write`` saves, copied to host memory (DTensors keep their sharding): the
    snapshot of an asynchronous save, on the training thread; training may then go on."""
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    staged: dict[str, Any] = BlockingAsyncStager().stage(_state(sharded, optimizers_saved(sharded)))
    return staged


def write(state: dict[str, Any], path: str, group: Any = None) -> None:
    """Save ``state`` (from ``stage``) into the DCP folder ``path``: a collective over
    ``group`` (the default group when None), on whichever thread every rank of it calls."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    writer, planner = dcpio.Writer(path), dcpio.SavePlanner()
    try:
        dcp.save(state, storage_writer=writer, planner=planner, process_group=group)  # type: ignore[attr-defined]
    except CheckpointException as exc:  # a BaseException: every rank gets it, from every rank
        raise _dcp_failed(
            exc, lambda why: StorageError(f"{path}: saving the sharded state failed ({why})")
        ) from exc


def check_listed(path: str) -> None:
    """Refuse a DCP folder (``path``, the ``dcp/`` of a checkpoint) holding anything the
    checkpoint's manifest does not list (so was not verified when the checkpoint was
    read), anything that is not a regular file, or DCP's own pickled ``.metadata``, even
    listed: ferry reads its description from ``metadata.json`` only, and a pickle there
    says the folder was made by something else."""
    storage, name = split_url(os.path.dirname(path.rstrip("/")))
    if name is None:
        raise UnsafeCheckpointError(f"{path} is not the sharded state of a committed checkpoint; refused")
    prefix = f"{DCP_DIR}/"
    listed = {f.removeprefix(prefix) for f in read_manifest(storage, name)["files"] if f.startswith(prefix)}
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafeCheckpointError(f"{path} is not a folder (a link?); refused")
        entries = list(os.scandir(path))
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path} is missing: the checkpoint has no sharded state") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if ".metadata" in listed or any(e.name == ".metadata" for e in entries):
        raise UnsafeCheckpointError(
            f"{path}/.metadata is torch.distributed.checkpoint's pickled description, which could run "
            "code when read; ferry writes and reads metadata.json only: refused, resume from another one"
        )
    if METADATA not in listed:
        raise UnsafeCheckpointError(f"{path}/{METADATA} is not listed in the manifest; refused")
    for entry in entries:
        if entry.name not in listed or not entry.is_file(follow_symlinks=False):
            raise UnsafeCheckpointError(
                f"{path}/{entry.name} is not a file the manifest lists and verified; refused: "
                "resume from another checkpoint"
            )
        if entry.name != METADATA and not SHARDS.fullmatch(entry.name):
            raise UnsafeCheckpointError(f"{path}/{entry.name} is not a file ferry writes there; refused")


def load(sharded: dict[str, tuple[nn.Module, list[Any]]], path: str, with_optim: dict[str, bool]) -> None:
    """Load the sharded models of the checkpoint whose DCP folder is ``path``; the
    checkpoint has been read (its files verified) already."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    check_listed(path)
    description = dcpio.read_description(path)
    state = _state(sharded, with_optim)
    try:
        reader, planner = dcpio.Reader(path, description), dcpio.LoadPlanner()
        dcp.load(state, storage_reader=reader, planner=planner)  # type: ignore[attr-defined]
    except FerryError:
        raise
    except (Exception, CheckpointException) as exc:  # every rank gets it: DCP gathers the failures of all
        raise _dcp_failed(exc, lambda why: _unloadable(path, why)) from exc
    for name, (model, opts) in sharded.items():
        optim = state[name].get("optim")
        set_state_dict(
            model,
            opts if optim is not None else [],
            model_state_dict=state[name]["model"],
            optim_state_dict=optim if optim is not None else {},
        )


def _unloadable(path: str, why: str) -> FerryError:
    return CorruptCheckpointError(
        f"{path}: torch.distributed.checkpoint could not load the sharded state ({why}); "
        "resume from another checkpoint"
    )


def _dcp_failed(exc: BaseException, wrap: Callable[[str], FerryError]) -> FerryError:
    """One line for a failed DCP call: the first rank's own ferry error where there is one
    (DCP wraps what each rank raised in a CheckpointException whose text is a traceback),
    else ``wrap`` of the first rank's exception, named."""
    failures = getattr(exc, "failures", None)
    first: BaseException = exc
    if isinstance(failures, dict) and failures:
        wrapped = [f[0] if isinstance(f, tuple) else f for _, f in sorted(failures.items())]
        ours = [f for f in wrapped if isinstance(f, FerryError)]
        if ours:
            return ours[0]
        first = wrapped[0] if isinstance(wrapped[0], BaseException) else exc
    return wrap(f"{type(first).__name__}: " + " ".join(str(first).split())[:300])


def written_by(path: str, rank: int) -> list[str]:
    """The DCP files this rank wrote (its shards; rank 0 also the description)."""
    names = [shards_file(rank), *([METADATA] if rank == 0 else [])]
    return [n for n in names if os.path.isfile(os.path.join(path, n))]
