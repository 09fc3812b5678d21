"""Random generators of the script's own, as Stateful objects, so `ferry.track` takes them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ferry.state.rng import own


class GeneratorState:
    """``random.Random``, ``numpy.random.Generator`` or ``torch.Generator``, saved and restored
    in place (the script keeps its own object)."""

    def __init__(self, rng: random.Random | np.random.Generator | torch.Generator) -> None:
        self.rng = rng

    @staticmethod
    def accepts(obj: Any) -> bool:
        return isinstance(obj, (random.Random, np.random.Generator, torch.Generator))

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.rng, random.Random):
            return {"state": self.rng.getstate()}
        if isinstance(self.rng, np.random.Generator):
            return {"state": self.rng.bit_generator.state}
        return {"state": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(self.rng, random.Random):
            self.rng.setstate(state["state"])
        elif isinstance(self.rng, np.random.Generator):
            self.rng.bit_generator.state = state["state"]
        else:
            self.rng.set_state(own(state["state"]))
