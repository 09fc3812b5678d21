"""One Keras 3 ``model.fit`` (torch backend) under ferry; shared by the explicit callback
(``keras.py``) and zero-code mode (``keras_auto.py``), so that a checkpoint of either mode
resumes under the other.

Three hooks on Keras's classes, each keeping the hooked function's name, signature and
``__wrapped__``, and each doing nothing unless a fit runs under ferry (``install``):

- ``EpochIterator.__iter__``: the iterator of training steps of the fit gets a wrapper
  around its step generator. Each time it hands out a step, all callbacks have logged the
  step before (``on_train_batch_end``) or the epoch before (``on_epoch_end``, validation
  included) and started this epoch (``on_epoch_begin``): that is the safe point
  (``session.step()``), and what it saves is exactly "k steps of epoch e done". Resumed,
  it skips the k steps (no data is drawn for them) and goes on with step k.
- ``TorchEpochIterator._get_iterator``: every torch ``DataLoader`` Keras draws from is
  iterated untracked (zero-code mode takes none of them for the loop's); the training one
  is counted, or replayed at the checkpoint's batch (``_keras_data``).
- ``CallbackList.on_epoch_begin``: the restore point. At the fit's first epoch, after every
  callback's ``on_train_begin`` and Keras's ``reset_metrics``, ferry's state is tracked and
  restored: variables, metrics, every callback's state (``_keras_state``), the step, the
  data position. The callbacks' ``on_epoch_begin`` of the resumed epoch ran before the
  checkpoint, so it is not run again (the "Epoch 3/6" line is not printed twice).

``fit`` reads ``model._initial_epoch`` (Keras's own resume, BackupAndRestore, sets it too)
right after ``on_train_begin``; ``KerasFit.begin`` sets it to the checkpoint's epoch.
Several ``fit`` calls in one script are numbered; resumed, the calls before the
checkpoint's run again from their start (without safe points), and ferry says so.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import keras
from keras.src.backend.torch.trainer import TorchEpochIterator
from keras.src.callbacks.callback_list import CallbackList
from keras.src.trainers.epoch_iterator import EpochIterator
from torch.utils.data import DataLoader

from ferry.errors import ConfigError, FerryError, bug
from ferry.integrations import _keras_data, _keras_state, _pools
from ferry.state.loader import ignore_stops_in_workers, iterate_untracked

log = logging.getLogger("ferry")

STATE_NAME = "keras"
_VERSION = 1
_ACTIVE: KerasFit | None = None
_FITS = 0


class KerasState:
    """The Stateful tracked as ``keras``, once per process: the state of the fit in progress."""

    def __init__(self) -> None:
        self.fit: KerasFit | None = None
        self.tracked = False
        self.applied = False

    def state_dict(self) -> dict[str, Any]:
        if self.fit is None:
            raise bug("a Keras checkpoint outside fit")
        return self.fit.capture()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.fit is None:
            raise bug("a Keras restore outside fit")
        self.fit.apply(state)
        self.applied = True


_STATE = KerasState()


def _saved(session: Any) -> dict[str, Any] | None:
    """The checkpoint's Keras state while it waits to be restored, else None."""
    if _STATE.applied or session.loaded is None:
        return None
    saved = session.saved_state(STATE_NAME)
    if saved is not None and (not isinstance(saved, dict) or saved.get("version") != _VERSION):
        raise ConfigError(
            f"{session.loaded.url}: its Keras state was written by another version of ferry's Keras "
            "support: resume it with that ferry, or start fresh in another --dir"
        )
    return saved


def _theirs(callbacks: Any) -> list[Any]:
    """The fit's callbacks, ferry's own aside."""
    return [cb for cb in callbacks.callbacks if not getattr(type(cb), "ferry_callback", False)]


