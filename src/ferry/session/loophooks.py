"""Where the training loop meets the session: the hooks a tracked loader calls (a batch
taken, the restore point, an epoch to continue in place or to fast-forward), zero-code
mode's safe points without a loader (an optimizer step, a model's forward), and which
loader drives training. ``Session`` (``core``) holds one, as ``loop_hooks``, and is its
``Driving``; the safe points themselves are ``SafePoints``'s (``safepoints``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from ferry.session import resume
from ferry.state.loader import Hooks, LoaderTracker

log = logging.getLogger("ferry")


class LoopState(Protocol):
    """Zero-code mode's handle on the training loop's frames (``autotrack/keeper.py``)."""

    def capture(self, objects: dict[str, Any], loader: Any = None) -> dict[str, Any]: ...
    def prepare(self, saved: dict[str, Any], loader: Any) -> None: ...
    def examine(self, objects: dict[str, Any], loader: Any = None) -> None: ...
    def matches(self, saved: dict[str, Any]) -> bool: ...
    def restore(self, saved: dict[str, Any]) -> dict[int, Any]: ...


class LoopExtras(Protocol):
    """What zero-code mode keeps beside the loop's frames (``autotrack/extras.py``): the
    files the script writes, the loops that run in a library's code."""

    def examine(self) -> None: ...
    def capture(self) -> dict[str, Any]: ...
    def restore(self, saved: dict[str, Any]) -> list[str]: ...


class Driving(Protocol):
    """The training state the loop hooks read and move (``Session`` has it)."""

    loaders: dict[str, LoaderTracker]
    driver: LoaderTracker | None
    """The loader whose batches are the training steps."""
    driver_pinned: bool
    """The driver is known (named ``loader``, fed an optimizer step, a framework's): kept."""
    last_batch_from: LoaderTracker | None
    framework: str | None
    """A framework's support drives training (``integrations/framework.py``): its loop makes
    the safe points and counts the steps; the driving loader's batch requests are neither."""
    global_step: int
    loop: LoopState | None
    found: resume.Resume | None
    """The checkpoint being resumed, if any."""


class SafePointsPort(Protocol):
    """What the loop hooks ask of the safe points (``safepoints.SafePoints``)."""

    def safe_point(self) -> None:
        """Save or stop here if asked."""

    def between_safe_points(self) -> float:
        """Control requests and the status heartbeat, no save."""


class LoopHooks(Hooks):
    """The session's side of the training loop: what a tracked loader, an optimizer step or
    a framework's support tells the session."""

    def __init__(self, state: Driving, points: SafePointsPort, restore_all: Callable[[], None]) -> None:
        self.state, self.points, self._restore_all = state, points, restore_all

    def fast_forwarding(self, tracker: LoaderTracker) -> bool:
        return self.restore_pending

    def resume_in_place(self, tracker: LoaderTracker) -> bool:
        """Zero-code mode: the driving loader's first iter() of the resumed process continues
        the saved epoch at once, when the loop's frames (its epoch counter and position
        included) will be put back at the restore point; no epoch is fast-forwarded."""
        found = self.state.found
        if found is None or not found.pending or tracker is not self.state.driver or self.state.loop is None:
            return False
        if found.state.driver != tracker.name or (tracker.identity is not None and tracker.identity.ordinal):
            return False  # not the first loader of that line: one built per epoch (fast-forwarded)
        saved = found.state.frames
        if saved is None or saved.get("by") != "loader" or not self.state.loop.matches(saved):
            return False
        found.in_place = True
        self.state.loop.prepare(saved, tracker.loader_ref())
        return True

    def restore_at(self, by: str) -> bool:
        """Zero-code mode without a loader: restore now if the checkpoint's safe points were
        made by ``by`` (this is then the restore point); True if it restored."""
        found = self.state.found
        if found is None or found.done or (found.state.frames or {}).get("by") != by:
            return False
        self._restore_all()
        return True

    def saved_loop(self) -> dict[str, Any] | None:
        """The loop state of the checkpoint still to be restored, if any."""
        found = self.state.found
        return None if found is None or found.done else found.state.frames

    def step_safe_point(self) -> None:
        """Zero-code mode without a loader: an optimizer step or a model forward ended a step."""
        self.state.global_step += 1
        self.points.safe_point()

    def at_restore_point(self, tracker: LoaderTracker) -> None:
        if self.restore_pending:
            self._restore_all()

    @property
    def restore_pending(self) -> bool:
        """A checkpoint waits for the training loader's first batch to be restored."""
        return restore_pending(self.state)

    def before_batch(self, tracker: LoaderTracker) -> None:
        if tracker is not self.state.driver or self.state.framework is not None:
            return
        if not tracker.feeding.safe(tracker.batches):  # an evaluation pass, or what a wrapper holds unknown
            self.points.between_safe_points()
            return
        # Batches a wrapper holds ahead are not trained yet: the checkpoint's step and
        # position leave them out, and the resumed run fetches them again.
        tracker.held = tracker.feeding.held(tracker.batches)
        self.state.global_step -= tracker.held
        try:
            self.points.safe_point()
        finally:
            self.state.global_step += tracker.held
            tracker.held = 0

    def after_batch(self, tracker: LoaderTracker) -> None:
        self.state.last_batch_from = tracker
        if tracker is self.state.driver and self.state.framework is None:
            self.state.global_step += 1

    def pass_ended(self, tracker: LoaderTracker) -> None:
        """A pass over a loader ended: one over the training loader that trained nothing (an
        evaluation on the training data) made no steps."""
        if (
            tracker is self.state.driver
            and self.state.framework is None
            and tracker.feeding.trained_nothing()
        ):
            self.state.global_step -= tracker.batches

    def framework_drives(self, framework: str, name: str | None = None) -> None:
        """``framework``'s support drives training: from now on its loop makes the safe points
        and counts the steps, and zero-code mode tracks no other loader. ``name``: the tracked
        loader it trains on; it puts its own progress back before its loop runs, so on resume
        that loader continues the saved epoch at its next iter()."""
        self.state.framework = framework
        if name is None:
            return
        tracker = self.state.loaders[name]
        self.state.driver, self.state.driver_pinned = tracker, True
        if tracker.resume_at is not None:
            tracker.relative = True

    def note_optimizer_step(self) -> None:
        """The loader that fed the last batch before an optimizer step is the training loader."""
        feeding = self.state.last_batch_from
        if feeding is not None and feeding is not self.state.driver and not self.state.driver_pinned:
            log.info("ferry: %s feeds training; its batches are the safe points", feeding.name)
            self.state.driver = feeding
            self.state.driver_pinned = True
        if self.state.driver is not None:
            self.state.driver.feeding.step(self.state.driver.batches)


def restore_pending(state: Driving) -> bool:
    """A checkpoint waits for the training loader's first batch to be restored."""
    return state.found is not None and state.found.pending
