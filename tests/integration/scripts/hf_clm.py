"""A `run_clm.py`-style Hugging Face Trainer job that never imports ferry (unless --explicit):
its TrainingArguments come from the command line (HfArgumentParser), a 2-layer GPT-2 built
from a config, synthetic token blocks, evaluation, checkpoints, best model and early
stopping, all from the Trainer itself. Output goes to the working folder.

--explicit: ferry's explicit callback (``FerryCallback`` + ``resume_from``) instead of
zero-code mode. --mask-prob P: a collator that hides a random share of the labels, drawing
from the global torch RNG in the main process (as an MLM collator does).

For the tests only, ``HF_STOP_AT`` lists where the job sends itself SIGTERM, as
``kind:N`` items: ``step:N`` after optimizer step N, ``epoch:N`` at the end of epoch N
(counted from 1), ``eval:N`` inside the evaluation after step N; ``HF_STOP_RANK`` limits
that to one rank (all by default). ``HF_STEP_SLEEP`` makes each step last that many seconds
more (under torchrun: ranks agree on a stop at least every 0.5 s, so with steps longer than
that a stop lands on the step it was sent at)."""

from __future__ import annotations

import inspect
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    EarlyStoppingCallback,
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint


@dataclass
class ScriptArguments:
    train_blocks: int = 40
    eval_blocks: int = 8
    block_size: int = 16
    mask_prob: float = 0.0
    explicit: bool = False
    patience: int = 0


class Blocks(Dataset[dict[str, torch.Tensor]]):
    """Token blocks of a synthetic corpus (what run_clm's group_texts makes)."""

    def __init__(self, count: int, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 128, (count, size), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class RandomMask:
    """Labels hidden at random, drawn from the global RNG while the batch is collated."""

    def __init__(self, prob: float) -> None:
        self.prob = prob

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = default_data_collator(features)
        hidden = torch.rand(batch["labels"].shape) < self.prob
        batch["labels"] = batch["labels"].masked_fill(hidden, -100)
        return batch


class StopAt(TrainerCallback):  # type: ignore[misc]
    """The test's SIGTERMs (see the module docstring)."""

    def __init__(self, spec: str, rank: str, sleep: str) -> None:
        self.at = {tuple(item.split(":")) for item in spec.split(",") if item}
        self.sleep = float(sleep or 0)
        self.mine = not rank or rank == os.environ.get("RANK", "0")
        self.sent: set[tuple[str, str]] = set()

    def _maybe(self, kind: str, n: int) -> None:
        key = (kind, str(n))
        if self.mine and key in self.at and key not in self.sent:
            self.sent.add(key)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.sleep)
        self._maybe("step", state.global_step)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._maybe("epoch", round(state.epoch))

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step:  # an evaluation during training
            self._maybe("eval", state.global_step)


def main() -> None:
    script, training = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    set_seed(training.seed)
    sizes = {"vocab_size": 128, "n_positions": script.block_size, "n_embd": 32, "n_layer": 2, "n_head": 2}
    config = GPT2Config(**sizes, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)  # dropout 0.1: the resume must put the RNG back at the right point
    env = os.environ.get
    callbacks: list[Any] = [StopAt(env("HF_STOP_AT", ""), env("HF_STOP_RANK", ""), env("HF_STEP_SLEEP", ""))]
    if script.patience:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=script.patience))
    ferry_callback = None
    if script.explicit:
        from ferry.integrations.transformers import FerryCallback

        ferry_callback = FerryCallback()
        callbacks.insert(0, ferry_callback)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Blocks(script.train_blocks, script.block_size, seed=1),
        eval_dataset=Blocks(script.eval_blocks, script.block_size, seed=2),
        data_collator=RandomMask(script.mask_prob) if script.mask_prob else default_data_collator,
        callbacks=callbacks,
    )
    if ferry_callback is not None:
        resume = ferry_callback.resume_from(trainer)
    else:  # as run_clm.py does: the Trainer's own resume from its newest checkpoint folder
        found = os.path.isdir(training.output_dir) and get_last_checkpoint(training.output_dir)
        resume = training.resume_from_checkpoint or found or None
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()
    trainer.save_state()
    if trainer.is_world_process_zero():
        print(f"global_step={result.global_step} train_loss={result.training_loss!r}")
        torch.save(trainer.optimizer.state_dict(), os.path.join(training.output_dir, "optimizer-final.pt"))
        with open(os.path.join(training.output_dir, "introspection.txt"), "w") as f:  # what hooks must keep
            for method in (Trainer.__init__, Trainer.train):
                f.write(f"{method.__module__} {method.__qualname__} {inspect.signature(method)}\n")


if __name__ == "__main__":
    main()
