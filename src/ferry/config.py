"""Every setting of the in-process session, in one keyword-only dataclass.

Environment variables map onto it in one place, ``Config.from_env`` (``FERRY_<FIELD>``,
upper case), and back with its inverse ``Config.to_env``, which is how ``ferry run`` hands
its options to the worker.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict

from ferry.errors import ConfigError
from ferry.knobs import CHECKPOINT_EXIT_CODE, FAILURE_EXIT_CODE

MAX_SECONDS = 366 * 24 * 3600.0
"""The longest duration any setting accepts (a year). A longer one is a typo or an overflow,
and a wait that long overflows the timeouts of threads and selectors."""
MAX_COUNT = 2**53
"""The largest step count or number of checkpoints: JSON numbers stay exact below it."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The range of one numeric setting: a finite number in [low, high], ``low`` itself
    excluded when ``above``; ``whole`` for counts."""

    low: float
    high: int | float
    above: bool = False
    whole: bool = False
    hint: str = ""
    """What the setting means at its edge, for the message."""

    def check(self, name: str, value: object) -> None:
        """ConfigError naming ``name``, the bad ``value`` and the range, unless it fits.
        NaN fails every comparison, so it is refused explicitly rather than let through."""
        kind = "a whole number" if self.whole else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be {kind}, got {value!r}")
        if self.whole and not isinstance(value, int):
            raise ConfigError(f"{name} must be {kind}, got {value!r}")
        low_ok = value > self.low if self.above else value >= self.low
        if not (math.isfinite(value) and low_ok and value <= self.high):
            bound = f"> {self.low:g}" if self.above else f">= {self.low:g}"
            # a count's bound (2**53, where JSON stops being exact) is no range a user types
            high = "" if self.high >= MAX_COUNT else f" and at most {self.high:.15g}"
            raise ConfigError(f"{name} must be {bound}{high}{self.hint}, got {value!r}")


def check_url(name: str, url: str) -> None:
    """ConfigError for an empty location or a URL whose scheme no storage backend knows:
    found before any worker starts, not at its first save."""
    from ferry.storage import BACKENDS, scheme  # here: config must load without the storage

    if not url or "\0" in url:
        raise ConfigError(f"{name} {url!r} is not a path or URL: name a folder, e.g. ./ferry-checkpoints")
    proto = scheme(url)
    if proto in BACKENDS:
        return
    import fsspec

    if proto not in fsspec.available_protocols():
        raise ConfigError(
            f"{name} {url!r}: no storage backend knows the scheme {proto!r}:// ; use a local "
            "path or an fsspec URL (file://, s3://, gs://, root://, memory://, ...)"
        )


SECONDS = Limits(low=0.0, high=MAX_SECONDS, above=True, hint=" (a year)")
LIMITS: dict[str, Limits] = {
    "every_steps": Limits(low=1, high=MAX_COUNT, whole=True),
    "every_seconds": SECONDS,
    "keep_last": Limits(low=1, high=MAX_COUNT, whole=True, hint=" (>= 1 keeps the last good checkpoint)"),
    "keep_every": Limits(low=0, high=MAX_COUNT, above=True, whole=True, hint=" (or unset)"),
    "grace_seconds": Limits(low=0.0, high=MAX_SECONDS, above=True, hint=" (a year; or unset)"),
    "control_poll_seconds": Limits(low=0.0, high=3600.0, above=True, hint=" (an hour)"),
    "stall_seconds": Limits(low=0.0, high=MAX_SECONDS, above=True, hint=" (a year; or unset: never)"),
}
"""Every numeric field of ``Config`` and its range (the exit codes have checks of their own)."""


@dataclass(kw_only=True)
class Config:
    dir: str = "ferry-checkpoints"
    """Checkpoint root: a local path or an fsspec URL (s3://, root://, memory://)."""
    every_steps: int | None = None
    """Checkpoint every N training steps (None: never on a step count)."""
    every_seconds: float | None = None
    """Checkpoint when this many seconds of wall clock passed since the last one."""
    keep_last: int = 3
    """Committed checkpoints to keep; older ones are deleted after each commit."""
    keep_every: int | None = None
    """Also keep forever every checkpoint whose step is a multiple of this."""
    async_save: bool = True
    """Periodic checkpoints persist in the background (a stop always waits)."""
    overlap_snapshot: bool = False
    """With ``async_save``: the parameters an optimizer updates and its state are copied while
    the next forward and backward run, and that optimizer's next ``step()`` waits for the
    copies (docs/api.md). For scripts that change those tensors only in ``step()``."""
    stop_signals: tuple[str, ...] = ("SIGUSR1", "SIGTERM")
    """Signals that mean: checkpoint at the next safe point, then exit with exit_code."""
    checkpoint_signals: tuple[str, ...] = ("SIGUSR2",)
    """Signals that mean: checkpoint at the next safe point and keep training."""
    exit_code: int = CHECKPOINT_EXIT_CODE
    """Exit status after a committed checkpoint-and-stop ("checkpointed, resume me")."""
    failure_exit_code: int = FAILURE_EXIT_CODE
    """Exit status when a stop was requested but the checkpoint could not be committed."""
    grace_seconds: float | None = None
    """Time between the stop signal and SIGKILL, if known; saves slower than 80% of it warn."""
    resume: bool = True
    """Resume from the newest good checkpoint under ``dir`` when one exists."""
    job_dir: str | None = None
    """The job directory (status, control requests). None: ~/.local/state/ferry/jobs/<id>."""
    job_id: str | None = None
    """The job's id. None: FERRY_JOB_ID, else <host>-<pid>."""
    control_poll_seconds: float = 0.2
    """How often safe points look for control requests."""
    remote: str | None = None
    """Also copy each committed checkpoint to this root (a shared path, s3://, root://) in the
    background, and fetch the newest from it at start when ``dir`` has none (docs/transfer.md)."""
    ignore_generators: tuple[str, ...] = ()
    """Zero-code mode: global random generators of the script, by variable name, not to warn
    about when training draws from them (FERRY_IGNORE_GENERATORS=name,name)."""
    allow_changed_inputs: bool = False
    """Resume even when a loader's batch size, dataset length, sampler or drop_last differ
    from the checkpoint's (with a warning); by default such a resume is refused, since the
    saved position would mean other samples (FERRY_ALLOW_CHANGED_INPUTS=1)."""
    stall_seconds: float | None = 60.0
    """A job of several ranks: a rank not heard from for this long (stopped, hung, cut off)
    ends the job with a message naming it and its node, instead of leaving every other rank
    waiting in its next collective for the process group's timeout (None: never)."""
    handoff_dir: str | None = None
    """A host-memory folder (tmpfs) for in-place restarts: a stop for a restart leaves a
    second copy of its checkpoint there, and the restarted worker loads that copy instead of
    reading the durable one back from storage. `ferry run` sets it under /dev/shm."""

    def __post_init__(self) -> None:
        for name, limits in LIMITS.items():
            value = getattr(self, name)
            if value is not None:
                limits.check(name, value)
        for name in ("dir", "remote"):
            url = getattr(self, name)
            if url is not None:
                check_url(name, url)
        for name in ("exit_code", "failure_exit_code"):
            code = getattr(self, name)
            if isinstance(code, bool) or not isinstance(code, int):
                raise ConfigError(f"{name} must be a whole number 1..255, got {code!r}")
        if not 0 < self.failure_exit_code < 256:
            raise ConfigError(
                f"failure_exit_code {self.failure_exit_code} must be 1..255: 0 would read "
                "as finished, and exit statuses above 255 wrap around"
            )
        if self.exit_code in (0, self.failure_exit_code) or not 0 < self.exit_code < 256:
            raise ConfigError(
                f"exit_code {self.exit_code} must be 1..255 and differ from 0 and "
                f"failure_exit_code ({self.failure_exit_code}): the supervisor "
                "tells finished, checkpointed and failed apart by it"
            )
        for name in (*self.stop_signals, *self.checkpoint_signals):
            if not isinstance(getattr(signal, name, None), signal.Signals):
                raise ConfigError(f"unknown signal {name!r}; use names like SIGUSR1")
        if set(self.stop_signals) & set(self.checkpoint_signals):
            raise ConfigError("a signal cannot be both a stop and a checkpoint signal")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Config:
        """Defaults, then the scheduler's (``worker_defaults``), then FERRY_* variables, then
        explicit overrides."""
        from ferry.schedulers import detect  # here: the adapters must not load with Config

        env = os.environ if environ is None else environ
        values: dict[str, Any] = detect(env).worker_defaults()  # a batch system's, e.g. HTCondor's
        for f in fields(cls):
            raw = env.get(f"FERRY_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _parse(f.name, str(f.type), raw)
            if f.name in LIMITS and values[f.name] is not None:  # the message names the variable
                try:
                    LIMITS[f.name].check(f.name, values[f.name])
                except ConfigError as exc:
                    raise ConfigError(f"FERRY_{f.name.upper()}={raw}: {exc}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; the settings are: {', '.join(sorted(known))}"
            )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def to_env(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """The inverse of ``from_env``: ``FERRY_<FIELD>`` variables for the fields ``names``
        (default: all), so that ``Config.from_env(cfg.to_env()) == cfg``. None is the empty
        string, a tuple is comma-separated, a bool is 1 or 0."""
        known = {f.name for f in fields(self)}
        chosen = list(known if names is None else names)
        unknown = sorted(set(chosen) - known)
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; the settings are: {', '.join(sorted(known))}"
            )
        return {f"FERRY_{name.upper()}": _format(getattr(self, name)) for name in chosen}

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)


class Overrides(TypedDict, total=False):
    """``Config``'s fields as keyword arguments of ``ferry.configure``, each optional; a
    value of None counts as not given. Kept equal to ``Config``'s fields by a unit test."""

    dir: str | None
    every_steps: int | None
    every_seconds: float | None
    keep_last: int | None
    keep_every: int | None
    async_save: bool | None
    overlap_snapshot: bool | None
    stop_signals: tuple[str, ...] | None
    checkpoint_signals: tuple[str, ...] | None
    exit_code: int | None
    failure_exit_code: int | None
    grace_seconds: float | None
    resume: bool | None
    job_dir: str | None
    job_id: str | None
    control_poll_seconds: float | None
    remote: str | None
    ignore_generators: tuple[str, ...] | None
    allow_changed_inputs: bool | None
    stall_seconds: float | None
    handoff_dir: str | None


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)  # str(float) reads back as the same float


def _parse(name: str, type_: str, raw: str) -> Any:
    try:
        if raw == "" and "None" in type_:
            return None
        if type_.startswith("bool"):
            if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ConfigError(
                    f"FERRY_{name.upper()}={raw!r} is not a boolean; use 1/0, true/false, yes/no"
                )
            return raw.lower() in ("1", "true", "yes", "on")
        if type_.startswith("tuple"):
            return tuple(s.strip() for s in raw.split(",") if s.strip())
        if type_.startswith("int"):
            return int(raw)
        if type_.startswith("float"):
            return float(raw)
    except ValueError:
        kind = "a whole number" if type_.startswith("int") else "a number"
        empty = " (or empty, for none)" if "None" in type_ else ""
        raise ConfigError(f"FERRY_{name.upper()}={raw!r} is not {kind}: set it to {kind}{empty}") from None
    return raw
