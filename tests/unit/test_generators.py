"""Random generators of the script's own are tracked as they are and restored in place."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ferry.config import Config
from ferry.engine import load, save
from ferry.errors import UnsupportedStateError
from ferry.session import Session
from ferry.state.generators import GeneratorState


def draws(py: random.Random, npg: np.random.Generator, tg: torch.Generator) -> list[float]:
    return [py.random(), float(npg.standard_normal()), float(torch.rand(1, generator=tg))]


def test_generators_continue_exactly_after_a_round_trip(tmp_path: Path) -> None:
    py, npg, tg = random.Random(1), np.random.default_rng(2), torch.Generator().manual_seed(3)
    draws(py, npg, tg)
    state = {n: GeneratorState(g) for n, g in {"py": py, "np": npg, "torch": tg}.items()}
    save(state, str(tmp_path), step=1)
    expected = draws(py, npg, tg)
    py2, npg2, tg2 = random.Random(9), np.random.default_rng(9), torch.Generator().manual_seed(9)
    load(str(tmp_path), into={n: GeneratorState(g) for n, g in {"py": py2, "np": npg2, "torch": tg2}.items()})
    assert draws(py2, npg2, tg2) == expected


def test_track_takes_generators_and_refuses_other_objects(tmp_path: Path) -> None:
    session = Session.start(Config(dir=str(tmp_path / "ck"), job_dir=str(tmp_path / "job"), job_id="g"))
    try:
        rng = np.random.default_rng(0)
        session.track(rng=rng)
        assert session.objects["rng"].rng is rng
        with pytest.raises(UnsupportedStateError, match="random generators"):
            session.track(thing=object())
    finally:
        session.close()
