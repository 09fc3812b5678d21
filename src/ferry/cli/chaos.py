"""``ferry chaos``: soak a training command under injected faults (see ferry.chaos)."""

from __future__ import annotations

import signal

import click

from ferry.chaos import KINDS, ChaosOptions, Soak, summary_json
from ferry.cli.params import POSITIVE_SECONDS, SECONDS, Checked, Whole
from ferry.cli.run import ENV_PAIR
from ferry.errors import ConfigError
from ferry.knobs import CHAOS_OUTAGE_SECONDS, CHAOS_PAUSE_SECONDS, CHAOS_TIMEOUT_SECONDS


def fault_kinds(text: str) -> tuple[str, ...]:
    """``--kinds``: fault kinds, comma-separated (one named twice is drawn twice as often)."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ConfigError(
            f"unknown fault kind(s) {', '.join(unknown) or '(none)'}; use some of {', '.join(KINDS)}"
        )
    return kinds


def min_max(ctx: click.Context, param: click.Parameter, value: tuple[float, float]) -> tuple[float, float]:
    """A MIN MAX pair of durations: MIN above 0, MAX not below it."""
    low, high = value
    if not 0 < low <= high:
        raise click.BadParameter(f"{low:g} {high:g}: MIN must be above 0 and at most MAX", ctx, param)
    return value


@click.command(
    "chaos",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog="""\b
Exit status:
  0  every round's outputs equal the uninterrupted run's
  1  they differ (the summary names the files)
  2  usage error
  8  the soak could not run to its end (a `ferry run` failure, the timeout)

\b
Example:
  ferry chaos --events 500 --compare out/params.txt --steps out/log.txt \\
      -- python train.py --out out

The contract with the command and the fault kinds: `ferry help chaos`.""",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the faults and pauses.")
@click.option(
    "--events", type=Whole(0, what="faults"), default=30, show_default=True, help="Faults to inject in all."
)
@click.option(
    "--every-steps",
    type=Whole(1, what="steps"),
    default=5,
    show_default=True,
    help="Periodic checkpoint period.",
)
@click.option(
    "--work", metavar="DIR", default="ferry-chaos", show_default=True, help="Working copies, checkpoints."
)
@click.option("--compare", multiple=True, metavar="FILE", help="Output file that must be equal (repeatable).")
@click.option("--steps", multiple=True, metavar="FILE", help="Per-step log, 'STEP ...' lines (repeatable).")
@click.option(
    "--kinds",
    type=Checked("KINDS", fault_kinds),
    default=",".join(KINDS),
    show_default=True,
    help="Comma-separated fault kinds to draw from.",
)
@click.option(
    "--pause",
    nargs=2,
    type=SECONDS,
    callback=min_max,
    default=CHAOS_PAUSE_SECONDS,
    show_default=True,
    metavar="MIN MAX",
    help="Seconds of training between two faults, drawn uniformly.",
)
@click.option(
    "--outage",
    nargs=2,
    type=SECONDS,
    callback=min_max,
    default=CHAOS_OUTAGE_SECONDS,
    show_default=True,
    metavar="MIN MAX",
    help="Seconds a remote-down fault keeps the remote unreachable, drawn uniformly.",
)
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=CHAOS_TIMEOUT_SECONDS,
    show_default=True,
    help="Give up after S seconds.",
)
@click.option(
    "--duration", type=POSITIVE_SECONDS, metavar="S", help="Inject faults only during the first S seconds."
)
@click.option("--env", "env_pairs", type=ENV_PAIR, multiple=True, help="Set a variable for the command.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def chaos_cmd(
    ctx: click.Context,
    seed: int,
    events: int,
    every_steps: int,
    work: str,
    compare: tuple[str, ...],
    steps: tuple[str, ...],
    kinds: tuple[str, ...],
    pause: tuple[float, float],
    outage: tuple[float, float],
    timeout: float,
    duration: float | None,
    env_pairs: tuple[tuple[str, str], ...],
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND plainly, then under `ferry run` with seeded faults, and compare.

    ferry chaos [OPTIONS] -- COMMAND [ARGS]...  Checkpoint requests, stops, preemption
    signals, SIGKILL of the worker and of the supervisor, migrations, a full disk, the
    remote the checkpoints are copied to going down: the final outputs and the per-step
    record must equal the uninterrupted run's.
    """
    options = ChaosOptions(
        work=work,
        seed=seed,
        events=events,
        every_steps=every_steps,
        kinds=kinds,
        compare=compare,
        steps=steps,
        pause=pause,
        outage=outage,
        timeout=timeout,
        duration=duration,
        env=dict(env_pairs),
    )
    # SIGTERM unwinds like Ctrl-C, so that the soak kills its jobs, unmounts its tmpfs and
    # stops its S3 server.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    summary = Soak(command, options, echo=lambda m: click.echo(m, err=True)).run()
    click.echo(summary_json(summary) if as_json else summary.table())
    ctx.exit(0 if summary.equal else 1)


COMMANDS = [chaos_cmd]
