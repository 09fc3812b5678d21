"""Config: every bad setting is refused with a ConfigError that names the fix; FERRY_*
environment variables map onto the fields in one place, ``Config.from_env``."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from ferry import Config, ConfigError, FerryError
from ferry.runtime.grace import slow_save_warning
from ferry.runtime.identity import default_job_id


def test_the_defaults_are_valid_and_documented() -> None:
    config = Config()
    assert config.dir == "ferry-checkpoints"
    assert (config.exit_code, config.failure_exit_code) == (85, 86)
    assert config.stop_signals == ("SIGUSR1", "SIGTERM")
    assert config.checkpoint_signals == ("SIGUSR2",)
    assert config.every_steps is None and config.every_seconds is None
    assert config.resume and config.async_save


def test_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Config("ckpts")  # type: ignore[misc]


# (settings, words the message must contain: the field, the bad value, and what to do)
BAD = [
    ({"every_steps": 0}, ["every_steps", ">= 1", "got 0"]),
    ({"every_steps": -3}, ["every_steps", ">= 1", "got -3"]),
    ({"every_seconds": 0}, ["every_seconds", "> 0", "got 0"]),
    ({"every_seconds": -1.5}, ["every_seconds", "> 0", "got -1.5"]),
    ({"keep_last": 0}, ["keep_last", ">= 1", "last good checkpoint", "got 0"]),
    ({"exit_code": 0}, ["exit_code 0", "1..255", "differ from 0"]),
    ({"exit_code": 256}, ["exit_code 256", "1..255"]),
    ({"exit_code": -1}, ["exit_code -1", "1..255"]),
    ({"exit_code": 86}, ["exit_code 86", "failure_exit_code (86)", "finished, checkpointed and failed"]),
    ({"exit_code": 7, "failure_exit_code": 7}, ["exit_code 7", "failure_exit_code (7)"]),
    ({"stop_signals": ("SIGNOPE",)}, ["'SIGNOPE'", "names like SIGUSR1"]),
    ({"checkpoint_signals": ("USR2",)}, ["'USR2'", "names like SIGUSR1"]),
    ({"stop_signals": ("SIG_DFL",)}, ["'SIG_DFL'", "names like SIGUSR1"]),
    ({"stop_signals": ("SIGUSR1",), "checkpoint_signals": ("SIGUSR1",)}, ["both a stop and a checkpoint"]),
]


@pytest.mark.parametrize(
    ("settings", "words"), BAD, ids=[",".join(f"{k}={v}" for k, v in b[0].items()) for b in BAD]
)
def test_a_bad_setting_names_the_fix(settings: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**settings)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, FerryError) and info.value.exit_code == 2


def test_the_same_checks_apply_to_with_and_from_env() -> None:
    with pytest.raises(ConfigError, match="every_steps must be >= 1"):
        Config().with_(every_steps=0)
    with pytest.raises(ConfigError, match="keep_last must be >= 1"):
        Config.from_env({"FERRY_KEEP_LAST": "0"})


def test_a_count_out_of_range_is_told_without_its_json_bound() -> None:
    """``FERRY_EVERY_STEPS=0`` said "at most 9.00719925474099e+15" (2**53): no range to type."""
    with pytest.raises(ConfigError) as info:
        Config.from_env({"FERRY_EVERY_STEPS": "0"})
    assert str(info.value) == "FERRY_EVERY_STEPS=0: every_steps must be >= 1, got 0"
    with pytest.raises(ConfigError, match=r"must be > 0 and at most 31622400 \(a year\)"):
        Config.from_env({"FERRY_EVERY_SECONDS": "0"})


def test_good_edge_values_pass() -> None:
    Config(every_steps=1, every_seconds=0.001, keep_last=1, exit_code=255, failure_exit_code=1)
    Config(stop_signals=(), checkpoint_signals=())
    Config(stop_signals=("SIGTERM", "SIGINT", "SIGHUP"), checkpoint_signals=("SIGUSR2", "SIGUSR1"))


# ------------------------------------------------------------------ environment
def test_the_documented_variables() -> None:
    """FERRY_<FIELD>, parsed to the field's type, for the fields of docs/api.md."""
    env = {
        "FERRY_DIR": "s3://bucket/run 1",
        "FERRY_EVERY_STEPS": "50",
        "FERRY_EVERY_SECONDS": "1.5",
        "FERRY_KEEP_LAST": "5",
        "FERRY_KEEP_EVERY": "1000",
        "FERRY_ASYNC_SAVE": "false",
        "FERRY_STOP_SIGNALS": "SIGTERM, SIGINT",
        "FERRY_CHECKPOINT_SIGNALS": "SIGUSR2,SIGHUP,",
        "FERRY_EXIT_CODE": "3",
        "FERRY_FAILURE_EXIT_CODE": "4",
        "FERRY_GRACE_SECONDS": "30",
        "FERRY_RESUME": "0",
        "FERRY_JOB_DIR": "/tmp/job dir",
        "FERRY_JOB_ID": "train-7",
        "FERRY_CONTROL_POLL_SECONDS": "0.5",
    }
    assert {f"FERRY_{f.name.upper()}" for f in dataclasses.fields(Config)} >= set(env)
    config = Config.from_env(env)
    assert config == Config(
        dir="s3://bucket/run 1",
        every_steps=50,
        every_seconds=1.5,
        keep_last=5,
        keep_every=1000,
        async_save=False,
        stop_signals=("SIGTERM", "SIGINT"),
        checkpoint_signals=("SIGUSR2", "SIGHUP"),
        exit_code=3,
        failure_exit_code=4,
        grace_seconds=30.0,
        resume=False,
        job_dir="/tmp/job dir",
        job_id="train-7",
        control_poll_seconds=0.5,
    )
    assert isinstance(config.every_steps, int) and isinstance(config.grace_seconds, float)


