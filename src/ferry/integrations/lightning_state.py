"""What ferry keeps of a Lightning ``Trainer`` (both modes: zero-code and ``FerryCallback``).

One Stateful, tracked as ``lightning``, whose state is Lightning's own checkpoint content
(``dump_checkpoint``: the LightningModule's weights and ``on_save_checkpoint`` additions,
the loops' progress, every callback's ``state_dict`` (ModelCheckpoint's best and last paths
and top-k, EarlyStopping's counters), the optimizers, the LR schedulers, the precision
plugin, the DataModule's state) plus what Lightning's own checkpoint lacks and a resumed run
needs to log as the uninterrupted one does:

- ``results``: the running epoch-level sums of the metrics logged with ``on_epoch=True``
  (``train_loss_epoch`` is the mean over the whole epoch, not over the resumed part);
- ``loggers``: each logger's version (one version folder across the resume) and, for a
  CSVLogger, its header keys, the rows it holds in memory and the length of its file.

The hyperparameters are left out (they may hold any object, and the resumed process
builds them again); they are put back from the live module when the state is handed to
Lightning. On resume, Lightning restores from this state itself, through its own
checkpoint connector (``hand_over``), as for ``fit(ckpt_path=...)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch

log = logging.getLogger("ferry")
_REDUCE = ("mean", "max", "min", "sum")


def _hparam_keys(obj: Any) -> list[str]:
    return [
        getattr(obj, attr)
        for attr in (
            "CHECKPOINT_HYPER_PARAMS_KEY",
            "CHECKPOINT_HYPER_PARAMS_NAME",
            "CHECKPOINT_HYPER_PARAMS_TYPE",
        )
        if isinstance(getattr(obj, attr, None), str)
    ]


def _hparams(trainer: Any) -> dict[str, Any]:
    """The hyperparameter entries ``dump_checkpoint`` writes, from the live objects."""
    found: dict[str, Any] = {}
    for obj in (trainer.lightning_module, trainer.datamodule):
        if obj is None or not obj.hparams:
            continue
        key, name, kind = (getattr(obj, a) for a in ("CHECKPOINT_HYPER_PARAMS_KEY",
                                                      "CHECKPOINT_HYPER_PARAMS_NAME",
                                                      "CHECKPOINT_HYPER_PARAMS_TYPE"))  # fmt: skip
        if hasattr(obj, "_hparams_name"):
            found[name] = obj._hparams_name
        if isinstance(obj.hparams, dict):
            found[key] = dict(obj.hparams)
        else:  # an omegaconf container
            found[key], found[kind] = obj.hparams, type(obj.hparams)
    return found


class LightningState:
    """Stateful over one Trainer (see the module docstring). ``validated`` is set by the safe
    point: whether Lightning validated after the batch just trained."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.validated = False

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        for obj in (trainer.lightning_module, trainer.datamodule):
            for key in _hparam_keys(obj) if obj is not None else []:
                checkpoint.pop(key, None)
        return {
            "checkpoint": checkpoint,
            "validated": self.validated,
            "results": capture_results(trainer.fit_loop.epoch_loop._results),
            "loggers": [capture_logger(logger) for logger in trainer.loggers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to do here: Lightning restored this state itself, before its loop ran
        (``hand_over``); ferry restores the random streams and the data position after it."""


def hand_over(saved: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """The checkpoint Lightning restores from: the saved one with the hyperparameters of the
    live objects, and its loop counters as Lightning's own save after validation has them.

    ferry saves at the end of the batch, after validation and after Lightning counted the
    batch for its loggers; Lightning resumes a checkpoint it wrote after validation by
    passing over that validation once more and counting the batch then: so the count is
    taken one back when Lightning validated after the saved batch."""
    checkpoint = dict(saved["checkpoint"])
    checkpoint.update(_hparams(trainer))
    if saved.get("validated"):
        loops = dict(checkpoint["loops"])
        fit = dict(loops["fit_loop"])
        epoch = dict(fit["epoch_loop.state_dict"])
        epoch["_batches_that_stepped"] = int(epoch["_batches_that_stepped"]) - 1
        fit["epoch_loop.state_dict"] = epoch
        loops["fit_loop"] = fit
        checkpoint["loops"] = loops
    return checkpoint


# ---------------------------------------------------------------------- epoch-level metrics
def _reduction(meta: Any) -> str | None:
    for name in _REDUCE:
        if getattr(meta, f"is_{name}_reduction"):
            return name
    return None


def capture_results(results: Any) -> dict[str, dict[str, Any]]:
    """The accumulated epoch-level values of the training loop's logged tensors, by key."""
    kept: dict[str, dict[str, Any]] = {}
    for key, metric in results.items():
        meta = metric.meta
        reduce = _reduction(meta)
        if not metric.is_tensor or not meta.on_epoch or reduce is None:
            continue
        sync = meta.sync
        kept[key] = {
            "fx": meta.fx, "name": meta.name, "prog_bar": meta.prog_bar, "logger": meta.logger,
            "on_step": meta.on_step, "enable_graph": meta.enable_graph, "reduce_fx": reduce,
            "add_dataloader_idx": meta.add_dataloader_idx, "dataloader_idx": meta.dataloader_idx,
            "metric_attribute": meta.metric_attribute, "sync_dist": bool(sync._should),
            "rank_zero_only": bool(sync.rank_zero_only), "value": metric.value.detach().clone(),
            "count": metric.cumulated_batch_size.detach().clone() if reduce == "mean" else None,
            "updates": int(metric._update_count),
        }  # fmt: skip
    return kept


def apply_results(saved: dict[str, dict[str, Any]], trainer: Any) -> None:
    """Put the epoch's accumulated values back before the next batch logs: the entries are
    made as ``LightningModule.log`` makes them, then given the saved sums."""
    results = trainer.fit_loop.epoch_loop._results
    for key, item in saved.items():
        if key not in results:
            results.dataloader_idx = item["dataloader_idx"]
            results.log(
                item["fx"], item["name"], torch.tensor(0.0), prog_bar=item["prog_bar"],
                logger=item["logger"], on_step=item["on_step"], on_epoch=True,
                reduce_fx=item["reduce_fx"], enable_graph=item["enable_graph"],
                add_dataloader_idx=item["add_dataloader_idx"], batch_size=1,
                sync_dist=item["sync_dist"], sync_dist_fn=trainer.strategy.reduce,
                metric_attribute=item["metric_attribute"], rank_zero_only=item["rank_zero_only"],
            )  # fmt: skip
            results.dataloader_idx = None
        metric = results[key]
        metric.value = item["value"].to(metric.value.device)
        if item["count"] is not None:
            metric.cumulated_batch_size = item["count"].to(metric.cumulated_batch_size.device)
        metric._update_count = item["updates"]
        metric._forward_cache = None
    # mid-epoch: the next batch's logging must add to these sums, not start the epoch's anew
    trainer._logger_connector._first_loop_iter = False
    trainer._logger_connector._current_fx = None


# ---------------------------------------------------------------------- loggers
def capture_logger(logger: Any) -> dict[str, Any]:
    """A logger's version and, for a CSV writer, what it holds that is not in its file yet."""
    kept: dict[str, Any] = {"type": type(logger).__qualname__, "version": getattr(logger, "_version", None)}
    writer: Any = getattr(logger, "_experiment", None)
    path = getattr(writer, "metrics_file_path", None)
    if isinstance(path, str) and isinstance(getattr(writer, "metrics", None), list):
        kept["csv"] = {
            "keys": list(writer.metrics_keys),
            "rows": [dict(row) for row in writer.metrics],
            "length": os.path.getsize(path) if os.path.isfile(path) else 0,
        }
    return kept


def pin_versions(saved: list[dict[str, Any]], loggers: list[Any]) -> None:
    """Before the loggers make their folders: the versions the checkpointed run had (the
    Trainer may have asked for a version already, the next free one: nothing was made in it)."""
    for logger, item in zip(loggers, saved, strict=False):
        version = item.get("version")
        if (
            item.get("type") != type(logger).__qualname__
            or version is None
            or not hasattr(logger, "_version")
        ):
            continue
        if getattr(logger, "_experiment", None) is not None and logger._version != version:
            log.warning(
                "ferry: warning: %s had made its folder before the resume (version %s, the "
                "checkpoint's: %s): its logs go to another folder",
                type(logger).__name__,
                logger._version,
                version,
            )
            continue
        logger._version = version


@contextlib.contextmanager
def csv_continued(saved: list[dict[str, Any]], loggers: list[Any]) -> Any:
    """Around the creation of the loggers' writers: a CSV writer made in a version folder that
    holds files would warn and delete its metrics file. The folder's files are moved aside
    while the writer is made and put back after, the metrics file cut back to its length at
    the checkpoint, and the writer given the header keys and rows it held then."""
    moved: list[tuple[str, str]] = []
    for logger, item in zip(loggers, saved, strict=False):
        csv = item.get("csv")
        log_dir = getattr(logger, "log_dir", None) if csv is not None else None
        if csv is None or not isinstance(log_dir, str) or getattr(logger, "_experiment", None) is not None:
            continue
        if os.path.isdir(log_dir) and os.listdir(log_dir):
            aside = log_dir.rstrip(os.sep) + ".ferry-resume"
            os.replace(log_dir, aside)
            moved.append((log_dir, aside))
        else:
            moved.append((log_dir, ""))
    try:
        yield
    finally:
        for log_dir, aside in moved:
            _put_back(log_dir, aside)
    for logger, item in zip(loggers, saved, strict=False):
        writer = getattr(logger, "_experiment", None)
        if item.get("csv") is not None and isinstance(getattr(writer, "metrics", None), list):
            _continue_writer(writer, item["csv"])


def _put_back(log_dir: str, aside: str) -> None:
    if not aside:
        return
    os.makedirs(log_dir, exist_ok=True)
    for name in os.listdir(aside):
        os.replace(os.path.join(aside, name), os.path.join(log_dir, name))
    os.rmdir(aside)


def _continue_writer(writer: Any, csv: dict[str, Any]) -> None:
    path = writer.metrics_file_path
    length = int(csv["length"])
    if length and os.path.isfile(path) and os.path.getsize(path) >= length:
        with open(path, "r+b") as file:
            file.truncate(length)
    elif length:
        log.warning(
            "ferry: warning: %s is shorter than at the checkpoint: rows before the resume are lost", path
        )
    elif os.path.isfile(path):
        os.remove(path)
    writer.metrics_keys = list(csv["keys"])
    writer.metrics = [dict(row) for row in csv["rows"]]
