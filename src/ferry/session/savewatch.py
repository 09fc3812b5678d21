"""The save in flight, made visible to the operator: its bytes, total and start go into the
job's status (``saving``), where ``ferry status`` and a command waiting for the save
(``ferry checkpoint --wait``, ``stop``, ``migrate``, ``export``) read them. Nothing is
drawn on the worker's stderr: that is the training script's stream.

One thread per session, asleep until a save begins: a save that ends within
``AFTER_SECONDS`` is never published (a short save costs one notification), a longer one
is published every ``EVERY_SECONDS`` and its field removed once it ends. The writer only
adds to a counter (``ferry.progress.Tally``)."""

from __future__ import annotations

import functools
import logging
import threading

from ferry.progress import Tally
from ferry.runtime.jobdir import JobDir
from ferry.runtime.jobfiles import Saving

log = logging.getLogger("ferry")

AFTER_SECONDS = 1.0
"""A save is published once it has run this long."""
EVERY_SECONDS = 0.25
"""...and then at most four times a second: each is a rewrite of status.json."""


class SaveWatch:
    """Publishes ``tally``'s save in flight into ``job``'s status until ``close``."""

    def __init__(self, job: JobDir, tally: Tally) -> None:
        self.job, self.tally = job, tally
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ferry-save-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self.tally.changed:
            self._closed = True
            self.tally.changed.notify_all()
        self._thread.join(timeout=5)

    def _over(self, serial: int) -> bool:
        """The save ``serial`` ended (or the watch closed); called holding ``changed``."""
        return self._closed or not self.tally.active or self.tally.serial != serial

    def _run(self) -> None:
        tally = self.tally
        while True:
            with tally.changed:
                tally.changed.wait_for(lambda: tally.active or self._closed)
                if self._closed:
                    return
                serial = tally.serial
                if tally.changed.wait_for(functools.partial(self._over, serial), timeout=AFTER_SECONDS):
                    continue  # a short save: nothing to show
            try:
                self._publish(serial)
            except OSError as exc:  # a full disk: the save's own error will say more
                log.warning("ferry: the save's progress is not shown in the job's status: %s", exc)

    def _publish(self, serial: int) -> None:
        tally = self.tally
        try:
            while True:
                with tally.changed:
                    if self._over(serial):
                        return
                    done = min(tally.done, tally.total)
                    saving = Saving(step=tally.step, bytes=done, total=tally.total, started=tally.started)
                self.job.save_progress(saving)
                with tally.changed:
                    tally.changed.wait_for(lambda: self._over(serial), timeout=EVERY_SECONDS)
        finally:
            self.job.save_progress(None)
