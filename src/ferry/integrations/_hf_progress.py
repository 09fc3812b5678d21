"""The Hugging Face Trainer's own progress, as ferry saves and restores it (both modes).

The safe point is the ``on_step_begin`` of the next optimizer step: the last step's logging,
evaluation and saving are done, and the batches of the next step have been fetched (the
Trainer fetches a whole gradient-accumulation group at once, and accelerate's
``DataLoaderShard`` one batch more). What comes back on resume, and where:

- ``TrainerState`` (global step, epoch, ``log_history``, best metric and checkpoint, flos):
  written as the ``trainer_state.json`` of the folder handed to ``train(resume_from_checkpoint=
  ...)``, so that the Trainer's own resume skips the trained epochs and, with accelerate's
  ``skip_first_batches``, the trained batches at the sampler (nothing of them is loaded);
- the stateful callbacks (``EarlyStoppingCallback``'s patience counter), whatever
  ``restore_callback_states_from_checkpoint`` says, put back in place at ``on_train_begin``;
- the running loss and its bookkeeping (``_tr_loss``, ``_total_loss_scalar``,
  ``_globalstep_last_logged``, ``_initial_global_step``, ``current_flos``), also at
  ``on_train_begin``, after the Trainer reset them, so that the next logged loss and the
  final ``train_loss`` are the uninterrupted run's;
- the global random streams, set at the point of the resumed run that matches the
  checkpoint's: at ``on_epoch_begin`` for a checkpoint at an epoch's first step (the epoch's
  batches are fetched from there), else at ``on_step_begin``, after the fetches; the batches
  fetched ahead of the checkpoint are drawn again from the streams they were drawn with
  (``_hf_fetches``), so a collator or dataset that draws random numbers gives the same
  batches.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import torch

from ferry.errors import CorruptCheckpointError, bug
from ferry.integrations._hf_fetches import SAMPLER, FetchLog
from ferry.state.rng import GlobalRNG

log = logging.getLogger("ferry")

STATE_NAME = "hf_progress"
"""The name the Trainer's progress is tracked under, in zero-code and explicit mode."""

_COUNTERS: dict[str, type] = {
    "_total_loss_scalar": float,
    "_globalstep_last_logged": int,
    "_initial_global_step": int,
    "_initial_num_input_tokens_seen": int,
    "current_flos": float,
}
"""The Trainer's running-loss bookkeeping (transformers 5.x), beside ``_tr_loss`` (a tensor)."""


class TrainerProgress:
    """Stateful: the Trainer's progress at the safe point (see the module docstring).

    ``bind`` the Trainer before the first save; ``epoch_begins`` and ``step_begins`` from
    the callback's events, which also put the resumed state back where it belongs."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.fetches = FetchLog()
        self.epoch_rng: dict[str, Any] | None = None
        """The global random streams as the current epoch began (its batches drawn from there)."""
        self.first_of_epoch = False
        self.saved: dict[str, Any] | None = None
        """The checkpoint's progress, from ``load_state_dict`` until it is all put back."""
        self._rng_at_step: dict[str, Any] | None = None

    def bind(self, trainer: Any) -> None:
        self.trainer = trainer

    # ------------------------------------------------------------------ save
    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            raise bug("the Trainer's progress is saved before the Trainer was bound")
        counters: dict[str, Any] = {n: getattr(trainer, n) for n in _COUNTERS if hasattr(trainer, n)}
        if isinstance(getattr(trainer, "_tr_loss", None), torch.Tensor):
            counters["_tr_loss"] = trainer._tr_loss.detach().to("cpu", copy=True)
        first = self.first_of_epoch and self.epoch_rng is not None
        return {
            "trainer_state": json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n",
            "callbacks": _callback_states(trainer),
            "counters": counters,
            "epoch_rng": self.epoch_rng if first else None,
            "rng": GlobalRNG().state_dict(),
            "fetches": {} if first else {_key(i): rng for i, rng in self.fetches.pending().items()},
        }

    # ------------------------------------------------------------------ resume
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = _parse(state)

    @property
    def resuming(self) -> bool:
        return self.saved is not None

    def write_folder(self, folder: str, model: Any) -> None:
        """The folder the Trainer's own resume reads: ``trainer_state.json`` and the weights
        it insists on loading (the model's own, restored already: loading them changes nothing)."""
        saved = self._saved()
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            f.write(saved["trainer_state"])
        torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))

    def train_begins(self, trainer: Any) -> None:
        """``on_train_begin`` of a resumed run: after the Trainer reset its running loss."""
        saved = self._saved()
        for name, value in saved["counters"].items():
            if name == "_tr_loss":
                trainer._tr_loss = value.to(trainer._tr_loss.device)
            elif hasattr(trainer, name):
                setattr(trainer, name, _COUNTERS[name](value))
        missing = sorted(n for n in ("_tr_loss", *_COUNTERS) if not hasattr(trainer, n))
        if missing:
            log.warning(
                "ferry: warning: this Trainer has no %s (transformers before 5.0?): the logged loss "
                "after a resume and the final train_loss count only the resumed run's steps",
                ", ".join(missing),
            )
        _restore_callbacks(trainer, saved["callbacks"])
        self.fetches.replay_next_epoch(saved["fetches"])

    def epoch_begins(self) -> None:
        self.first_of_epoch = True
        if self.saved is not None and self.saved["epoch_rng"] is not None:  # resumed at this epoch's start
            GlobalRNG().load_state_dict(self.saved["epoch_rng"])
        self.epoch_rng = GlobalRNG().state_dict()

    def step_begins(self) -> None:
        """After the safe point of this ``on_step_begin``."""
        self.first_of_epoch = False
        if self.saved is not None:  # the resumed run is where the checkpoint was taken
            if self.saved["rng"] is not None:  # None: saved by ferry's first HF callback
                GlobalRNG().load_state_dict(self.saved["rng"])
            self.saved = None

    def _saved(self) -> dict[str, Any]:
        if self.saved is None:
            raise bug("the Trainer's progress is put back without a checkpoint")
        return self.saved