SAMPLE = {"bool": "0", "int": "7", "float": "0.5", "tuple": "SIGHUP", "str": "some value"}
"""A valid value of each type, for any field (7 is neither exit code default)."""


@pytest.mark.parametrize("field", dataclasses.fields(Config), ids=lambda f: f.name)
def test_every_field_has_its_variable(field: dataclasses.Field[Any]) -> None:
    kind = str(field.type).split("[")[0].split(" ")[0]
    raw = SAMPLE[kind]
    value = getattr(Config.from_env({f"FERRY_{field.name.upper()}": raw}), field.name)
    expected = {"bool": False, "int": 7, "float": 0.5, "tuple": ("SIGHUP",), "str": raw}[kind]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", "On"])
def test_true_spellings(raw: str) -> None:
    assert Config.from_env({"FERRY_RESUME": raw, "FERRY_ASYNC_SAVE": raw}).async_save is True


@pytest.mark.parametrize("raw", ["0", "false", "no", "off", "OFF"])
def test_false_spellings(raw: str) -> None:
    config = Config.from_env({"FERRY_RESUME": raw, "FERRY_ASYNC_SAVE": raw})
    assert config.resume is False and config.async_save is False


def test_an_empty_variable_clears_an_optional_field() -> None:
    config = Config.from_env({"FERRY_EVERY_STEPS": "", "FERRY_GRACE_SECONDS": "", "FERRY_JOB_DIR": ""})
    assert config.every_steps is None and config.grace_seconds is None and config.job_dir is None
    assert Config.from_env({"FERRY_STOP_SIGNALS": ""}).stop_signals == ()


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("FERRY_EVERY_STEPS", "ten"),
        ("FERRY_EVERY_STEPS", "2.5"),
        ("FERRY_KEEP_LAST", ""),
        ("FERRY_EXIT_CODE", "0x55"),
        ("FERRY_EVERY_SECONDS", "1 minute"),
    ],
)
def test_an_unparsable_variable_names_itself(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env({name: raw})
    assert f"{name}={raw!r}" in str(info.value)
    assert "is not a" in str(info.value) and "number: set it to" in str(info.value)


def test_a_bad_value_from_the_environment_is_refused_by_the_checks() -> None:
    with pytest.raises(ConfigError, match="unknown signal 'SIGFOO'"):
        Config.from_env({"FERRY_STOP_SIGNALS": "SIGTERM,SIGFOO"})
    with pytest.raises(ConfigError, match="every_seconds must be > 0"):
        Config.from_env({"FERRY_EVERY_SECONDS": "-2"})


def test_precedence_defaults_then_environment_then_overrides() -> None:
    env = {"FERRY_EVERY_STEPS": "10", "FERRY_DIR": "from-env", "FERRY_KEEP_LAST": "4"}
    config = Config.from_env(env, every_steps=20, keep_last=None)
    assert config.every_steps == 20  # an override beats the environment
    assert config.dir == "from-env"  # the environment beats the default
    assert config.keep_last == 4  # an override of None means "not given", not "clear it"


def test_an_explicit_mapping_ignores_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_EVERY_STEPS", "7")
    monkeypatch.setenv("FERRY_DIR", "from-process")
    assert Config.from_env({}).every_steps is None
    assert Config.from_env().every_steps == 7
    assert Config.from_env().dir == "from-process"


def test_unrelated_variables_are_ignored() -> None:
    assert Config.from_env({"FERRY_HOME": "/x", "EVERY_STEPS": "3", "ferry_dir": "lower"}) == Config()


# ------------------------------------------------------------------ back to the environment
ROUND_TRIP = [
    Config(),
    Config(every_steps=1, every_seconds=0.001, keep_last=1, exit_code=255, failure_exit_code=1),
    Config(dir="s3://bucket/run 1", keep_every=1000, async_save=False, resume=False),
    Config(stop_signals=(), checkpoint_signals=()),
    Config(stop_signals=("SIGTERM", "SIGINT", "SIGHUP"), checkpoint_signals=("SIGUSR2", "SIGUSR1")),
    Config(grace_seconds=30.0, every_seconds=1 / 3, control_poll_seconds=0.05),
    Config(job_dir="/tmp/job dir", job_id="train-7", remote="root://eos//x", handoff_dir="/dev/shm/f"),
    Config(exit_code=99, failure_exit_code=98, grace_seconds=1e-3),
]


@pytest.mark.parametrize("config", ROUND_TRIP, ids=range(len(ROUND_TRIP)))
def test_to_env_is_the_inverse_of_from_env(config: Config) -> None:
    env = config.to_env()
    assert set(env) == {f"FERRY_{f.name.upper()}" for f in dataclasses.fields(Config)}
    assert Config.from_env(env) == config


def test_to_env_writes_what_a_person_would() -> None:
    config = Config(every_steps=50, grace_seconds=30.0, async_save=False, stop_signals=("SIGTERM", "SIGINT"))
    assert config.to_env(["every_steps", "grace_seconds", "async_save", "stop_signals", "keep_every"]) == {
        "FERRY_EVERY_STEPS": "50",
        "FERRY_GRACE_SECONDS": "30.0",
        "FERRY_ASYNC_SAVE": "0",
        "FERRY_STOP_SIGNALS": "SIGTERM,SIGINT",
        "FERRY_KEEP_EVERY": "",
    }
    with pytest.raises(ConfigError, match="unknown setting"):
        config.to_env(["every_step"])


# ------------------------------------------------------------------ known gaps (bugs)
@pytest.mark.parametrize("code", [0, 300, -1])
def test_failure_exit_code_is_checked(code: int) -> None:
    with pytest.raises(ConfigError, match="failure_exit_code"):
        Config(failure_exit_code=code)


def test_an_unknown_boolean_spelling_is_refused() -> None:
    with pytest.raises(ConfigError, match="FERRY_RESUME"):
        Config.from_env({"FERRY_RESUME": "ture"})


def test_a_misspelt_setting_names_the_fields() -> None:
    with pytest.raises(ConfigError, match="every_steps"):
        Config.from_env({}, every_step=5)


# ------------------------------------------------------------------ what the settings imply
@pytest.mark.parametrize(
    ("save", "grace", "warned"),
    [(1.0, None, False), (50.0, None, False), (8.0, 10.0, False), (8.5, 10.0, True), (31.0, 30.0, True)],
)
def test_a_save_over_80_percent_of_the_grace_period_is_warned_about(
    save: float, grace: float | None, warned: bool
) -> None:
    warning = slow_save_warning(save, grace)
    assert (warning is not None) == warned
    if warning is not None:
        assert warning == (
            f"ferry: warning: a checkpoint took {save:.1f} s, over 80% of the {grace:.0f} s grace "
            "period; a stop may be killed before it commits: raise the grace period or save less state"
        )


def test_the_default_job_id_is_host_and_pid() -> None:
    assert default_job_id() == f"{socket.gethostname()}-{os.getpid()}"
    assert default_job_id(7) == f"{socket.gethostname()}-7"


# ------------------------------------------------------------------ nan, inf, negative, absurd
NUMERIC = {
    "every_steps": "int",
    "every_seconds": "float",
    "keep_last": "int",
    "keep_every": "int",
    "exit_code": "int",
    "failure_exit_code": "int",
    "grace_seconds": "float",
    "control_poll_seconds": "float",
    "stall_seconds": "float",
}
"""Every numeric field of Config (checked against the dataclass below)."""
HOSTILE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "-1": -1, "absurd": 10**30}
"""Values no setting may take: NaN compares false with everything, so a ``<= 0`` check lets
it through (and it then turns periodic saves, the control channel or the grace kill off)."""


