"""An unmodified GPT-2-style script (it never imports ferry) whose data loader is its own
class, without torch.utils.data: ``DataLoaderLite`` keeps ``current_shard``,
``current_position`` and ``tokens``, the current shard's NumPy array (20 MiB by default:
over the 16 MiB a plain value may have, so it is kept because training changed it). The
loop is a function with a closure over its arguments (``args`` is a cell), and ``main()``
collects a ``results`` list of dicts that the loop appends to. Stops are SIGTERMs the script
sends itself after the steps in ``ZC_STOP_AT``."""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

STOP_AT = {int(s) for s in os.environ.get("ZC_STOP_AT", "").split(",") if s}
VOCAB = 50


def load_tokens(shard: int, size: int) -> np.ndarray:
    return np.random.default_rng(1000 + shard).integers(0, VOCAB, size=size, dtype=np.int32)


class DataLoaderLite:
    def __init__(self, B: int, T: int, shards: int, shard_size: int, batches_per_shard: int) -> None:
        self.B, self.T = B, T
        self.shards = shards
        self.shard_size = shard_size
        self.limit = batches_per_shard * B * T
        self.reset()

    def reset(self) -> None:
        self.current_shard = 0
        self.tokens = load_tokens(self.current_shard, self.shard_size)
        self.current_position = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.B, self.T
        buf = torch.from_numpy(
            self.tokens[self.current_position : self.current_position + B * T + 1].astype(np.int64)
        )
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.current_position += B * T
        if self.current_position + B * T + 1 > min(len(self.tokens), self.limit):
            self.current_shard = (self.current_shard + 1) % self.shards
            self.tokens = load_tokens(self.current_shard, self.shard_size)
            self.current_position = 0
        return x, y


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x)))


def train(model: nn.Module, loader: DataLoaderLite, args: argparse.Namespace, results: list[Any]) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def lr_at(step: int) -> float:  # reads an argument: `args` is a cell of this frame
        return args.lr * (1 - step / args.steps)

    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = loader.next_batch()
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(
            f"step {step}: shard {loader.current_shard} at {loader.current_position} loss {loss.item():.8f}"
        )
        results.append({"step": step, "loss": loss.item()})
        if step in STOP_AT:  # the tests' stand-in for a scheduler's SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--shard-size", type=int, default=5 << 20)
    args = p.parse_args()
    torch.manual_seed(0)
    model = TinyLM()
    loader = DataLoaderLite(B=4, T=8, shards=3, shard_size=args.shard_size, batches_per_shard=3)
    results: list[Any] = []
    train(model, loader, args, results)
    print(f"{len(results)} results, mean loss {sum(r['loss'] for r in results) / len(results):.8f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "params.txt"), "w") as f:
        for name, t in model.state_dict().items():
            f.write(f"{name} {t.numpy().tobytes().hex()}\n")


if __name__ == "__main__":
    main()
