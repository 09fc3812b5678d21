"""``ferry run``'s supervisor, one module per job:

``options``: ``RunOptions`` and the check that a command can start.
``worker``: the worker's environment and process group, clearing up after it.
``signals``: the signal pump, forwarding and the SIGKILL at the end of a grace period.
``decide``: what to do when the worker exits (pure, tested from a table).
``stopping``: what to say while the worker stops (pure, tested from a table).
``supervisor``: the loop around them, and the job directory's records.
"""

from ferry.supervisor.decide import Decision, WorkerExit, decide
from ferry.supervisor.options import RunOptions, check_command
from ferry.supervisor.supervisor import Supervisor

__all__ = ["Decision", "RunOptions", "Supervisor", "WorkerExit", "check_command", "decide"]
