"""Where ferry meets Lightning's own loop, in both modes (zero-code and ``FerryCallback``).

Six narrow hooks on Lightning's classes, each keeping the hooked function's name, signature
and ``__wrapped__``, and each doing nothing for a Trainer ferry does not drive (``driving``):

- ``call._call_setup_hook``: before the loggers make their folders, the checkpointed run's
  versions are pinned and a CSV writer continues its file (``lightning_state``);
- ``_CheckpointConnector.resume_start``: Lightning restores from ferry's checkpoint itself,
  as for ``fit(ckpt_path=...)`` (weights through ``on_load_checkpoint``, callbacks, loops,
  optimizers, schedulers, precision);
- ``FitLoop._load_combined_loader_states`` (where Lightning puts back a resumable loader's
  state): the training DataLoader is tracked; its position is the trained batches, and on
  resume it continues the saved epoch (its order drawn again, the trained batches skipped at
  the sampler); the random streams come back at its first batch;
- ``_TrainingEpochLoop.on_run_start``: the resumed epoch's restore point (random streams),
  and its accumulated logged values come back;
- ``_TrainingEpochLoop.on_advance_end``: the end of a training batch, after Lightning logged
  it, validated if due and flushed its loggers, is the safe point (where Lightning itself
  honours a SIGTERM); not in the middle of a gradient accumulation;
- ``_SignalConnector.register_signal_handlers``: for the signals ferry handles, ferry's
  handler stays in place, so Lightning's SIGTERM handler (which ends ``fit`` with exit 0
  before any checkpoint, and forwards the signal to DDP children) never runs under ferry.
"""

from __future__ import annotations

import functools
import importlib
import logging
import signal
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from ferry.integrations import lightning_state as state

log = logging.getLogger("ferry")
NAME = "lightning"
"""The name of Lightning's state in a checkpoint, in both modes."""
LOADER = "lightning_train"
"""The name of the training loader's position, in both modes."""

SessionFor = Callable[[Any], Any]
"""trainer -> the ferry session that drives it, or None when ferry does not drive it."""
_policies: list[SessionFor] = []
_driven: weakref.WeakKeyDictionary[Any, Driven] = weakref.WeakKeyDictionary()
_installed: set[str] = set()
_OWN_FILES = r"Checkpoint directory .* exists and is not empty"
_NOT_RESUMABLE = r"You're resuming from a checkpoint that ended before the epoch ended"
"""Lightning's warnings about a resume that ferry makes exact: said by the plain run never."""


def drive_when(policy: SessionFor) -> None:
    """Add a rule that says which trainers ferry drives (zero-code mode: all of them; the
    callback: those it is given to)."""
    if policy not in _policies:
        _policies.append(policy)


def driving(trainer: Any) -> Driven | None:
    """ferry's handle on ``trainer`` while it fits, or None."""
    if _stage(trainer) != "fit":
        return None
    found = _driven.get(trainer)
    if found is None:
        for policy in _policies:
            session = policy(trainer)
            if session is not None:
                found = _driven[trainer] = Driven(trainer, session)
                break
    return found


def _stage(trainer: Any) -> str | None:
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    return getattr(fn, "value", None)


class Driven:
    """One Trainer's fit under ferry: its session, its state, what the resume has put back."""

    def __init__(self, trainer: Any, session: Any) -> None:
        self.trainer = trainer
        self.session = session
        self.state = state.LightningState(trainer)
        self.saved: dict[str, Any] | None = session.saved_state(NAME)
        self.handed = False
        self.results: dict[str, Any] | None = None if self.saved is None else self.saved.get("results")
        session.leave_zero_code({"model": trainer.lightning_module})  # zero-code discovery steps aside
        session.loop_hooks.framework_drives("Lightning")  # and its loaders are Lightning's

    def hand_over(self) -> dict[str, Any] | None:
        """The checkpoint for Lightning to restore from, once."""
        if self.saved is None or self.handed:
            return None
        self.handed = True
        # ferry keeps the position of the loader: it is resumable, whatever Lightning sees
        warnings.filterwarnings("ignore", message=_NOT_RESUMABLE)
        return state.hand_over(self.saved, self.trainer)

    def data_ready(self, loaders: list[Any]) -> None:
        torch_loaders = [dl for dl in loaders if isinstance(dl, DataLoader)]
        if len(torch_loaders) != 1 or len(loaders) != 1:
            log.warning(
                "ferry: warning: Lightning trains on %d loaders here; ferry keeps the position of "
                "one torch DataLoader: a resume restarts the interrupted epoch's data",
                len(loaders),
            )
            self.session.track(**{NAME: self.state})
            return
        loader = torch_loaders[0]
        # The loader's iterator is made next, before Lightning sets the sampler's epoch for
        # the epoch: ferry draws the order when the iterator is made (the epoch a resume
        # continues needs its own), so the epoch is set now, to what Lightning sets after.
        epoch = int(self.trainer.fit_loop.epoch_progress.current.processed)
        samplers: list[Any] = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
        for sampler in samplers:
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
        self.session.track(**{LOADER: loader, NAME: self.state})
        self.session.loop_hooks.framework_drives("Lightning", LOADER)

    def epoch_started(self) -> None:
        """Before the epoch's first batch (or Lightning's pass over a restored validation): the
        restore point. Lightning asks for no batch of an epoch the checkpoint had finished."""
        tracker = self.session.loaders.get(LOADER)
        if tracker is not None and self.session.loop_hooks.restore_pending:
            self.session.loop_hooks.at_restore_point(tracker)
        if self.results is not None:
            saved, self.results = self.results, None
            state.apply_results(saved, self.trainer)

    def safe_point(self, loop: Any, validated: bool) -> None:
        if self.trainer.should_stop or loop._should_accumulate():
            return  # the fit ends here anyway / gradients are mid-accumulation
        self.state.validated = validated
        tracker = self.session.loaders.get(LOADER)
        if tracker is not None and self.session.driver is tracker:
            tracker.batches = int(loop.batch_progress.current.completed)  # trained (prefetching aside)
        self.session.global_step = int(self.trainer.global_step)
        self.session.step()


