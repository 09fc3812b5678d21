"""ferry for the Hugging Face ``Trainer`` (transformers 5.x with accelerate).

    callback = FerryCallback()            # before the Trainer: ferry's signal handlers first
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.resume_from(trainer))

Zero-code mode (``ferry run -- python train.py``, no code change) uses this same callback,
added to every Trainer by ``transformers_auto``, so a checkpoint of either mode resumes
under the other.

The safe point is ``on_step_begin``, where the previous optimizer step has been trained,
logged, evaluated and saved (so its log line and its ``trainer_state.json`` entry are in
the checkpoint). Tracked: the model (``hf_model``), the optimizer and scheduler (made by the
Trainer, tracked at ``on_train_begin``) and the Trainer's own progress (``hf_progress``:
``_hf_progress``). ``resume_from`` restores the model and writes the folder that the
Trainer's own resume reads, so that the Trainer skips the trained epochs and batches at the
sampler; the rest comes back at ``on_train_begin``, ``on_epoch_begin`` and ``on_step_begin``.
Keep ``ignore_data_skip=False`` (the default).
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import threading
from typing import Any

from transformers import TrainerCallback

from ferry import session as _session
from ferry.errors import FerryError, bug
from ferry.integrations import _hf_fetches
from ferry.integrations._hf_progress import STATE_NAME, TrainerProgress

log = logging.getLogger("ferry")

FRAMEWORK = "Hugging Face Trainer"


class FerryCallback(TrainerCallback):  # type: ignore[misc]
    """Makes ``Trainer.train`` preemptible and resumes it exactly. See docs/integrations.md."""

    def __init__(self) -> None:
        self.session = _session.current()
        if self.session is None:
            raise bug("no ferry session in this process")
        self.progress = TrainerProgress()
        self.trainer: Any = None
        self.stop_handler = signal.getsignal(signal.SIGTERM)
        """The SIGTERM handler before the Trainer was made: ferry's (see ``keep_stop_handler``)."""
        self._folder: str | None = None  # a resume folder of ours, removed once read
        self._model: Any = None  # the model tracked as hf_model
        self._eval_on_start: bool | None = None  # set aside for a resumed train() (see resume_from)
        self.zero_code = False
        """Added by zero-code mode (``transformers_auto``), not by the script."""

    def resume_from(self, trainer: Any, folder: str | None = None) -> str | None:
        """Restore the model; return the folder to pass as ``train(resume_from_checkpoint=...)``
        (None when starting fresh). ``folder`` defaults to a new local temporary folder (the
        checkpoint directory may be remote), removed once the Trainer has read it."""
        session = self._bind(trainer)
        self._model = trainer.model
        session.track(hf_model=trainer.model, **{STATE_NAME: self.progress})
        if not self.progress.resuming:
            return None
        if getattr(trainer.args, "ignore_data_skip", False):
            log.warning(
                "ferry: warning: ignore_data_skip=True: the Trainer starts the interrupted epoch over "
                "instead of skipping its trained batches, so this run trains more steps than an "
                "uninterrupted one"
            )
        if getattr(trainer.args, "eval_on_start", False):  # done before the checkpoint: not again
            trainer.args.eval_on_start, self._eval_on_start = False, True
        if folder is None:
            folder = self._folder = tempfile.mkdtemp(prefix="ferry-hf-resume-")
        self.progress.write_folder(folder, trainer.model)
        return folder

    def _bind(self, trainer: Any) -> Any:
        session = self.session
        if session is None or session.closed:
            raise FerryError(
                "the ferry session of this FerryCallback is closed (ferry.close() was called): "
                "make a new FerryCallback for the next Trainer"
            )
        if self.trainer is not trainer:
            self.trainer = trainer
            self.progress.bind(trainer)
            args = trainer.args
            self.progress.fetches.keep((args.gradient_accumulation_steps + 1) * max(args.world_size, 1) + 1)
            callbacks = trainer.callback_handler.callbacks
            if self in callbacks:  # first: the safe point comes before any other on_step_begin
                callbacks.remove(self)
                callbacks.insert(0, self)
            session.leave_zero_code({}, steps=True)  # zero-code discovery and loop capture step aside
            session.loop_hooks.framework_drives(FRAMEWORK)  # and the Trainer's loaders are the Trainer's
        return session

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        keep_stop_handler(args, self.stop_handler)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            raise FerryError(
                "FerryCallback needs the Trainer before training: call "
                "trainer.train(resume_from_checkpoint=callback.resume_from(trainer))"
            )
        session = self._bind(self.trainer)
        objects = {}
        if kwargs.get("model") is not None and kwargs["model"] is not self._model:  # model_init made one
            objects["hf_model"] = self._model = kwargs["model"]
        if kwargs.get("optimizer") is not None:
            objects["hf_optimizer"] = kwargs["optimizer"]
        if kwargs.get("lr_scheduler") is not None:
            objects["hf_scheduler"] = kwargs["lr_scheduler"]
        session.track(**objects)
        loader = kwargs.get("train_dataloader")
        _hf_fetches.attach(getattr(loader, "base_dataloader", loader), self.progress.fetches)
        if self.progress.resuming:
            self.progress.train_begins(self.trainer)
        else:  # a fresh ferry session: count as the Trainer does (it may resume its own checkpoint)
            session.global_step = state.global_step

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._eval_on_start is not None:  # past the Trainer's look at it: as the script set it
            args.eval_on_start, self._eval_on_start = self._eval_on_start, None
        self.progress.epoch_begins()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session = self.session
        if session is None:
            raise bug("no ferry session in this process")
        if state.global_step > session.global_step:  # the previous step is done: a safe point
            # step() counts one more unless a loader tracked before the Trainer drives
            session.global_step = state.global_step - (session.driver is None)
            session.step()  # checkpoints when one is due, exits 85 after a stop
        self.progress.step_begins()
        if self._folder is not None:  # the Trainer has read it
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def keep_stop_handler(args: Any, ours: Any) -> None:
    """With ``enable_jit_checkpoint``, the Trainer replaces the SIGTERM handler (ferry's) by
    its own, which does not chain: it would save a checkpoint of its own 3 s later and end
    ``train()``, and the job would exit 0 as if finished. Put ``ours`` back: a SIGTERM then
    ends in ferry's checkpoint at the next step and the checkpoint exit code."""
    if not getattr(args, "enable_jit_checkpoint", False) or not callable(ours):
        return
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is ours:
        return
    signal.signal(signal.SIGTERM, ours)
    log.info(
        "ferry: enable_jit_checkpoint: SIGTERM is ferry's: it checkpoints at the next step and "
        "exits with the checkpoint exit code, instead of the Trainer's just-in-time save"
    )
