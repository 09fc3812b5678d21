"""Hugging Face Trainer training with ferry's callback; --signal-at N sends SIGTERM after step N."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from ferry.integrations.transformers import FerryCallback


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 64, (96, 12), generator=g)
        self.labels = (self.ids.sum(1) % 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class SignalAt(TrainerCallback):  # type: ignore[misc]
    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--signal-at", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    model = BertForSequenceClassification(config)  # dropout 0.1: the resume must restore the RNG
    training = TrainingArguments(
        output_dir=str(args.out / "hf"),
        per_device_train_batch_size=8,  # 12 steps an epoch
        num_train_epochs=3,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        save_strategy="no",
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        data_seed=0,
    )
    ferry_cb = FerryCallback()
    callbacks = [SignalAt(args.signal_at), ferry_cb] if args.signal_at else [ferry_cb]
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=ferry_cb.resume_from(trainer))
    args.out.mkdir(parents=True, exist_ok=True)
    state = [*model.state_dict().values()]
    for group in trainer.optimizer.state.values():
        state += [v for v in group.values() if isinstance(v, torch.Tensor)]
    lines = [t.detach().numpy().tobytes().hex() for t in state]
    lines.append(f"global_step={trainer.state.global_step}")
    (args.out / "params.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