def _key(index: int) -> str:
    return "sampler" if index == SAMPLER else str(index)


def _callback_states(trainer: Any) -> dict[str, list[dict[str, Any]]]:
    """Each stateful callback's ``state()`` (``ExportableState``), by class name, in order."""
    states: dict[str, list[dict[str, Any]]] = {}
    for callback in trainer.callback_handler.callbacks:
        if callable(getattr(callback, "state", None)) and hasattr(type(callback), "from_state"):
            states.setdefault(type(callback).__name__, []).append(callback.state())
    return states


def _restore_callbacks(trainer: Any, saved: dict[str, list[dict[str, Any]]]) -> None:
    """Put each stateful callback's attributes back, in place (the Trainer's own resume would
    replace the objects, and only with ``restore_callback_states_from_checkpoint``)."""
    live: dict[str, list[Any]] = {}
    for callback in trainer.callback_handler.callbacks:
        live.setdefault(type(callback).__name__, []).append(callback)
    for name, states in saved.items():
        for callback, state in zip(live.get(name, []), states, strict=False):
            for attribute, value in (state.get("attributes") or {}).items():
                setattr(callback, attribute, value)
        if len(live.get(name, [])) != len(states):
            log.warning(
                "ferry: warning: the checkpoint has the state of %d %s callback(s), this Trainer has %d: "
                "those without a saved state start fresh",
                len(states),
                name,
                len(live.get(name, [])),
            )


def _parse(state: Any) -> dict[str, Any]:
    """The saved progress, checked at the edge (a checkpoint may come from anywhere)."""

    def corrupt(what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"the checkpoint's {STATE_NAME}.{what} is not what a ferry Trainer integration saves; "
            "resume from another checkpoint or start fresh in another --dir"
        )

    if not isinstance(state, dict) or not isinstance(state.get("trainer_state"), str):
        raise corrupt("trainer_state")
    try:
        trainer_state = json.loads(state["trainer_state"])
    except ValueError:
        raise corrupt("trainer_state") from None
    if not isinstance(trainer_state, dict) or not isinstance(trainer_state.get("global_step"), int):
        raise corrupt("trainer_state")
    counters = state.get("counters", {})  # not in checkpoints of ferry's first HF callback
    if not isinstance(counters, dict) or not all(
        isinstance(v, torch.Tensor) if k == "_tr_loss" else k in _COUNTERS and isinstance(v, (int, float))
        for k, v in counters.items()
    ):
        raise corrupt("counters")
    callbacks = state.get("callbacks", {})
    if not isinstance(callbacks, dict) or not all(
        isinstance(v, list) and all(isinstance(s, dict) for s in v) for v in callbacks.values()
    ):
        raise corrupt("callbacks")
    fetches = state.get("fetches", {})
    if not isinstance(fetches, dict) or not all(
        isinstance(k, str) and (k.isdigit() or k == "sampler") and isinstance(v, dict)
        for k, v in fetches.items()
    ):
        raise corrupt("fetches")
    for key in ("rng", "epoch_rng"):
        if state.get(key) is not None and not isinstance(state[key], dict):
            raise corrupt(key)
    return {
        "trainer_state": state["trainer_state"],
        "counters": counters,
        "callbacks": callbacks,
        "fetches": {SAMPLER if k == "sampler" else int(k): v for k, v in fetches.items()},
        "rng": state.get("rng"),
        "epoch_rng": state.get("epoch_rng"),
    }
