"""The files the script writes, rolled back with the training state (zero-code mode).

A resumed process runs the script from the top: ``open("out/main.log", "w")`` truncates the
log the stopped run wrote, and lines written after the checkpoint (a crash after a periodic
one) would stay. So ferry follows the script's files through Python's ``open`` audit event
(the script's own code only: a library's files are the library's business):

- at each checkpoint, for each file the script opened for writing: its size, after the
  script's file objects in the loop's frames are flushed, and a hash of its last bytes;
- in the resumed process, a file the script opens for writing before the restore point is
  copied aside first (its content from the stopped run), if a checkpoint is to be resumed;
- at the restore point, each recorded file the resumed script has opened for writing gets
  back its content at the checkpoint, the first ``size`` bytes of what the stopped run left,
  when its last bytes hash as recorded; the script's file objects are moved to its end. A
  recorded file the script opens later is rolled back as it opens it (its per-epoch CSV).
  What cannot be put back is said, once, naming the file.

A checkpoint's records are untrusted: ferry only ever shortens a file that the resumed
script itself opens for writing, never one a record merely names.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable
from types import FrameType
from typing import Any

import xxhash

from ferry.state.usercode import user_frames  # (the loop's frames: torch-free, imported at start-up)

log = logging.getLogger("ferry")
_TAIL = 4096
_MAX_ASIDE = 64 << 20
"""Bigger files are not copied aside at the resumed script's open (said instead)."""
_MAX_FILES = 256
_WRITING = ("w", "a", "x", "+")


def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in _WRITING)
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR))


def _tail_hash(path: str, size: int) -> str | None:
    """xxh64 of the ``_TAIL`` bytes before ``size`` of ``path``; None if it is shorter."""
    try:
        with open(path, "rb") as f:
            start = max(0, size - _TAIL)
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return None
    return xxhash.xxh64_hexdigest(data) if len(data) == size - start else None


class Outputs:
    """The script's files written, in one process; ``watch`` installs the audit hook."""

    def __init__(self, is_user_file: Callable[[str], bool], resuming: Callable[[], bool]) -> None:
        self.is_user_file, self.resuming = is_user_file, resuming
        self.opened: dict[str, str] = {}
        """Path -> the mode it was first opened for writing in (by the script's code)."""
        self.aside: dict[str, str | None] = {}
        """Files opened for writing before the restore point: path -> a copy of what the
        stopped run left (None: there was nothing, or too much, to copy)."""
        self.restored = False
        self.pending: dict[str, tuple[int, str]] = {}
        """Recorded files the resumed script had not opened at the restore point: rolled
        back when it opens them (path -> size, tail hash)."""
        self._resuming: bool | None = None

    def watch(self) -> None:
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or len(args) < 3:
            return
        path, mode, flags = args[0], args[1], args[2]
        if not isinstance(path, str) or not _writes(mode, flags) or len(self.opened) >= _MAX_FILES:
            return
        caller: FrameType | None = sys._getframe(1)
        while caller is not None and caller.f_code.co_filename.startswith("<"):
            caller = caller.f_back  # frozen importlib and the like
        if caller is None or not self.is_user_file(caller.f_code.co_filename):
            return
        path = os.path.abspath(path)
        self.opened.setdefault(path, mode if isinstance(mode, str) else "os.open")
        if self.restored and path in self.pending:
            size, tail = self.pending.pop(path)
            with contextlib.suppress(OSError):
                self._restore_one(path, size, tail, [])
        if not self.restored and path not in self.aside and self._is_resuming():
            self.aside[path] = _copy_aside(path)

    def _is_resuming(self) -> bool:
        if self._resuming is None:
            self._resuming = self.resuming()
        return self._resuming

    # ------------------------------------------------------------------ checkpoint
    def capture(self) -> dict[str, Any]:
        """The recorded files' sizes and tail hashes now; the script's file objects in the
        loop's frames are flushed first (their buffered lines belong to the checkpoint)."""
        for f in _file_objects(user_frames(sys._getframe(1))):
            with contextlib.suppress(OSError, ValueError):
                f.flush()
        files: dict[str, Any] = {}
        for path in self.opened:
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            tail = _tail_hash(path, size)
            if tail is not None:
                files[path] = {"size": size, "tail": tail}
        return files

    # ------------------------------------------------------------------ restore
    def restore(self, saved: Any) -> list[str]:
        """Roll the recorded files back to the checkpoint; returns what could not be."""
        self.restored = True
        problems: list[str] = []
        records = saved if isinstance(saved, dict) else {}
        objects = _file_objects(user_frames(sys._getframe(1)))
        for f in objects:
            with contextlib.suppress(OSError, ValueError):
                f.flush()
        for path, record in list(records.items())[:_MAX_FILES]:
            size, tail = _record(record)
            if not isinstance(path, str) or size is None:
                continue
            if path not in self.opened:  # not (yet) a file of this run: never touched before
                self.pending[path] = (size, tail)
                continue
            problem = self._restore_one(path, size, tail, objects)
            if problem is not None:
                problems.append(problem)
        for copy in self.aside.values():
            if copy is not None:
                with contextlib.suppress(OSError):
                    os.unlink(copy)
        self.aside.clear()
        return problems

    def _restore_one(self, path: str, size: int, tail: str, objects: list[Any]) -> str | None:
        name = os.path.relpath(path)
        source = self.aside.get(path)  # reopened by the resumed script before the restore point
        if source is not None and _tail_hash(source, size) == tail:
            _put_back(path, source, size)
        elif _tail_hash(path, size) == tail:  # the file itself holds the checkpoint's bytes
            # (never set aside; or set aside before the stopped run wrote them, as a warm
            # worker started ahead of the checkpoint does, and opened for appending since)
            if os.stat(path).st_size == size:
                return None
            with open(path, "r+b") as f:
                f.truncate(size)  # lines written after the checkpoint: the resumed run writes them
        elif path in self.aside:
            return (
                f"{name} was opened for writing again before the restore point; its content "
                "from the stopped run could not be put back (it was missing, changed or over "
                f"{_MAX_ASIDE >> 20} MiB): it holds only what the resumed run writes"
            )
        else:
            return None  # rewritten since (a model file saved again): the script's business
        for f in objects:
            if _names(f, path):
                with contextlib.suppress(OSError, ValueError):
                    f.seek(size)
        return None


