"""What zero-code mode keeps beside the loop's frames: the files the script writes
(``outputs``), the loops that run in a library's code (``libloops``) and accelerate's
gradient accumulation count (``accelerators``). The session calls
``examine`` at the first safe point, ``capture`` with each checkpoint and ``restore`` at the
restore point, through ``session.loophooks.LoopExtras``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ferry.autotrack import accelerators, libloops
from ferry.autotrack.outputs import Outputs


class Extras:
    def __init__(
        self, outputs: Outputs, is_user_file: Callable[[str], bool], covered: Callable[[str], bool]
    ) -> None:
        self.outputs, self.is_user_file, self.covered = outputs, is_user_file, covered
        self._said = False

    def _loops(self) -> list[dict[str, Any]]:
        return libloops.library_loops(sys._getframe(2), self.is_user_file, self.covered)

    def examine(self) -> None:
        """Before the first save: say which loop ferry cannot capture, once."""
        line = libloops.warning(self._loops())
        if line is not None and not self._said:
            self._said = True
            sys.stderr.write(line + "\n")

    def capture(self) -> dict[str, Any]:
        state = {"files": self.outputs.capture(), "library_loops": self._loops()}
        counts = accelerators.capture(sys._getframe(1))
        if counts:  # only a loop that holds an Accelerator records them
            state["accelerators"] = counts
        return state

    def restore(self, saved: dict[str, Any]) -> list[str]:
        problems = self.outputs.restore(saved.get("files"))
        accelerators.restore(sys._getframe(1), saved.get("accelerators"))
        said = libloops.at_resume(saved.get("library_loops"))
        if said is None:
            return problems
        self._said = True  # said here; not again at this run's first safe point
        return [said.removeprefix("ferry: warning: "), *problems]
