"""The module-level API (``ferry.track``, ``ferry.step``, ...) over the process's session."""

from __future__ import annotations

from typing import Any

from ferry.config import Config
from ferry.errors import FerryError
from ferry.session.core import Session

_CURRENT: Session | None = None
"""The session of this process; a closed one no longer counts."""


def current(create: bool = True) -> Session | None:
    """The session of this process (made from FERRY_* settings on first use)."""
    global _CURRENT
    if _CURRENT is not None and _CURRENT.closed:
        _CURRENT = None
    if _CURRENT is None and create:
        _CURRENT = Session()
    return _CURRENT


def adopt(session: Session) -> None:
    """Make ``session`` (built by zero-code mode, with its own signals) the current one."""
    global _CURRENT
    _CURRENT = session


def configure(**settings: Any) -> Session:
    """Start the session with these settings (see ``ferry.Config``); call before ``track``."""
    global _CURRENT
    if current(create=False) is not None:
        raise FerryError(
            "ferry is already configured in this process; call ferry.configure() before ferry.track(), once"
        )
    _CURRENT = Session(Config.from_env(**settings))
    return _CURRENT


def _session() -> Session:
    session = current()
    assert session is not None
    return session


def track(**objects: Any) -> None:
    """Track training state by name; see ``Session.track``."""
    _session().track(**objects)


def step() -> None:
    """Mark a safe point between iterations (needed only without a tracked DataLoader)."""
    _session().step()


def restore() -> int | None:
    """Restore the newest checkpoint now; returns its step, or None when starting fresh."""
    return _session().restore()


def checkpoint(stop: bool = False) -> None:
    """Request a checkpoint (and a stop, with ``stop=True``) at the next safe point."""
    _session().request("stop" if stop else "checkpoint")


def close() -> None:
    """Finish the session: wait for the last save, put handlers back."""
    session = current(create=False)
    if session is not None:
        session.close()
