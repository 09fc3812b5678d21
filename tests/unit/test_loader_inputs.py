"""What a loader position depends on, and what a resume may change (state/inputs.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ferry.state.inputs import Verdict, changes, command_change, loader_inputs, refusal, verdict


def test_loader_inputs_are_plain_values() -> None:
    data = TensorDataset(torch.arange(10))
    assert loader_inputs(DataLoader(data, batch_size=4, shuffle=True, drop_last=True)) == {
        "batch_size": 4,
        "dataset_length": 10,
        "sampler": "RandomSampler",
        "drop_last": True,
    }
    assert loader_inputs(DataLoader(data, batch_size=3))["sampler"] == "SequentialSampler"


@pytest.mark.parametrize(
    ("saved", "now", "expected"),
    [
        ({"batch_size": 8}, {"batch_size": 8}, []),
        (
            {"batch_size": 8, "dataset_length": 80},
            {"batch_size": 4, "dataset_length": 90},
            ["batch_size 8 -> 4", "dataset_length 80 -> 90"],
        ),
        (
            {"sampler": "RandomSampler"},
            {"sampler": "SequentialSampler"},
            ["sampler 'RandomSampler' -> 'SequentialSampler'"],
        ),
        ({}, {"batch_size": 4}, []),  # a checkpoint from before the record: nothing to compare
    ],
)
def test_changes_name_old_and_new(saved: dict[str, Any], now: dict[str, Any], expected: list[str]) -> None:
    assert changes(saved, now) == expected


@pytest.mark.parametrize(
    ("position_changes", "command_changed", "allowed", "outcome"),
    [
        ([], False, False, Verdict.SAME),
        ([], True, False, Verdict.WARN),  # more epochs, another log interval: a resume's business
        (["batch_size 8 -> 4"], False, False, Verdict.REFUSE),
        (["batch_size 8 -> 4"], True, False, Verdict.REFUSE),
        (["batch_size 8 -> 4"], False, True, Verdict.WARN),
    ],
)
def test_verdict(position_changes: list[str], command_changed: bool, allowed: bool, outcome: Verdict) -> None:
    assert verdict(position_changes, command_changed=command_changed, allowed=allowed) is outcome


def test_command_change_and_refusal_say_what_changed_and_the_override() -> None:
    assert command_change(None, ["train.py"]) is None
    assert command_change(["train.py", "--lr", "1"], ["train.py", "--lr", "1"]) is None
    assert command_change(["train.py"], ["train.py", "--bs", "4"]) == (
        "command line 'train.py' -> 'train.py --bs 4'"
    )
    message = refusal("/ck/step-7", "train.py:12", ["batch_size 8 -> 4"])
    assert "\n" not in message
    assert "batch_size 8 -> 4" in message and "--allow-changed-inputs" in message
    assert "FERRY_ALLOW_CHANGED_INPUTS=1" in message
