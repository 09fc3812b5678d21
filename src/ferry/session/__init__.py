"""The in-process session: tracked state, safe points, signals, control requests, save and
restore. One per process; ``ferry.track`` makes it on first use.

A *safe point* lies between two training iterations: when the driving DataLoader is asked
for its next batch, or at ``ferry.step()``. Signals and control requests only set flags;
checkpoints are taken at safe points only.

    policy        what to do at a safe point (pure, tested from a table)
    checkpointer  how this process writes: alone (in the background) or as one rank of several
    resume        finding the checkpoint to resume and putting it back
    reporting     log lines, job status and events, answers to requests
    warm          a warm worker's wait at its restore point (a warm migration)
    core          the Session, which holds the state and calls the above
    api           the module-level functions over the process's session
"""

from __future__ import annotations

from ferry.session.api import adopt, checkpoint, close, configure, current, restore, step, track
from ferry.session.core import Session

__all__ = ["Session", "adopt", "checkpoint", "close", "configure", "current", "restore", "step", "track"]
