"""Zero-code mode: ``ferry run`` puts ``BOOT_DIR`` first on the worker's PYTHONPATH, so
Python imports ferry's ``sitecustomize`` at start-up; that one chains to any existing
``sitecustomize`` and, when ``FERRY_AUTOTRACK=1``, arms the hooks in ``hooks.py``."""

from __future__ import annotations

import os

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
