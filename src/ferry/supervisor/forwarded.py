"""Which signals ``ferry run`` passes on to its worker: every one it can catch, but those
that concern the supervisor itself. A leaf of ``ferry.supervisor``: the options check their
stop signals against it, the signal pump catches what it lists."""

from __future__ import annotations

import signal

_NOT_FORWARDED = {
    name
    for name in (
        "SIGKILL",  # cannot be caught
        "SIGSTOP",
        "SIGCHLD",  # the supervisor's own: its worker changed state
        "SIGSEGV",  # faults of the supervisor itself, not requests for the worker
        "SIGBUS",
        "SIGFPE",
        "SIGILL",
        "SIGTRAP",
        "SIGSYS",
        "SIGABRT",
        "SIGPIPE",  # the supervisor's own output went away
        "SIGTTIN",  # terminal job control of the supervisor itself
        "SIGTTOU",
    )
    if hasattr(signal, name)
}


def _forwardable(signum: int) -> bool:
    try:
        return signal.Signals(signum).name not in _NOT_FORWARDED
    except ValueError:  # a real-time signal without a name of its own
        return True


FORWARDED = tuple(int(s) for s in sorted(signal.valid_signals()) if _forwardable(s))
"""Every signal the supervisor catches and passes on to the worker's process group."""
