"""Suite-wide test selection: which tests `make check` (the edit loop) leaves out.

`make test` runs everything. `make check` runs `-m "not slow"`: the unit tests and the core
integration tests (exact resume in explicit and zero-code mode, the supervisor, the
operator commands, storage backends, faults). The slow ones are listed here, in one
place, instead of a mark in each file: the soak, the real SLURM cluster, the scheduler
and trainer-library runs, torchrun jobs, migration, the crash-consistency trials, the
checkpoint fuzzer, the pseudo-terminal and other-user runs, the longer CLI journeys, the
zero-code idiom lineages (thirteen `ferry run` launches), and the wheel built and installed
into a fresh venv.
"""

from __future__ import annotations

import pytest

SLOW_MODULES = {
    "test_chaos.py",
    "test_slurm.py",
    "test_slurm_nodes.py",
    "test_many_nodes.py",
    "test_htcondor.py",
    "test_kubernetes.py",
    "test_integrations.py",
    "test_crash_consistency.py",
    "test_transfer.py",
    "test_cli_migrate.py",
    "test_warm_migrate.py",
    "test_own_memory.py",
    "test_fuzz_checkpoints.py",
    "test_trust.py",
    "test_interrupts.py",
    "test_cli_hints.py",
    "test_job_report.py",
    "test_cooperate.py",
    "test_zero_code_idioms.py",
    "test_wheel_install.py",
}
SLOW_NAMES = ("torchrun", "fsdp", "torch-compile")
"""Any test whose name holds one of these (multi-rank jobs, torch.compile) is slow."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES or any(word in item.name for word in SLOW_NAMES):
            item.add_marker(pytest.mark.slow)