def _record(record: Any) -> tuple[int | None, str]:
    """(size, tail hash) of a saved record, or (None, "") if it is malformed."""
    if not isinstance(record, dict):
        return None, ""
    size, tail = record.get("size"), record.get("tail")
    if type(size) is not int or size < 0 or size > 1 << 50 or not isinstance(tail, str) or len(tail) > 32:
        return None, ""
    return size, tail


def _copy_aside(path: str) -> str | None:
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > _MAX_ASIDE:
            return None
        fd, copy = tempfile.mkstemp(prefix="ferry-aside-")
        with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out)
        return copy
    except OSError:
        return None


def _put_back(path: str, source: str, size: int) -> None:
    """``path`` holds the first ``size`` bytes of ``source``, in place (same inode: the
    script's open file objects keep writing to it)."""
    with open(source, "rb") as src, open(path, "r+b") as dst:
        dst.seek(0)
        remaining = size
        while remaining:
            chunk = src.read(min(remaining, 1 << 20))
            if not chunk:
                break
            dst.write(chunk)
            remaining -= len(chunk)
        dst.truncate(size)


def _names(f: Any, path: str) -> bool:
    name = getattr(f, "name", None)
    return isinstance(name, str) and os.path.abspath(name) == path


def _file_objects(frames: list[Any]) -> list[Any]:
    """Open file objects written to, held in the loop's frames (as locals or globals, or as
    attributes of objects there) and by the logging handlers."""
    found: dict[int, Any] = {}

    def add(value: Any) -> None:
        if isinstance(value, io.IOBase) and not value.closed and value.writable():
            found[id(value)] = value

    for frame in frames:
        names = frame.f_globals if frame.f_code.co_name == "<module>" else frame.f_locals
        for value in list(names.values()):
            add(value)
            if not isinstance(value, (type, types.ModuleType)):
                for attr in list(getattr(value, "__dict__", {}).values()):
                    add(attr)
    for handler in _logging_handlers():
        add(getattr(handler, "stream", None))
    return list(found.values())


def _logging_handlers() -> list[Any]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [h for lg in loggers for h in getattr(lg, "handlers", [])]
