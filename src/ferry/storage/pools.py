"""Background pools that keep working while the interpreter shuts down.

A save still in flight when the program ends must commit; but concurrent.futures refuses
new work once the interpreter is exiting. Then the work runs inline, on the caller's
thread: slower, never lost.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def submit(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> Future[T]:
    try:
        return pool.submit(fn, *args)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done
