"""A checkpoint's frame state is untrusted input (docs/format.md, "Threat model"): crafted
sections are refused by the parser with the field named, or field by field when they do not
fit the live frames, and nothing is ever written into a module, a class, a model or a name
the code does not define. Each case mutates a real capture of a running loop and restores
it into a fresh run of the same loop (``LoopKeeper``, in process)."""

from __future__ import annotations

import copy
import os
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from torch import nn

from ferry.autotrack import stack
from ferry.autotrack.keeper import LoopKeeper
from ferry.errors import CorruptCheckpointError
from ferry.state import frameparse

pytestmark = pytest.mark.skipif(
    not stack.supported(), reason="frame stacks readable on CPython 3.11-3.13 only"
)


class Box:
    def __init__(self) -> None:
        self.count = 0
        self.name = "box"


def _in_a_thread(run: SimpleNamespace) -> None:
    """Run ``_loop`` where it is the only frame of user code on its stack (a thread starts
    in the standard library), the same in the stopped and in the resumed run."""
    thread = threading.Thread(target=_loop, args=(run,))
    thread.start()
    thread.join()


def _loop(run: SimpleNamespace) -> None:
    """Stops (captures) at epoch 1, item 1; resumed, restores at its first item and records
    what the names hold then and where the loops go next."""
    keeper = LoopKeeper()
    mod = os
    model = nn.Linear(2, 2)
    box = Box()
    count = 0
    for epoch in range(3):
        for i, x in enumerate([5, 6, 7]):
            if run.after is not None:  # the item after the restore point
                run.next = (epoch, i, x)
                return
            if run.tree is not None:  # the resumed run's restore point
                keeper.restore(run.tree)
                run.after = {"epoch": epoch, "i": i, "x": x, "count": count, "box": dict(vars(box)),
                             "model": type(model).__name__, "mod": mod.__name__}  # fmt: skip
                continue
            if (epoch, i) == (1, 1):
                run.tree = keeper.capture({}, None)
                return
            count += x
            box.count += 1


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    run = SimpleNamespace(tree=None, after=None)
    _in_a_thread(run)
    return run.tree  # type: ignore[no-any-return]


def _resume(tree: dict[str, Any]) -> SimpleNamespace:
    run = SimpleNamespace(tree=tree, after=None, next=None)
    _in_a_thread(run)
    return run


def _frame(tree: dict[str, Any]) -> dict[str, Any]:
    (frame,) = tree["frames"]
    assert frame["qualname"] == "_loop"
    return frame


