"""Safe points for scripts without a DataLoader (zero-code mode).

- With ``torch.optim``: the end of each optimizer step (torch's global step post-hook),
  while no loader drives training. The resumed process restores at its first optimizer
  step, overwriting what that step did (weights, optimizer, gradients, RNG streams and the
  loop's frames, the loss it computed included).
- Without any optimizer (``p.data.add_(p.grad, alpha=-lr)``): the forward of the root
  model, when a backward has run since its last forward and gradients are enabled, i.e.
  provably between two steps. The root model is the first module called with gradients
  enabled that has trainable parameters; its backward is seen on one of them. The
  resumed process restores at the first forward of a module of the same class, and hands
  the forward the saved batch in place of the one its not yet restored loop had computed.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ferry.autotrack.keeper import LoopKeeper

Session = Any  # ferry.session.Session: typed loosely, the session is made lazily by hooks.py


class Stepper:
    """Decides, at optimizer steps and module forwards, whether this is a safe point."""

    def __init__(self, keeper: LoopKeeper, session: Callable[[], Session]) -> None:
        self.keeper, self.session = keeper, session
        self.root: nn.Module | None = None
        self.forward_handle: RemovableHandle | None = None
        self._backward_seen = False
        self._optimizer_steps = False
        self._checked = False

    # ---------------------------------------------------------------- optimizer steps
    def after_optimizer_step(self) -> None:
        session = self.session()
        self._optimizer_steps = True
        self._stop_forward()
        if session.driver is not None or session.loop is not self.keeper:
            return  # a loader drives training, or the script uses the explicit API (ferry.step)
        self.keeper.by = "optimizer"
        if session.loop_hooks.restore_at("optimizer"):
            return  # restored to the state right after the saved step
        session.loop_hooks.step_safe_point()

    # ---------------------------------------------------------------- model forwards
    def arm_forward(self) -> None:
        global _ACTIVE
        _ACTIVE = self
        self.forward_handle = nn.modules.module.register_module_forward_pre_hook(_before_forward)
        # torch.compile's module warns at each call while any global module hook exists: while
        # this one is the only one, the warning is about ferry, not the script (`_stop_forward`
        # takes the filter away with the hook, at the first forward of a script that steps an
        # optimizer or reads a loader)
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)

    def _stop_forward(self) -> None:
        if self.forward_handle is not None:
            self.forward_handle.remove()
            self.forward_handle = None
            ours = [f for f in warnings.filters if f[1] is not None and f[1].pattern == _COMPILE_WARNING]
            for item in ours:
                warnings.filters.remove(item)  # type: ignore[attr-defined]

    def before_forward(self, module: nn.Module, args: Any) -> Any:
        if self._optimizer_steps or not torch.is_grad_enabled():
            return None
        if not self._checked and not self._first_look():
            return None
        if self.root is None:
            if not self._adopt(module):
                return None
            saved = self.session().loop_hooks.saved_loop()
            if saved is None or saved.get("by") != "forward" or saved.get("model") != _model_name(module):
                return None  # a fresh run's first forward: not between two steps
        elif module is not self.root or not self._backward_seen:
            return None
        session = self.session()
        if session.loop is not self.keeper:  # the script (or a framework's support) took to
            self._optimizer_steps = True  # the explicit API since the model was adopted: its
            self._stop_forward()  # own safe points are the only ones (ferry.step, Keras's fit)
            return None
        self._backward_seen = False
        self.keeper.by, self.keeper.model = "forward", _model_name(module)
        if session.loop_hooks.restore_at("forward"):
            swapped = session.swapped
            return tuple(swapped.get(id(a), a) for a in args)
        session.loop_hooks.step_safe_point()
        return None

    def _adopt(self, module: nn.Module) -> bool:
        """The first module called with gradients enabled that has trainable parameters is
        the model (module pre-hooks run outermost first); its backward is watched on one
        parameter, which marks the next forward as one between two steps."""
        trainable = next((p for p in module.parameters() if p.requires_grad), None)
        if trainable is None:
            return False
        self.root = module
        trainable.register_post_accumulate_grad_hook(self._after_backward)  # type: ignore[no-untyped-call]
        return True

    def _first_look(self) -> bool:
        """At the first forward (of the outermost module, eagerly): with a loader driving
        training or an optimizer alive, those make the safe points and the hook goes away
        at once, before ``torch.compile`` traces a forward with it (removing it later would
        recompile)."""
        self._checked = True
        session = self.session()
        if (
            session.driver is not None
            or session.loop is not self.keeper
            or any(issubclass(type(o), torch.optim.Optimizer) for o in gc.get_objects())
        ):
            self._optimizer_steps = True
            self._stop_forward()
            return False
        return True

    def _after_backward(self, param: torch.Tensor) -> None:
        self._backward_seen = True

    def found(self) -> dict[str, Any]:
        """The model trained by hand, by the name the checkpoint gives it."""
        return {} if self.root is None else {_model_name(self.root): self.root}


def _model_name(module: nn.Module) -> str:
    return f"model:{type(module).__qualname__}:0"


_ACTIVE: Stepper | None = None
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def _before_forward(module: nn.Module, args: Any) -> Any:
    """The global forward pre-hook. While ``torch.compile`` traces a forward it does nothing
    (and reaches no ferry object), so the compiled graph holds no trace of it."""
    if _is_compiling():
        return None
    return None if _ACTIVE is None else _ACTIVE.before_forward(module, args)


def _is_compiling() -> bool:
    check = getattr(torch.compiler, "is_compiling", None)
    return bool(check()) if check is not None else False
