"""Gradients that are part of the training state: mid-accumulation ``.grad`` buffers."""

from __future__ import annotations

from typing import Any

from torch import nn


class Gradients:
    """Stateful view of a module's ``.grad`` tensors. After ``zero_grad()`` they are None and
    nothing is saved; between the micro-batches of gradient accumulation they are the
    partial sums, and a resume without them would not be exact."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return {n: p.grad for n, p in self.module.named_parameters() if p.grad is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = dict(self.module.named_parameters())
        for name, p in params.items():
            saved = state.get(name)
            if saved is None:
                p.grad = None
            else:
                p.grad = saved.to(device=p.device, dtype=p.dtype, copy=True)
