"""What ``ferry run`` does when its worker exits (``ferry.supervisor.decide``), from a table.

Each row: how the worker exited and what the supervisor knew, the options, and the
decision: the action, the exit status, the backoff, and words of the message."""

from __future__ import annotations

from typing import Any

import pytest

from ferry.knobs import BACKOFF_CAP_SECONDS, CHECKPOINT_EXIT_CODE, backoff_delay
from ferry.supervisor import RunOptions, WorkerExit, decide_exit
from ferry.supervisor.decide import exit_status, resume_hint
from ferry.supervisor.stopping import StopProgress, grace_kill_notice, stop_notice, stop_progress

CKPT = "/ck/job"
GPU1 = {"CUDA_VISIBLE_DEVICES": "1"}
Opt = RunOptions


def P(saving: int | None = None, last: int | None = None) -> StopProgress:
    """How far a stop got: the step being saved, the newest committed checkpoint's."""
    return StopProgress(saving_step=saving, last_checkpoint_step=last)


def X(returncode: int, stop: str | None = None, **known: Any) -> WorkerExit:
    """How the worker exited: its return code, the stop signal received, what else was known."""
    return WorkerExit(returncode=returncode, stop_signal=stop, **known)


# (id, the exit, the options, then the decision: action, exit status, backoff, words of the message)
ROWS: list[tuple[str, WorkerExit, RunOptions, str, int, float, str]] = [
    ("finished", X(0), Opt(), "finished", 0, 0, "the worker finished"),
    ("finished after a stop", X(0, "SIGTERM"), Opt(), "finished", 0, 0, "the worker finished"),
    ("checkpointed", X(85), Opt(), "checkpointed", 85, 0, "stopped; run the same command again"),
    ("checkpointed, named", X(85), Opt(job_id="j"), "checkpointed", 85, 0, "run the same command again"),
    ("stop, checkpointed", X(85, "SIGTERM"), Opt(), "checkpointed", 85, 0, "checkpointed on SIGTERM"),
    ("HTCondor's code", X(99, "SIGTERM"), Opt(exit_code=99), "checkpointed", 99, 0, "on SIGTERM"),
    ("torchrun's 1 after 85", X(1, checkpointed=True), Opt(), "checkpointed", 85, 0, "checkpointed and"),
    ("stop, save failed", X(86, "SIGUSR1"), Opt(max_failures=3), "failed", 86, 0, "86 after SIGUSR1"),
    ("stop, grace over", X(-9, "SIGTERM", killed=True), Opt(), "failed", 137, 0, "after the 30 s grace"),
    ("grace over, none kept", X(-9, "SIGINT", killed=True, progress=P()), Opt(), "failed", 137, 0,
     "period; the job has no committed checkpoint: a new run"),
    ("grace over, one kept", X(-9, "SIGINT", killed=True, progress=P(2, 1)), Opt(), "failed", 137, 0,
     "period; the last committed checkpoint, step 1, stays"),
    ("KeyboardInterrupt", X(130, "SIGINT"), Opt(), "failed", 130, 0, "130 after SIGINT, without a committed"),
    ("stop, then a crash", X(-11, "SIGTERM"), Opt(), "failed", 139, 0, "killed by SIGSEGV before it"),
    ("restart asked", X(85, restart=GPU1), Opt(max_restarts=2), "restart", 0, 0, "(1 of 2) with CUDA_VIS"),
    ("2nd restart", X(85, restart=GPU1, restarts=1), Opt(max_restarts=2), "restart", 0, 0, "(2 of 2)"),
    ("restarts used", X(85, restart=GPU1, restarts=2), Opt(max_restarts=2), "checkpointed", 85, 0, "stopped"),
    ("restart, stop", X(85, "SIGINT", restart=GPU1), Opt(max_restarts=2), "checkpointed", 85, 0, "on SIGINT"),
    ("crash, none allowed", X(1), Opt(), "failed", 1, 0, "exited with 1 (--max-failures N restarts it)"),
    ("crash, 1st of 3", X(1), Opt(max_failures=3), "backoff", 85, 1.0, "1; a stop signal came during"),
    ("crash, 3rd of 3", X(1, failures=2), Opt(max_failures=3), "backoff", 85, 4.0, "exited with 1"),
    ("crash, none left", X(1, failures=3), Opt(max_failures=3), "failed", 1, 0, "(no restarts left)"),
    ("backoff capped", X(1, failures=9), Opt(max_failures=20), "backoff", 85, 60.0, "exited with 1"),
    ("base 0.5 s", X(1, failures=1), Opt(max_failures=5, backoff_seconds=0.5), "backoff", 85, 1.0, ""),
    ("killed, stray signal", X(-9), Opt(max_failures=1), "backoff", 85, 1.0, "was killed by SIGKILL"),
    ("killed, forwarded", X(-1, forwarded=frozenset({"SIGHUP"})), Opt(), "failed", 129, 0, "SIGHUP, which"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("exited", "options", "action", "code", "delay", "words"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_the_decision_after_an_exit(
    exited: WorkerExit, options: RunOptions, action: str, code: int, delay: float, words: str
) -> None:
    decision = decide_exit(exited, options, CKPT)
    assert (decision.action, decision.code, decision.delay) == (action, code, delay)
    assert words in decision.message
    assert decision.hand_back == (action == "checkpointed" and exited.stop_signal is not None)


def test_a_restart_carries_the_requested_env_and_unsets_none() -> None:
    decision = decide_exit(
        WorkerExit(returncode=85, restart={"CUDA_VISIBLE_DEVICES": "1", "OLD": None, "N": 3}),
        RunOptions(max_restarts=1),
        CKPT,
    )
    assert decision.env == {"CUDA_VISIBLE_DEVICES": "1", "OLD": None, "N": "3"}


def test_the_notes_say_why_a_code_was_reread_or_a_restart_refused() -> None:
    reread = decide_exit(WorkerExit(returncode=1, checkpointed=True), RunOptions(), CKPT)
    assert [n for _, n in reread.notes] == [
        "ferry run: the worker exited with 1, but its job committed a checkpoint and stopped: "
        "treating it as checkpointed"
    ]
    refused = decide_exit(WorkerExit(returncode=85, restart={}), RunOptions(), CKPT)
    assert "0 of 0 restarts are used (--max-restarts): exiting with 85 instead" in refused.notes[0][1]


def test_the_resume_hint_is_the_same_command_in_the_same_folder() -> None:
    """The default job id is made of the folder and the command line: it resumes as it is."""
    again = "run the same command again, in the same folder, to resume"
    assert resume_hint(RunOptions(), "/a b/c") == again
    assert resume_hint(RunOptions(dir="/x"), "/x") == again
    fresh = resume_hint(RunOptions(fresh=True), "/x")
    assert fresh == "run the same command again, in the same folder and without --fresh, to resume"


@pytest.mark.parametrize(
    ("base", "failure", "delay"),
    [(1.0, 1, 1.0), (1.0, 2, 2.0), (0.5, 4, 4.0), (1.0, 7, BACKOFF_CAP_SECONDS), (0.0, 5, 0.0)],
)
def test_the_backoff_doubles_up_to_its_cap(base: float, failure: int, delay: float) -> None:
    assert backoff_delay(base, failure, BACKOFF_CAP_SECONDS) == delay


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (85, 85), (-9, 137), (-15, 143), (255, 255)])
def test_exit_status_is_what_a_shell_reports(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


def test_the_default_exit_code_is_the_one_constant() -> None:
    assert RunOptions().exit_code == CHECKPOINT_EXIT_CODE == 85


# What ``ferry run`` says while its worker stops (ferry.supervisor.stopping). Issue 13: it
# said "the worker checkpoints and stops" and "the last committed one stays" whether or not
# the worker ever reached a safe point and whether or not the job had a checkpoint.
# (id, grace left, a repeat?, progress, words that must be there, words that must not)
NOTICES = [
    ("first", 30.0, False, P(),
     ["SIGINT: asked the worker to checkpoint at its next safe point and stop; SIGKILL in 30 s"],
     ["checkpoints and stops"]),
    ("first, no grace", None, False, P(), ["no grace period (--grace)"], ["SIGKILL"]),
    ("again, saving", 12.4, True, P(7, 5),
     ["SIGINT again", "saving the checkpoint of step 7, which signals do not interrupt", "in 12 s, SIGKILL",
      "step 5, stays"], []),
    ("again, no safe point", 3.0, True, P(None, None),
     ["has not reached a safe point yet; further signals change nothing", "has no committed checkpoint"],
     ["stays"]),
    ("again, no grace", None, True, P(3, 3), ["never killed: `kill -KILL 4242` ends it"], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("grace", "repeated", "progress", "there", "absent"),
    [n[1:] for n in NOTICES],
    ids=[n[0] for n in NOTICES],
)
def test_what_the_supervisor_says_when_it_forwards_a_stop(
    grace: float | None, repeated: bool, progress: StopProgress, there: list[str], absent: list[str]
) -> None:
    line = stop_notice("SIGINT", grace, repeated=repeated, progress=progress, pid=4242)
    assert all(w in line for w in there), line
    assert not any(w in line for w in absent), line


@pytest.mark.parametrize(
    ("progress", "words"),
    [
        (P(), "(it reached no safe point after the signal (`ferry help zero-code`: loops without one))"),
        (P(None, 4), "no new checkpoint: the last committed checkpoint, step 4, stays"),
        (P(9, None), "(it was still saving the checkpoint of step 9)"),
        (P(9, None), "the job has no committed checkpoint: a new run starts from the beginning"),
    ],
)
def test_what_the_supervisor_says_when_the_grace_ends(progress: StopProgress, words: str) -> None:
    assert words in grace_kill_notice("SIGTERM", 30.0, progress)


@pytest.mark.parametrize(
    ("status", "progress"),
    [
        ({}, P()),
        ({"state": "running", "step": 4, "updated": 20.0, "worker_started": 10.0}, P()),
        ({"state": "checkpointing", "step": 4, "updated": 20.0, "worker_started": 10.0}, P(4)),
        ({"state": "checkpointing", "step": 4, "updated": 5.0, "worker_started": 10.0}, P()),  # earlier
        ({"state": "running", "last_checkpoint": {"step": 2, "url": "u", "time": 1.0}}, P(None, 2)),
    ],
)  # fmt: skip
def test_how_far_a_stop_got_is_read_from_the_status(status: Any, progress: StopProgress) -> None:
    assert stop_progress(status) == progress
