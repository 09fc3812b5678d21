"""ferry for the Hugging Face ``Trainer``.

    callback = FerryCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.resume_from(trainer))

The end of each optimizer step (``on_step_end``) is a safe point. Tracked: ``trainer.model``,
the optimizer and scheduler (at ``on_train_begin``, once the Trainer has made them), the
``TrainerState`` (global step, epoch, log history) and the random state in the Trainer's
own format. On resume, ``resume_from`` restores the model and writes the small folder the
Trainer's own resume reads: ``trainer_state.json`` (so the Trainer skips the trained epochs
and, with accelerate's ``skip_first_batches``, the trained batches of the interrupted epoch
at the sampler, without loading them), the weights, and ``rng_state.pth`` (which the
Trainer puts back after that skip). The optimizer and scheduler come from ferry's
checkpoint, not from that folder. Keep ``ignore_data_skip=False`` (the default).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from ferry import session as _session
from ferry.errors import bug
from ferry.state.rng import own


class TrainerRNG:
    """The global random state, saved in the layout of the Trainer's ``rng_state.pth``;
    restored by the Trainer itself at the point its own resume does (after the skip)."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["cuda"] = torch.cuda.random.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["python"]
        numpy = state["numpy"]
        self.saved = {
            **state,
            "python": (int(version), tuple(int(i) for i in internal), gauss),
            "numpy": (str(numpy[0]), np.asarray(numpy[1]), *(numpy[2:])),
            "cpu": own(state["cpu"]),
        }


class FerryCallback(TrainerCallback):  # type: ignore[misc]
    """Makes ``Trainer.train`` preemptible and resumes it exactly. See docs/integrations.md."""

    def __init__(self) -> None:
        self.session = _session.current()
        self.progress: dict[str, Any] = {"trainer_state": None}
        self.rng = TrainerRNG()

    def resume_from(self, trainer: Any, folder: str | None = None) -> str | None:
        """Restore the model; return the folder to pass as ``train(resume_from_checkpoint=...)``
        (None when starting fresh). ``folder`` defaults to a new local temporary folder (the
        checkpoint directory may be remote)."""
        session = self.session
        if session is None:
            raise bug("no ferry session in this process")
        session.track(hf_model=trainer.model, hf_progress=self.progress, hf_rng=self.rng)
        if not session.resumed or self.progress["trainer_state"] is None:
            return None
        folder = folder or tempfile.mkdtemp(prefix="ferry-hf-resume-")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            f.write(self.progress["trainer_state"])
        torch.save(trainer.model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
        if self.rng.saved is None:
            raise bug("the trainer's RNG streams were not captured")
        torch.save(self.rng.saved, os.path.join(folder, "rng_state.pth"))
        return folder

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is None:
            raise bug("no ferry session in this process")
        objects = {"hf_model": kwargs["model"], "hf_progress": self.progress, "hf_rng": self.rng}
        if kwargs.get("optimizer") is not None:
            objects["hf_optimizer"] = kwargs["optimizer"]
        if kwargs.get("lr_scheduler") is not None:
            objects["hf_scheduler"] = kwargs["lr_scheduler"]
        self.session.track(**objects)
        self.session.restore()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.progress["trainer_state"] = json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True)
        if self.session is None:
            raise bug("no ferry session in this process")
        self.session.step()  # a safe point: checkpoints when one is due, exits 85 after a stop
