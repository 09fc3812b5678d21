"""The module-level API (``ferry.track``, ``ferry.step``, ...) over the process's session."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ferry.config import Config, Overrides
from ferry.errors import ConfigError, FerryError, bug
from ferry.session.core import Session

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

_CURRENT: Session | None = None
"""The session of this process; a closed one no longer counts."""


factory: Callable[[], Session] | None = None
"""Zero-code mode sets this: a session the script starts (``ferry.track`` in an otherwise
unmodified script) is made with zero-code mode's wiring too."""


def current(create: bool = True) -> Session | None:
    """The session of this process (made from FERRY_* settings on first use)."""
    global _CURRENT
    if _CURRENT is not None and _CURRENT.closed:
        _CURRENT = None
    if _CURRENT is None and create:
        _CURRENT = Session.start() if factory is None else factory()
    return _CURRENT


def adopt(session: Session) -> None:
    """Make ``session`` (built by zero-code mode, with its own signals) the current one."""
    global _CURRENT
    _CURRENT = session


def configure(config: Config | None = None, **overrides: Unpack[Overrides]) -> Session:
    """Start this process's session with these settings; call it once, before ``track``.

    ``config``: a whole ``ferry.Config`` to start from; without one, the FERRY_* environment
    variables (``ferry run`` sets those) fill in the settings not given. ``overrides``:
    ``ferry.Config`` fields (``dir``, ``every_steps``, ``every_seconds``, ``keep_last``, ...)
    that win over ``config`` or the variables; one given as None counts as not given.
    Without a call, the first ``track`` starts the session from the environment alone.
    Raises ``FerryError`` when the session exists already, ``ConfigError`` for a setting
    that is unknown or out of range.

    Example::

        ferry.configure(dir="s3://bucket/run1", every_steps=500, keep_last=2)
        ferry.configure(ferry.Config(dir="/scratch/run1"), every_steps=500)
    """
    global _CURRENT
    if current(create=False) is not None:
        raise FerryError(
            "ferry is already configured in this process; call ferry.configure() before ferry.track(), once"
        )
    _CURRENT = Session.start(_settings(config, dict(overrides)))
    return _CURRENT


def _settings(config: Config | None, overrides: dict[str, Any]) -> Config:
    if config is None:
        return Config.from_env(**overrides)
    if not isinstance(config, Config):
        raise ConfigError(
            f"ferry.configure() takes a ferry.Config or settings by keyword, not a {type(config).__name__}: "
            "e.g. ferry.configure(dir=...)"
        )
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)}; the settings are: {', '.join(sorted(known))}"
        )
    return config.with_(**{k: v for k, v in overrides.items() if v is not None})


def _session() -> Session:
    session = current()
    if session is None:
        raise bug("no ferry session in this process")
    return session


def track(**objects: Any) -> None:
    """Track training state by name, so that every checkpoint saves it and a resumed run
    gets it back exactly.

    Each keyword names one object, and the name is its key in the checkpoint (keep names
    stable between the interrupted and the resumed run). Accepted:

    - objects with ``state_dict()`` / ``load_state_dict()``: models, optimizers, LR
      schedulers, grad scalers, your own ``ferry.Stateful`` classes;
    - plain ``dict`` and ``list`` objects that training updates in place (counters, history);
    - random generators (``torch.Generator``, ``numpy.random.Generator``, ``random.Random``);
    - ``torch.utils.data.DataLoader``: each batch request becomes a safe point (where a
      checkpoint may be taken), and a resume skips the batches already consumed at the
      sampler, without loading them. The one named ``loader`` (or the first) counts steps.

    The global RNGs (Python, NumPy, torch CPU and CUDA) are always saved. When a checkpoint
    exists under the configured ``dir``, tracked objects are restored from it: at once when
    no DataLoader is tracked, else at the first batch request. Anything else raises
    ``UnsupportedStateError``, naming the object.

    Example::

        ferry.track(model=model, optimizer=opt, scheduler=sched, loader=loader)
        for epoch in range(epochs):
            for x, y in loader:  # resumed runs pick up at the saved batch
                ...
    """
    session = _session()
    session.leave_zero_code(objects)
    session.track(**objects)


def step() -> None:
    """Mark the end of a training iteration: a safe point, where a requested or periodic
    checkpoint is taken and a stop takes effect.

    Needed only when no DataLoader is tracked (with one, its batch requests are the safe
    points and count the steps); then each call also counts one step (``ferry.global_step``).
    Call it between iterations, never inside one: a checkpoint must not see half a step.
    """
    session = _session()
    session.leave_zero_code({}, steps=True)
    session.step()


def restore() -> int | None:
    """Restore the newest good checkpoint into the tracked objects now, instead of at the
    first safe point; returns its step, or None when starting fresh.

    Useful when the script reads restored state (an epoch counter) before its first batch.
    A checkpoint that fails verification is skipped for the newest good one, with a warning.
    """
    return _session().restore()


def checkpoint(stop: bool = False) -> None:
    """Request a checkpoint at the next safe point; with ``stop=True``, then exit with the
    "checkpointed, resume me" status (``Config.exit_code``, 85 by default).

    It returns at once: the save happens at the next safe point, as for a signal
    (``ferry checkpoint`` from another shell does the same for a running job).
    """
    _session().request("stop" if stop else "checkpoint")


def close() -> None:
    """Finish the session: wait for the save in flight to commit, put the signal handlers
    back and release the job. Called at exit by itself; call it to end a session earlier
    (e.g. before training a second model in the same process)."""
    session = current(create=False)
    if session is not None:
        session.close()
