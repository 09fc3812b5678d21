"""``ferry report``: a job's life as a self-contained HTML page and a PNG."""

from __future__ import annotations

import os

import click

from ferry.cli.output import emit_json, json_option
from ferry.cli.places import check_output
from ferry.ops import figure, report
from ferry.ops.jobs import find_job, list_jobs


@click.command("report")
@click.argument("job")
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="The HTML page; the PNG goes next to it. [default: ferry-report-JOB.html]",
)
@json_option
def report_cmd(job: str, output: str | None, as_json: bool) -> None:
    """Draw JOB's life across its runs: steps over time, checkpoints, stops, resumes, failures, moves.

    Every run of the job is on one time axis: each `ferry run` that wrote JOB's checkpoint
    root, whatever its job id. Needs matplotlib: pip install 'gpuferry[report]'."""
    record = find_job(job)
    page = output or f"ferry-report-{record.id}.html"
    check_output(page, "the report", "give -o a file in a folder you can write")
    runs = report.lineage(record, list_jobs())
    events, status = report.merged(runs)
    timeline = report.build(record.id, events, status, exists=report.checkpoint_exists)
    drawing = figure.draw(timeline)
    image = os.path.splitext(page)[0] + ".png"
    with open(page, "w") as f:
        f.write(report.page(timeline, status, figure.svg(drawing)))
    with open(image, "wb") as f:
        f.write(figure.png(drawing))
    summary = {
        "job": record.id,
        "job_ids": [r.id for r in runs],
        "runs": timeline.runs,
        "html": os.path.abspath(page),
        "png": os.path.abspath(image),
        "checkpoints": len(timeline.checkpoints),
        "deleted_checkpoints": sum(c["deleted"] for c in timeline.checkpoints),
        "marks": timeline.marks,
        "startups": timeline.startups,
        "overlaps": timeline.overlaps,
        "lost_seconds": timeline.lost_seconds,
    }
    if as_json:
        emit_json(summary)
    else:
        click.echo(f"job {record.id}: report written to {page} and {image}")


COMMANDS = [report_cmd]
