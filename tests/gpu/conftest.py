"""Every test under tests/gpu needs an NVIDIA GPU: without one it is skipped, saying why."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def why_no_gpu() -> str | None:
    """None when a CUDA GPU, the driver's checkpoint API and NVML are all usable here."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"no CUDA GPU: torch {torch.__version__} is a CPU-only build"
    if torch.cuda.device_count() == 0:
        return "no CUDA GPU: torch.cuda.device_count() is 0"
    from ferry.errors import FerryError
    from ferry.process import load_driver, nvml

    try:
        load_driver()
    except FerryError as exc:
        return f"a GPU is here but process checkpoint is not: {exc}"
    reason = nvml.status()
    return None if reason is None else f"a GPU is here but NVML is not: {reason}"


@pytest.fixture(autouse=True, scope="session")
def _require_cuda_gpu() -> None:
    reason = why_no_gpu()
    if reason is not None:
        pytest.skip(reason)
