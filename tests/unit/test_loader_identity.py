"""Loader identity in zero-code mode: names from the construction site, and the table of
what a saved position means for a loader (state/loader_identity.py)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ferry.state.loader_identity import (
    Identity,
    Outcome,
    active,
    decide,
    legacy,
    note,
    relocated,
    replays_finished_epoch,
    succeeds,
)

R, C, F = Outcome.RESUME, Outcome.CONTINUE, Outcome.FRESH

#   zero_code, before_restore, driver, built_after_restore, active -> outcome
TABLE = [
    (False, False, False, True, False, R),  # explicit mode: the user's name is the proof
    (True, True, False, False, False, R),  # met while the script replays up to the restore point
    (True, False, True, False, False, R),  # the training loader
    (True, False, False, False, True, R),  # mid-epoch at the checkpoint: same loader, same epoch
    (True, False, False, True, True, R),  # built again, but was mid-iteration: resumed
    (True, False, False, False, False, C),  # a test loader built at the top, between its epochs
    (True, False, False, True, False, F),  # evaluate()'s new loader after the restore point
]


@pytest.mark.parametrize(("zero_code", "before", "driver", "after", "mid", "outcome"), TABLE)
def test_what_a_saved_position_means(
    zero_code: bool, before: bool, driver: bool, after: bool, mid: bool, outcome: Outcome
) -> None:
    facts = {"before_restore": before, "driver": driver, "built_after_restore": after, "active": mid}
    assert decide(zero_code=zero_code, **facts) is outcome


@pytest.mark.parametrize(
    ("position", "mid"),
    [
        ({"batches": 0, "length": 10}, False),
        ({"batches": 3, "length": 10}, True),
        ({"batches": 10, "length": 10}, False),
        ({"batches": 3, "length": None}, True),  # an IterableDataset: no end known
    ],
)
def test_active_means_mid_epoch(position: dict[str, Any], mid: bool) -> None:
    assert active(position) is mid


def test_legacy_names_are_recognised() -> None:
    assert legacy({"loader0": {"batches": 1}, "loader1": {"batches": 0}})
    assert not legacy({"train.py:12": {"batches": 1, "inputs": {}}})
    assert not legacy({"loader0": {"batches": 1, "inputs": {}}})  # new format, odd name


class Sub(DataLoader[Any]):
    def __init__(self, data: Any) -> None:
        super().__init__(data, batch_size=2)
        self.identity = note(self, sys._getframe())  # as the hook sees it, from inside __init__


def build_two() -> list[Any]:
    data = TensorDataset(torch.arange(6))
    return [Sub(data) for _ in range(2)]


def test_site_is_the_line_that_builds_it_and_ordinals_count_per_site() -> None:
    first, second = build_two()
    line = build_two.__code__.co_firstlineno + 2
    assert first.identity.site == f"test_loader_identity.py:{line}"
    assert second.identity.site == first.identity.site
    assert second.identity.ordinal == first.identity.ordinal + 1
    assert second.identity.name == f"{first.identity.site}#{second.identity.ordinal}"
    assert second.identity.serial > first.identity.serial


def test_a_loader_whose_line_moved_finds_its_saved_position() -> None:
    """The script was edited between checkpoint and resume: the one saved site of the same
    file that built a loader with the same inputs is taken, ordinals kept; nothing when that
    is ambiguous, or when the loader's own site is in the checkpoint."""
    train = {"batch_size": 8, "dataset_length": 80, "sampler": "RandomSampler", "drop_last": False}
    test = {**train, "batch_size": 10, "dataset_length": 30, "sampler": "SequentialSampler"}
    saved = {
        "train.py:57#3": {"inputs": train},
        "train.py:80": {"inputs": test},
        "lib.py:60": {"inputs": train},
    }
    moved = Identity(site="train.py:60", ordinal=1, serial=0)
    found = relocated(moved, train, saved)
    assert found is not None and (found.site, found.ordinal, found.name) == (
        "train.py:57",
        1,
        "train.py:57#1",
    )
    assert relocated(moved, {**train, "batch_size": 4}, saved) is None  # other inputs
    assert relocated(Identity(site="train.py:57", ordinal=0, serial=0), train, saved) is None  # its own site
    twins = {"train.py:57": {"inputs": train}, "train.py:58": {"inputs": train}}
    assert relocated(moved, train, twins) is None


@pytest.mark.parametrize(
    ("site", "ordinal", "driver", "replays"),
    [
        ("train.py:57", 0, "train.py:57#2", True),  # a loader per epoch: epochs 0 and 1 are done
        ("train.py:57", 1, "train.py:57#2", True),
        ("train.py:57", 2, "train.py:57#2", False),  # the saved one itself
        ("train.py:57", 0, "train.py:57", False),  # built once
        ("train.py:90", 0, "train.py:57#2", False),  # another line
        ("train.py:57", 0, None, False),  # no training loader saved
    ],
)
def test_training_loaders_built_per_epoch_replay_finished_epochs(
    site: str, ordinal: int, driver: str | None, replays: bool
) -> None:
    assert replays_finished_epoch(Identity(site=site, ordinal=ordinal, serial=0), driver) is replays


def test_a_training_loader_built_anew_takes_over_at_its_line() -> None:
    first = Identity(site="train.py:57", ordinal=0, serial=4)  # its first pass began with 6 built
    assert succeeds(Identity(site="train.py:57", ordinal=1, serial=9), first, 6)
    assert not succeeds(Identity(site="train.py:90", ordinal=0, serial=9), first, 6)  # an evaluation loader
    assert not succeeds(first, first, 6)
    assert not succeeds(None, first, 6)  # explicit mode: the user's names decide
    # Built at the same line before the training loader ran: accelerate's prepare(model, opt,
    # train_dl, eval_dl) makes both shards at the user's one line (the evaluation loader took
    # over as the training loader at its first pass, and ferry's step count went wrong).
    assert not succeeds(Identity(site="train.py:57", ordinal=1, serial=5), first, 6)
