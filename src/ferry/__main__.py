"""``python -m ferry``: the ``ferry`` command, for where its script is not on PATH (a venv
that is not activated, ``python -m ferry run -- python train.py``)."""

from __future__ import annotations

from ferry.cli import main

if __name__ == "__main__":
    main(prog_name="ferry")
