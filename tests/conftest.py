"""Suite-wide test selection: which tests each tier runs.

Three tiers, chosen here in one place instead of a mark in each file:

- `make check` (the edit loop): `-m "not slow and not long"`: the unit tests and the core
  integration tests (exact resume in explicit and zero-code mode, the supervisor, the
  operator commands, storage backends, faults).
- `make test` (CI: 2 cores, at most 8 minutes): `-m "not long"`: the above, plus one real
  run of each scheduler (SLURM, HTCondor, Kubernetes), migration, the trust and interrupt
  cases, the CLI journeys, and one lineage per framework (Lightning, HF Trainer, Keras).
- `make test-long` (before a release, about 25 minutes on 2 cores): `-m long`: the soaks,
  the fuzzers, every framework lineage (DDP, torchrun, both modes resuming each other),
  many nodes and the two-node SLURM cluster, the crash-consistency trials, the idiom
  lineages and the wheel built into a fresh venv.
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


LONG_MODULES = {
    "test_chaos.py",
    "test_many_nodes.py",
    "test_slurm_nodes.py",
    "test_crash_consistency.py",
    "test_fuzz_checkpoints.py",
    "test_fuzz_frames.py",
    "test_zero_code_idioms.py",
    "test_wheel_install.py",
    "test_integrations.py",
    "test_warm_migrate.py",
    "test_ranks_async.py",
    "test_own_memory.py",
    "test_job_report.py",
    "test_cooperate.py",
    "test_cli_hints.py",
}
LONG_TESTS = (
    "test_exact_lightning.py::test_ddp_",
    "test_exact_lightning.py::test_stopped_three_times",
    "test_compat_lightning.py::test_uninterrupted_fit_and_predict_equal_the_plain_run[ddp",
    "test_exact_hf.py::test_torchrun_",
    "test_compat_hf.py::test_an_uninterrupted_run_is_the_plain_run[torchrun",
    "test_exact_keras.py::test_arrays_",
    "test_exact_keras.py::test_pydataset_",
    "test_exact_accelerate.py::test_an_uninterrupted_",
    "test_slurm.py::test_two_slurm_jobs",
    "test_zero_code_ground.py::test_a_handler_of_the_script_installed_over_ferrys_does_not_end_the_run_first[True]",
    "test_zero_code_ground.py::test_persistent_pools",
    "test_zero_code_arming.py::test_a_stop_is_served_however_torch_is_imported[import-module]",
    "test_zero_code_arming.py::test_a_stop_is_served_however_torch_is_imported[lazy]",
    "test_zero_code_loaders.py::test_evaluation_per_call_worker_augmentation_and_changed_inputs",
    "test_supervisor_ends.py::test_requests_during_a_stop",
    "test_trust.py::test_function_checkpoint_files_of_every_rank",
    "test_interrupts.py::test_ctrl_c_twice_in_explicit_mode",
    "test_interrupts.py::test_a_killed_supervisor_makes_its_worker_checkpoint_and_stop",
    "test_zero_code.py::test_unmodified_script_resumes_bitwise[step-budget-iter-next]",
    # 2026-11-27, to keep make test near 7 minutes here: siblings stay in make test
    # (epochs-workers2 runs the same script; test_compat_timm's stopped run the generator frames)
    "test_zero_code.py::test_unmodified_script_resumes_bitwise[epochs-train-test-steplr]",
    "test_zero_code_generators.py::test_nested_generator_wrappers_resume_as_the_plain_run",
    "test_launcher.py::test_sigterm_to_the_supervisor_checkpoints_then_resumes_bitwise",
    "test_cli_migrate.py::test_export_then_resume",
    "test_zero_code_ground.py::test_an_evaluation_over_the_training_loader",
    "test_zero_code_ground.py::test_a_resume_at_an_epochs_end",
    "test_compat_timm.py::test_uninterrupted_",
    "test_zero_code_arming.py::test_torch_compile_",
    "test_zero_code.py::test_unmodified_script_resumes_bitwise[torch-compile]",
    "test_trust.py::test_function_checkpoint_survives_an_in_place_restart",
    "test_zero_code_loaders.py::test_a_loader_with_its_own_state_dict",
    "test_launcher.py::test_restart_in_place_applies_the_requested_env",
    "test_interrupts.py::test_ctrl_c_twice_in_zero_code_mode",
    "test_compat_timm.py::test_stopped_mid_epoch",
    "test_first_run.py::test_rerun_resumes_finished",
    "test_compat_keras.py::",
    "test_compat_hf.py::",
    "test_zero_code.py::test_unmodified_script_resumes_bitwise[epochs-workers2]",
    "test_transfer.py::test_s3_server_killed_mid_transfer",
    "test_cli_migrate.py::test_migrate_moves_the_worker",
    "test_cli_jobs.py::test_checkpoint_wait_then_stop_then_resume",
    "test_zero_code_loaders.py::test_an_epoch_loop_that_builds",
)
"""Single tests of the long tier, by the end of their node id's path ("file::name...")."""
LONG_NAMES = ("torchrun", "fsdp")
"""Any other test whose name holds one of these (multi-rank jobs) is long, but for one
torchrun job in the CI tier (test_zero_code.py's agent kill) that keeps ranks covered."""
LONG_KEPT = ("test_killed_torchrun_agent_leaves_no_rank_behind",)


def _long(item: pytest.Item) -> bool:
    if item.path.name in LONG_MODULES:
        return True
    where = f"{item.path.name}::{item.name}"
    if any(where.startswith(prefix) for prefix in LONG_TESTS):
        return True
    return any(word in item.name for word in LONG_NAMES) and not item.name.startswith(LONG_KEPT)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _long(item):
            item.add_marker(pytest.mark.long)
        elif item.path.name in SLOW_MODULES or any(word in item.name for word in SLOW_NAMES):
            item.add_marker(pytest.mark.slow)
