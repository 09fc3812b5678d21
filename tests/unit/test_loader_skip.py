"""Resuming a DataLoader epoch at the sampler, in process, through the loader tracker.

For each loader shape (shuffle with the global RNG or an explicit ``generator=``, 0 or 2
workers, persistent or not, ``drop_last`` or not): an "interrupted run" takes k batches
of epoch 0 and its ``tracker.position()``; a "fresh process" (hooks removed, every RNG
reseeded elsewhere, a new loader) resumes from that position and must yield exactly the
batches the uninterrupted epoch had left, then the uninterrupted next epoch; and the
dataset must never have been asked for a skipped sample.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from ferry.state.loader import Hooks, LoaderTracker, track_loader, untrack_all
from ferry.state.rng import GlobalRNG

N = 30  # batch 4: 8 batches (the last of 2), or 7 with drop_last
BATCH = 4
SEED, GEN_SEED = 1234, 99
OTHER_SEED, OTHER_GEN_SEED = 5, 6  # the "fresh process" seeds differently on purpose


class Recording(Dataset[torch.Tensor]):
    """Sample i is the tensor i; every ``__getitem__`` call is appended to a file, so the
    calls made in worker processes are seen too."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        return torch.tensor(i)


def loaded(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


@dataclass(frozen=True)
class Shape:
    generator: bool
    workers: int
    persistent: bool
    drop_last: bool

    def __str__(self) -> str:
        gen = "gen" if self.generator else "global"
        pers = "-persistent" if self.persistent else ""
        return f"{gen}-w{self.workers}{pers}-{'drop' if self.drop_last else 'keep'}"

    @property
    def checks_next_epoch(self) -> bool:
        """The next epoch after the resumed one is checked in process and with persistent
        workers (the iterator that resumed goes on); a non-persistent pool is just made anew."""
        return self.persistent or not self.workers

    def loader(self, log: Path, gen_seed: int) -> DataLoader[torch.Tensor]:
        gen = torch.Generator().manual_seed(gen_seed) if self.generator else None
        return DataLoader(
            Recording(log),
            batch_size=BATCH,
            shuffle=True,
            generator=gen,
            num_workers=self.workers,
            persistent_workers=self.persistent,
            drop_last=self.drop_last,
        )


SHAPES = [
    Shape(g, w, p, d)
    for g in (False, True)
    for (w, p) in ((0, False), (2, False), (2, True))
    for d in (False, True)
]
KS = ("0", "1", "mid", "last", "end")  # "last": one batch left; "end": none left


def resume_cases() -> list[Any]:
    """Every shape in the session's lazy mode; the explicit mode differs only in how the RNG is
    put back, so it runs on the in-process shapes. Worker shapes take fewer k (each epoch
    forks two workers) and stay within this file's time budget."""
    cases = []
    for shape in SHAPES:
        for mode in ("lazy", "explicit"):
            if shape.workers and mode == "explicit":
                continue
            for k in KS if not shape.workers else ("1", "last", "end"):
                cases.append(pytest.param(shape, mode, k, id=f"{shape}-{mode}-{k}"))
    return cases


def k_of(name: str, n_batches: int) -> int:
    return {"0": 0, "1": 1, "mid": n_batches // 2, "last": n_batches - 1, "end": n_batches}[name]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def ids(batches: Iterator[torch.Tensor] | list[torch.Tensor]) -> list[list[int]]:
    return [b.tolist() for b in batches]


class Recorder(Hooks):
    """A minimal session: counts the hook calls; at the restore point it does what the
    session does there (every global RNG stream and the loader's generators back to the
    state they had when the position was taken)."""

    def __init__(self, restore: Callable[[LoaderTracker], None] | None = None) -> None:
        self.restore = restore
        self.events: list[str] = []

    def fast_forwarding(self, tracker: LoaderTracker) -> bool:
        return self.restore is not None

    def at_restore_point(self, tracker: LoaderTracker) -> None:
        self.events.append("restore")
        if self.restore is not None:
            self.restore(tracker)
            self.restore = None

    def before_batch(self, tracker: LoaderTracker) -> None:
        self.events.append(f"before {tracker.batches}")

    def after_batch(self, tracker: LoaderTracker) -> None:
        self.events.append(f"after {tracker.batches}")


@dataclass
class Interrupted:
    reference: list[list[list[int]]]  # uninterrupted epochs 0 and 1, untracked
    n_batches: int
    taken: list[list[int]]  # epoch 0 as the tracked, interrupted run saw it
    positions: dict[int, tuple[dict[str, Any], dict[str, Any]]]  # k -> (position, global rng)


@pytest.fixture(autouse=True)
def clean_hooks() -> Iterator[None]:
    untrack_all()
    yield
    untrack_all()


@pytest.fixture(scope="module")
def interrupted_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[Shape, Interrupted]:
    return {}


def interrupted(cache: dict[Shape, Interrupted], shape: Shape, tmp: Path) -> Interrupted:
    """The uninterrupted reference, and one tracked pass over epoch 0 that takes the
    position at every k (a position is all a checkpoint keeps of the loader)."""
    if shape in cache:
        return cache[shape]
    seed_all(SEED)
    plain = shape.loader(tmp / "ref.log", GEN_SEED)
    reference = [ids(plain) for _ in range(2 if shape.checks_next_epoch else 1)]
    del plain

    seed_all(SEED)
    loader = shape.loader(tmp / "run.log", GEN_SEED)
    tracker = track_loader("loader", loader, Recorder())
    it = iter(loader)
    n = len(reference[0])
    positions, taken = {}, []
    for k in range(n + 1):
        positions[k] = (tracker.position(), GlobalRNG().state_dict())
        if k < n:
            taken.append(next(it).tolist())
    del it, loader
    untrack_all()
    cache[shape] = Interrupted(reference, n, taken, positions)
    return cache[shape]


def resumed(
    shape: Shape, log: Path, position: dict[str, Any], rng: dict[str, Any], lazy: bool = True
) -> tuple[DataLoader[torch.Tensor], LoaderTracker, Recorder]:
    """The fresh process: different seeds, a new loader, a new tracker, resuming at
    ``position``. ``lazy``: as ``ferry.track(loader=..., model=...)``, the state restored at
    the restore point; else as ``ferry.restore()`` before the loop, state first, the loader
    at its next ``iter()``."""
    seed_all(OTHER_SEED)
    loader = shape.loader(log, OTHER_GEN_SEED)

    def restore_session_state(tracker: LoaderTracker) -> None:
        GlobalRNG().load_state_dict(rng)
        tracker.restore_generators(position)

    if lazy:
        hooks = Recorder(restore=restore_session_state)
        tracker = track_loader("loader", loader, hooks)
        tracker.resume_at, tracker.restore_pending = position, True
    else:
        hooks = Recorder()
        tracker = track_loader("loader", loader, hooks)
        restore_session_state(tracker)
        tracker.resume_at, tracker.relative = position, True
    return loader, tracker, hooks


@pytest.mark.parametrize(("shape", "mode", "k_name"), resume_cases())
def test_resume_yields_exactly_the_rest_and_loads_nothing_skipped(
    shape: Shape, mode: str, k_name: str, tmp_path: Path, interrupted_runs: dict[Shape, Interrupted]
) -> None:
    run = interrupted(interrupted_runs, shape, tmp_path.parent)
    assert len(run.reference[0]) == (7 if shape.drop_last else 8)
    assert run.taken == run.reference[0], "tracking changed the order of an uninterrupted epoch"
    k = k_of(k_name, run.n_batches)
    position, rng = run.positions[k]
    assert (position["epoch"], position["batches"]) == (0, k)

    log = tmp_path / "resumed.log"
    loader, tracker, hooks = resumed(shape, log, position, rng, lazy=mode == "lazy")

    rest = ids(loader)
    rest_loaded, events = loaded(log), list(hooks.events)
    rest_position = tracker.position()["batches"]
    nxt, nxt_loaded = None, None
    if shape.checks_next_epoch:  # the next epoch must be the uninterrupted run's, in full
        log.unlink(missing_ok=True)
        nxt = ids(loader)
        nxt_loaded = loaded(log)
    epoch_after = (tracker.epoch, tracker.batches)
    del loader  # a failing assert below must not keep (persistent) workers alive until exit

    assert rest == run.reference[0][k:]
    assert rest_position == run.n_batches
    assert sorted(rest_loaded) == sorted(i for b in rest for i in b), "a skipped sample was loaded"
    if mode == "lazy":
        assert events[0] == "restore" and events.count("restore") == 1
        assert events[1] == f"before {k}"
    else:
        assert "restore" not in events and events[0] == f"before {k}"
    if nxt is not None:
        assert nxt == run.reference[1]
        assert sorted(nxt_loaded or []) == sorted(i for b in nxt for i in b)
        assert epoch_after == (1, run.n_batches)


FAST_FORWARD = [
    pytest.param(Shape(False, 0, False, False), id="global-w0-keep"),
    pytest.param(Shape(True, 0, False, True), id="gen-w0-drop"),
    pytest.param(Shape(True, 2, False, False), id="gen-w2-keep"),
    pytest.param(Shape(False, 2, True, False), id="global-w2-persistent-keep"),
    pytest.param(Shape(True, 2, True, True), id="gen-w2-persistent-drop"),
]


@pytest.mark.parametrize("shape", FAST_FORWARD)
def test_completed_epochs_are_fast_forwarded_without_loading(shape: Shape, tmp_path: Path) -> None:
    """Interrupted in epoch 2 at batch 3: the resumed run's loop still iterates epochs 0 and
    1, which yield nothing and load nothing, then gets the rest of epoch 2 exactly."""
    seed_all(SEED)
    plain = shape.loader(tmp_path / "ref.log", GEN_SEED)
    reference = [ids(plain) for _ in range(3)]
    del plain

    seed_all(SEED)
    loader = shape.loader(tmp_path / "run.log", GEN_SEED)
    tracker = track_loader("loader", loader, Recorder())
    for epoch in range(2):
        assert ids(loader) == reference[epoch]
    it = iter(loader)
    for _ in range(3):
        next(it)
    position, rng = tracker.position(), GlobalRNG().state_dict()
    assert (position["epoch"], position["batches"]) == (2, 3)
    del it, loader
    untrack_all()

    log = tmp_path / "resumed.log"
    loader, tracker, hooks = resumed(shape, log, position, rng)
    skipped = [ids(loader), ids(loader)]
    skipped_loaded, events = loaded(log), list(hooks.events)
    rest = ids(loader)
    rest_loaded = loaded(log)
    del loader  # a failing assert below must not keep (persistent) workers alive until exit

    assert skipped == [[], []]
    assert skipped_loaded == [] and events == []
    assert rest == reference[2][3:]
    assert sorted(rest_loaded) == sorted(i for b in reference[2][3:] for i in b)


@pytest.mark.parametrize("shape", [Shape(False, 0, False, False), Shape(True, 0, False, True)], ids=str)
def test_a_step_loop_jumps_straight_to_the_saved_position(shape: Shape, tmp_path: Path) -> None:
    """``next(it)`` with a re-``iter()`` on StopIteration: an empty fast-forwarded epoch would
    end such a loop, so its first ``next()`` goes to the saved position (epoch 2, batch 2)
    at once; the loop then runs on into epoch 3 as the uninterrupted run did."""
    seed_all(SEED)
    plain = shape.loader(tmp_path / "ref.log", GEN_SEED)
    reference = [ids(plain) for _ in range(4)]
    del plain

    seed_all(SEED)
    loader = shape.loader(tmp_path / "run.log", GEN_SEED)
    tracker = track_loader("loader", loader, Recorder())
    for _ in range(2):
        for _batch in loader:
            pass
    it = iter(loader)
    next(it), next(it)
    position, rng = tracker.position(), GlobalRNG().state_dict()
    assert (position["epoch"], position["batches"]) == (2, 2)
    del it, loader
    untrack_all()

    log = tmp_path / "resumed.log"
    loader, tracker, hooks = resumed(shape, log, position, rng)
    expected = reference[2][2:] + reference[3]
    got: list[list[int]] = []
    it = iter(loader)
    while len(got) < len(expected):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        got.append(batch.tolist())
    assert got == expected
    assert sorted(loaded(log)) == sorted(i for b in expected for i in b)
    assert hooks.events[:2] == ["restore", "before 2"]
