"""The iterators a running frame's ``for`` loops hold, read from its value stack.

CPython keeps a ``for`` loop's iterator on the frame's value stack, out of reach of Python
code (``gc.get_referents`` sees no stack of an executing frame on 3.11 and later). This
module finds the live part of the stack by a stack-depth analysis of the code object at
the instruction the frame is executing (a call or a ``FOR_ITER``; slots above that depth
may hold stale pointers and are never read), and reads the live slots of the interpreter
frame through ctypes. The frame layout is checked once against a probe whose stack
contents are known; where the check fails (another Python), ``supported()`` is False and
loop positions are reported as not captured instead of guessed.
"""

from __future__ import annotations

import bisect
import ctypes
import dis
import sys
from functools import cache
from types import CodeType, FrameType
from typing import Any

from ferry.errors import bug

_PTR = ctypes.sizeof(ctypes.c_void_p)
_LOCALSPLUS = 72
"""Offset of ``localsplus`` in ``_PyInterpreterFrame`` on CPython 3.11 to 3.13 (64-bit)."""
_F_FRAME = 3 * _PTR
"""Offset of ``PyFrameObject.f_frame`` (after the object header and ``f_back``)."""
_ENDS = {
    "RETURN_VALUE",
    "RETURN_CONST",
    "RAISE_VARARGS",
    "RERAISE",
    "JUMP_FORWARD",
    "JUMP_BACKWARD",
    "JUMP_BACKWARD_NO_INTERRUPT",
    "JUMP",
    "JUMP_NO_INTERRUPT",
    "JUMP_ABSOLUTE",
}


@cache
def _depths(code: CodeType) -> dict[int, int]:
    """Stack depth before each instruction (by offset), as the compiler computes it."""
    instructions = list(dis.get_instructions(code))
    index = {ins.offset: i for i, ins in enumerate(instructions)}
    depth: dict[int, int] = {}
    work: list[tuple[int, int]] = [(0, 0)]
    entries = getattr(dis.Bytecode(code), "exception_entries", [])  # 3.11+: the exception table
    handlers = [(e.start, e.end, e.target, e.depth, e.lasti) for e in entries]
    while work:
        i, d = work.pop()
        while i < len(instructions):
            ins = instructions[i]
            if ins.offset in depth:
                break
            depth[ins.offset] = d
            for start, end, target, hdepth, lasti in handlers:
                if start <= ins.offset < end and target in index and target not in depth:
                    work.append((index[target], hdepth + 1 + int(lasti)))
            if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
                target = index.get(ins.argval)
                if target is not None:
                    work.append((target, d + dis.stack_effect(ins.opcode, ins.arg, jump=True)))
            if ins.opname in _ENDS:
                break
            arg = ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None
            d += dis.stack_effect(ins.opcode, arg, jump=False)
            i += 1
    return depth


def _slot(frame: FrameType, index: int) -> Any:
    interp = ctypes.c_void_p.from_address(id(frame) + _F_FRAME).value
    if interp is None:
        raise bug("a running frame without its interpreter frame")
    address = ctypes.c_void_p.from_address(interp + _LOCALSPLUS + index * _PTR).value
    if not address:
        return None
    return ctypes.cast(address, ctypes.py_object).value


def _nlocalsplus(code: CodeType) -> int:
    return len(code.co_varnames) + len(code.co_cellvars) + len(code.co_freevars)


def live_stack(frame: FrameType) -> list[Any] | None:
    """The objects on ``frame``'s value stack below the instruction it is executing, bottom
    first; None where that cannot be read safely."""
    if not supported():
        return None
    return _live(frame)


@cache
def _loops(code: CodeType) -> list[tuple[int, int, int]]:
    """(first offset, end offset, stack slot of the iterator) of each ``for`` loop."""
    depths = _depths(code)
    return [
        (ins.offset, int(ins.argval), depths[ins.offset] - 1)
        for ins in dis.get_instructions(code)
        if ins.opname == "FOR_ITER" and ins.offset in depths
    ]


def inside_loops(frame: FrameType) -> bool:
    """Is ``frame`` inside a ``for`` loop (from its code alone, reading no memory)?"""
    try:
        here = _here(frame)
        return any(start <= here < end for start, end, _ in _loops(frame.f_code))
    except Exception:  # an unknown bytecode: better to say so than to stay silent
        return True


def _here(frame: FrameType) -> int:
    """Offset of the instruction ``frame`` is executing."""
    offsets = _offsets(frame.f_code)
    at = bisect.bisect_right(offsets, frame.f_lasti) - 1
    return offsets[at] if at >= 0 else -1


def loop_iterators(frame: FrameType) -> dict[int, Any] | None:
    """The iterators of the ``for`` loops ``frame`` is inside, by stack slot (outermost
    first); None where the stack cannot be read."""
    live = live_stack(frame)
    if live is None:
        return None
    here = _here(frame)
    return {
        slot: live[slot]
        for start, end, slot in _loops(frame.f_code)
        if start <= here < end and 0 <= slot < len(live) and live[slot] is not None
    }


def _depth_at(code: CodeType, lasti: int) -> int | None:
    """Depth before the instruction holding ``lasti`` (which may point into its inline
    caches: a frame that is calling reports the call's last cache entry)."""
    depths = _depths(code)
    offsets = _offsets(code)
    at = bisect.bisect_right(offsets, lasti) - 1
    return None if at < 0 else depths.get(offsets[at])


@cache
def _offsets(code: CodeType) -> list[int]:
    return [ins.offset for ins in dis.get_instructions(code)]


def _live(frame: FrameType) -> list[Any] | None:
    depth = _depth_at(frame.f_code, frame.f_lasti)
    if depth is None:
        return None
    base = _nlocalsplus(frame.f_code)
    return [_slot(frame, base + i) for i in range(depth)]


def _probe() -> bool:
    marker_list, marker_range = [object()], range(3)
    seen: list[Any] = []

    def look() -> None:
        caller = sys._getframe(1)
        seen.extend(_live(caller) or [])

    for _a in marker_list:
        for _b in iter(marker_range):
            look()
            break
    kinds = [type(x).__name__ for x in seen]
    return kinds[:2] == ["list_iterator", "range_iterator"] and seen[-1] is look


_SUPPORTED: bool | None = None


def supported() -> bool:
    """Whether this interpreter's frames can be read: CPython 3.11 to 3.13 (whose frame
    layout this module knows; a later one is not read at all), checked on a probe."""
    global _SUPPORTED
    if _SUPPORTED is None:
        ok = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info < (3, 14) and _PTR == 8
        try:
            _SUPPORTED = ok and _probe()
        except Exception:  # any surprise in the layout: report, never guess
            _SUPPORTED = False
    return _SUPPORTED


def set_enumerate_count(it: Any, count: int) -> bool:
    """Set an ``enumerate``'s next index (it has no ``__setstate__``): ``en_index`` is the
    first field after the object header. Checked through ``__reduce__``; False if not."""
    if not supported() or type(it) is not enumerate:
        return False
    ctypes.c_ssize_t.from_address(id(it) + 2 * _PTR).value = count
    return bool(it.__reduce__()[1][1] == count)
