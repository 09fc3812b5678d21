"""The part of a snapshot copied after the safe point (``overlap_snapshot``).

At the safe point the snapshot copies what training may change at any time (buffers,
gradients, RNG states, the loop's own values) and leaves the tensors that only an
optimizer's ``step()`` changes (the parameters it updates and its state) to copies that run
meanwhile: on ferry's copy threads for host memory, on a side CUDA stream for a GPU's. The
training thread goes on with the next forward and backward; the next ``optimizer.step()``
waits until those copies are done (``Deferred.wait``, from an optimizer step pre-hook).

The contract is checked rather than trusted: each deferred tensor's version counter (which
every in-place torch op bumps) is noted at the safe point and compared once its copy is
done, and a few of its words, drawn at random, are read at the safe point, in the copy
and after it (``ferry.engine.probe``: writes through ``.data`` or a NumPy view bump no
counter). A tensor changed meanwhile fails the checkpoint (``OverlapBroken``), never a
checkpoint of mixed steps or a torn tensor committed.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ferry.engine.probe import Probe
from ferry.errors import UnsupportedStateError


class OverlapBroken(UnsupportedStateError):
    """A deferred tensor changed before its copy was done: the snapshot is not one step's."""

    def __init__(self, message: str, changed: str) -> None:
        super().__init__(message)
        self.changed = changed
        """The name of a tensor that changed."""


@dataclass
class Deferred:
    """The copies a snapshot left running, and what it noted of each tensor at the safe
    point (``probe``). ``wait`` is called from the training thread (before an optimizer
    step) and from the writing thread (before the bytes are written); whichever comes first
    waits for the copies and checks them, once."""

    host_copies: list[Future[None]] = field(default_factory=list)
    cuda_done: list[torch.cuda.Event] = field(default_factory=list)
    probe: Probe = field(default_factory=Probe)
    waited: float = 0.0
    """Seconds the training thread waited here: part of what the save blocked training."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _error: Exception | None = None
    _done: bool = False

    def wait(self, *, training: bool = False) -> Exception | None:
        """Until the copies are done and checked; what makes the bytes no snapshot, if
        anything: ``OverlapBroken``, or a copy's own failure. ``training``: the caller is
        the training thread, whose wait counts as blocked."""
        if self._done:
            return self._error
        start = time.perf_counter()
        with self._lock:
            if not self._done:
                try:
                    for fut in self.host_copies:
                        fut.result()
                    for event in self.cuda_done:
                        event.synchronize()
                except Exception as exc:  # any: the save fails with it, on the writing thread
                    self._error = exc
                else:
                    self.probe.again_host()
                    self._error = _broken(self.probe.changed())
                self._done = True
        if training:
            self.waited += time.perf_counter() - start
        return self._error

    def check(self) -> None:
        """On the writing thread, before the bytes are written: ``wait``, and raise what
        makes them no snapshot."""
        failed = self.wait()
        if failed is not None:
            raise failed


def _broken(changed: tuple[object, str] | None) -> OverlapBroken | None:
    if changed is None:
        return None
    name, how = str(changed[0]), changed[1]
    if how == "in place":
        what = f"{name} changed in place"
    else:  # its version counter did not move: .data, a NumPy view, DLPack
        what = f"{name} was written without torch counting it (through .data or a NumPy view)"
    return OverlapBroken(
        f"{what} between the safe point and the optimizer's next step, while overlap_snapshot "
        "copies it: the checkpoint could mix two steps and was not committed",
        name,
    )
