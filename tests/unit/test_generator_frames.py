"""A loop over a generator that wraps the loader, in process: the generator runs at the safe
point (it asked for the item), so its frame is one of the loop's frames, and its state (the
items it holds ahead, the random draws it made) comes back with it; a loop over it keeps its
``enumerate`` count. A generator that resumes at another instruction than it was saved at is
not written, and that is said (``autotrack/restore.py``)."""

from __future__ import annotations

import copy
import random
import threading
from collections import UserDict
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ferry.autotrack import stack
from ferry.autotrack.keeper import LoopKeeper
from ferry.state import frameparse

pytestmark = pytest.mark.skipif(
    not stack.supported(), reason="frame stacks readable on CPython 3.11-3.13 only"
)


class Stop(Exception):
    """Ends the stopped run at its checkpoint."""


class TrackedIter:
    """The loader's part, named as the iterator ferry's tracked loaders hand out (so that
    the capture takes it for theirs): hands out 0..7 from ``run.start``; a request may be
    the checkpoint (at ``run.stop_at`` items handed out) or the restore point (the resumed
    run's first request)."""

    def __init__(self, run: SimpleNamespace) -> None:
        self.run, self.handed = run, run.start

    def __iter__(self) -> TrackedIter:
        return self

    def __next__(self) -> int:
        run = self.run
        if run.tree is not None and not run.restored:
            run.restored = True
            run.keeper.restore(run.tree)
            random.setstate(run.rng)  # the session's part: the random streams as they were
        elif run.tree is None and self.handed == run.stop_at:
            run.tree, run.rng = run.keeper.capture({}, None), random.getstate()
            raise Stop
        if self.handed == 8:
            raise StopIteration
        self.handed += 1
        return self.handed - 1


def ahead(source: Iterator[int]) -> Iterator[tuple[int, float]]:
    """timm's PrefetchLoader in miniature: holds the next item, transformed with a random
    draw (a draw the resumed run must not make again)."""
    first = True
    held: tuple[int, float] = (-1, 0.0)
    for item in source:
        noisy = (item, round(random.random(), 6))
        if not first:
            yield held
        first = False
        held = noisy
    if not first:
        yield held


def primed(source: Iterator[int]) -> Iterator[tuple[int, float]]:
    """The same, asking for its first item with next(): a resumed one asks at another line."""
    it = iter(source)
    held = (next(it), 0.0)
    for item in it:
        yield held
        held = (item, round(random.random(), 6))
    yield held


def each(source: Iterator[int]) -> Iterator[tuple[int, float]]:
    """A generator expression over the loader, holding nothing ahead."""
    return ((item, round(random.random(), 6)) for item in source)


def _loop(run: SimpleNamespace, wrapper: Callable[..., Iterator[tuple[int, float]]]) -> None:
    run.keeper = LoopKeeper()
    random.seed(5)
    for i, (item, noise) in enumerate(wrapper(TrackedIter(run))):
        run.seen.append((i, item, noise))


def _run(wrapper: Callable[..., Iterator[tuple[int, float]]], **fields: Any) -> SimpleNamespace:
    run = SimpleNamespace(
        **{"tree": None, "restored": False, "start": 0, "stop_at": None, "seen": [], **fields}
    )

    def target() -> None:  # a thread: the loop's frames are the only user frames on its stack
        try:
            _loop(run, wrapper)
        except Stop:
            pass
        except BaseException as exc:  # raised again in the test's thread
            run.error = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if getattr(run, "error", None) is not None:
        raise run.error
    return run


@pytest.mark.parametrize("wrapper", [ahead, primed, each])
def test_a_generator_that_wraps_the_loader_resumes_where_it_was(
    wrapper: Callable[..., Iterator[tuple[int, float]]], capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _run(wrapper).seen
    assert [s[1] for s in plain] == list(range(8))
    stopped = _run(wrapper, stop_at=5)  # 5 handed out: 0-3 consumed, 4 held (with its draw)
    assert [s[1] for s in stopped.seen] == [0, 1, 2, 3, 4][: 5 if wrapper is each else 4]
    tree = copy.deepcopy(stopped.tree)
    *_, loop_frame, generator_frame, _request = frameparse.parse(tree, "ck").frames  # type: ignore[union-attr]
    assert generator_frame.offset is not None and loop_frame.offset is None
    assert [lp.state.kind for lp in loop_frame.loops] == ["enumerate"]
    resumed = _run(
        wrapper, tree=tree, rng=stopped.rng, start=5
    )  # the loader continues after what was handed out
    err = capsys.readouterr().err
    if wrapper is not primed:
        assert stopped.seen + resumed.seen == plain
        assert err == ""
    else:  # resumed at its next(): nothing of it is written, and that is said
        assert "primed" in err and "not exact" in err and "runs instruction" in err
        assert stopped.seen + resumed.seen != plain


def boxed(source: Iterator[int]) -> Iterator[UserDict[str, torch.Tensor]]:
    """Holds its next batch in a library object with a tensor in it: not captured, said."""
    held = None
    for item in source:
        if held is not None:
            yield held
        held = UserDict(x=torch.full((2,), float(item)), y=torch.zeros(1))


def test_a_batch_held_in_an_object_ferry_cannot_capture_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    _run(boxed, stop_at=3)
    err = capsys.readouterr().err
    assert "(in boxed): `held`: the generator holds a collections.UserDict with tensors in it" in err, err
    assert "not restored after a resume" in err
