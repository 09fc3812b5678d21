"""Which saved loader position belongs to which live DataLoader (zero-code mode).

A loader is named after the line of the script that built it (``train.py:57``) and its
ordinal among the loaders built there (``train.py:57#3`` for the fourth), never after the
order in which loaders happened to be iterated: an evaluation loader made afresh inside
``evaluate()`` at every call must not take over the saved position of the training loader,
nor that of an old evaluation loader.

Even a matching name does not prove that a loader is the one that was saved: the resumed
process runs the script from the top, and an ``evaluate()`` called after the restore point
builds loaders that the saved ones only share a line with. ``decide`` says what a saved
position means for a loader, from plain facts about it (a table in
tests/unit/test_loader_identity.py).

The construction site comes from one narrow hook, ``DataLoader.__init__``, installed by
zero-code mode only: it notes, per loader, the first frame outside torch, ferry and the
loader's own constructors.
"""

from __future__ import annotations

import enum
import functools
import os
import re
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader

_SKIP_PREFIXES = tuple(
    os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep
    for m in (sys.modules["torch"], sys.modules["ferry"])
)
"""Frames in these trees are never the construction site (DataLoader subclasses of torch
and the hook's own frames)."""


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Where and when a DataLoader was built, in the script's terms."""

    site: str
    """``file:line`` of the statement that built it (the file's base name)."""
    ordinal: int
    """How many loaders were built at ``site`` before this one, in this process."""
    serial: int
    """How many loaders were built before this one, anywhere, in this process."""

    @property
    def name(self) -> str:
        return self.site if self.ordinal == 0 else f"{self.site}#{self.ordinal}"


_IDENTITIES: weakref.WeakKeyDictionary[DataLoader[Any], Identity] = weakref.WeakKeyDictionary()
_per_site: dict[str, int] = {}
_next_serial = 0
_original_init: Callable[..., None] | None = None
_on_init: Callable[[type], None] | None = None


is_user_file: Callable[[str], bool] = lambda filename: False  # noqa: E731
"""Is ``filename`` the user's code (not a library)? Zero-code mode sets the real test
(autotrack's user code: the script, the user's own packages, --code-root)."""


def _site(loader: DataLoader[Any], frame: FrameType | None) -> str:
    """The innermost frame of the user's code that built ``loader`` (a loader built inside a
    library, Lightning's or accelerate's, is named by the user's line that led there); else
    the first frame that is neither in torch or ferry nor a constructor of ``loader``."""
    first: FrameType | None = None
    while frame is not None:
        code = frame.f_code
        own_init = code.co_name == "__init__" and frame.f_locals.get("self") is loader
        if not own_init and not os.path.abspath(code.co_filename).startswith(_SKIP_PREFIXES):
            if is_user_file(code.co_filename):
                return _line(frame)
            first = first or frame
        frame = frame.f_back
    return "<unknown>:0" if first is None else _line(first)


def _line(frame: FrameType) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def note(loader: DataLoader[Any], frame: FrameType | None) -> Identity:
    """Record ``loader``'s identity (once), ``frame`` being its constructor's caller."""
    known = _IDENTITIES.get(loader)
    if known is not None:
        return known
    global _next_serial
    site = _site(loader, frame)
    ordinal = _per_site.get(site, 0)
    _per_site[site] = ordinal + 1
    identity = _IDENTITIES[loader] = Identity(site=site, ordinal=ordinal, serial=_next_serial)
    _next_serial += 1
    return identity


def identity_of(loader: DataLoader[Any]) -> Identity:
    """``loader``'s identity; one built before the hook was installed is noted now, at the
    frame that first iterates it (the best site there is for it)."""
    return _IDENTITIES.get(loader) or note(loader, sys._getframe(1))


def built_so_far() -> int:
    """The serial the next loader will get: loaders with a serial below it exist already."""
    return _next_serial


