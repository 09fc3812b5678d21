"""Every tunable of ferry, named once, with what it trades off: the session, the engine and
the storage, the supervisor, the operator commands, the soak and the scheduler adapters.

These are fixed numbers, not settings: what a user chooses per job is a ``Config`` field or
a ``ferry run`` option (their defaults, where they are one of these, come from here).
"""

from __future__ import annotations

# ---------------------------------------------------------------------- exit codes
CHECKPOINT_EXIT_CODE = 85
"""The default "checkpointed, resume me" exit status (Config.exit_code, ``ferry run
--exit-code``; HTCondor's job ad may name another). Any non-zero value a scheduler does not
read as success or as a crash would do; 85 is the one the docs, submit files and manifests
name, so changing it breaks every generated file that names it."""

FAILURE_EXIT_CODE = 86
"""The default exit status of a stop whose checkpoint could not be committed
(Config.failure_exit_code): distinct from CHECKPOINT_EXIT_CODE, so that a scheduler never
takes a failed save for a resumable stop."""

# ---------------------------------------------------------------------- the session
STATUS_SECONDS = 1.0
"""How often a training process refreshes its status (the heartbeat that `ferry list` and
`ferry status` read), at a safe point: fresher step counts, against a small file write."""

ASKED_SAVE_SHARE = 0.05
"""The most of training's time that saves asked for by control requests or checkpoint
signals may block it: the next one waits until the time since the last save began is the
last save's blocked time over this share (``policy.decide_at_safe_point``), or
ASKED_SAVE_HOLD_SECONDS. A stream of requests (a monitor asking every 100 ms) then costs at
most this much of a job whose saves block it under 50 ms, besides the writing thread's work.
Periodic saves and stops are not held back."""

ASKED_SAVE_HOLD_SECONDS = 1.0
"""The longest ASKED_SAVE_SHARE holds an asked-for save back: a request that must be
answered soon (a Kubernetes preStop hook's, within half the grace period) is never late by
more, whatever the last save cost."""

AGREE_OVERHEAD = 0.0025
"""The share of training time the ranks of a job may spend agreeing whether to save or stop
(``ferry.session.agreement``): they agree every N steps, N chosen from the measured cost
of one agreement and of one step. A quarter of the 1 % goal: both measures are noisy (one
agreement took 0.4-0.9 ms here, with peaks of 3-4 ms on every rank at once); lower
means rarer agreements, so a signal waits more steps."""

AGREE_LATENCY_SECONDS = 0.5
"""The longest a signal or request waits for the ranks' next agreement (steps longer than
this: one step). Bounds the interval that AGREE_OVERHEAD asks for when agreeing is costly
against the step (thousands of ranks, millisecond steps), at the price of that overhead."""

RANK_SAVE_TIMEOUT_SECONDS = 1800.0
"""How long a rank's background save waits for the other ranks (rank 0's plan, every rank's
part, rank 0's outcome) before it fails: a rank that died is seen sooner by the ranks'
next agreement, this only bounds a rank that hangs. As long as torch's default process
group timeout, which the same hang would hit in a collective."""

# ---------------------------------------------------------------------- engine and storage I/O
WRITE_CHUNK_BYTES = 16 << 20
"""Bytes per write call of a checkpoint file: large enough for full-speed I/O, small enough
that hashing one chunk overlaps writing the next."""

WRITE_SMALL_BYTES = 1 << 20
"""Segments below this (small tensors, padding) are gathered into one write call instead of
one call each: 10,000 biases are not 10,000 system calls."""

WRITE_BOUNCE_BYTES = 4 << 20
"""The buffer small segments are gathered in, per file being written."""

READ_CHUNK_BYTES = 16 << 20
"""The largest piece read at once when loading or verifying (hashed while the next is read):
larger means fewer calls to a remote store, at this much memory for two read buffers."""

# ---------------------------------------------------------------------- the supervisor
GRACE_SECONDS = 30.0
"""The default of ``ferry run --grace``: how long a stopped worker gets to checkpoint and
exit before its group is SIGKILLed. Longer fits bigger saves; shorter keeps the
supervisor's kill ahead of a scheduler's own, which leaves no job directory behind."""

BACKOFF_SECONDS = 1.0
"""The default of ``ferry run --backoff``: the wait before the first restart after a failure
(doubled for each further one). Shorter recovers sooner from a one-off crash; longer stops
a crash loop from hammering shared storage or the GPU driver."""

BACKOFF_CAP_SECONDS = 60.0
"""The longest wait between a failure and the restart: bounds the time a job sits idle after
several failures, at the price of restarting a persistent crash once a minute."""


def backoff_delay(base_seconds: float, attempt: int, cap_seconds: float) -> float:
    """The one backoff formula: the wait before the ``attempt``-th retry (1, 2, ...) doubles
    from ``base_seconds``, up to ``cap_seconds``. It lives here, at the bottom of the layers,
    so that every retry loop (the supervisor's restarts, storage transfers) can use it."""
    return min(base_seconds * 2.0 ** (attempt - 1), cap_seconds)


