"""Hugging Face Trainer training made preemptible by ferry's callback. A tiny BERT built
from its config (no downloads) on synthetic tokens.

    FERRY_DIR=ckpts/hf python examples/hf_trainer_train.py
    # kill -TERM <pid> mid-epoch: ferry checkpoints as the next optimizer step begins (the
    # last one logged, evaluated and saved) and exits 85; run the same command again: the
    # Trainer skips the trained batches (at the sampler) and continues with the same
    # weights, optimizer, scheduler, running loss, log history and random state.

Without the callback, `ferry run -- python examples/hf_trainer_train.py` does the same
(zero-code mode adds it to the Trainer).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from ferry.integrations.transformers import FerryCallback


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 2048) -> None:
        self.ids = torch.randint(0, 256, (n, 32), generator=torch.Generator().manual_seed(1))
        self.labels = (self.ids.sum(1) % 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir="hf-out", per_device_train_batch_size=32, num_train_epochs=5, save_strategy="no",
        report_to=[], use_cpu=True, seed=0,
    )  # fmt: skip
    ferry_cb = FerryCallback()
    trainer = Trainer(
        model=BertForSequenceClassification(config), args=args, train_dataset=Tokens(), callbacks=[ferry_cb]
    )
    trainer.train(resume_from_checkpoint=ferry_cb.resume_from(trainer))


if __name__ == "__main__":
    main()
