"""Click parameter types shared by the commands: every option value is parsed at the edge,
with its limits, so that a bad one ends in one kind of error, click's usage error (exit 2),
naming the option as the user typed it and the range in words ("1 or more", "up to a
year"), never an internal field name or a float bound. ``nan``, ``inf``, negative and absurd
numbers are refused there, never turned into a setting that silently switches something off.
The settings' own checks (``Config``, ``RunOptions``) stay, for callers from Python."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import TypeVar

import click

from ferry.config import MAX_COUNT, MAX_SECONDS
from ferry.errors import ConfigError

T = TypeVar("T")


def _words(n: float) -> str:
    return "a year" if n == MAX_SECONDS else f"{n:,}" if isinstance(n, int) else f"{n:g}"


class Seconds(click.ParamType[float, object]):
    """A finite duration in seconds, ``low`` (excluded when ``above``) up to a year."""

    name = "seconds"

    def __init__(self, *, low: float = 0.0, above: bool = False, zero: str = "") -> None:
        self.low, self.above = low, above
        bound = f"above {low:g}" if above else f"{low:g} or more"
        self.wanted = f"a number of seconds, {bound}, up to a year" + (f" ({zero})" if zero else "")

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low_ok = seconds > self.low if self.above else seconds >= self.low
        if not (math.isfinite(seconds) and low_ok and seconds <= MAX_SECONDS):
            self.fail(f"{value}: must be {self.wanted}", param, ctx)
        return seconds


SECONDS = Seconds()
"""Zero or more seconds (0 has a meaning of its own where it is accepted)."""
POSITIVE_SECONDS = Seconds(above=True)
"""More than zero seconds."""
GRACE = Seconds(zero="0: never")
"""A grace period before SIGKILL: 0 turns it off."""


class Whole(click.ParamType[int, object]):
    """A whole number in [low, high], ``what`` it counts named in the message."""

    name = "integer"

    def __init__(self, low: int, high: int = MAX_COUNT, *, what: str = "") -> None:
        self.low, self.high = low, high
        noun = f"a whole number of {what}" if what else "a whole number"
        bound = f"{low:,} or more" if high >= MAX_COUNT else f"from {low:,} to {_words(high)}"
        self.wanted = f"{noun}, {bound}"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip(), 10)
            except ValueError:
                self.fail(f"{value!r} is not {self.wanted.split(',')[0]}", param, ctx)
        if not self.low <= number <= self.high:
            self.fail(f"{value}: must be {self.wanted}", param, ctx)
        return number


class Checked(click.ParamType[T, object]):
    """A value parsed by a function of ferry's that raises ConfigError with what is wrong
    (a device list, an age, a job id, a URL): its message becomes the usage error's."""

    def __init__(self, name: str, parse: Callable[[str], T]) -> None:
        self.name, self.parse = name, parse

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> T:
        try:
            return self.parse(str(value))
        except ConfigError as exc:
            self.fail(_without_name(str(exc), param), param, ctx)


def _without_name(message: str, param: click.Parameter | None) -> str:
    """A message that starts with the option's name already: click names it in front."""
    for name in [] if param is None else param.opts:
        if message.startswith(f"{name} "):
            return message[len(name) + 1 :]
    return message


def checked(parse: Callable[[T], T]) -> Callable[[click.Context, click.Parameter, T], T]:
    """An option callback that runs ``parse`` on the whole value (a repeated option's tuple,
    say) and turns its ConfigError into click's usage error for the option."""

    def callback(ctx: click.Context, param: click.Parameter, value: T) -> T:
        try:
            return parse(value)
        except ConfigError as exc:
            raise click.BadParameter(_without_name(str(exc), param), ctx, param) from None

    return callback


def check_timeout(timeout: float) -> float:
    """A wait's timeout as given from Python (the CLI's own are parsed by POSITIVE_SECONDS):
    finite, > 0, at most MAX_SECONDS. ``nan`` would otherwise pass a ``<= 0`` check and
    never time out."""
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_SECONDS):
        raise ConfigError(f"--timeout must be a number of seconds > 0 and at most a year, got {timeout:g}")
    return timeout


class OldNamesHidden(click.Option):
    """An option renamed: its first name is the one ``--help`` and errors show; the names after
    it (the old ones) still parse, for scripts written before the rename."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        shown = copy.copy(self)
        shown.opts = self.opts[:1]
        return click.Option.get_help_record(shown, ctx)

    def get_error_hint(self, ctx: click.Context | None) -> str:
        return f"'{self.opts[0]}'"
