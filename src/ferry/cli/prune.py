"""``ferry prune``: delete the directories of jobs that ended long ago (docs/cli.md)."""

from __future__ import annotations

import dataclasses
import time

import click

from ferry.cli.output import ago, emit_json, json_option
from ferry.cli.params import checked
from ferry.ops.jobs import list_jobs
from ferry.ops.prune import candidate, parse_age, prune_job, select


def _age(text: str) -> str:
    """``--older-than``: checked here, kept as typed for the messages."""
    parse_age(text)
    return text


@click.command(
    "prune",
    epilog="""\b
Exit status:
  0  done (also when nothing was old enough)
  2  bad input: an --older-than that is not an age""",
)
@click.option(
    "--older-than",
    "older_than",
    callback=checked(_age),
    default="7d",
    show_default=True,
    metavar="AGE",
    help="Only jobs that ended longer ago than AGE: 2w, 30d, 12h, 90m, 45s.",
)
@click.option("--checkpoints", is_flag=True, help="Also delete the checkpoints ferry wrote for them.")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@json_option
def prune_cmd(older_than: str, checkpoints: bool, dry_run: bool, as_json: bool) -> None:
    """Delete the directories of jobs that ended longer ago than --older-than (never a live one).

    A job qualifies when it finished, failed or checkpointed and is not running. Jobs that
    died without recording an end are kept (see them with `ferry list --all`). With
    --checkpoints, the checkpoints under a pruned job's checkpoint root go too, unless a job
    that stays shares that root.
    """
    seconds = parse_age(older_than)
    now = time.time()
    records = list_jobs()
    doomed = set(select([candidate(r) for r in records], seconds, now))
    shared = {
        r.identity.get("checkpoint_dir", "")
        for r in records
        if r.id not in doomed and r.identity.get("checkpoint_dir")
    }
    pruned = [
        prune_job(r, checkpoints=checkpoints, shared=shared, dry_run=dry_run)
        for r in records
        if r.id in doomed
    ]
    if as_json:
        emit_json({"dry_run": dry_run, "pruned": [dataclasses.asdict(p) for p in pruned]})
        return
    verb = "would delete" if dry_run else "deleted"
    ended = {r.id: candidate(r).ended for r in records}
    for p in pruned:
        end = ended.get(p.id)
        click.echo(f"{verb} job {p.id} (ended {ago(now - end) if end else '?'}): {p.job_dir}")
        for url in p.checkpoints_removed:
            click.echo(f"  {verb} checkpoint {url}")
        if p.checkpoints_kept_because:
            click.echo(f"  kept its checkpoints under {p.checkpoint_dir}: {p.checkpoints_kept_because}")
    if not pruned:
        click.echo(f"no ended job older than {older_than} (ferry list --all shows every job)")


COMMANDS = [prune_cmd]
