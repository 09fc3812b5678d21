"""The iterators a running frame's ``for`` loops hold, read from its value stack.

CPython keeps a ``for`` loop's iterator on the frame's value stack, out of reach of Python
code (``gc.get_referents`` sees no stack of an executing frame on 3.11 and later). This
module finds the live part of the stack by an analysis of the code object at the
instruction the frame is executing (a call or a ``FOR_ITER``): its depth, and which slots
hold a loop's iterator, followed along every path, exception handlers included (slots above
that depth may hold stale pointers and are never read). The value stack starts after the
frame's ``localsplus`` slots (locals, cells, free variables, each once: an argument a
closure captures has one slot), and the live slots are read through ctypes. The frame
layout is checked once against a probe whose stack contents are known; where the check
fails (another Python), ``supported()`` is False and loop positions are reported as not
captured instead of guessed.
"""

from __future__ import annotations

import bisect
import ctypes
import dis
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _At:
    """The value stack before one instruction: its depth, and the slots that hold the
    iterator of a ``for`` loop (slot -> offset of that loop's ``FOR_ITER``)."""

    depth: int
    loops: tuple[tuple[int, int], ...] = ()

    def after(self, effect: int) -> _At:
        """After an instruction of net stack effect ``effect``: an iterator whose slot the
        stack dropped to is gone (a loop's exit, a ``break``, a ``return`` from inside it).
        The body of a loop never reaches below its iterator, so nothing else removes one."""
        kept = self.depth + min(effect, 0)
        return _At(self.depth + effect, tuple((s, f) for s, f in self.loops if s < kept))

    def loop(self, offset: int) -> _At:
        """At the ``FOR_ITER`` at ``offset``: the top of the stack is its iterator."""
        slot = self.depth - 1
        return _At(self.depth, (*(x for x in self.loops if x[0] != slot), (slot, offset)))

    def handler(self, depth: int) -> _At:
        """At an exception handler entered from here: the stack cut to ``depth``."""
        return _At(depth, tuple((s, f) for s, f in self.loops if s < depth))


@cache
def _layout(code: CodeType) -> dict[int, _At]:
    """The stack before each instruction (by offset), as the compiler lays it out: an
    abstract run over every path, exception handlers included (3.11+ puts handlers, and on
    3.12+ other cold code, after the loop they belong to, so a loop's extent in the
    bytecode says nothing of which loops are live)."""
    instructions = list(dis.get_instructions(code))
    index = {ins.offset: i for i, ins in enumerate(instructions)}
    seen: dict[int, _At] = {}
    work: list[tuple[int, _At]] = [(0, _At(0))]
    entries = getattr(dis.Bytecode(code), "exception_entries", [])  # 3.11+: the exception table
    handlers = [(e.start, e.end, e.target, e.depth, e.lasti) for e in entries]
    while work:
        i, at = work.pop()
        while i < len(instructions):
            ins = instructions[i]
            if ins.offset in seen:
                break
            if ins.opname == "FOR_ITER":  # its iterator, below the next value
                at = at.loop(ins.offset)
            seen[ins.offset] = at
            for start, end, target, hdepth, lasti in handlers:
                if start <= ins.offset < end and target in index and target not in seen:
                    work.append((index[target], at.handler(hdepth).after(1 + int(lasti))))
            if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
                target = index.get(ins.argval)
                if target is not None:
                    work.append((target, at.after(_effect(ins, jump=True))))
            if ins.opname in _ENDS:
                break
            at = at.after(_effect(ins, jump=False))
            i += 1
    return seen


def _effect(ins: dis.Instruction, *, jump: bool) -> int:
    if ins.opname == "RETURN_GENERATOR":  # resumed, the generator finds the sent value pushed
        return 1  # (3.11 and 3.12 say 0 and count its POP_TOP: every depth would be one short)
    arg = ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None
    return dis.stack_effect(ins.opcode, arg, jump=jump)


def _slot(frame: FrameType, index: int) -> Any:
    interp = ctypes.c_void_p.from_address(id(frame) + _F_FRAME).value
    if interp is None:
        raise bug("a running frame without its interpreter frame")
    address = ctypes.c_void_p.from_address(interp + _LOCALSPLUS + index * _PTR).value
    if not address:
        return None
    return ctypes.cast(address, ctypes.py_object).value


