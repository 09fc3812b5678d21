"""Every global RNG stream as one Stateful: Python, NumPy, torch CPU, and each CUDA device."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

log = logging.getLogger("ferry")


def own(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy with its own storage: torch's RNG setters misread views with an offset."""
    return t.detach().to("cpu", copy=True).contiguous()


class GlobalRNG:
    """``state_dict`` captures, ``load_state_dict`` restores, all global random streams."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(own(state["torch"]))
        cuda = state.get("cuda") or []
        if cuda and not torch.cuda.is_available():
            log.warning(
                "ferry: the checkpoint has CUDA RNG state but no GPU is visible; "
                "CPU streams restored, CUDA streams skipped"
            )
            return
        count = torch.cuda.device_count() if cuda else 0
        for i, s in enumerate(cuda[:count]):
            torch.cuda.set_rng_state(own(s), i)
        if len(cuda) > count:
            log.warning(
                "ferry: the checkpoint has RNG state for %d GPUs, %d visible; "
                "the extra streams are not restored",
                len(cuda),
                count,
            )


def generator_state(gen: torch.Generator | None) -> torch.Tensor | None:
    return None if gen is None else gen.get_state()


def set_generator_state(gen: torch.Generator | None, state: torch.Tensor | None) -> None:
    if gen is not None and state is not None:
        gen.set_state(own(state))
