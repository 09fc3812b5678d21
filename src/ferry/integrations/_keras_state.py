"""What a Keras 3 ``fit`` keeps outside torch: its variables and its callbacks' state.

- Variables (``variables`` / ``apply_variables``): the model's (weights and its layers'
  seed generators), the optimizer's (its iteration counter and learning rate included) and
  the metrics' running totals, by position and path, as NumPy copies; and Keras's global
  seed generator (``keras.random`` ops called without a seed draw from it), when the
  process has one. Keras variables hold torch tensors, but they are not torch state that
  ferry's torch-side capture sees (the optimizer is not a ``torch.optim`` one).
- Callbacks (``callbacks`` / ``apply_callbacks``): every attribute of every callback in the
  fit's list that is a plain value (numbers, strings, NumPy arrays, and lists, tuples, dicts
  and sets of those), by the callback's class and its rank among callbacks of that class.
  EarlyStopping's ``wait``/``best``/``best_weights``, ReduceLROnPlateau's counters,
  ModelCheckpoint's ``best`` and batch counters, History's epochs and values, the progress
  bar's step count are all such attributes. A module-level function (a monitor's
  ``monitor_op``) is kept by name and found again among the loaded modules, never imported.
  CSVLogger's file is kept whole and written back through the logger's own handle, and its
  row writer rebuilt, so that the file goes on as in the uninterrupted run. Anything else
  of the script's own callbacks (an open file, an object) is named in a warning at the
  first checkpoint; Keras's own callbacks hold nothing else that outlives an epoch.
"""

from __future__ import annotations

import csv
import logging
import sys
from collections import Counter
from typing import Any

import keras
import numpy as np

from ferry.errors import ConfigError

log = logging.getLogger("ferry")

_SKIP = frozenset({"model", "_model", "params"})
"""Set again by Keras in every fit (``set_model``/``set_params``), never kept."""
_NOT_PLAIN = object()


# ---------------------------------------------------------------------------- variables
def _variable_map(model: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    optimizer = model.optimizer
    groups = (
        ("model", model.variables),
        ("optimizer", [] if optimizer is None else optimizer.variables),
        ("metrics", model.metrics_variables),
    )
    for prefix, variables in groups:
        for i, var in enumerate(variables):
            found[f"{prefix}/{i}/{var.path}"] = var
    return found


def _global_seed_generator() -> Any:
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    return global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)


def variables(model: Any) -> dict[str, Any]:
    """Every variable of the model, its optimizer and its metrics, as NumPy copies."""
    state = {name: np.array(keras.ops.convert_to_numpy(v)) for name, v in _variable_map(model).items()}
    seeds = _global_seed_generator()
    if seeds is not None:
        state["keras/global_seed_generator"] = np.array(keras.ops.convert_to_numpy(seeds.state))
    return state


def apply_variables(model: Any, state: dict[str, Any]) -> None:
    found = _variable_map(model)
    saved = {k: v for k, v in state.items() if not k.startswith("keras/")}
    if set(found) != set(saved):
        differ = sorted(set(found) ^ set(saved))
        raise ConfigError(
            f"the checkpoint's Keras variables differ from this model's ({', '.join(differ[:4])}"
            f"{', ...' if len(differ) > 4 else ''}): resume with the model and optimizer the "
            "checkpoint was taken with, or start fresh in another --dir"
        )
    for name, var in found.items():
        var.assign(saved[name])
    seeds = state.get("keras/global_seed_generator")
    if seeds is not None:
        generator = _global_seed_generator()
        if generator is None:  # made after the restore point in the uninterrupted run
            from keras.src.random.seed_generator import global_seed_generator

            generator = global_seed_generator()  # its seed draw is undone: ferry restores the RNG after
        generator.state.assign(seeds)


# ---------------------------------------------------------------------------- callbacks
def _plain(value: Any) -> Any:
    """A copy of ``value`` made of plain values only, or ``_NOT_PLAIN``."""
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return value
    if isinstance(value, np.ndarray):
        return value.copy() if value.dtype.kind in "biufc" else _NOT_PLAIN
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        if any(v is _NOT_PLAIN for v in items):
            return _NOT_PLAIN
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict) and all(isinstance(k, (str, int)) for k in value):
        copied = {k: _plain(v) for k, v in value.items()}
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in copied.values()) else copied
    return _NOT_PLAIN


