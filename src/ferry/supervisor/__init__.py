"""``ferry run``'s supervisor, one module per job:

``options``: ``RunOptions`` and the check that a command can start.
``forwarded``: which signals the supervisor passes on to its worker.
``worker``: the worker's environment and process group, clearing up after it.
``launcher``: starting the job's workers (cold, warm, gated), holding its locks.
``signals``: the signal pump, forwarding and the SIGKILL at the end of a grace period.
``decide``: what to do when the worker exits (pure, tested from a table).
``stopping``: what to say while the worker stops (pure, tested from a table).
``warm``, ``warmslot``: a warm migration's worker, its requests and its take-over.
``nodes``: the job directory and checkpoint root of a job on one node or many.
``running``: the loop around them, and the job directory's records of each worker.
``supervisor``: names the job, claims what it owns and hands the run to ``running``.
"""

from ferry.supervisor.decide import ExitDecision, WorkerExit, decide_exit
from ferry.supervisor.options import RunOptions, check_command
from ferry.supervisor.supervisor import Supervisor

__all__ = ["ExitDecision", "RunOptions", "Supervisor", "WorkerExit", "check_command", "decide_exit"]
