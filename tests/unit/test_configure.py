"""``ferry.configure``: a whole ``Config``, keyword settings over the environment (the old
form), or both; its typed keywords are ``Config``'s fields, no more, no fewer."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

import ferry
from ferry.config import Config, Overrides
from ferry.errors import ConfigError, FerryError


@pytest.fixture
def where(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {"dir": str(tmp_path / "ck"), "job_dir": str(tmp_path / "job"), "job_id": "c"}
    ferry.close()


def test_the_keywords_are_configs_fields_each_optional() -> None:
    hints = typing.get_type_hints(Overrides)
    config = typing.get_type_hints(Config)
    assert set(hints) == {f.name for f in fields(Config)}
    for name, hint in hints.items():
        assert hint == config[name] | None, name


def test_keywords_over_the_environment(where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_KEEP_LAST", "5")
    monkeypatch.setenv("FERRY_EVERY_STEPS", "9")
    session = ferry.configure(**where, every_steps=4, every_seconds=None)
    assert (session.config.every_steps, session.config.keep_last) == (4, 5)
    assert session.config.every_seconds is None


def test_a_config_and_keywords_over_it(where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_KEEP_LAST", "5")  # a whole Config: the variables do not fill it in
    session = ferry.configure(Config(**where, every_steps=3), every_steps=6, keep_every=None)
    assert (session.config.every_steps, session.config.keep_last, session.config.keep_every) == (6, 3, None)
    assert session.config.dir == where["dir"]
    with pytest.raises(FerryError, match="already configured"):
        ferry.configure(Config(**where))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"every_step": 3}, r"unknown setting\(s\) every_step; the settings are: "),
        ((Config(),), {"every_step": 3}, r"unknown setting\(s\) every_step; the settings are: "),
        (("/scratch/run1",), {}, r"takes a ferry.Config or settings by keyword, not a str"),
        ((Config(),), {"keep_last": -1}, r"keep_last"),
    ],
    ids=["unknown keyword", "unknown keyword over a Config", "a path instead of a Config", "out of range"],
)
def test_bad_settings_are_refused_before_anything_starts(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        ferry.configure(*args, **kwargs)  # type: ignore[arg-type]
    assert ferry.current(create=False) is None
