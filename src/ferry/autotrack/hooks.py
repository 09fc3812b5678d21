"""Zero-code hooks, armed by ferry's sitecustomize when ``FERRY_AUTOTRACK=1``.

Narrow hook points only: ``DataLoader.__iter__`` (each loader is tracked the first time it
is iterated), torch's global optimizer step hook (it tells which loader feeds training,
and is the safe point where no loader does) and, until an optimizer steps or a loader
drives training, torch's global module forward pre-hook (the safe point of a model
trained by hand, ``stepping.py``). No builtins are patched, no bound methods replaced.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ferry.errors import FerryError
from ferry.runtime.signals import SignalRequests

log = logging.getLogger("ferry")
_early_signals: SignalRequests | None = None
_stepper: Any = None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once the module ``name`` has been fully imported."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            original(module)
            callback()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def arm() -> None:
    """Record stop signals from the very start; install the torch hooks once torch loads."""
    global _early_signals
    from ferry.config import Config

    config = Config.from_env()
    _early_signals = SignalRequests(config.stop_signals, config.checkpoint_signals)
    _early_signals.install()
    atexit.register(_say_if_stop_missed)
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _install))


def _say_if_stop_missed() -> None:
    """A stop signal came, and the script ended without ever starting ferry's session (no
    loader batch, optimizer step or model forward): say that no checkpoint was taken. (A
    session that started says so itself, at its own exit.)"""
    api = sys.modules.get("ferry.session.api")  # never imported at exit: torch would load late
    signals = _early_signals
    if signals is None or signals.stop_signal is None:
        return
    if api is not None and getattr(api, "_CURRENT", None) is not None:
        return
    import signal

    name = signal.Signals(signals.stop_signal).name
    sys.stderr.write(
        f"ferry: {name} asked for a checkpoint and stop, but the script never reached a safe point "
        "(no DataLoader batch, optimizer step or model forward after a backward) and ended without "
        "one: no checkpoint was taken; track the state and call `ferry.step()` after each iteration\n"
    )


def _install() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ferry.autotrack.keeper import LoopKeeper
    from ferry.autotrack.stepping import Stepper
    from ferry.session import api
    from ferry.state import loader

    global _stepper
    _stepper = Stepper(LoopKeeper(), _session)
    api.factory = _make
    loader.auto_track = _auto_track
    loader.install_iter_hook()
    register_optimizer_step_post_hook(_after_optimizer_step)
    _stepper.arm_forward()


def _session() -> Any:
    from ferry.session import api

    api.factory = _make
    return api.current(create=True)


def _make() -> Any:
    """The process's session, wired for zero-code mode (also when the script itself starts
    it, with ``ferry.track``)."""
    from ferry import session as session_module
    from ferry.autotrack.discovery import discover, uncaptured_rngs

    try:
        current = session_module.Session(signals=_early_signals)
    except FerryError as exc:  # the script never called ferry: no traceback into its loop
        sys.stderr.write(f"ferry: error: {exc}\n")
        raise SystemExit(1) from None
    stepper = _stepper
    current.discover = lambda: {**discover(), **stepper.found()}
    current.uncaptured = uncaptured_rngs
    current.loop = stepper.keeper
    return current


def _auto_track(dataloader: Any) -> Any:
    session = _session()
    name = f"loader{len(session.loaders)}"
    session.track(**{name: dataloader})
    return session.loaders[name]


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _session().note_optimizer_step()
    _stepper.after_optimizer_step()
