"""The one small protocol a framework's zero-code support implements.

Each supported framework has one module beside its explicit callback
(``integrations/<framework>.py``): ``integrations/<framework>_auto.py``, whose module-level
``SUPPORT`` object is a ``FrameworkSupport``. Call order:

1. Zero-code mode (``autotrack/frameworks.py``) calls ``SUPPORT.arm()`` once per process,
   in every process of the job (torchrun ranks, processes a framework starts itself), as
   soon as one of ``SUPPORT.modules`` has been imported, whatever the import order.
2. ``arm`` installs what the framework needs, through the framework's public interfaces
   where it has them (a callback list, an entry point) and otherwise through hooks that
   keep the hooked function's name, signature and ``__wrapped__``; it does no I/O and
   makes no session.
3. From then on, when the framework's loop runs, the support tracks the framework's own
   progress in the process's session under ``state_name`` (the name the explicit callback
   uses too, so that a checkpoint of either mode resumes under the other), makes the end
   of each training batch, after the framework has logged it, the safe point, and puts the
   framework's progress back before its loop continues on resume.

The explicit callbacks never call ``arm``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class FrameworkSupport(Protocol):
    name: str
    """The framework's name in messages and docs ("Lightning", "Hugging Face Trainer")."""
    modules: tuple[str, ...]
    """Import names whose loading arms the support ("lightning.pytorch", ...)."""
    state_name: str
    """The name its state is tracked under, in both modes."""

    def arm(self) -> None:
        """Install the framework's zero-code hooks (idempotent)."""
        ...
