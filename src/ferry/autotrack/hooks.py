"""Zero-code hooks, armed by ferry's sitecustomize when ``FERRY_AUTOTRACK=1``.

Narrow hook points only: ``DataLoader.__init__`` (it notes where the script built each
loader: the loader's name, state/loader_identity.py), ``DataLoader.__iter__`` (each loader
is tracked the first time it is iterated), torch's global optimizer step hook (it tells
which loader feeds training, and is the safe point where no loader does) and, until an
optimizer steps or a loader drives training, torch's global module forward pre-hook (the
safe point of a model trained by hand, ``stepping.py``). No builtins are patched, no bound
methods replaced.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ferry.autotrack import frameworks
from ferry.autotrack.outputs import Outputs
from ferry.errors import ConfigError, FerryError
from ferry.runtime.procs import own_process
from ferry.runtime.signals import SignalRequests
from ferry.state.usercode import is_user_file

log = logging.getLogger("ferry")
_early_signals: SignalRequests | None = None
_stepper: Any = None


def _resuming() -> bool:
    """Is there a committed checkpoint for this process to resume (a cheap look, once)?"""
    try:
        from ferry.config import Config
        from ferry.engine.catalog import list_checkpoints
        from ferry.storage import open_storage

        directory = Config.from_env().dir
        return bool(directory) and bool(list_checkpoints(open_storage(directory)))
    except Exception:  # no root yet, a remote that cannot be asked: nothing to put back
        return False


_outputs = Outputs(is_user_file, _resuming)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once the module ``name`` has been fully imported, however it is
    imported (``import``, ``importlib.import_module``, inside a function).

    It stays on ``sys.meta_path`` until the module has run: a look-up that only asks for the
    spec (``importlib.util.find_spec("torch")``, which ``datasets`` makes while it is
    imported) gets a spec whose loader calls back, and is free to throw it away; the next
    look-up is served again. Should the module arrive by a route that bypasses the finder,
    the next import of anything after it has run calls back too."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname == self.name:
            return self._spec(fullname, path, target)
        if _loaded(self.name):  # imported past us (a custom finder, sys.modules set by hand)
            self._done()
        return None

    def _spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None) -> Any:
        spec = _next_spec(self, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module
        own = vars(loader).get("exec_module") if hasattr(loader, "__dict__") else None

        @functools.wraps(original)
        def exec_module(module: ModuleType) -> None:
            try:
                original(module)
            finally:  # the loader is the module's __loader__: leave it as it was
                if own is not None:
                    loader.exec_module = own
                else:
                    with contextlib.suppress(AttributeError):
                        del loader.exec_module
            self._done()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def _done(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        self.callback()


def _next_spec(me: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None) -> Any:
    """The spec the finders after ``me`` give (as the import system would without it)."""
    finders = list(sys.meta_path)
    after = finders[finders.index(me) + 1 :] if me in finders else finders
    for finder in after:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None


def _loaded(name: str) -> bool:
    """Has module ``name`` finished running (not merely entered ``sys.modules``)?"""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def arm() -> None:
    """Record stop signals from the very start; install the torch hooks once torch loads."""
    global _early_signals
    from ferry.config import Config

    config = Config.from_env()
    _early_signals = SignalRequests(config.stop_signals, config.checkpoint_signals)
    _early_signals.install()
    _outputs.watch()
    atexit.register(own_process(_at_exit))
    if _loaded("torch"):
        _install()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _install))


def _launcher() -> bool:
    """Is this process a launcher of the ranks (torchrun's agent), not a rank?"""
    launchers = ("torch.distributed.run", "torch.distributed.elastic.agent.server")
    return any(name in sys.modules for name in launchers)


def installed() -> bool:
    """Are zero-code mode's torch hooks in place?"""
    return _stepper is not None


def unarmed_reason() -> str | None:
    """Why torch is loaded and ferry's hooks are not, in the user's terms; None when all is
    well (torch not imported, or the hooks installed)."""
    if installed() or not _loaded("torch"):
        return None
    return (
        "torch was imported, but ferry's zero-code hooks were never installed (its import "
        "hook on sys.meta_path was removed before torch finished loading): ferry saw no "
        "loader, optimizer or model; this is ferry's miss, not the script's. Use the explicit "
        "API (`ferry.track(...)` and `ferry.step()`) or report this with the script's imports"
    )


def _at_exit() -> None:
    """At the end of a script that never started ferry's session: a stop signal that came
    is answered truthfully (no checkpoint was taken, and why)."""
    api = sys.modules.get("ferry.session.api")  # never imported at exit: torch would load late
    signals = _early_signals
    if _launcher():
        return  # torchrun's agent: its ranks train and say what happened, not it
    if signals is None or signals.stop_signal is None:
        why = unarmed_reason()
        if why is not None:  # a run ferry never protected: say so even without a stop
            sys.stderr.write(f"ferry: warning: {why}\n")
        return
    if api is not None and getattr(api, "_CURRENT", None) is not None:
        return
    import signal

    name = signal.Signals(signals.stop_signal).name
    why = unarmed_reason()
    if why is not None:
        sys.stderr.write(
            f"ferry: {name} asked for a checkpoint and stop, but no checkpoint was taken: {why}\n"
        )
        return
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
    from ferry.state import loader, loader_identity, stateful_loader

    global _stepper
    _stepper = Stepper(LoopKeeper(), _session)
    api.factory = _make
    loader_identity.is_user_file = is_user_file
    loader_identity.install_init_hook(loader.hook_class)  # a stateful loader's own __iter__
    loader.auto_track = _auto_track
    loader.install_iter_hook()
    for module, name in stateful_loader.KNOWN.items():
        after_import(module, _stateful_class_hook(module, name))
    frameworks.arm_when_imported(after_import)
    register_optimizer_step_post_hook(_after_optimizer_step)
    _stepper.arm_forward()


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` once ``module`` has been imported: now if it is, else when it is."""
    if _loaded(module):
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(module, callback))


def _stateful_class_hook(module: str, name: str) -> Callable[[], None]:
    def hook() -> None:
        from ferry.state import loader_identity

        cls = getattr(sys.modules[module], name, None)
        if isinstance(cls, type):
            loader_identity.hook_init_of(cls)

    return hook


def _session() -> Any:
    from ferry.session import api

    api.factory = _make
    return api.current(create=True)


def _make() -> Any:
    """The process's session, wired for zero-code mode (also when the script itself starts
    it, with ``ferry.track``)."""
    from ferry import session as session_module
    from ferry.autotrack.discovery import discover, uncaptured_rngs
    from ferry.autotrack.extras import Extras  # (frames: torch; this module is imported at start-up)

    try:
        current = session_module.Session.start(signals=_early_signals)
    except FerryError as exc:  # the script never called ferry: no traceback into its loop
        sys.stderr.write(f"ferry: error: {exc}\n")
        raise SystemExit(1) from None
    stepper = _stepper
    current.discover = lambda: {**discover(), **stepper.found()}
    current.uncaptured = uncaptured_rngs
    current.loop = stepper.keeper
    current.extras = Extras(_outputs, is_user_file, frameworks.covers)
    return current


_legacy_names = 0
_moved_warned: set[str] = set()


def _name(session: Any, dataloader: Any) -> tuple[str, Any]:
    """The loader's name and identity. A checkpoint from before loaders had identities
    names them by the order they were first iterated (``loader0``, ...): resuming one, the
    loaders are named that way again, so that the saved positions still find their loaders."""
    global _legacy_names
    from ferry.state import loader_identity
    from ferry.state.inputs import loader_inputs

    identity = loader_identity.identity_of(dataloader)
    loaded = session.loaded
    saved = loaded.state.get("ferry", {}).get("loaders", {}) if loaded is not None else {}
    if saved and loader_identity.legacy(saved):
        _legacy_names += 1
        return f"loader{_legacy_names - 1}", None
    moved = loader_identity.relocated(identity, loader_inputs(dataloader), saved) if saved else None
    if moved is not None and identity.site not in _moved_warned:
        _moved_warned.add(identity.site)
        log.warning(
            "ferry: warning: the loader built at %s is taken for the one saved as built at %s: "
            "the script changed since the checkpoint, and that is the one line of the file "
            "that built a loader with the same inputs",
            identity.site,
            moved.site,
        )
    if moved is not None:
        identity = moved
    return identity.name, identity


def _auto_track(dataloader: Any) -> Any:
    from ferry.state.loader import ignore_stops_in_workers, track_loader

    session = _session()
    if session.framework is not None:  # the framework's support keeps its own loaders' positions
        ignore_stops_in_workers(dataloader, session.signals.signals)
        return None
    name, identity = _name(session, dataloader)
    track_loader(name, dataloader, session.loop_hooks).identity = identity  # before the session resumes it
    try:
        session.track(**{name: dataloader})
    except FerryError as exc:  # e.g. inputs changed since the checkpoint
        _fail(session, exc)
    return session.loaders[name]


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    session = _session()
    if session.restoring:  # DCP initialises optimizer state with a step while loading
        return
    if session.loop_hooks.restore_pending and _trained_by_loader(session):  # before the restore point
        _fail(session, _unmatched(session))
    session.loop_hooks.note_optimizer_step()
    _stepper.after_optimizer_step()


def _trained_by_loader(session: Any) -> bool:
    """Whether the checkpoint's steps were a training loader's (its restore point is that
    loader's first batch, which an optimizer step here came before): not a script whose
    safe points are its optimizer steps or its model's forwards."""
    saved = session.loaded.state.get("ferry", {})
    frames = saved.get("frames") or {}
    return saved.get("driver") is not None and frames.get("by", "loader") == "loader"


def _unmatched(session: Any) -> ConfigError:
    saved = session.loaded.state.get("ferry", {}).get("driver")
    seen = ", ".join(session.loaders) or "none"
    return ConfigError(
        f"{session.loaded.url}: the script trains, but the checkpoint's training loader "
        f"{saved} matches none of this run's loaders ({seen}): was the script changed since "
        "the checkpoint? Resume it with the script that was checkpointed, or start fresh in "
        "another --dir"
    )


def _fail(session: Any, exc: FerryError) -> None:
    """End the script with one line: no traceback into its loop, the job marked failed."""
    sys.stderr.write(f"ferry: error: {exc}\n")
    session.report.crashed(session.global_step, type(exc), exc)
    session.close()
    raise SystemExit(exc.exit_code)
