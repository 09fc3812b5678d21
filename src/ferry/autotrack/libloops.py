"""Training loops that run in a library's code, which zero-code mode does not capture.

The loop's own state (its epoch and step counters, what it accumulates) lives in its
frames. ferry captures the frames of the user's code (``frames.py``) and, through their
support, the progress of the frameworks it knows (``frameworks.py``). A loop in any other
library (an engine or trainer class in site-packages) restarts from its beginning on
resume, with the weights, optimizer and data position restored: said before the first save,
never guessed at, and said again at the resume.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from ferry.autotrack import stack

_FERRY = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(os.path.abspath(getattr(torch, "__file__", None) or os.sep)) + os.sep


def _library(filename: str, is_user_file: Callable[[str], bool]) -> bool:
    """A library's file: not the user's code, not ferry, torch or the interpreter's own."""
    if filename.startswith("<") or is_user_file(filename):
        return False
    path = os.path.abspath(filename)
    return not path.startswith((_FERRY, _torch_dir())) and (
        "site-packages" in path or "dist-packages" in path
    )


def library_loops(
    start: FrameType | None, is_user_file: Callable[[str], bool], covered: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """The library frames on the stack from ``start`` that run a ``for`` loop, outermost
    first, leaving out those ``covered`` (a framework whose support captures its loop)."""
    found: list[dict[str, Any]] = []
    frame = start
    while frame is not None:
        code = frame.f_code
        if (
            _library(code.co_filename, is_user_file)
            and not covered(code.co_filename)
            and stack.inside_loops(frame)
        ):
            found.append(
                {
                    "file": _short(code.co_filename),
                    "line": frame.f_lineno,
                    "qualname": getattr(code, "co_qualname", code.co_name),
                }
            )
        frame = frame.f_back
    return found[::-1]


def _short(filename: str) -> str:
    """The file from its package on (``site-packages/`` and what is before it dropped)."""
    path = os.path.abspath(filename)
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def where(loop: dict[str, Any]) -> str:
    return f"{loop.get('file')}:{loop.get('line')} (in {loop.get('qualname')})"


def warning(loops: list[dict[str, Any]]) -> str | None:
    """What to say before the first save about the loops found; None if none."""
    if not loops:
        return None
    outer = loops[0]
    return (
        f"ferry: warning: the training loop runs in a library's code, {where(outer)}, which "
        "zero-code mode does not capture: a resume restores the weights, the optimizer and the "
        "data position, but that loop's own counters (epoch, step) and what it accumulates start "
        "over; use the library's own resume, or track its progress (a dict, or an object with "
        "state_dict()) with one line: `ferry.track(progress=...)` (docs/zero-code.md, library loops)"
    )


def _saved_where(loop: dict[str, Any]) -> str:
    """``where`` of a loop read from a checkpoint (untrusted): said only when it is a plain
    place (printable, short, a line number), never control characters or a forged line."""
    file, line, qualname = loop.get("file"), loop.get("line"), loop.get("qualname")
    plain = all(isinstance(t, str) and len(t) <= 1024 and t.isprintable() for t in (file, qualname))
    if plain and type(line) is int and 0 < line < 1 << 31:
        return where(loop)
    return "a place the checkpoint does not name plainly"


def at_resume(saved: Any) -> str | None:
    """What to say when a checkpoint taken inside such a loop is resumed; None if not."""
    if not isinstance(saved, list) or not saved or not isinstance(saved[0], dict):
        return None
    return (
        f"ferry: warning: the checkpoint was taken inside {_saved_where(saved[0])}, a library's loop "
        "that zero-code mode does not capture: it starts over in this run (weights, optimizer "
        "and data position are restored; its own step and epoch counters are not)"
    )