@cache
def _nlocalsplus(code: CodeType) -> int:
    """The number of ``localsplus`` slots before the value stack: the code's fast locals,
    cells and free variables, each once. An argument that a nested function captures is in
    ``co_varnames`` and ``co_cellvars`` both, yet has one slot; so do the hidden locals of an
    inlined comprehension (3.12+). ``_varname_from_oparg`` reads the real layout (the
    interpreter's ``co_localsplusnames``); where it is missing, the same count from the
    public attributes."""
    name_of = getattr(code, "_varname_from_oparg", None)
    if name_of is None:
        cells = [c for c in code.co_cellvars if c not in code.co_varnames]
        return len(code.co_varnames) + len(cells) + len(code.co_freevars)
    count = 0
    while True:
        try:
            name_of(count)
        except (IndexError, ValueError):
            return count
        count += 1


def live_stack(frame: FrameType) -> list[Any] | None:
    """The objects on ``frame``'s value stack below the instruction it is executing, bottom
    first; None where that cannot be read safely."""
    if not supported():
        return None
    return _live(frame)


def inside_loops(frame: FrameType) -> bool:
    """Is ``frame`` inside a ``for`` loop (from its code alone, reading no memory)?"""
    try:
        at = _at(frame)
        return at is None or bool(at.loops)
    except Exception:  # an unknown bytecode: better to say so than to stay silent
        return True


def instruction(frame: FrameType) -> int:
    """Offset of the instruction ``frame`` is executing."""
    offsets = _offsets(frame.f_code)
    at = bisect.bisect_right(offsets, frame.f_lasti) - 1
    return offsets[at] if at >= 0 else -1


def loop_iterators(frame: FrameType) -> dict[int, Any] | None:
    """The iterators of the ``for`` loops ``frame`` is inside, by stack slot (outermost
    first); None where the stack cannot be read."""
    live = live_stack(frame)
    at = _at(frame)
    if live is None or at is None:
        return None
    return {slot: live[slot] for slot, _ in sorted(at.loops) if slot < len(live) and live[slot] is not None}


def _at(frame: FrameType) -> _At | None:
    """The stack layout before the instruction holding ``f_lasti`` (which may point into
    its inline caches: a frame that is calling reports the call's last cache entry)."""
    return _layout(frame.f_code).get(instruction(frame))


@cache
def _offsets(code: CodeType) -> list[int]:
    return [ins.offset for ins in dis.get_instructions(code)]


def _live(frame: FrameType) -> list[Any] | None:
    at = _at(frame)
    if at is None:
        return None
    base = _nlocalsplus(frame.f_code)
    return [_slot(frame, base + i) for i in range(at.depth)]


def _probe(marker_list: list[object], seen: list[Any]) -> None:
    """A frame whose stack contents are known: two loops' iterators under a call of ``look``
    (after or before its NULL: 3.11-3.12 push the NULL first, 3.13 after the callable).
    Its argument is a cell too (``look`` reads it), which shares the argument's slot."""
    marker_range = range(3)

    def look() -> None:
        caller = sys._getframe(1)
        seen.extend(_live(caller) or [])
        seen.append(marker_list)

    for _a in marker_list:
        for _b in iter(marker_range):
            look()
            break


def _probe_ok() -> bool:
    seen: list[Any] = []
    _probe([object()], seen)
    kinds = [type(x).__name__ for x in seen]
    return (
        len(seen) == 5
        and kinds[:2] == ["list_iterator", "range_iterator"]
        and {*kinds[2:4]}
        == {
            "function",
            "NoneType",
        }
    )


_SUPPORTED: bool | None = None


def supported() -> bool:
    """Whether this interpreter's frames can be read: CPython 3.11 to 3.13 (whose frame
    layout this module knows; a later one is not read at all), checked on a probe."""
    global _SUPPORTED
    if _SUPPORTED is None:
        ok = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info < (3, 14) and _PTR == 8
        try:
            _SUPPORTED = ok and _probe_ok()
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
