"""ferry's exceptions: one root, a few subclasses, each carrying the exit code the CLI uses.

Every message says what went wrong *and* what to do about it.
"""

from __future__ import annotations


class FerryError(Exception):
    """Root of every error ferry raises on purpose."""

    exit_code: int = 1


class ConfigError(FerryError):
    """A setting or argument is invalid."""

    exit_code = 2


class StorageError(FerryError):
    """The storage backend failed (full disk, server down, permission denied)."""

    exit_code = 3


class NoCheckpointError(FerryError):
    """No committed checkpoint exists where one was expected."""

    exit_code = 4


class CorruptCheckpointError(FerryError):
    """A checkpoint failed verification (checksum, size, or manifest)."""

    exit_code = 5


class UnsafeCheckpointError(CorruptCheckpointError):
    """A checkpoint asked for something ferry refuses to load (code, unknown types)."""

    exit_code = 6


class UnsupportedStateError(FerryError):
    """A value in the training state cannot be captured in a ferry checkpoint."""

    exit_code = 7


class JobError(FerryError):
    """A job could not be found, reached, or controlled."""

    exit_code = 8


class ProcessCheckpointError(FerryError):
    """Process-level (CUDA driver / CRIU) checkpointing is unavailable or failed."""

    exit_code = 9


def bug(what: str) -> FerryError:
    """An invariant of ferry's own code that does not hold. Raised, not asserted: a one-line
    ferry error that ends the job the way every other one does (an ``assert`` would be an
    AssertionError with a traceback, and would be skipped altogether under ``python -O``)."""
    return FerryError(f"ferry internal error: {what}; this is a bug in ferry, please report it")
