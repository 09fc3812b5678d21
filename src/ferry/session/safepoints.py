"""What each safe point does around the decision: the signals and control requests read,
the status heartbeat, the ranks' agreement, then a save or a stop (``saving``); the first
safe point's looks at the loop and the script's generators; the requests still waiting
when the session closes. What to do is decided in ``policy``, from plain values."""

from __future__ import annotations

import time
from typing import Any, Protocol

from ferry.config import Config
from ferry.errors import FerryError, bug
from ferry.knobs import STATUS_SECONDS
from ferry.runtime.control import ControlInbox, Request
from ferry.runtime.jobdir import JobDir
from ferry.runtime.signals import SignalRequests
from ferry.session import policy
from ferry.session.checkpointer import Checkpointer
from ferry.session.loophooks import Driving, LoopExtras, restore_pending
from ferry.session.reporting import Reporter
from ferry.session.rngwatch import GeneratorScan, GeneratorWatch
from ferry.session.saving import Saves


class Watched(Driving, Protocol):
    """The training state the safe points look at (``Session`` has it)."""

    objects: dict[str, Any]
    extras: LoopExtras | None
    uncaptured: GeneratorScan | None


class SafePoints:
    """The safe points of this process's session (``safe_point``), and what happens between
    them (``between_safe_points``)."""

    def __init__(
        self,
        state: Watched,
        saves: Saves,
        *,
        config: Config,
        signals: SignalRequests,
        checkpointer: Checkpointer,
        report: Reporter,
        inbox: ControlInbox,
        job: JobDir,
        started: float,
        resumed: bool,
    ) -> None:
        self.state, self.saves, self.config, self.signals = state, saves, config, signals
        self.checkpointer, self.report, self.inbox, self.job = checkpointer, report, inbox, job
        self.requests: list[Request] = []
        """Control requests and ``ferry.checkpoint()`` calls not served yet."""
        self.last_blocked = 0.0
        """What the last save cost the training thread, seconds."""
        self._next_poll = 0.0
        self._next_status = started + STATUS_SECONDS
        self._trained = False  # past the first safe point
        self._first_steps: list[float] | None = [] if resumed else None
        """After a resume: when the first safe points were passed (``ferry migrate`` takes the
        first step's warm-up, beyond the second's length, as part of the downtime)."""
        self._generators: GeneratorWatch | None = None

    def safe_point(self) -> None:
        """Between two training iterations: save or stop here if asked or due."""
        entered = time.perf_counter()  # a save here blocked training from now (CheckpointInfo)
        self.signals.at_safe_points = True  # a stop signal now waits for the next one
        for signum, handler in self.signals.reassert():
            self.report.handler_replaced(signum, handler)
        if policy.idle(stopping=self.saves.stopping, restore_pending=restore_pending(self.state)):
            return
        if not self._trained:
            self._first_safe_point()
        if self._first_steps is not None:
            self._time_first_steps()
        now = self.between_safe_points()
        point = self.point(now)
        asked = policy.asked_at(point)
        if not self.checkpointer.may_agree_at(
            self.state.global_step,
            every_steps=self.config.every_steps,
            last_saved_step=self.saves.last_step,
            asked=asked.save or asked.stop,
        ):
            return  # between the ranks' agreements: requests and signals wait for the next
        decision = policy.decide_at_safe_point(point, self.checkpointer.agree(point, asked))
        if decision.action is policy.SafePointAction.NOTHING:
            return
        self.signals.checkpoint_requested = False
        requests, self.requests = self.requests, []
        if decision.action is policy.SafePointAction.STOP:
            self.saves.stop(requests, decision.why, entered)
        else:
            self.check_generators()
            self.saves.save(requests, entered)
            self.last_blocked = time.perf_counter() - entered

    def between_safe_points(self) -> float:
        """What every batch does, safe point or not: control requests are read and the status
        beats (for `ferry list` / `ferry status`); returns the time it looked at."""
        now = time.monotonic()
        if now >= self._next_poll:
            self.requests.extend(self.inbox.poll())
            self._next_poll = now + self.config.control_poll_seconds
        if now >= self._next_status:
            self.job.update_status("running", step=self.state.global_step)
            self.check_generators()
            self._next_status = now + STATUS_SECONDS
        return now

    def point(self, now: float) -> policy.SafePoint:
        return policy.SafePoint(
            now=now,
            step=self.state.global_step,
            last_saved_step=self.saves.last_step,
            last_saved_time=self.saves.last_time,
            every_steps=self.config.every_steps,
            every_seconds=self.config.every_seconds,
            stop_signal=self.signals.stop_signal,
            checkpoint_signal=self.signals.checkpoint_requested,
            requests=tuple(r.action for r in self.requests),
            saving=self.checkpointer.busy(),
            last_blocked=self.last_blocked if self.checkpointer.world_size == 1 else 0.0,
        )

    def _first_safe_point(self) -> None:
        """Training runs: the worker's start-up ends here (``ferry report`` draws it), and the
        script's generators are looked at, to tell later which ones training draws from."""
        self._trained = True
        self.job.event("training_start", step=self.state.global_step)
        loop, extras = self.state.loop, self.state.extras
        if loop is not None:
            self.saves.discover()
            loop.examine(self.state.objects, self.saves.driving_loader())
            if extras is not None:
                extras.examine()
        if self.state.uncaptured is not None:
            self._generators = GeneratorWatch(self.state.uncaptured, self.config.ignore_generators)
            self._generators.start()

    def _time_first_steps(self) -> None:
        """At the third safe point after a resume: the ``first_step`` event, with the lengths
        of the first two steps."""
        if self._first_steps is None:
            raise bug("the first steps after a resume are timed without a start")
        self._first_steps.append(time.monotonic())
        if len(self._first_steps) == 3:
            a, b, c = self._first_steps
            self._first_steps = None
            self.job.event("first_step", step=self.state.global_step, seconds=b - a, next_seconds=c - b)

    def check_generators(self) -> None:
        """Warn about the script's generators that training drew from since the last look."""
        if self._generators is not None:
            self._generators.check()

    def serve_pending(self) -> None:
        """A checkpoint asked for (``ferry.checkpoint()``, ``ferry checkpoint``) and not yet
        served when the session closes: served now where this process alone decides and the
        script's state is whole (explicit mode, one rank); otherwise answered as dropped,
        with the reason, never dropped in silence."""
        requests = [r for r in self.requests if r.action == "checkpoint"]
        if not requests or self.saves.stopping:
            return
        self.requests = [r for r in self.requests if r.action != "checkpoint"]
        step, world = self.state.global_step, self.checkpointer.world_size
        if self.state.loop is None and world == 1:
            self.report.saves.awaiting(step, requests)
            try:
                self.checkpointer.agree(self.point(time.monotonic()), policy.Asked(save=True))
                self.saves.write(time.perf_counter(), blocking=True)
            except FerryError as exc:
                self.report.saves.failed(step, exc)
            return
        why = (
            "the script ended before its next safe point"
            if self.state.loop is not None
            else f"the {world} ranks had not reached the step they agree at"
        )
        self.report.dropped(step, requests, why)
