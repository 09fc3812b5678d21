"""Issue 16: the library surface. ``dir(ferry)`` lists the lazily imported API,
``help(ferry.track)`` shows the whole docstring, and zero-code mode warns about a global
generator only when training draws from it after the first safe point, unless silenced."""

from __future__ import annotations

import logging
import pydoc
import subprocess
import sys

import pytest

import ferry
from ferry.config import Config
from ferry.session.rngwatch import GeneratorWatch, used_since


def test_dir_lists_the_api_before_any_of_it_is_imported() -> None:
    code = "import ferry, sys; print(' '.join(dir(ferry))); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, torch_loaded = out.splitlines()
    assert {"track", "step", "checkpoint", "restore", "configure", "close", "Config", "FerryError",
            "global_step", "resumed", "save", "load"} <= set(names.split())  # fmt: skip
    assert torch_loaded == "False"  # listing imports nothing
    assert set(ferry.__all__) <= set(dir(ferry))


@pytest.mark.parametrize("name", ["track", "step", "checkpoint", "restore", "configure", "close"])
def test_help_shows_the_whole_docstring(name: str) -> None:
    text = pydoc.render_doc(getattr(ferry, name), renderer=pydoc.plaintext)
    doc = getattr(ferry, name).__doc__
    assert doc is not None and len(doc.splitlines()) >= 3
    assert all(line.strip() in text for line in doc.splitlines())


def test_help_of_the_track_docstring_names_what_it_accepts() -> None:
    doc = ferry.track.__doc__ or ""
    for what in ("state_dict()", "DataLoader", "dict", "Generator", "UnsupportedStateError", "Example"):
        assert what in doc, what


A, B = ("a numpy Generator", 1), ("a random.Random", 7)


@pytest.mark.parametrize(
    ("first", "now", "ignored", "warned", "used"),
    [
        ({"g": 1, "r": 7}, {"g": A, "r": B}, (), (), []),  # nothing drawn since
        ({"g": 0, "r": 7}, {"g": A, "r": B}, (), (), [("g", "a numpy Generator")]),
        ({"g": 0, "r": 0}, {"g": A, "r": B}, (), (), [("g", "a numpy Generator"), ("r", "a random.Random")]),
        ({"g": 0}, {"g": A}, ("g",), (), []),  # silenced by name
        ({"g": 0}, {"g": A}, (), ("g",), []),  # told once already
        ({}, {"g": A}, (), (), []),  # first seen now: compared from here on
    ],
)
def test_used_since(
    first: dict[str, int],
    now: dict[str, tuple[str, int]],
    ignored: tuple[str, ...],
    warned: tuple[str, ...],
    used: list[tuple[str, str]],
) -> None:
    assert used_since(first, now, ignored, warned) == used


def test_the_watch_warns_once_per_used_generator(caplog: pytest.LogCaptureFixture) -> None:
    state = {"setup": 1, "noise": 1, "quiet": 1}
    watch = GeneratorWatch(lambda: {k: ("a random.Random", v) for k, v in state.items()}, ignored=["quiet"])
    state["setup"] = 2  # drawn while setting up, before the first safe point
    watch.start()
    watch.check()
    assert caplog.records == []
    state["noise"] += 1
    state["quiet"] += 1
    with caplog.at_level(logging.WARNING, logger="ferry"):
        watch.check()
        state["noise"] += 1
        watch.check()
    (record,) = caplog.records
    assert "global noise (a random.Random) is not captured" in record.getMessage()
    assert "FERRY_IGNORE_GENERATORS=noise" in record.getMessage()


def test_ignore_generators_from_the_environment() -> None:
    assert Config.from_env({"FERRY_IGNORE_GENERATORS": "rng, split"}).ignore_generators == ("rng", "split")
    assert Config().ignore_generators == ()
