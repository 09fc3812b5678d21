"""ferry for Lightning (``lightning`` or, failing that, ``pytorch_lightning``).

    trainer = Trainer(callbacks=[FerryCallback(train_loader)], ...)
    trainer.fit(model, train_loader)

Tracked at ``on_fit_start``, where Lightning would restore its own checkpoint: the
LightningModule, ``trainer.optimizers``, the schedulers of ``trainer.lr_scheduler_configs``
and ``trainer.fit_loop`` (epoch, batch and optimizer-step progress). The end of each
training batch is a safe point, where Lightning's own ``ModelCheckpoint`` saves too. The
data position is that of the training DataLoader (see ``_position``): the interrupted
epoch's order is drawn again and the trained batches are skipped at the sampler.

One owner of requeue: ferry (``ferry run``) requeues a stopped job, so Lightning's SLURM
auto-requeue must be off: ``Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])``.
Lightning's own SIGTERM handler chains to ferry's and, with requeue off, only notes the
signal; ferry's checkpoint and exit (85) come first, at the end of the batch.
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import SLURMEnvironment  # type: ignore[attr-defined]
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.plugins.environments import (  # type: ignore[no-redef,attr-defined,assignment]
        SLURMEnvironment,
    )

from ferry import session as _session
from ferry.errors import FerryError, bug
from ferry.integrations._position import LoaderPosition


class FerryCallback(pl.Callback):  # type: ignore[misc]
    """Makes ``Trainer.fit`` preemptible and resumes it exactly. See docs/integrations.md."""

    def __init__(self, train_loader: Any) -> None:
        super().__init__()
        self.session = _session.current()  # installs ferry's signal handlers before Lightning's
        self.position = LoaderPosition()
        self.position.attach(train_loader)

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

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        objects: dict[str, Any] = {"module": pl_module, "fit_loop": trainer.fit_loop, "data": self.position}
        for i, optimizer in enumerate(trainer.optimizers):
            objects[f"optimizer{i}"] = optimizer
        for i, config in enumerate(trainer.lr_scheduler_configs):
            objects[f"scheduler{i}"] = config.scheduler
        if self.session is None:
            raise bug("no ferry session in this process")
        self.session.track(**{f"lightning_{name}": obj for name, obj in objects.items()})
        self.session.restore()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.position.batch_done()
        if self.session is None:
            raise bug("no ferry session in this process")
        self.session.step()  # a safe point: checkpoints when one is due, exits 85 after a stop