def _function_name(value: Any) -> list[str] | None:
    """``[module, qualname]`` of a module-level function that can be found again by name."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not callable(value) or not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if "<" in qualname or _find_function([module, qualname]) is not value:
        return None  # a lambda, a closure, a bound method: not a name
    return [module, qualname]


def _find_function(name: list[str]) -> Any:
    """The function named ``[module, qualname]`` among the modules already loaded (nothing
    is imported, so a checkpoint cannot make code run)."""
    found: Any = sys.modules.get(name[0])
    for part in name[1].split("."):
        found = getattr(found, part, None)
    return found if callable(found) else None


def _keys(callbacks: list[Any]) -> list[str]:
    """A stable name per callback: its class and its rank among callbacks of that class."""
    seen: Counter[str] = Counter()
    keys = []
    for cb in callbacks:
        kind = type(cb).__qualname__
        keys.append(f"{kind}#{seen[kind]}")
        seen[kind] += 1
    return keys


def _one(cb: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    sets: list[str] = []
    functions: dict[str, list[str]] = {}
    for name, value in vars(cb).items():
        if name in _SKIP:
            continue
        if isinstance(value, (set, frozenset)):
            value, kind = sorted(value, key=repr), name
        else:
            kind = None
        plain = _plain(value)
        if plain is not _NOT_PLAIN:
            attrs[name] = plain
            if kind is not None:
                sets.append(kind)
        elif (function := _function_name(value)) is not None:
            functions[name] = function
        elif not callable(value) and not type(cb).__module__.startswith("keras."):
            _say_lost(cb, name, value)
    state: dict[str, Any] = {"attrs": attrs, "sets": sets, "functions": functions}
    if isinstance(cb, keras.callbacks.CSVLogger) and cb.csv_file is not None and not cb.csv_file.closed:
        cb.csv_file.flush()
        with open(cb.filename, encoding="utf-8", newline="") as f:
            state["file"] = f.read()
    return state


_LOST: set[tuple[str, str]] = set()


def _say_lost(cb: Any, name: str, value: Any) -> None:
    """Once per attribute: what of the script's own callback a checkpoint does not keep."""
    key = (type(cb).__qualname__, name)
    if key not in _LOST:
        _LOST.add(key)
        log.warning(
            "ferry: warning: keras: %s.%s (a %s) is not kept in checkpoints: a resumed fit has it as "
            "the script makes it; keep plain values (numbers, strings, arrays, lists, dicts) there",
            key[0],
            name,
            type(value).__name__,
        )


def callbacks(items: list[Any]) -> dict[str, Any]:
    """The plain state of every callback of a fit, by ``_keys``."""
    return {key: _one(cb) for key, cb in zip(_keys(items), items, strict=True)}


def apply_callbacks(items: list[Any], saved: dict[str, Any]) -> None:
    keys = _keys(items)
    for key in sorted(set(saved) - set(keys)):
        log.warning(
            "ferry: warning: keras: the checkpoint has callback %s, which this fit does not have", key
        )
    for key, cb in zip(keys, items, strict=True):
        state = saved.get(key)
        if state is None:
            log.warning("ferry: warning: keras: callback %s is not in the checkpoint; it starts fresh", key)
            continue
        for name, value in state["attrs"].items():
            setattr(cb, name, set(value) if name in state["sets"] else value)
        for name, function in state["functions"].items():
            found = _find_function(function)
            if found is not None:
                setattr(cb, name, found)
        if "file" in state and isinstance(cb, keras.callbacks.CSVLogger):
            _rewrite_csv(cb, state["file"], bool(state["attrs"].get("keys")))


def _rewrite_csv(cb: Any, text: str, had_writer: bool) -> None:
    """The log file as it was at the checkpoint, and a row writer like the one it had."""
    if cb.csv_file is None or cb.csv_file.closed:
        return
    cb.csv_file.seek(0)
    cb.csv_file.truncate()
    cb.csv_file.write(text)
    cb.csv_file.flush()
    if had_writer:

        class Dialect(csv.excel):
            delimiter = cb.sep

        cb.writer = csv.DictWriter(cb.csv_file, fieldnames=["epoch", *cb.keys], dialect=Dialect)
