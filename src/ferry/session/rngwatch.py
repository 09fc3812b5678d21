"""Zero-code mode's watch over the script's own global random generators.

ferry cannot tell what a generator held in the script's globals is for, so it cannot
capture it; it warns, but only about generators training actually uses: one whose state
changed after the first safe point. A generator used only while setting up (a seeded
split, a fixed initialisation) draws the same numbers on resume and needs no warning.
A user silences one by name with ``FERRY_IGNORE_GENERATORS=name,name``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger("ferry")

GeneratorScan = Callable[[], Mapping[str, tuple[str, int]]]
"""Global name -> (what it is, a fingerprint of its state), as discovery finds them now."""


def used_since(
    first: Mapping[str, int],
    now: Mapping[str, tuple[str, int]],
    ignored: Iterable[str],
    warned: Iterable[str],
) -> list[tuple[str, str]]:
    """(name, what) of each generator whose state moved since ``first``, oldest name first,
    leaving out the ignored ones and those already warned about. A generator first seen
    after the baseline is compared with its first sighting, so it is not here yet."""
    skip = {*ignored, *warned}
    return sorted(
        (name, what)
        for name, (what, state) in now.items()
        if name not in skip and first.get(name, state) != state
    )


class GeneratorWatch:
    """Call ``start`` at the first safe point and ``check`` at later ones (each checkpoint,
    the status heartbeat, the session's end); each used generator is warned about once."""

    def __init__(self, scan: GeneratorScan, ignored: Iterable[str]) -> None:
        self._scan, self._ignored = scan, frozenset(ignored)
        self._first: dict[str, int] | None = None
        self._warned: set[str] = set()

    def start(self) -> None:
        self._first = {name: state for name, (_, state) in self._scan().items()}

    def check(self) -> None:
        if self._first is None:
            return
        now = self._scan()
        for name, what in used_since(self._first, now, self._ignored, self._warned):
            self._warned.add(name)
            log.warning(
                "ferry: warning: the script's global %s (%s) is not captured in zero-code mode and "
                "training draws from it, so a resumed run may differ; ferry.track() it, or, if that "
                "does not matter, set FERRY_IGNORE_GENERATORS=%s",
                name,
                what,
                name,
            )
        for name, (_, state) in now.items():
            self._first.setdefault(name, state)
