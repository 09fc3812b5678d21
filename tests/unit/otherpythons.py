"""The other CPython interpreters of this machine, for tests that check a torch-free part of
ferry under each of them (test_stack_layouts.py, test_ranges.py)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys


def other_pythons() -> dict[str, str]:
    """CPython 3.11-3.13 interpreters other than this one, by version: on PATH, or under pyenv."""
    found: dict[str, str] = {}
    candidates = [shutil.which(f"python3.{m}") for m in (11, 12, 13)]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{root}/versions/3.1[123]*/bin/python"))
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            continue  # a pyenv shim without that version
        version = out.stdout.strip()
        if version != "{}.{}".format(*sys.version_info[:2]):
            found.setdefault(version, exe)
    return found
