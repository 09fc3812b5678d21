"""What ferry keeps of a Keras fit's callbacks and variables (integrations/_keras_state.py),
on Keras's real callbacks: plain attributes by class and rank, module-level functions by
name (never imported), CSVLogger's file and row writer, and a clear word for what is not
kept. The resumed fits themselves: tests/integration/test_exact_keras.py."""

from __future__ import annotations

import importlib.util
import io
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferry.errors import ConfigError

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="pip install 'gpuferry[keras]'"),
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),  # Keras's, NumPy 2
]
os.environ.setdefault("KERAS_BACKEND", "torch")


@pytest.fixture(scope="module")
def keras() -> Any:
    import keras

    if keras.config.backend() != "torch":
        pytest.skip("Keras was imported with another backend in this process")
    return keras


@pytest.fixture(scope="module")
def state(keras: Any) -> Any:
    from ferry.integrations import _keras_state

    return _keras_state


def test_callbacks_come_back_with_their_plain_state_and_say_what_is_not_kept(
    keras: Any, state: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Mine(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.count, self.best, self.seen = 0, float("inf"), {"a": [1, 2]}
            self.tags: set[str] = set()
            self.weights = [np.zeros(3, dtype="float32")]
            self.reduce = np.mean
            self.pick = lambda logs: logs
            self.log = io.StringIO()

    first, second = Mine(), Mine()
    first.count, first.best, first.tags = 7, np.float32(0.25), {"x", "y"}
    first.seen["a"].append(3)
    first.weights[0][:] = 1.5
    first.reduce = np.median
    second.count = 1
    with caplog.at_level(logging.WARNING, logger="ferry"):
        saved = state.callbacks([first, second])
        state.callbacks([first, second])
    assert [key.rsplit(".", 1)[-1] for key in sorted(saved)] == ["Mine#0", "Mine#1"]
    # the open file is named once; the lambda (set by __init__, the same in a resumed run) is not
    said = [r.getMessage() for r in caplog.records if "not kept" in r.getMessage()]
    assert len(said) == 1 and ".<locals>.Mine.log (a StringIO) is not kept in checkpoints" in said[0], said

    again, other = Mine(), Mine()
    state.apply_callbacks([again, other], saved)
    assert (again.count, again.best, again.tags, again.seen) == (
        7,
        np.float32(0.25),
        {"x", "y"},
        {"a": [1, 2, 3]},
    )
    assert again.reduce is np.median and np.array_equal(again.weights[0], np.full(3, 1.5, dtype="float32"))
    assert other.count == 1
    first.weights[0][:] = 9  # a copy was kept, not the live array
    assert np.array_equal(again.weights[0], np.full(3, 1.5, dtype="float32"))


def test_a_monitor_keeps_its_comparison_and_the_sign_of_min_delta(keras: Any, state: Any) -> None:
    """Keras sets ``monitor_op`` lazily and flips ``min_delta``'s sign when it does: put back
    without ``monitor_op``, the next epoch would flip it a second time."""
    stopping = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.03, patience=2)
    stopping._set_monitor_op()
    stopping.wait, stopping.best = 1, 0.5
    saved = state.callbacks([stopping])
    fresh = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.03, patience=2)
    fresh.on_train_begin()
    state.apply_callbacks([fresh], saved)
    assert fresh.monitor_op is keras.src.ops.less and fresh.min_delta == pytest.approx(-0.03)
    assert (fresh.wait, fresh.best) == (1, 0.5)


def test_unknown_functions_are_looked_up_not_imported(state: Any) -> None:
    assert state._find_function(["ferry_no_such_module", "f"]) is None
    assert state._find_function(["numpy", "mean"]) is np.mean


def test_the_csv_log_comes_back_and_goes_on_without_a_second_header(
    keras: Any, state: Any, tmp_path: Path
) -> None:
    path = tmp_path / "log.csv"
    logger = keras.callbacks.CSVLogger(str(path))
    logger.on_train_begin()
    logger.on_epoch_end(0, {"loss": 0.5})
    saved = state.callbacks([logger])
    logger.on_epoch_end(1, {"loss": 0.25})  # past the checkpoint: lost with the stopped process

    resumed = keras.callbacks.CSVLogger(str(path))
    resumed.on_train_begin()  # opens the file for writing: empty
    state.apply_callbacks([resumed], saved)
    resumed.on_epoch_end(1, {"loss": 0.3})
    resumed.on_train_end()
    assert path.read_text().splitlines() == ["epoch,loss,val_loss", "0,0.5,NA", "1,0.3,NA"]


def test_a_model_with_other_variables_is_refused_with_the_fix(keras: Any, state: Any) -> None:
    def model(width: int) -> Any:
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(width, name="dense")], name="m")
        m.compile(optimizer=keras.optimizers.SGD(name="sgd"), loss="mse")
        return m

    saved = state.variables(model(2))
    target = model(2)
    state.apply_variables(target, saved)
    assert all(
        np.array_equal(keras.ops.convert_to_numpy(v), saved[k])
        for k, v in state._variable_map(target).items()
    )
    with pytest.raises(
        ConfigError, match="resume with the model and optimizer the checkpoint was taken with"
    ):
        bigger = model(4)
        bigger.add(keras.layers.Dense(1, name="head"))
        state.apply_variables(bigger, saved)
