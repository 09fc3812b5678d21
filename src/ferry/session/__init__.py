"""The in-process session: tracked state, safe points, signals, control requests, save and
restore. One per process; ``ferry.track`` makes it on first use.

A *safe point* lies between two training iterations: when the driving DataLoader is asked
for its next batch, or at ``ferry.step()``. Signals and control requests only set flags;
checkpoints are taken at safe points only.

    policy        what to do at a safe point, and a stop's exit code (pure, tested from tables)
    safepoints    what each safe point does around that decision
    saving        a save (in the background or waited for) and a stop
    checkpointer  how this process writes: alone (in the background) or as one rank of several
    resume        finding the checkpoint to resume and putting it back
    loophooks     what the training loop (a loader, an optimizer step, a framework) tells it
    reporting     log lines, job status and events, answers to requests (savereport: a save's)
    warm          a warm worker's wait at its restore point (a warm migration)
    startup       opening a session's parts, in order (``Session.start``)
    core          the Session, which holds the tracked state and its parts
    api           the module-level functions over the process's session
"""

from __future__ import annotations

from ferry.session.api import adopt, checkpoint, close, configure, current, restore, step, track
from ferry.session.core import Session

__all__ = ["Session", "adopt", "checkpoint", "close", "configure", "current", "restore", "step", "track"]
