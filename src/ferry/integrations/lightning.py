"""ferry for Lightning (``lightning`` or, failing that, ``pytorch_lightning``), explicit mode.

    trainer = Trainer(callbacks=[FerryCallback()], ...)
    trainer.fit(model, datamodule)

The callback makes ferry drive that Trainer's ``fit`` exactly as zero-code mode drives every
``fit`` under ``ferry run`` (``lightning_hooks``): the safe point is the end of each training
batch, after Lightning logged it and validated; Lightning's own checkpoint content (loops,
callbacks, the module's ``on_save_checkpoint``, optimizers, schedulers) is ferry's state and
Lightning restores it itself on resume; the training DataLoader resumes the saved epoch; the
loggers keep their version folder. So a checkpoint of either mode resumes under the other.

One owner of requeue: ferry (``ferry run``) requeues a stopped job, so Lightning's SLURM
auto-requeue must be off: ``Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])``.
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import SLURMEnvironment  # type: ignore[attr-defined]

    _PACKAGE = "lightning.pytorch"
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.plugins.environments import (  # type: ignore[no-redef,attr-defined,assignment]
        SLURMEnvironment,
    )

    _PACKAGE = "pytorch_lightning"

from ferry import session as _session
from ferry.errors import FerryError
from ferry.integrations import lightning_hooks


def _by_callback(trainer: Any) -> Any:
    """The session of the FerryCallback given to ``trainer``, if any."""
    for callback in getattr(trainer, "callbacks", []):
        if isinstance(callback, FerryCallback):
            return _session.current()
    return None


class FerryCallback(pl.Callback):  # type: ignore[misc]
    """Makes ``Trainer.fit`` preemptible and resumes it exactly. See docs/integrations.md.

    The session is made when ``fit`` sets up (after a DDP process group exists), not here."""

    def __init__(self) -> None:
        super().__init__()
        lightning_hooks.install(_PACKAGE)
        lightning_hooks.drive_when(_by_callback)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        env = (
            getattr(trainer.strategy, "cluster_environment", None)
            or trainer._accelerator_connector.cluster_environment
        )
        if isinstance(env, SLURMEnvironment) and env.auto_requeue:
            raise FerryError(
                "Lightning's SLURM auto-requeue and ferry would both requeue this job on a stop: "
                "pass Trainer(plugins=[SLURMEnvironment(auto_requeue=False)]) and let `ferry run` requeue"
            )
