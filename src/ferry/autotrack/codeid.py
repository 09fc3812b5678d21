"""Which code a frame runs, and which names that code defines: a frame of the checkpoint is
written into a frame of the resumed process only when both run the same code, and a saved
name only when that code defines it.

A frame's code is identified by a digest of what its values mean: its bytecode, the names
and constants it uses and the interpreter's version (bytecode differs between minor
versions), not by its lines: a comment added above a function leaves its frames the same
code. Nested functions count by name only (their own frames have their own digests), so
an edit inside ``train()`` does not change the module frame's code.
"""

from __future__ import annotations

import dis
import sys
from collections.abc import Iterator
from functools import cache
from types import CodeType

import xxhash

from ferry.state.framestate import is_name

_STORES = frozenset({"STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL"})
_GLOBAL_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})


def python() -> str:
    return "{}.{}".format(*sys.version_info[:2])


@cache
def digest(code: CodeType) -> str:
    """16 hex digits that change when the code's bytecode, names or constants do."""
    h = xxhash.xxh3_64()
    h.update(python().encode())
    h.update(code.co_code)
    for names in (code.co_names, code.co_varnames, code.co_cellvars, code.co_freevars):
        h.update(b"\0".join(n.encode() for n in names) + b"\1")
    h.update(f"{code.co_argcount},{code.co_kwonlyargcount},{code.co_flags}".encode())
    for const in code.co_consts:
        h.update(_const(const).encode("utf-8", "backslashreplace") + b"\1")
    return h.hexdigest()


def _const(const: object) -> str:
    if isinstance(const, CodeType):
        return f"<code {getattr(const, 'co_qualname', const.co_name)}>"
    if isinstance(const, (tuple, frozenset)):
        return f"{type(const).__name__}({','.join(_const(c) for c in const)})"
    return f"{type(const).__name__}:{const!r}"


@cache
def defined_names(code: CodeType, module: bool) -> tuple[str, ...]:
    """The names ``code`` defines, in a stable order: a function's locals, cells and free
    variables; a module's globals (what its body and its functions' ``global`` statements
    assign, import or delete). Names ferry never keeps (dunders) are left out."""
    if module:
        found = dict.fromkeys(_module_stores(code))
    else:
        found = dict.fromkeys((*code.co_varnames, *code.co_cellvars, *code.co_freevars))
    return tuple(n for n in found if is_name(n))


def _module_stores(code: CodeType) -> Iterator[str]:
    yield from (str(i.argval) for i in dis.get_instructions(code) if i.opname in _STORES)
    yield from _nested_globals(code)


def _nested_globals(code: CodeType) -> Iterator[str]:
    """What the functions defined in ``code`` assign through ``global`` statements."""
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from (str(i.argval) for i in dis.get_instructions(const) if i.opname in _GLOBAL_STORES)
            yield from _nested_globals(const)


def what_changed(saved_names: tuple[str, ...], names: tuple[str, ...], saved_python: str) -> str:
    """Says how the code of a frame differs from the checkpoint's (same place, other digest)."""
    if saved_python != python():
        return f"the checkpoint was taken under Python {saved_python}, this is {python()} (other bytecode)"
    gone = [n for n in saved_names if n not in names]
    new = [n for n in names if n not in saved_names]
    if gone or new:
        parts = [f"{_listed(gone)} no longer defined" if gone else "", f"{_listed(new)} new" if new else ""]
        return "its variables changed since the checkpoint: " + "; ".join(p for p in parts if p)
    return "its code changed since the checkpoint (same variables, other statements)"


def _listed(names: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
