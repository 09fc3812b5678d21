"""DataLoader positions: which epoch, how many batches, and the RNG the epoch began with.

ferry hooks one narrow point, ``DataLoader.__iter__``, and only for loaders it tracks: the
iterator it returns is wrapped so that each batch request is a safe point. On resume, the
interrupted epoch's iterator is rebuilt from the RNG state the epoch began with (so the
shuffle permutation and worker seeds are the same) and the consumed batches are skipped
at the sampler: their indices are drawn, their samples are never loaded (``epoch_replay``).

Beside it: the iterators it hands out (``loader_iter``), which live loader a saved
position belongs to (``loader_identity``), the workers' RNG streams replayed mid-epoch
(``worker_rng``), what a position depends on (``inputs``), and loaders that keep their own
position (``stateful_loader``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ferry.state import stateful_loader, worker_rng
from ferry.state.epoch_replay import apply_epoch_rng, build_skipping, capture_epoch_rng, loader_generators
from ferry.state.feeding import Feeding
from ferry.state.inputs import loader_inputs
from ferry.state.loader_identity import Identity, built_so_far
from ferry.state.loader_iter import FastForward, TrackedIter
from ferry.state.rng import set_generator_state

log = logging.getLogger("ferry")


class Hooks:
    """What a tracked loader asks of the session."""

    def before_batch(self, tracker: LoaderTracker) -> None: ...

    def after_batch(self, tracker: LoaderTracker) -> None: ...

    def at_restore_point(self, tracker: LoaderTracker) -> None: ...

    def pass_ended(self, tracker: LoaderTracker) -> None: ...

    def fast_forwarding(self, tracker: LoaderTracker) -> bool:
        return False

    def resume_in_place(self, tracker: LoaderTracker) -> bool:
        return False


def _length(loader: DataLoader[Any] | None) -> int | None:
    try:
        return None if loader is None else len(loader)
    except TypeError:
        return None


class LoaderTracker:
    """Position of one tracked DataLoader."""

    def __init__(self, name: str, loader: DataLoader[Any], hooks: Hooks) -> None:
        self.name = name
        self.loader_ref = weakref.ref(loader)
        self.hooks = hooks
        self.epoch = -1
        self.batches = 0
        self.epoch_rng: dict[str, Any] | None = None
        self.resume_at: dict[str, Any] | None = None
        """Saved position to rebuild at the matching iter() call."""
        self.restore_pending = False
        self.relative = False
        """Resume at the very next iter() (explicit restore), not at the saved epoch index."""
        self.identity: Identity | None = None
        """Zero-code mode: where the script built the loader (state/loader_identity.py)."""
        self.began = built_so_far()
        """The loaders built before this one was tracked (zero-code mode: before its first
        pass): one built later at its line may be its successor (``loader_identity.succeeds``)."""
        self.worker_rng: dict[str, Any] = {}
        """Per worker id, its RNG state after its last consumed batch (state/worker_rng.py)."""
        self.feeding = Feeding()
        """How its batches feed optimizer steps (zero-code mode; state/feeding.py)."""
        self.held = 0
        """At a checkpoint: batches handed out but not yet trained (held ahead by a wrapper)."""
        self.asked_by_generator = False
        """The last batch was asked for by a generator of the user's code: one that wraps the
        loader, whose frame (and the batches it holds ahead) the loop's state captures."""
        self.kept = 0
        """Resuming in place: batches the restored frames hold, handed out after the saved
        position's trained ones (the loader continues after them)."""
        self.pool_rng: dict[str, Any] | None = None
        """A persistent worker pool's: the random state its creation drew its base seed from
        (in this process, or, until the pool is made here, in the checkpoint's)."""
        self._pool_made = False

    # ------------------------------------------------------------------ checkpoint
    def position(self) -> dict[str, Any]:
        loader = self.loader_ref()
        gens = {} if loader is None else {r: g.get_state() for r, g in loader_generators(loader).items()}
        return {
            "epoch": self.epoch,
            "batches": self.batches - self.held,
            "kept": self.held if self.asked_by_generator else 0,
            "feeding": self.feeding.state(),
            "length": _length(loader),
            "epoch_rng": self.epoch_rng,
            "generators": gens,
            "worker_rng": dict(self.worker_rng),
            "pool_rng": self.pool_rng if self._pool_made else None,
            **({} if loader is None else {"inputs": loader_inputs(loader)}),
            **({} if loader is None else stateful_loader.position(loader)),
        }

    def restore_generators(self, position: dict[str, Any]) -> None:
        loader = self.loader_ref()
        if loader is not None:
            for role, gen in loader_generators(loader).items():
                set_generator_state(gen, position.get("generators", {}).get(role))

    # ------------------------------------------------------------------ iteration
    def new_epoch(self, loader: DataLoader[Any], make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        if self.epoch >= 0:
            self.hooks.pass_ended(self)
        self.feeding.new_pass()
        self.epoch += 1
        self.batches = 0
        if not loader.persistent_workers:  # new workers, newly seeded
            self.worker_rng = {}
        target = self.resume_at
        if target is not None and not self.relative and self.hooks.resume_in_place(self):
            self.relative = True  # the script's loop is put back too: continue the saved epoch now
            self.kept = _kept(target)  # and the wrapping generator, with the batches it held
        if target is not None and self.relative:
            self.epoch = int(target["epoch"])
        if target is not None and self.epoch < int(target["epoch"]) and self.hooks.fast_forwarding(self):
            return FastForward(self, loader, make, target)
        if target is None or self.epoch != int(target["epoch"]):
            self.epoch_rng = capture_epoch_rng(loader)
            rewind = self._make_pool(loader, self.epoch_rng)
            return TrackedIter(self, self._build(loader, 0, make, rewind))
        return self.resume_epoch(loader, make, target)

    def _make_pool(self, loader: DataLoader[Any], now: dict[str, Any]) -> Callable[[], None] | None:
        """Before an iter() that creates a persistent worker pool: the pool draws its base seed
        from the random state, once in the process's life. A pool the checkpoint's process had
        made already draws it again here, from the state it drew from there (same workers'
        seeds); then ``now`` is put back before the sampler starts (the returned rewind), so
        that the draw never shifts later shuffles. None when there is nothing to rewind."""
        if self._pool_made or not (loader.persistent_workers and loader.num_workers > 0):
            return None
        self._pool_made = True
        if getattr(loader, "_iterator", None) is not None:  # made before ferry tracked it
            return None
        saved, self.pool_rng = self.pool_rng, now
        if saved is None:
            return None
        self.pool_rng = saved
        apply_epoch_rng(loader, saved)
        return _rewinder(loader, now)

    @staticmethod
    def _build(
        loader: DataLoader[Any],
        skip: int,
        make: Callable[[], Iterator[Any]],
        rewind: Callable[[], None] | None = None,
    ) -> Iterator[Any]:
        """Build the epoch's iterator with its sampler started at once, skipping ``skip``
        batches. Starting the sampler in iter() (rather than at the first batch) makes the
        random draws happen in the same order in a fresh and in a resumed epoch."""
        if isinstance(loader.dataset, IterableDataset) or stateful_loader.is_stateful(loader):
            return make()
        return build_skipping(loader, skip, make, rewind, worker_rng.blanks(loader, skip))

    def resume_epoch(
        self, loader: DataLoader[Any], make: Callable[[], Iterator[Any]], target: dict[str, Any]
    ) -> Iterator[Any]:
        self.resume_at = None
        self.relative = False
        kept, self.kept = self.kept, 0
        skip = len(loader) if target.get("complete") else int(target["batches"]) + kept
        stash = capture_epoch_rng(loader)
        self.epoch_rng = target["epoch_rng"]
        if self.epoch_rng is not None:
            apply_epoch_rng(loader, self.epoch_rng)
        if stateful_loader.is_stateful(loader) and "loader_state" in target:
            # the loader keeps its own position (StatefulDataLoader's protocol): it resumes itself
            stateful_loader.load(loader, target["loader_state"])
            it = make()
        elif isinstance(loader.dataset, IterableDataset):
            it = make()
            if skip:
                log.warning(
                    "ferry: %s iterates an IterableDataset; resuming reads and drops %d "
                    "batches (no sampler to skip at)",
                    self.name,
                    skip,
                )
                for _ in itertools.islice(it, skip):
                    pass
        else:
            # A persistent worker pool is made once, in epoch 0, and draws its base seed there.
            # Made again here, in a later epoch, it would draw one seed more than the run being
            # resumed; so the epoch's RNG is put back just before the sampler starts.
            epoch_rng = self.epoch_rng
            persistent = loader.persistent_workers and loader.num_workers > 0 and self.epoch > 0
            rewind = _rewinder(loader, epoch_rng) if persistent and epoch_rng else None
            if persistent and epoch_rng:
                self.pool_rng = target.get("pool_rng") or self.pool_rng
                rewind = self._make_pool(loader, epoch_rng) or rewind
            self.worker_rng = dict(target.get("worker_rng") or {})
            starts = loader.worker_init_fn if isinstance(loader.worker_init_fn, WorkerInit) else None
            if starts is not None and worker_rng.tagged(loader):
                starts.rng_states = self.worker_rng  # the workers start in _build, from these
            try:
                it = self._build(loader, skip, make, rewind)
            finally:
                if starts is not None:
                    starts.rng_states = None  # workers of later epochs start as PyTorch seeds them
        self.batches = skip
        self.feeding.resumed(skip, target.get("feeding"), kept=kept)
        if self.restore_pending:
            return TrackedIter(self, it, restore_point=True, kept=kept)
        apply_epoch_rng(loader, stash)  # explicit restore already set the save-time state
        self.restore_generators(target)
        return TrackedIter(self, it)


def _kept(position: dict[str, Any]) -> int:
    """The position's batches held by the frames it was taken in (a plausible count: it
    comes from a checkpoint; never more than the loader has left)."""
    kept, batches, length = position.get("kept"), position.get("batches"), position.get("length")
    if type(kept) is not int or type(batches) is not int or not 0 <= kept < 1 << 20:
        return 0
    return kept if type(length) is not int or batches + kept <= length else 0


def _rewinder(loader: DataLoader[Any], epoch_rng: dict[str, Any]) -> Callable[[], None]:
    """Puts the epoch's RNG back on ``loader`` just before its sampler starts. It holds the
    loader weakly: the persistent iterator keeps it, and the loader keeps that iterator, so
    a strong reference would keep the worker pool alive past the script's end (its workers
    ignore the stop signals, so multiprocessing's exit would wait for them forever)."""
    ref = weakref.ref(loader)

    def rewind() -> None:
        live = ref()
        if live is not None:
            apply_epoch_rng(live, epoch_rng)

    return rewind


def shut_down_pools() -> None:
    """At the end of the process: stop the worker pools of the tracked loaders the way their
    iterators do when they are freed (each worker is told to finish, then joined). A pool
    still referenced at exit would otherwise be left to multiprocessing, which ends workers
    with SIGTERM, a signal ferry's workers ignore."""
    for loader in list(_TRACKED):
        shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()


_TRACKED: weakref.WeakKeyDictionary[DataLoader[Any], LoaderTracker] = weakref.WeakKeyDictionary()
_original_iter: Callable[[DataLoader[Any]], Iterator[Any]] | None = None
auto_track: Callable[[DataLoader[Any]], LoaderTracker | None] | None = None
"""Zero-code mode sets this: every loader is tracked the first time it is iterated."""


_BUILDING: set[int] = set()
"""Loaders whose own ``__iter__`` is building their iterator (a hooked subclass's): a call
it makes to ``DataLoader.__iter__`` is part of that, not a new epoch."""


def _tracked_iter(
    self: DataLoader[Any], original: Callable[[DataLoader[Any]], Iterator[Any]]
) -> Iterator[Any]:
    tracker = _TRACKED.get(self)
    if tracker is None and auto_track is not None and id(self) not in _BUILDING:
        tracker = auto_track(self)
    if tracker is None or id(self) in _BUILDING:
        return original(self)

    def make() -> Iterator[Any]:
        _BUILDING.add(id(self))
        try:
            return original(self)
        finally:
            _BUILDING.discard(id(self))

    return tracker.new_epoch(self, make)


def _hooked_iter(original: Callable[[DataLoader[Any]], Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """``original`` (a loader class's ``__iter__``) tracking the loader: the same name,
    signature and ``__wrapped__`` as ``original``."""

    @functools.wraps(original)
    def __iter__(self: DataLoader[Any]) -> Iterator[Any]:
        return _tracked_iter(self, original)

    return __iter__


def iterate_untracked(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)`` as torch makes it, never tracked: for a loader whose position a
    framework's support keeps itself (the loaders Keras's ``fit`` draws from,
    integrations/_keras_data.py), so that zero-code mode takes none of them for the loop's."""
    _BUILDING.add(id(loader))
    try:
        return iter(loader)
    finally:
        _BUILDING.discard(id(loader))


def hook_class(cls: type) -> None:
    """A stateful loader class with its own ``__iter__`` (StatefulDataLoader never calls
    DataLoader's): hook that one the same way, once per class."""
    owner = stateful_loader.iter_owner(cls)
    if owner is None or not stateful_loader.is_stateful_class(cls) or "_ferry_original_iter" in vars(owner):
        return
    original = vars(owner)["__iter__"]
    owner._ferry_original_iter = original  # type: ignore[attr-defined]
    setattr(owner, "__iter__", _hooked_iter(original))  # noqa: B010  (on the class, as DataLoader's own hook)


def install_iter_hook() -> None:
    global _original_iter
    if _original_iter is None:
        _original_iter = DataLoader.__iter__
        DataLoader.__iter__ = _hooked_iter(_original_iter)  # type: ignore[method-assign,assignment]


def track_loader(name: str, loader: DataLoader[Any], hooks: Hooks) -> LoaderTracker:
    """Start tracking ``loader``: installs the ``DataLoader.__iter__`` hook on first use."""
    install_iter_hook()
    hook_class(type(loader))
    tracker = _TRACKED.get(loader)
    if tracker is None:
        tracker = _TRACKED[loader] = LoaderTracker(name, loader, hooks)
    return tracker


def untrack_all() -> None:
    """Forget every tracked loader and put ``DataLoader.__iter__`` back."""
    global _original_iter
    _TRACKED.clear()
    if _original_iter is not None and auto_track is None:
        DataLoader.__iter__ = _original_iter  # type: ignore[method-assign,assignment]
        _original_iter = None


class WorkerInit:
    """Wraps a loader's ``worker_init_fn``: workers ignore the stop signals, so a signal sent
    to the whole process group cannot kill them before the main process has saved."""

    def __init__(self, inner: Callable[[int], None] | None, signums: list[int]) -> None:
        self.inner, self.signums = inner, signums
        self.rng_states: dict[str, Any] | None = None
        """Set while a resumed epoch's workers start: each continues from its saved state."""

    def __call__(self, worker_id: int) -> None:
        from ferry.runtime.signals import ignore_in_worker

        ignore_in_worker(self.signums)
        if self.inner is not None:
            self.inner(worker_id)
        state = (self.rng_states or {}).get(str(worker_id))
        if state is not None:  # after the script's own init, which may seed its streams
            worker_rng.set_state(state)


def ignore_stops_in_workers(loader: DataLoader[Any], signums: list[int]) -> None:
    """The loader's workers ignore the stop signals (a loader ferry does not track too)."""
    if loader.num_workers > 0 and not isinstance(loader.worker_init_fn, WorkerInit):
        loader.worker_init_fn = WorkerInit(loader.worker_init_fn, signums)


def protect_workers(loader: DataLoader[Any], signums: list[int]) -> None:
    ignore_stops_in_workers(loader, signums)
    if not stateful_loader.is_stateful(loader):  # a stateful loader restores its own workers
        worker_rng.tag(loader)
