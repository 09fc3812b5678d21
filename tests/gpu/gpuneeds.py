"""What the GPU tests need, and the ``ferry`` command they run."""

from __future__ import annotations

import functools
import sys

FERRY = [sys.executable, "-c", "import sys; from ferry.cli import main; sys.argv[0] = 'ferry'; main()"]
"""The ``ferry`` command of this interpreter, also where ferry runs from source (no console script)."""


@functools.cache
def why_no_gpu() -> str | None:
    """None when torch sees a CUDA GPU here."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"no CUDA GPU: torch {torch.__version__} is a CPU-only build"
    if torch.cuda.device_count() == 0:
        return "no CUDA GPU: torch.cuda.device_count() is 0"
    return None


@functools.cache
def why_no_process_checkpoint() -> str | None:
    """None when the driver's checkpoint API and NVML are both usable here."""
    from ferry.errors import FerryError
    from ferry.process import load_driver, nvml

    try:
        load_driver()
    except FerryError as exc:
        return f"a GPU is here but process checkpoint is not: {exc}"
    reason = nvml.status()
    return None if reason is None else f"a GPU is here but NVML is not: {reason}"