LEFTOVER_SECONDS = 5.0
"""How long processes the worker left behind get after SIGTERM, before SIGKILL: time for them
to close files, against the time the next worker waits for its GPU."""

GROUP_EXIT_SECONDS = 1.0
"""How long the supervisor waits for the worker's process group to empty by itself after the
worker exited (children finishing their own exit), and for strays to die after SIGKILL,
before it starts killing: a longer wait delays every restart by that much."""

POLL_SECONDS = 0.5
"""The supervisor's main loop wakes on every signal (SIGCHLD included); this is only a safety
net. Shorter costs wake-ups of an idle supervisor; longer delays noticing a missed one."""

# ---------------------------------------------------------------------- processes
PROCESS_POLL_SECONDS = 0.05
"""The sleep of loops that wait for a process to change (to exit, to appear in /proc, a log
line): shorter reacts sooner and burns more CPU on the machine the job trains on."""

STOP_PROCESS_SECONDS = 10.0
"""How long a helper child process (a test server, moto) gets after SIGTERM before SIGKILL."""

# ---------------------------------------------------------------------- operator commands
SUSPEND_LOCK_SECONDS = 60.0
"""The default of ``ferry process suspend --timeout``: how long the driver may wait for in-flight GPU
work before the process's CUDA state is locked; longer waits out long kernels."""

REQUEST_TIMEOUT_SECONDS = 300.0
"""The default ``--timeout`` of ``ferry checkpoint --wait``, ``migrate`` and ``export``: the
longest an operator waits for the next safe point plus a save. Long steps or big saves need
more; a shorter one gives up on a healthy job."""

ANSWER_CHECK_SECONDS = 0.25
"""While waiting for a worker's answer, how often its job is checked for being alive: a
dead worker is reported this much later, at the cost of a read of the job directory."""

ANSWER_FIRST_NOTE_SECONDS = 2.0
"""When the first "waiting" progress line is printed: answers faster than this print none."""

ANSWER_NOTE_SECONDS = 5.0
"""How often "waiting" progress lines follow: quieter, or more reassuring."""

# ---------------------------------------------------------------------- ferry chaos
CHAOS_PAUSE_SECONDS = (0.3, 1.5)
"""The default ``ferry chaos --pause``: training between two faults. Shorter pauses hit more
steps between safe points (more faults land mid-save) and make the soak slower per step."""

CHAOS_OUTAGE_SECONDS = (1.0, 8.0)
"""The default ``ferry chaos --outage``: how long a remote-down fault lasts. Long enough to
outlast a few retries, short enough that a stop's copy waits it out."""

CHAOS_TIMEOUT_SECONDS = 1800.0
"""The default ``ferry chaos --timeout``: the soak gives up after this."""

CHAOS_BACKOFF_SECONDS = 0.1
"""The soak's ``ferry run --backoff``: a killed worker comes back almost at once, so that
faults, not waits, fill the soak's time."""

CHAOS_SPARE_RESTARTS = 10
"""Restarts and failures the soak allows ``ferry run`` beyond one per fault: headroom for a
fault that costs two (a kill during a restart)."""

CHAOS_REQUEST_SECONDS = 30.0
"""How long the disk-full fault waits for the save it provoked before freeing the disk."""

KILL_TREE_SECONDS = 30.0
"""How long processes get to vanish after SIGKILL before the soak reports them as stuck (in
uninterruptible sleep, e.g. on a hung filesystem)."""

SERVER_START_SECONDS = 30.0
"""How long the soak waits for its local S3 server (moto) to serve: a slow, busy machine
needs a few seconds to import it."""

RELAY_POLL_SECONDS = 0.1
"""The soak's TCP relay: how often its accept loop looks whether it was cut, and how long it
waits before trying to bind its port again after an outage."""

RELAY_REBIND_SECONDS = 10.0
"""How long the relay keeps trying to listen on its port again after an outage (the port may
sit in TIME_WAIT): the job's copies must find the remote on the same URL."""

RELAY_CONNECT_SECONDS = 10.0
"""The relay's connect timeout to the S3 server behind it."""

# ---------------------------------------------------------------------- schedulers
SLURM_MAX_REQUEUES = 20
"""Requeues a SLURM job may do by default (FERRY_SLURM_MAX_REQUEUES): more keeps a job
going through more preemptions; fewer ends a job that is preempted again and again."""

K8S_SAFETY = 2.0
"""Kubernetes: the pod's grace period must fit this many saves of the measured length (the
preStop checkpoint and the stop checkpoint)."""

K8S_MARGIN_SECONDS = 10.0
"""Kubernetes: what the grace period needs beyond the saves: the hook's process start-up,
the last step in flight, the exit."""

# ---------------------------------------------------------------------- warnings
GRACE_WARN_FRACTION = 0.8
"""A save longer than this fraction of the grace period is warned about: closer to 1 warns
only when a stop is about to be killed; lower warns while there is still room to grow."""
