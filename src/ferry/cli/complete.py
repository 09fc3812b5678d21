"""Shell completion of JOB arguments: the job ids under FERRY_HOME, no job file opened.

Enable it with ``eval "$(_FERRY_COMPLETE=bash_source ferry)"`` (zsh: ``zsh_source``,
fish: ``fish_source``); docs/cli.md.
"""

from __future__ import annotations

import click
from click.shell_completion import CompletionItem

from ferry.ops.jobs import job_ids


def complete_job(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(name) for name in job_ids() if name.startswith(incomplete)]