class KerasFit:
    """One ``fit`` call: ``begin`` before its loop, ``end`` after; the hooks do the rest."""

    def __init__(self, model: Any, session: Any) -> None:
        global _FITS
        self.model, self.session = model, session
        self.index = _FITS
        _FITS += 1
        self.train: Any = None  # the fit's EpochIterator of training steps
        self.callbacks: Any = None  # the fit's CallbackList
        self.data: _keras_data.Position | None = None
        self.epoch = self.position = self.skip = 0
        self.steps_seen: int | None = None
        self.replay: dict[str, Any] | None = None
        self.started = self.rerun = self.pending = self.said_no_data = False
        self._initial_epoch = getattr(model, "_initial_epoch", None)

    def begin(self) -> None:
        global _ACTIVE
        _ACTIVE = self
        self.session.leave_zero_code({}, steps=True)  # ferry's own discovery and loop capture step aside
        self.session.loop_hooks.framework_drives("Keras")  # and zero-code mode tracks no loader of fit's
        driver = self.session.driver
        if driver is not None:  # a loader iterated outside fit (a look at one batch) is not the loop's
            self.session.loaders.pop(driver.name, None)
            self.session.driver = None
            if self.index == 0:  # its batches were counted as steps
                self.session.global_step = 0
        try:
            saved = _saved(self.session)
        except FerryError as exc:
            _fail(self.session, exc)
        if saved is None:
            return
        if int(saved["fit"]) > self.index:
            self.rerun = True
            log.info(
                "ferry: keras: fit call %d runs again from its start: the checkpoint is in fit call %d",
                self.index + 1,
                int(saved["fit"]) + 1,
            )
        elif int(saved["epoch"]):
            self.model._initial_epoch = int(saved["epoch"])

    def end(self, finished: bool) -> None:
        global _ACTIVE
        if finished and self.pending and not self.rerun:
            self.session.global_step += 1  # the fit's last step: it had no safe point after it
        _ACTIVE = None
        self.model._initial_epoch = self._initial_epoch

    # ------------------------------------------------------------------ the hooks' side
    def iterating(self, it: Any) -> None:
        if self.train is None and isinstance(it, TorchEpochIterator):
            self.train = it
        if it is self.train:
            it._epoch_iterator = self._steps(it._epoch_iterator)

    def _steps(self, inner: Iterator[Any]) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        for _ in range(skip):  # the resumed epoch's trained steps: the generator alone, no data
            if next(inner, None) is None:
                return
        seen, self.steps_seen = self.steps_seen if skip else None, None
        step = skip
        for item in inner:
            if seen is not None:  # Keras's count of the iterator's steps, as at the checkpoint
                self.train._steps_seen, seen = seen, None
            self.position = step
            if self.started and not self.rerun:
                if self.pending:
                    self.session.step()  # counts the step before; a safe point (exits 85 after a stop)
                self.pending = True
            yield item
            step += 1

    def batches(self, loader: DataLoader[Any]) -> Iterator[Any]:
        """The iterator of the fit's training batches, from ``loader`` (``_get_iterator``)."""
        self.protect(loader)
        replay, self.replay = self.replay, None
        batches = _keras_data.fresh(loader) if replay is None else _keras_data.replay(loader, replay)
        self.data = batches.position
        _pools.watch(batches.real)
        return batches

    def protect(self, loader: DataLoader[Any]) -> None:
        """Workers ignore the stop signals (``ferry run`` signals the process group): the
        main process saves first."""
        ignore_stops_in_workers(loader, self.session.signals.signals)

    def epoch_begins(self, callbacks: Any, epoch: int) -> bool:
        """At ``callbacks.on_epoch_begin(epoch)``; True: the callbacks' hooks must not run
        (a resumed epoch, begun before the checkpoint)."""
        if self.started:
            if callbacks is self.callbacks:
                self.epoch = epoch
            return False
        if getattr(callbacks, "model", None) is not self.model:
            return False
        self.started, self.callbacks, self.epoch = True, callbacks, epoch
        if self.rerun:
            return False
        if any(isinstance(cb, keras.callbacks.BackupAndRestore) for cb in callbacks.callbacks):
            log.warning(
                "ferry: warning: keras: BackupAndRestore resumes this fit too, at its last backup, and "
                "would move the epoch under ferry's checkpoint: remove it (ferry resumes at the step)"
            )
        _STATE.fit = self
        applied = _STATE.applied
        try:
            if not _STATE.tracked:
                _STATE.tracked = True
                self.session.track(**{STATE_NAME: _STATE})
            self.session.restore()
        except FerryError as exc:
            _fail(self.session, exc)
        return _STATE.applied and not applied

    # ------------------------------------------------------------------ state
    def capture(self) -> dict[str, Any]:
        flush = getattr(self.callbacks, "_flush_futures", None)
        if callable(flush):  # batch-end callbacks Keras dispatched to its threads
            flush()
        if self.data is None and not self.said_no_data:
            self.said_no_data = True
            log.warning(
                "ferry: warning: keras: the training data of this fit does not come from a torch "
                "DataLoader: its position is not kept, and a resumed epoch draws from its start"
            )
        return {
            "version": _VERSION,
            "fit": self.index,
            "epoch": self.epoch,
            "step": self.position,
            "steps_seen": getattr(self.train, "_steps_seen", None),
            "stop_training": bool(self.model.stop_training),
            "variables": _keras_state.variables(self.model),
            "callbacks": _keras_state.callbacks(_theirs(self.callbacks)),
            "data": None if self.data is None else self.data.state_dict(),
        }

    def apply(self, saved: dict[str, Any]) -> None:
        if int(saved["epoch"]) != self.epoch:
            fix = (
                "remove keras.callbacks.BackupAndRestore, which resumed it at its own last backup "
                "(ferry resumes at the step)"
                if any(isinstance(cb, keras.callbacks.BackupAndRestore) for cb in self.callbacks.callbacks)
                else "pass fit the initial_epoch the checkpointed run had"
            )
            raise ConfigError(
                f"the checkpoint is in epoch {int(saved['epoch']) + 1} of this fit, but fit starts at "
                f"epoch {self.epoch + 1}: {fix}"
            )
        _keras_state.apply_variables(self.model, saved["variables"])
        _keras_state.apply_callbacks(_theirs(self.callbacks), saved["callbacks"])
        self.model.stop_training = bool(saved["stop_training"])
        self.skip = self.position = int(saved["step"])
        seen = saved.get("steps_seen")
        self.steps_seen = None if seen is None else int(seen)
        self.replay = saved["data"]


