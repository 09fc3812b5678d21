"""Functions of the shapes training loops take (closures over their arguments, generators,
comprehensions, ``with``/``try``/``except`` blocks, ``match``), each reporting the
iterators of the ``for`` loops its frame is inside, as ``autotrack/stack.py`` reads them.

Needs only the standard library and ``ferry.autotrack.stack``, so that interpreters without
torch (another CPython minor version) run it too: ``python stack_cases.py SRC`` prints
``{case: kinds}`` as JSON, which test_stack_layouts.py compares with ``expected()``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])

from ferry.autotrack import stack

Kinds = list[str]


def look(depth: int = 1) -> Kinds:
    """The kinds of the iterators of the loops the caller (``depth`` frames up) is inside."""
    found = stack.loop_iterators(sys._getframe(depth))
    if found is None:
        raise RuntimeError("this interpreter's frames cannot be read")
    return [type(it).__name__ for _, it in sorted(found.items())]


def closure_over_arguments(loader: list[int], args: dict[str, int]) -> Kinds:
    """timm's train_one_epoch: a nested function reads the arguments, so they are cells too."""

    def lr_at(step: int) -> float:
        return args["lr"] * step / len(loader)

    seen: Kinds = []
    for step, _batch in enumerate(loader):
        lr_at(step)
        seen = look()
        break
    return seen


def nested_function_with_free_variables(items: list[int]) -> Kinds:
    scale = 2

    def inner(data: list[int]) -> Kinds:
        seen: Kinds = []
        for x in zip(data, range(scale), strict=False):
            for _y in reversed(data):
                seen = look() if x else []
                break
            break
        return seen

    return inner(items)


def generator(items: list[int]) -> Kinds:
    def batches(data: list[int]) -> Iterator[Kinds]:
        for _epoch in range(2):
            for _x in data:
                yield look()

    return next(batches(items))


def comprehension_in_a_loop(items: list[int]) -> Kinds:
    """On 3.12+ the comprehension is inlined: its iterator is on this frame's stack."""
    seen: list[Kinds] = []
    for _epoch in range(2):
        seen = [look() for _ in items]
        break
    return seen[0]


def with_and_try(items: list[int]) -> Kinds:
    seen: Kinds = []
    for _epoch in range(3):
        with contextlib.suppress(KeyError), contextlib.nullcontext():
            try:
                for _x in items:
                    seen = look()
                    break
            finally:
                items = list(items)
        break
    return seen


def in_an_exception_handler(items: list[int]) -> Kinds:
    seen: Kinds = []
    for _x in map(abs, items):
        try:
            raise ValueError
        except ValueError:
            seen = look()
        break
    return seen


def match_statement(items: list[Any]) -> Kinds:
    seen: Kinds = []
    for item in items:
        match item:
            case (a, b) if a < b:
                seen = look()
            case {"k": _v}:
                seen = look()
            case _:
                pass
        if seen:
            break
    return seen


def enumerate_count_set() -> Kinds:
    """An ``enumerate``'s next index, written in place (it has no ``__setstate__``)."""
    it = enumerate("abc")
    ok = stack.set_enumerate_count(it, 40)
    return [str(ok), repr(next(it))]


CASES: dict[str, Callable[[], Kinds]] = {
    "closure_over_arguments": lambda: closure_over_arguments([1, 2, 3], {"lr": 1}),
    "nested_function_with_free_variables": lambda: nested_function_with_free_variables([1, 2]),
    "generator": lambda: generator([4, 5]),
    "comprehension_in_a_loop": lambda: comprehension_in_a_loop([7, 8]),
    "with_and_try": lambda: with_and_try([1, 2]),
    "in_an_exception_handler": lambda: in_an_exception_handler([-1, 2]),
    "match_statement": lambda: match_statement([{"k": 1}, (1, 2)]),
    "enumerate_count_set": enumerate_count_set,
}


def expected(version: tuple[int, int]) -> dict[str, Kinds]:
    inlined = version >= (3, 12)  # PEP 709: comprehensions run in the enclosing frame
    return {
        "closure_over_arguments": ["enumerate"],
        "nested_function_with_free_variables": ["zip", "list_reverseiterator"],
        "generator": ["range_iterator", "list_iterator"],
        "comprehension_in_a_loop": ["range_iterator", "list_iterator"] if inlined else ["list_iterator"],
        "with_and_try": ["range_iterator", "list_iterator"],
        "in_an_exception_handler": ["map"],
        "match_statement": ["list_iterator"],
        "enumerate_count_set": ["True", "(40, 'a')"],
    }


def run_all() -> dict[str, Kinds]:
    return {name: case() for name, case in CASES.items()}


if __name__ == "__main__":
    print(json.dumps({"supported": stack.supported(), "cases": run_all()}))