def _hooked_init(original: Callable[..., None], *, announce: bool) -> Callable[..., None]:
    """``original`` (a loader class's ``__init__``) noting the construction site: the same
    name, signature and ``__wrapped__`` as ``original``, so that code inspecting it (Lightning
    reads the signature to re-create loaders) sees torch's ``__init__``."""

    @functools.wraps(original)
    def __init__(self: DataLoader[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        note(self, sys._getframe(1))
        if announce and _on_init is not None:
            _on_init(type(self))

    __init__._ferry_hooked = True  # type: ignore[attr-defined]
    return __init__


def hook_init_of(cls: type) -> None:
    """Note the construction site of a loader class whose ``__init__`` never calls
    DataLoader's (torchdata's StatefulDataLoader), as ``install_init_hook`` does; once."""
    original = vars(cls).get("__init__")
    if original is None or getattr(original, "_ferry_hooked", False):
        return
    setattr(cls, "__init__", _hooked_init(original, announce=False))  # noqa: B010
    if _on_init is not None:
        _on_init(cls)


def install_init_hook(on_init: Callable[[type], None] | None = None) -> None:
    """Note every DataLoader's construction site (zero-code mode; idempotent); ``on_init``
    is called with each new loader."""
    global _original_init, _on_init
    _on_init = on_init
    if _original_init is None:
        _original_init = DataLoader.__init__
        DataLoader.__init__ = _hooked_init(_original_init, announce=True)  # type: ignore[method-assign]


def relocated(
    identity: Identity, inputs: dict[str, Any], saved: dict[str, dict[str, Any]]
) -> Identity | None:
    """This loader's identity in the checkpoint's terms when the script was edited between
    the checkpoint and the resume and its line moved: the one saved site of the same file,
    with a loader of the same inputs, at which no loader has been built in this run. None
    when its own site is in the checkpoint, or when no site or several fit."""
    sites = {_site_of(name) for name in saved}
    if identity.site in sites:
        return None
    file = identity.site.rpartition(":")[0]
    built = {i.site for i in _IDENTITIES.values()}
    candidates = {
        _site_of(name)
        for name, position in saved.items()
        if _site_of(name).rpartition(":")[0] == file
        and _site_of(name) not in built
        and position.get("inputs") == inputs
    }
    if len(candidates) != 1:
        return None
    return replace(identity, site=candidates.pop())


def _site_of(name: str) -> str:
    return name.partition("#")[0]


def succeeds(new: Identity | None, driver: Identity | None, began: int) -> bool:
    """Does a loader built at the training loader's line, after it, take over from it (a
    script that builds its training loader anew each epoch)? Only one built once the training
    loader was tracked (``began``: the loaders built by then; in zero-code mode, when its
    first pass began): loaders built together at one line, before any ran (accelerate's
    ``prepare`` makes the training and the evaluation loader at the user's one line; a
    helper function that builds both), are not successors of each other."""
    if new is None or driver is None or new.site != driver.site:
        return False
    return new.serial > driver.serial and new.serial >= began


def replays_finished_epoch(identity: Identity, driver: str | None) -> bool:
    """Is this loader, met before the restore point, one the script built at the training
    loader's line for an epoch the checkpoint already covers (a script that builds its
    training loader anew each epoch)? Its ordinal there is below the saved loader's."""
    return driver is not None and identity.site == _site_of(driver) and identity.ordinal < _ordinal(driver)


def _ordinal(name: str) -> int:
    _, sep, ordinal = name.partition("#")
    return int(ordinal) if sep and ordinal.isdigit() else 0


def legacy(saved: dict[str, Any]) -> bool:
    """Were these loader positions saved under the old names, by first-iteration order?"""
    return all(re.fullmatch(r"loader\d+", name) and "inputs" not in pos for name, pos in saved.items())


class Outcome(enum.Enum):
    RESUME = "resume"
    """Put the loader at its saved position (skipping what the checkpoint consumed)."""
    CONTINUE = "continue"
    """Same loader, but it was between epochs: restore its generators and epoch count, and
    let its next epoch start from its beginning."""
    FRESH = "fresh"
    """Not the saved loader: it starts as the script built it."""


def active(position: dict[str, Any]) -> bool:
    """Was the loader mid-epoch (some batches of its current epoch consumed, not all)?"""
    batches, length = int(position.get("batches", 0)), position.get("length")
    return batches > 0 and (length is None or batches < int(length))


def decide(
    *, zero_code: bool, before_restore: bool, driver: bool, built_after_restore: bool, active: bool
) -> Outcome:
    """What a saved position with the loader's name means for it.

    ``before_restore``: tracked while the script re-runs up to the restore point (the
    resumed process replays the interrupted one, loader for loader); ``built_after_restore``:
    built after the restore point, so not an object that existed at the checkpoint.
    Explicit mode keeps its own rule: the user named the loader, the name is the proof."""
    if not zero_code or before_restore or driver:
        return Outcome.RESUME
    if active:
        return Outcome.RESUME
    return Outcome.FRESH if built_after_restore else Outcome.CONTINUE
