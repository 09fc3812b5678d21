"""The training state's checkpoint tree: the same layout as ever, parsed back, refused when
its shape is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ferry.engine import load, save
from ferry.engine.catalog import list_checkpoints
from ferry.errors import CorruptCheckpointError
from ferry.state.grads import Gradients
from ferry.state.rng import GlobalRNG
from ferry.state.training import TrainingState
from ferry.storage import open_storage


def live() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()  # mid-accumulation: grads are state
    return {"model": model, "progress": {"epoch": 2}}


def old_tree(objects: dict[str, Any]) -> dict[str, Any]:
    """The tree as the session built it before TrainingState, literally."""
    return {
        "objects": objects,
        "ferry": {
            "global_step": 7,
            "rng": GlobalRNG(),
            "grads": {n: Gradients(m) for n, m in objects.items() if isinstance(m, nn.Module)},
            "loaders": {},
            "driver": None,
        },
    }


def manifest(root: Path) -> dict[str, Any]:
    storage = open_storage(str(root))
    name = list_checkpoints(storage)[-1].name
    doc: dict[str, Any] = json.loads(storage.read_bytes(f"{name}/manifest.json"))
    return doc


def test_the_tree_is_byte_for_byte_the_layout_of_before(tmp_path: Path) -> None:
    objects = live()
    save(old_tree(objects), str(tmp_path / "old"), step=7)
    state = TrainingState.capture(objects, {}, global_step=7, driver=None, keep_objects=lambda _: True)
    save(state.tree(), str(tmp_path / "new"), step=7)
    old, new = manifest(tmp_path / "old"), manifest(tmp_path / "new")
    assert new["tree"] == old["tree"]
    assert new["files"] == old["files"]


def test_a_saved_state_parses_back(tmp_path: Path) -> None:
    objects = live()
    state = TrainingState.capture(objects, {}, global_step=7, driver=None, keep_objects=lambda _: True)
    save(state.tree(), str(tmp_path), step=7)
    loaded = load(str(tmp_path))
    back = TrainingState.parse(loaded.state, loaded.url)
    assert back.global_step == 7 and back.driver is None and back.sharded_optimizers is None
    assert back.saved_object("progress") == {"epoch": 2}
    assert set(back.grads["model"]) == {"weight", "bias"}
    assert set(back.rng) >= {"python", "numpy", "torch"}


def test_a_rank_part_without_objects_takes_rank_zeros() -> None:
    main = TrainingState.parse({"objects": {"m": 1}, "ferry": ferry_section(step=5)}, "main")
    part = TrainingState.parse({"ferry": ferry_section(step=5, driver="loader")}, "part", part=True)
    view = main.with_part(part)
    assert view.objects == {"m": 1} and view.driver == "loader"


def ferry_section(**changes: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"global_step": 5, "rng": {}, "loaders": {}, "driver": None}
    if "step" in changes:
        section["global_step"] = changes.pop("step")
    return {**section, **changes}


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        ({"objects": {}}, "no 'ferry' section"),
        ({"model": {}}, "no 'ferry' section"),
        ([1, 2], "no 'ferry' section"),
        ({"ferry": ferry_section()}, "objects is not a dict"),
        ({"objects": [], "ferry": ferry_section()}, "objects is not a dict"),
        ({"objects": {}, "ferry": ferry_section(step="5")}, "global_step is not a step number"),
        ({"objects": {}, "ferry": ferry_section(step=-1)}, "global_step is not a step number"),
        ({"objects": {}, "ferry": ferry_section(step=True)}, "global_step is not a step number"),
        ({"objects": {}, "ferry": ferry_section(rng=None)}, "rng is not a dict"),
        ({"objects": {}, "ferry": ferry_section(loaders={"a": 3})}, r"loaders\.a is not a dict"),
        ({"objects": {}, "ferry": ferry_section(driver=3)}, "driver is not a loader name"),
        ({"objects": {}, "ferry": ferry_section(grads=[])}, "grads is not a dict"),
        ({"objects": {}, "ferry": ferry_section(sharded_optimizers=1)}, "sharded_optimizers is not a dict"),
    ],
)
def test_a_wrong_shape_is_a_corrupt_checkpoint(tree: Any, match: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=match):
        TrainingState.parse(tree, "ckpt")


def test_the_oldest_trees_have_no_grads() -> None:
    state = TrainingState.parse({"objects": {}, "ferry": ferry_section()}, "ckpt")
    assert state.grads == {}
