"""Put a loaded state tree back into live objects, in place."""

from __future__ import annotations

from typing import Any

import torch

from ferry.engine.codec import is_stateful
from ferry.errors import CorruptCheckpointError, FerryError


def apply_state(target: Any, loaded: Any, path: str = "") -> Any:
    """Restore ``loaded`` into ``target`` (the tree that was saved, with live objects).

    Stateful objects get ``load_state_dict``; tensors are copied into; dicts and lists are
    updated in place (the way metric dicts are kept). Returns the value to use for
    ``target`` (a new value where it is immutable).
    """
    where = path or "the state"
    if is_stateful(target):
        try:
            target.load_state_dict(loaded)
        except FerryError:
            raise
        except Exception as exc:  # a checkpoint that does not fit is that checkpoint's fault
            raise _refused(where, "its load_state_dict", exc) from exc
        return target
    if isinstance(target, torch.Tensor):
        if not isinstance(loaded, torch.Tensor) or loaded.shape != target.shape:
            raise CorruptCheckpointError(
                f"{where}: checkpoint holds {_desc(loaded)}, the live tensor is {tuple(target.shape)}"
            )
        try:
            with torch.no_grad():
                target.copy_(loaded)
        except RuntimeError as exc:
            raise _refused(where, "the live tensor", exc) from exc
        return target
    if isinstance(target, dict) and isinstance(loaded, dict):
        for key in list(target):
            if key in loaded:
                target[key] = apply_state(target[key], loaded[key], f"{path}.{key}" if path else str(key))
        for key in loaded:
            if key not in target:
                target[key] = loaded[key]
        return target
    if isinstance(target, list) and isinstance(loaded, list):
        target[:] = [
            apply_state(target[i], v, f"{path}[{i}]") if i < len(target) else v for i, v in enumerate(loaded)
        ]
        return target
    return loaded


def _refused(where: str, who: str, exc: Exception) -> CorruptCheckpointError:
    first = " ".join(str(exc).split())[:300]  # one line, whatever the exception said
    return CorruptCheckpointError(
        f"{where}: {who} refused the checkpoint's state ({type(exc).__name__}: {first}); "
        "the checkpoint does not fit the live objects"
    )


def _desc(v: Any) -> str:
    return f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
