"""SignalRequests: a real signal only records the request; a handler that was there before
still runs; uninstall puts it back."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from ferry.runtime.signals import SignalRequests, chains, ignore_in_worker

SIGNUMS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@pytest.fixture(autouse=True)
def restore_handlers() -> Iterator[None]:
    """Whatever a test does, the process's handlers are as they were afterwards."""
    saved = {s: signal.getsignal(s) for s in SIGNUMS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def requests() -> SignalRequests:
    return SignalRequests(("SIGUSR1", "SIGTERM"), ("SIGUSR2",))


def kill(signum: int) -> None:
    """Deliver a real signal to this process; Python runs the handler before kill returns
    to the test's next bytecode (same thread: the main one)."""
    os.kill(os.getpid(), signum)


def test_a_stop_signal_is_recorded_and_nothing_else_happens() -> None:
    sig = requests()
    assert sig.install()
    kill(signal.SIGUSR1)
    assert sig.stop_signal == signal.SIGUSR1
    assert not sig.checkpoint_requested
    assert sig.count == 1


def test_a_checkpoint_signal_is_recorded() -> None:
    sig = requests()
    sig.install()
    kill(signal.SIGUSR2)
    assert sig.checkpoint_requested
    assert sig.stop_signal is None


def test_the_first_stop_signal_is_the_one_remembered() -> None:
    sig = requests()
    sig.install()
    kill(signal.SIGTERM)
    kill(signal.SIGUSR1)
    kill(signal.SIGUSR2)
    assert sig.stop_signal == signal.SIGTERM
    assert sig.checkpoint_requested
    assert sig.count == 3


def test_only_the_configured_signals_are_handled() -> None:
    sig = requests()
    sig.install()
    assert set(sig.signals) == {signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2}
    assert signal.getsignal(signal.SIGHUP) is not sig._handle


def test_a_previous_python_handler_still_runs() -> None:
    seen: list[int] = []

    def mine(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    signal.signal(signal.SIGUSR1, mine)
    signal.signal(signal.SIGUSR2, mine)
    sig = requests()
    sig.install()
    kill(signal.SIGUSR1)
    kill(signal.SIGUSR2)
    assert seen == [signal.SIGUSR1, signal.SIGUSR2]
    assert sig.stop_signal == signal.SIGUSR1 and sig.checkpoint_requested


def test_the_previous_handler_runs_after_the_request_is_recorded() -> None:
    """A previous handler that raises (as a framework's may) finds the request already taken."""
    sig = requests()

    class Boom(Exception):
        pass

    def raising(signum: int, frame: FrameType | None) -> None:
        assert sig.stop_signal == signum
        raise Boom

    signal.signal(signal.SIGTERM, raising)
    sig.install()
    with pytest.raises(Boom):
        kill(signal.SIGTERM)
    assert sig.stop_signal == signal.SIGTERM


def test_ignored_and_default_previous_handlers_are_not_called() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sig = requests()
    sig.install()
    kill(signal.SIGUSR1)
    kill(signal.SIGTERM)  # SIG_DFL would end the process: it must not be re-raised
    assert sig.stop_signal == signal.SIGUSR1 and sig.count == 2


def test_uninstall_restores_each_previous_handler() -> None:
    def mine(signum: int, frame: FrameType | None) -> None:
        pass

    signal.signal(signal.SIGUSR1, mine)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sig = requests()
    sig.install()
    assert signal.getsignal(signal.SIGUSR1) == sig._handle
    sig.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is mine
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    sig.uninstall()  # twice is harmless
    assert signal.getsignal(signal.SIGUSR1) is mine


def test_after_uninstall_a_signal_no_longer_records() -> None:
    seen: list[int] = []
    signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    sig = requests()
    sig.install()
    sig.uninstall()
    kill(signal.SIGUSR2)
    assert seen == [signal.SIGUSR2]
    assert not sig.checkpoint_requested and sig.count == 0


def test_uninstall_leaves_a_handler_installed_later_alone() -> None:
    sig = requests()
    sig.install()

    def later(signum: int, frame: FrameType | None) -> None:
        pass

    signal.signal(signal.SIGUSR1, later)
    sig.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is later


def test_two_in_a_row_chain_and_unwind() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    outer, inner = requests(), requests()
    outer.install()
    inner.install()
    kill(signal.SIGUSR1)
    assert inner.stop_signal == outer.stop_signal == signal.SIGUSR1
    inner.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == outer._handle
    outer.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_install_outside_the_main_thread_is_refused_quietly() -> None:
    sig = requests()
    result: list[bool] = []
    before = signal.getsignal(signal.SIGUSR1)
    t = threading.Thread(target=lambda: result.append(sig.install()))
    t.start()
    t.join()
    assert result == [False]
    assert signal.getsignal(signal.SIGUSR1) is before
    sig.uninstall()  # nothing installed, nothing to put back
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_worker_ignores_the_stop_signals() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    ignore_in_worker([signal.SIGUSR1])
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    kill(signal.SIGUSR1)  # would end the process with SIG_DFL


def _framework(signum: int, frame: FrameType | None) -> None:
    pass


# (id, the handler before ferry's, a stop signal?, safe points reached?, does it run after ferry's)
CHAINS = [
    ("default, stop", signal.SIG_DFL, True, True, False),
    ("ignored, stop", signal.SIG_IGN, True, False, False),
    ("none (a C handler), stop", None, True, True, False),
    ("KeyboardInterrupt, stop, in the loop", signal.default_int_handler, True, True, False),
    ("KeyboardInterrupt, stop, before the loop", signal.default_int_handler, True, False, True),
    ("KeyboardInterrupt, a checkpoint signal", signal.default_int_handler, False, True, True),
    ("a framework's, stop, in the loop", _framework, True, True, True),
    ("a framework's, checkpoint", _framework, False, False, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("previous", "stop", "at_safe_points", "runs"), [c[1:] for c in CHAINS], ids=[c[0] for c in CHAINS]
)
def test_which_previous_handler_runs(previous: Any, stop: bool, at_safe_points: bool, runs: bool) -> None:
    assert chains(previous, stop=stop, at_safe_points=at_safe_points) is runs


def test_ctrl_c_in_the_loop_records_a_stop_and_raises_nothing_even_twice() -> None:
    """Issue 13: SIGINT as a stop signal chained to Python's KeyboardInterrupt, which ended
    the run mid-step with no checkpoint (and a second Ctrl-C aborted the stop's save)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sig = SignalRequests(("SIGINT", "SIGTERM"), ())
    sig.install()
    sig.at_safe_points = True
    kill(signal.SIGINT)
    kill(signal.SIGINT)
    assert sig.stop_signal == signal.SIGINT and sig.stop_count == 2


def test_ctrl_c_before_the_first_safe_point_interrupts_as_without_ferry() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sig = SignalRequests(("SIGINT",), ())
    sig.install()
    with pytest.raises(KeyboardInterrupt):
        kill(signal.SIGINT)
    assert sig.stop_signal == signal.SIGINT


def test_a_handler_installed_over_ferrys_is_found_and_runs_after_it() -> None:
    """A framework installs its handler after ferry's (Lightning's ends the fit loop at the
    batch's end, before ferry's safe point): ferry puts its own back at the next safe point;
    the later handler then runs after ferry's for a checkpoint signal, and for a stop only
    before the first safe point."""
    sig = requests()
    sig.install()
    seen: list[int] = []
    later = lambda signum, frame: seen.append(signum)  # noqa: E731
    signal.signal(signal.SIGTERM, later)
    signal.signal(signal.SIGUSR2, later)
    assert sorted(s for s, _ in sig.reassert()) == [signal.SIGUSR2, signal.SIGTERM]
    assert sig.reassert() == []  # ferry's is in place again
    kill(signal.SIGTERM)  # before the first safe point: both run
    assert sig.stop_signal == signal.SIGTERM and seen == [signal.SIGTERM]
    sig.at_safe_points = True
    kill(signal.SIGTERM)
    kill(signal.SIGUSR2)
    assert seen == [signal.SIGTERM, signal.SIGUSR2] and sig.stop_count == 2 and sig.checkpoint_requested
    sig.uninstall()
    assert signal.getsignal(signal.SIGTERM) is later  # the later handler is the one left


def test_a_later_handler_that_calls_ferrys_back_does_not_loop() -> None:
    """Lightning's handler calls the handler it replaced (ferry's), which calls it again."""
    sig = requests()
    sig.install()
    calls: list[int] = []
    replaced = signal.getsignal(signal.SIGUSR2)

    def later(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)
        assert callable(replaced)
        replaced(signum, frame)

    signal.signal(signal.SIGUSR2, later)
    sig.reassert()
    kill(signal.SIGUSR2)
    assert calls == [signal.SIGUSR2] and sig.count == 1