def active() -> KerasFit | None:
    return _ACTIVE


def _fail(session: Any, exc: FerryError) -> NoReturn:
    """End the script with one line: no traceback into Keras's loop, the job marked failed."""
    sys.stderr.write(f"ferry: error: {exc}\n")
    session.report.crashed(session.global_step, type(exc), exc)
    session.close()
    raise SystemExit(exc.exit_code)


# ---------------------------------------------------------------------- the hooks
def _iter_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        result = original(self)
        if _ACTIVE is not None:
            _ACTIVE.iterating(self)
        return result

    return __iter__


def _get_iterator_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _get_iterator(self: Any) -> Any:
        loader = original(self)
        if not isinstance(loader, DataLoader):
            return loader
        fit = _ACTIVE
        if fit is not None and self is fit.train:
            return fit.batches(loader)
        if fit is None:
            return iterate_untracked(loader)
        fit.protect(loader)
        return _pools.watch(iterate_untracked(loader))

    return _get_iterator


def _on_epoch_begin_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def on_epoch_begin(self: Any, epoch: int, logs: Any = None) -> Any:
        if _ACTIVE is not None and _ACTIVE.epoch_begins(self, epoch):
            return None
        return original(self, epoch, logs)

    return on_epoch_begin


_HOOKS: tuple[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (
    (EpochIterator, "__iter__", _iter_hook),
    (TorchEpochIterator, "_get_iterator", _get_iterator_hook),
    (CallbackList, "on_epoch_begin", _on_epoch_begin_hook),
)


def install() -> None:
    """Hook Keras's classes (once per process; see the module docstring)."""
    for owner, name, hook in _HOOKS:
        current = vars(owner)[name]
        if not getattr(current, "_ferry_hook", False):
            hooked = hook(current)
            hooked._ferry_hook = True  # type: ignore[attr-defined]
            setattr(owner, name, hooked)
