"""Every test under tests/gpu needs an NVIDIA GPU: without one it is skipped, saying why. The
process-level tests also need the driver's checkpoint API and NVML (``gpuneeds``);
the snapshot tests do not, and run wherever torch sees a GPU."""

from __future__ import annotations

import pytest
from gpuneeds import why_no_gpu


@pytest.fixture(autouse=True, scope="session")
def _require_cuda_gpu() -> None:
    reason = why_no_gpu()
    if reason is not None:
        pytest.skip(reason)