def test_every_numeric_field_is_in_the_table() -> None:
    numeric = {f.name for f in dataclasses.fields(Config) if f.type.split(" ")[0] in ("int", "float")}
    assert numeric == set(NUMERIC)


@pytest.mark.parametrize("value", list(HOSTILE), ids=list(HOSTILE))
@pytest.mark.parametrize("name", list(NUMERIC))
def test_hostile_numbers_are_refused_in_python(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{name: HOSTILE[value]})
    assert name in str(info.value) and info.value.exit_code == 2


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "-1", "1e30", "99999999999999999999"])
@pytest.mark.parametrize("name", list(NUMERIC))
def test_hostile_numbers_are_refused_from_the_environment(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env({f"FERRY_{name.upper()}": raw})
    assert name.upper() in str(info.value).upper() and info.value.exit_code == 2


@pytest.mark.parametrize("value", [True, "5", 2.5])
def test_a_count_must_be_a_whole_number(value: object) -> None:
    with pytest.raises(ConfigError, match="every_steps must be"):
        Config(every_steps=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["dir", "remote"])
@pytest.mark.parametrize("url", ["foo://x", "nosuchscheme://bucket/a", ""])
def test_an_unknown_url_scheme_is_refused(field: str, url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{field: url})
    assert field in str(info.value) and info.value.exit_code == 2


@pytest.mark.parametrize(
    "url", ["ck", "/abs/ck", "file:///tmp/ck", "memory://x", "s3://b/k", "root://eos//x"]
)
def test_known_schemes_pass(url: str) -> None:
    Config(dir=url, remote=url)


# ------------------------------------------------------------------ ferry run's own options
RUN_NUMERIC = {
    "max_restarts": HOSTILE,
    "max_failures": HOSTILE,
    "backoff_seconds": HOSTILE,
    "grace_seconds": HOSTILE,
}


@pytest.mark.parametrize("value", list(HOSTILE), ids=list(HOSTILE))
@pytest.mark.parametrize("name", list(RUN_NUMERIC))
def test_run_options_refuse_hostile_numbers(name: str, value: str) -> None:
    from ferry.supervisor import RunOptions

    with pytest.raises(ConfigError) as info:
        RunOptions(**{name: HOSTILE[value]})
    assert name in str(info.value)


CLI_BAD = [
    ["--backoff", "nan"],
    ["--backoff", "-1"],
    ["--grace", "nan"],
    ["--grace", "inf"],
    ["--every-seconds", "nan"],
    ["--every-seconds", "0"],
    ["--every-steps", "-1"],
    ["--keep-last", "0"],
    ["--restarts", "-1"],
    ["--max-restarts", "-1"],
    ["--max-failures", "99999999999"],
    ["--exit-code", "0"],
    ["--exit-code", "300"],
    ["--dir", "foo://x"],
    ["--env", "FERRY_DIR=/elsewhere"],
    ["--env", "FERRY_JOB_ID=other"],
    ["--env", "FERRY_EXIT_CODE=3"],
]


@pytest.mark.parametrize("args", CLI_BAD, ids=[" ".join(a) for a in CLI_BAD])
def test_ferry_run_refuses_hostile_options_before_anything_starts(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from ferry.cli import main

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    result = CliRunner().invoke(
        main,
        ["run", "--job-id", "j", *args, "--", "touch", str(marker)],
        env={"FERRY_HOME": str(tmp_path / "h")},
    )
    assert result.exit_code == 2, result.output
    assert not marker.exists() and not (tmp_path / "h" / "jobs" / "j").exists()


@pytest.mark.parametrize(
    "variable", ["FERRY_EVERY_SECONDS", "FERRY_KEEP_EVERY", "FERRY_CONTROL_POLL_SECONDS"]
)
def test_ferry_run_refuses_a_nan_variable(
    variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from ferry.cli import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        main, ["run", "--job-id", "j", "--", "true"], env={"FERRY_HOME": str(tmp_path / "h"), variable: "nan"}
    )
    assert result.exit_code == 2 and variable in result.output, result.output


@pytest.mark.parametrize("args", [["migrate", "j", "--to", "0"], ["export", "j", "/tmp/x"]])
@pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "0"])
def test_operator_timeouts_refuse_hostile_numbers(args: list[str], timeout: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ferry.cli import main

    result = CliRunner().invoke(main, [*args, "--timeout", timeout], env={"FERRY_HOME": str(tmp_path)})
    assert result.exit_code == 2 and "--timeout" in result.output, result.output