# ---------------------------------------------------------------------- the hooks
def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(owner, name)
    if getattr(original, "_ferry_hook", False):
        return
    hooked = functools.wraps(original)(make(original))
    hooked._ferry_hook = True  # type: ignore[attr-defined]
    setattr(owner, name, hooked)


def _setup_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def _call_setup_hook(trainer: Any) -> Any:
        driven = driving(trainer)
        saved = None if driven is None or driven.saved is None else driven.saved.get("loggers")
        if saved is not None:
            state.pin_versions(saved, list(trainer.loggers))
            if trainer.is_global_zero:
                with state.csv_continued(saved, list(trainer.loggers)):
                    for logger in trainer.loggers:
                        if hasattr(logger, "experiment"):
                            _ = logger.experiment
            with warnings.catch_warnings():  # the folder holds this run's own checkpoints
                warnings.filterwarnings("ignore", message=_OWN_FILES)
                return original(trainer)
        return original(trainer)

    return _call_setup_hook


def _resume_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def resume_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        driven = driving(self.trainer)
        checkpoint = None if driven is None else driven.hand_over()
        if checkpoint is not None:
            if self._loaded_checkpoint:
                log.warning(
                    "ferry: resuming from ferry's checkpoint of step %d instead of %s",
                    driven.session.restored_step if driven is not None else 0,
                    self._ckpt_path,
                )
            self._loaded_checkpoint = checkpoint
        return result

    return resume_start


def _combined_states(original: Callable[..., Any]) -> Callable[..., Any]:
    def _load_combined_loader_states(self: Any) -> Any:
        result = original(self)
        driven = driving(self.trainer)
        if driven is not None and self._combined_loader is not None:
            driven.data_ready(list(self._combined_loader.flattened))
        return result

    return _load_combined_loader_states


def _epoch_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_run_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        driven = driving(self.trainer)
        if driven is not None:
            driven.epoch_started()
        return result

    return on_run_start


def _batch_end(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_advance_end(self: Any, data_fetcher: Any, *args: Any, **kwargs: Any) -> Any:
        driven = driving(self.trainer)
        if driven is None:
            return original(self, data_fetcher, *args, **kwargs)
        passing_over = self._skip_next_val  # Lightning passes over a restored validation
        validated = not passing_over and self._should_check_val_fx(data_fetcher)
        result = original(self, data_fetcher, *args, **kwargs)
        if not passing_over:
            driven.safe_point(self, validated)
        return result

    return on_advance_end


def _signal_handlers(original: Callable[..., Any]) -> Callable[..., Any]:
    def register_signal_handlers(self: Any) -> Any:
        driven = driving(self.trainer)
        if driven is None or threading.current_thread() is not threading.main_thread():
            return original(self)
        mine = {signum: signal.getsignal(signum) for signum in driven.session.signals.signals}
        result = original(self)
        for signum, handler in mine.items():
            if signal.getsignal(signum) is not handler and handler is not None:
                signal.signal(signum, handler)
        return result

    return register_signal_handlers


def install(package: str) -> None:
    """Place the hooks on ``package`` (``lightning.pytorch`` or ``pytorch_lightning``), once."""
    if package in _installed:
        return
    _installed.add(package)

    def part(name: str) -> Any:
        return importlib.import_module(f"{package}.{name}")

    call = part("trainer.call")
    _wrap(call, "_call_setup_hook", _setup_hook)
    _wrap(part("trainer.connectors.checkpoint_connector")._CheckpointConnector, "resume_start", _resume_start)
    _wrap(part("loops.fit_loop")._FitLoop, "_load_combined_loader_states", _combined_states)
    epoch_loop = part("loops.training_epoch_loop")._TrainingEpochLoop
    _wrap(epoch_loop, "on_run_start", _epoch_start)
    _wrap(epoch_loop, "on_advance_end", _batch_end)
    _wrap(
        part("trainer.connectors.signal_connector")._SignalConnector,
        "register_signal_handlers",
        _signal_handlers,
    )
