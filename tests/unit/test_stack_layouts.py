"""Reading a running frame's ``for`` loop iterators off its value stack (``stack.py``) in
the shapes training loops take: closures over their arguments (one slot per argument that
is also a cell), generators, comprehensions (inlined on 3.12+), ``with``/``try``/``except``
blocks, ``match``. Run here, and on every other CPython 3.11-3.13 found on this machine
(they need no torch: ``stack_cases.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import stack_cases
from otherpythons import other_pythons

from ferry.autotrack import stack

SRC = str(Path(__file__).parents[2] / "src")
pytestmark = pytest.mark.skipif(
    not stack.supported(), reason="frame stacks readable on CPython 3.11-3.13 only"
)


def test_each_shape_of_loop_finds_its_iterators_here() -> None:
    assert stack_cases.run_all() == stack_cases.expected(sys.version_info[:2])


OTHERS = other_pythons()


@pytest.mark.skipif(not OTHERS, reason="no other CPython 3.11-3.13 on this machine")
@pytest.mark.parametrize("version", sorted(OTHERS))
def test_each_shape_of_loop_finds_its_iterators_on_another_python(version: str) -> None:
    proc = subprocess.run(
        [OTHERS[version], str(Path(__file__).with_name("stack_cases.py")), SRC],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["supported"], f"python {version}: the probe refused this interpreter's frames"
    major, minor = map(int, version.split("."))
    assert got["cases"] == stack_cases.expected((major, minor))


def test_a_position_written_through_the_found_iterator_is_the_loop_s() -> None:
    """The object found is the loop's own iterator: moving it moves the loop."""

    def loop(args: list[int]) -> list[int]:
        def first() -> int:
            return args[0]

        seen = []
        for x in iter(args):
            seen.append(x + first() * 0)
            if x == 1:
                found = stack.loop_iterators(sys._getframe())
                assert found is not None
                (it,) = found.values()
                it.__setstate__(3)  # skip two items
        return seen

    assert loop([1, 2, 3, 4, 5]) == [1, 4, 5]


def test_no_loop_after_a_break_and_none_outside() -> None:
    kinds = []
    for _x in range(3):
        break
    kinds.append(stack_cases.look())
    while True:
        for _y in [1]:
            kinds.append(stack_cases.look())
        break
    assert kinds == [[], ["tuple_iterator"]]
