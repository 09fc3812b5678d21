"""Click parameter types shared by the commands: numbers are parsed with their limits at the
edge, so that ``nan``, ``inf``, negative and absurd values end in a usage error (exit 2)
naming the option, never in a setting that silently turns something off. Whole numbers
stay ``int``: they cannot be NaN, and the settings' own checks (``Config``, ``RunOptions``)
give their ranges with the reason."""

from __future__ import annotations

import math

import click

from ferry.config import MAX_SECONDS
from ferry.errors import ConfigError


class Seconds(click.ParamType[float, object]):
    """A finite duration in seconds, ``low`` (excluded when ``above``) up to MAX_SECONDS."""

    name = "seconds"

    def __init__(self, *, low: float = 0.0, above: bool = False) -> None:
        self.low, self.above = low, above

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low_ok = seconds > self.low if self.above else seconds >= self.low
        if not (math.isfinite(seconds) and low_ok and seconds <= MAX_SECONDS):
            bound = f"> {self.low:g}" if self.above else f">= {self.low:g}"
            self.fail(
                f"{value!r} must be a number of seconds {bound} and at most {MAX_SECONDS:.15g} (a year)",
                param,
                ctx,
            )
        return seconds


SECONDS = Seconds()
"""Zero or more seconds (0 has a meaning of its own where it is accepted, e.g. --grace 0)."""
POSITIVE_SECONDS = Seconds(above=True)
"""More than zero seconds."""


def check_timeout(timeout: float) -> float:
    """A wait's ``--timeout`` as given from Python (the CLI's own are parsed above, or here
    where the command keeps its one-line error): finite, > 0, at most MAX_SECONDS. ``nan``
    would otherwise pass a ``<= 0`` check and never time out."""
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_SECONDS):
        raise ConfigError(f"--timeout must be a number of seconds > 0 and at most a year, got {timeout:g}")
    return timeout