def test_an_untouched_section_resumes_the_loop(
    saved: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run = _resume(copy.deepcopy(saved))
    assert run.after == {"epoch": 1, "i": 1, "x": 6, "count": 23, "box": {"count": 4, "name": "box"},
                         "model": "Linear", "mod": "os"}  # fmt: skip
    assert run.next == (1, 2, 7)
    assert capsys.readouterr().err == ""


def test_zero_code_modes_extras_beside_the_frames_are_read_as_written(
    saved: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The section as a session writes it holds zero-code mode's extras (the files the script
    wrote, the library loops it ran in): the parser reads them as its own fields (a merge of
    two branches once refused every zero-code checkpoint for them)."""
    tree = copy.deepcopy(saved)
    tree.update({"files": {}, "library_loops": []})
    run = _resume(tree)
    assert run.next == (1, 2, 7)
    assert capsys.readouterr().err == ""


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A mutation: the field at ``path`` (keys and indexes from the loop's frame) := value."""

    def mutate(tree: dict[str, Any]) -> None:
        node: Any = _frame(tree)
        *parents, last = [int(p) if p.lstrip("-").isdigit() else p for p in path.split("/")]
        for part in parents:
            node = node[part]
        node[last] = value

    return mutate


def _both(*mutations: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(tree: dict[str, Any]) -> None:
        for m in mutations:
            m(tree)

    return mutate


REFUSED_BY_THE_PARSER = [
    # (mutation, the field the error names)
    (_set("loops/0/at", "abc"), "loops[0].at"),
    (_set("loops/0/at", 2**80), "loops[0].at"),
    (_both(_set("loops/0/kind", "list_iterator"), _set("loops/0/at", -5)), "loops[0].at"),
    (_set("loops/0/slot", "0"), "loops[0].slot"),
    (_set("loops/1/at/count", "abc"), "loops[1].at.count"),
    (_set("loops/1/at/count", -7), "loops[1].at.count"),
    (_set("loops/1/at/inner/at", -1), "loops[1].at.inner.at"),
    (_set("loops/0/kind", "coroutine"), "loops[0].kind"),
    (_both(_set("loops/0/kind", "generator"), _set("loops/0/at", -1)), "loops[0].at"),
    (_both(_set("loops/0/kind", "generator"), _set("loops/0/at", None)), "loops[0].at"),
    (_set("offset", -3), "offset"),
    (_set("offset", "0"), "offset"),
    (_set("loops/1/kind", "zip"), "loops[1].at"),
    (_set("values/__builtins__", {"value": {}}), "values"),
    (_set("values/box/object/__class__", {"value": 1}), "values.box"),
    (_set("values/box/object/count", {"value": 1, "set": [1]}), "values.box.count"),
    (_set("values/count", {"value": object.__new__(Box)}), "values.count.value"),
    (_set("values/count", {"value": [[[[[[[[[[1]]]]]]]]]]}), "values.count.value"),
    (_set("attrs", {"sys": {"path": ["/tmp/planted"]}}), "frames[0]"),  # the old layout's attack
    (_set("code", "print('x')"), "code"),
    (_set("line", True), "line"),
]


@pytest.mark.parametrize(("mutate", "field"), REFUSED_BY_THE_PARSER)
def test_a_section_ferry_never_writes_is_refused_naming_the_field(
    saved: dict[str, Any], mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    tree = copy.deepcopy(saved)
    mutate(tree)
    with pytest.raises(CorruptCheckpointError) as caught:
        frameparse.parse(tree, "ck/step-000000000004")
    message = str(caught.value)
    assert field in message and "\n" not in message
    assert "damaged or was crafted" in message and "resume from an older checkpoint" in message


REFUSED_BY_THE_LIVE_FRAME = [
    # (mutation, what the refusal line says, the names as the restore leaves them)
    (
        _set("values/model", {"value": 3}),
        "`model`: holds a torch.nn.modules.linear.Linear now",
        {"model": "Linear"},
    ),
    (_set("values/mod", {"object": {"sep": {"value": "/tmp"}}}), "`mod`: holds a module now", {"mod": "os"}),
    (_set("values/evil", {"value": 1}), "`evil`: not a variable of this code", {}),
    (_set("values/box/object/planted", {"value": 1}), "`box.planted`: the object has no such attribute", {}),
    (
        _set("values/box/object/count", {"value": "many"}),
        "`box.count`: holds a int now, the checkpoint a str",
        {"box": {"count": 0, "name": "box"}},
    ),
    (
        _set("values/box", {"value": 5}),
        "`box`: holds a test_frame_trust.Box now, not a plain value",
        {"box": {"count": 0, "name": "box"}},
    ),
    (_set("loops/0/at", 10**6), "loops[0] (range): its next value 1000000 is not ahead in the range", {}),
    (_set("loops/0/at", -5), "loops[0] (range): its next value -5 is not ahead in the range", {}),
    (_set("loops/1/at/inner/at", 10**6), "loops[1] (enumerate): position 1000000 is outside the 3 items", {}),
    (
        _set("loops/0/kind", "list_iterator"),
        "loops[0] (list_iterator): the loop iterates a range_iterator now",
        {},
    ),
    (_set("loops/0/slot", 7), "loops[0] (range): no loop's iterator at stack slot 7", {}),
    (
        _set("loops/0/kind", "generator"),
        "loops[0] (generator): the loop iterates a range_iterator now, not the generator the checkpoint's",
        {},
    ),
    (  # an offset only a generator's frame has: the frame is left whole as the resumed run made it
        _set("offset", 0),
        "(in _loop): runs instruction",
        {"epoch": 0, "i": 0, "x": 5, "count": 0, "box": {"count": 0, "name": "box"}},
    ),
]


@pytest.mark.parametrize(("mutate", "said", "left"), REFUSED_BY_THE_LIVE_FRAME)
def test_a_field_that_does_not_fit_the_live_frame_is_not_written_and_said(
    saved: dict[str, Any],
    mutate: Callable[[dict[str, Any]], None],
    said: str,
    left: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path_before, os_sep = list(sys.path), os.sep
    tree = copy.deepcopy(saved)
    mutate(tree)
    frameparse.parse(tree, "ck")  # well formed: only the live frame can refuse it
    run = _resume(tree)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("ferry: warning: not restored: test_frame_trust.py:"), (
        lines
    )
    assert said in lines[0], lines[0]
    assert sys.path == path_before and os.sep == os_sep and not hasattr(Box, "planted")
    expected = {"epoch": 1, "i": 1, "x": 6, "count": 23, "box": {"count": 4, "name": "box"},
                "model": "Linear", "mod": "os", **left}  # fmt: skip
    assert run.after == expected  # the rest is restored


def test_a_renamed_local_is_told_apart_from_the_saved_one(
    saved: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The loop's code is identified by a digest of its bytecode and names: a checkpoint
    whose frame defined `total` where this one defines `count` is not written into."""
    tree = copy.deepcopy(saved)
    frame = _frame(tree)
    frame["names"] = ["total" if n == "count" else n for n in frame["names"]]
    frame["values"]["total"] = frame["values"].pop("count")
    frame["code"] = "0123456789abcdef"
    run = _resume(tree)
    err = capsys.readouterr().err
    assert "the loop's counters and positions are not restored" in err
    assert "`total` no longer defined; `count` new" in err
    assert run.after["count"] == 0 and run.after["epoch"] == 0  # nothing written
