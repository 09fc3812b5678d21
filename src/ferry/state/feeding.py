"""How the training loader's batches feed optimizer steps, learned from when steps happen
(zero-code mode). Pure: fed the number of batches handed out so far in the epoch.

Between the loader and the model there may be code that holds batches ahead (a prefetching
wrapper: timm's ``PrefetchLoader``, a generator that keeps the next batch while the current
one trains), and a pass over the training loader may train nothing (an evaluation on the
training data). So a batch handed out is not a batch trained, and a request for a batch is
a safe point only inside a pass that trains, once ferry knows how many batches are held:

- ``ahead`` (P): batches a wrapper holds when an optimizer step happens; ``per_step`` (A):
  batches per optimizer step (gradient accumulation). At the epoch's first two steps the
  loader has handed out ``A + P`` and ``2A + P`` batches: both follow. One batch handed out
  at the first step means ``A = 1, P = 0`` at once.
- ``fed``: batches that went into training (stepped, or accumulated in the gradients): at a
  step, all but the ``P`` held; between steps the held ones are at most ``P``.
- Several optimizers stepping for one batch (a GAN) count as one step.

Before the process's first optimizer step nothing is known and every request is taken as
safe, with nothing held (a loop without a torch optimizer keeps its safe points).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Feeding:
    ahead: int | None = None
    """Batches held ahead of training (learned; carried across epochs and checkpoints)."""
    per_step: int | None = None
    """Batches per optimizer step (learned)."""
    seen_steps: bool = False
    """An optimizer step has happened in this process: the rules apply."""
    steps: int = 0
    """Optimizer steps in this pass (after a resume: since the resume)."""
    fed: int = 0
    """Batches of this pass that went into training."""
    training: bool = False
    """This pass trains (a step happened in it, or it was resumed from a training pass)."""
    site: tuple[str, int] | None = None
    """Where this pass's first batch was asked for (the code and line)."""
    _training_sites: frozenset[tuple[str, int]] = frozenset()
    _start: int = 0
    _first: int | None = None
    _last_at: int = -1
    _learning: bool = True

    def new_pass(self) -> None:
        """The loader's iterator starts a new pass over the data."""
        self.steps, self.fed, self.training, self._start, self.site = 0, 0, False, 0, None
        self._first, self._last_at, self._learning = None, -1, True

    def resumed(self, at: int, saved: Any, kept: int = 0) -> None:
        """A pass resumed at batch ``at``, in training; ``saved``: ``state()`` of the saver;
        ``kept``: of the ``at`` batches, those the wrapper holds again (its frame restored),
        not trained yet."""
        self.new_pass()
        self.fed, self.training, self._start = at - kept, True, at - kept
        if isinstance(saved, dict):
            self.ahead = _count(saved.get("ahead"), least=0)
            self.per_step = _count(saved.get("per_step"), least=1)
        self._learning = self.ahead is None  # else: steps here follow a part-accumulated one

    def step(self, handed: int) -> None:
        """An optimizer step, after ``handed`` batches of the pass were handed out."""
        if handed == self._last_at:
            return  # another optimizer stepping on the same batch
        self._last_at = handed
        self.seen_steps = self.training = True
        if self.site is not None and self.site not in self._training_sites:
            self._training_sites = self._training_sites | {self.site}
        self.steps += 1
        taken = handed - self._start
        if self._learning and self.steps == 1:
            self._first = taken
            if taken == 1:
                self.per_step, self.ahead = 1, 0
        elif self._learning and self.steps == 2 and self._first is not None:
            per_step = taken - self._first
            if per_step > 0:
                self.per_step = per_step
                self.ahead = min(max(self._first - per_step, 0), self._first - 1)
            self._learning = False
        if self.ahead is not None:
            self.fed = max(self.fed, handed - self.ahead)

    def held(self, handed: int) -> int:
        """Batches handed out but not yet trained, at a request for the next one."""
        if not self.seen_steps or self.ahead is None:
            return 0
        return max(0, min(self.ahead, handed - self.fed))

    def safe(self, handed: int) -> bool:
        """Is a request for a batch now a point to checkpoint at? The first request of a pass
        is, when it comes from where training passes ask (nothing of the pass is taken yet:
        the checkpoint is the previous pass's end); later ones once the pass has trained."""
        if not self.seen_steps:
            return True
        if handed == 0 and self.site in self._training_sites:
            return True
        return self.training and self.ahead is not None

    def trained_nothing(self) -> bool:
        """Did this pass train nothing (an evaluation over the training loader)?"""
        return self.seen_steps and not self.training

    def state(self) -> dict[str, int | None]:
        return {"ahead": self.ahead, "per_step": self.per_step}

    def inherit(self, other: Feeding) -> None:
        """What ``other`` (the loader this one succeeds, built anew each epoch) learned."""
        self.ahead, self.per_step, self.seen_steps = other.ahead, other.per_step, other.seen_steps
        self._training_sites = other._training_sites


def _count(value: Any, *, least: int) -> int | None:
    """``value`` if it is a plausible count (it comes from a checkpoint), else None."""
    return value if type(value) is int and least <= value < 1 << 20 else None
