"""gpu_proof.sh, the engine part: ferry's checkpoint engine on the state of a ~1B-parameter
model and its AdamW optimizer on one GPU (16 Linear(8192, 8192) layers: 1.07e9 parameters,
17 GB on the GPU with gradients, 12.9 GB saved).

1. ``overlap_snapshot`` refuses a write that torch does not count: an overlapped save, then
   ``p.data.mul_(0.5)`` on every parameter at once (on the current stream, while the side
   stream copies): the save must fail with ``OverlapBroken`` and commit nothing.
2. The default asynchronous save: training blocked (the call's return, after the previous
   save was waited for) <= 0.5 s; its device-to-host bandwidth over that of a plain
   ``copy_`` of the same tensors into pinned memory (the second of two) >= 0.7.
3. Load that checkpoint onto the CPU: bitwise the state saved (the pinned copy of 2 is the
   reference). Zero the live state, load the checkpoint into it on the GPU: bitwise again.
4. An ``overlap_snapshot`` save: training blocked (the call, plus the next optimizer step's
   wait for the side stream's copies) beside the default save's; the checkpoint loaded
   onto the CPU is bitwise the safe point's state although the step changed the weights.

    python engine.py ROOT [--device cuda] [--layers 16 --width 8192 --batch 2048]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import time
from typing import Any

import torch
from common import SMALL, plan, row, say, verdict, why_no_cuda
from torch import nn

from ferry.engine import AsyncSaver, list_checkpoints, load
from ferry.engine.deferred import OverlapBroken
from ferry.session.overlap import Overlap
from ferry.storage import open_storage

PART = "engine"
CHECKS = (
    "overlap_snapshot refuses a .data write on the GPU",
    "default async save: training blocked",
    "snapshot bandwidth / pinned copy_ of the same bytes",
    "save, load onto the CPU: bitwise",
    "load back onto the GPU: bitwise",
    "overlap_snapshot save: training blocked beside the default's",
    "overlap_snapshot save, loaded: bitwise the safe point",
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(device: torch.device, layers: int, width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    with device:  # initialized where they live: a billion parameters on the CPU take seconds
        for _ in range(layers):
            blocks += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*blocks)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: int, width: int) -> None:
    device = next(model.parameters()).device
    model(torch.randn(batch, width, device=device)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def saved_tensors(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor a save holds, by a name that finds it in a loaded state too."""
    out = {f"model/{k}": v for k, v in model.state_dict().items()}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state[p].items():
            if isinstance(v, torch.Tensor):
                out[f"opt/{i}/{k}"] = v
    return out


def in_loaded(state: Any, name: str) -> torch.Tensor:
    kind, *rest = name.split("/")
    if kind == "model":
        return state["model"][rest[0]]  # type: ignore[no-any-return]
    return state["opt"]["state"][int(rest[0])][rest[1]]  # type: ignore[no-any-return]


class Reference:
    """The saved tensors, copied with plain ``copy_`` into one pinned host buffer: the
    baseline of the snapshot's bandwidth, and what a checkpoint must hold."""

    def __init__(self, tensors: dict[str, torch.Tensor], pinned: bool) -> None:
        self.nbytes = sum(t.nbytes for t in tensors.values())
        self.buf = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pinned)
        self.views: dict[str, torch.Tensor] = {}
        at = 0
        for name, t in tensors.items():
            self.views[name] = self.buf[at : at + t.nbytes].view(t.dtype).view(t.shape)
            at += t.nbytes

    def copy(self, tensors: dict[str, torch.Tensor], device: torch.device) -> float:
        sync(device)
        t0 = time.perf_counter()
        for name, t in tensors.items():
            self.views[name].copy_(t, non_blocking=device.type == "cuda")
        sync(device)
        return time.perf_counter() - t0

    def differs(self, get: Any) -> list[str]:
        """The names whose tensor (``get(name)``, anywhere) differs from this copy, bit for bit."""
        bad = []
        for name, want in self.views.items():
            got = get(name)
            if got.device != want.device:
                want = want.to(got.device)
            if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(_bits(got), _bits(want)):
                bad.append(name)
        return bad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _bitwise_row(check: str, bad: list[str], seconds: float, nbytes: int) -> None:
    figure = f"{len(bad)} of the tensors differ" + (f" (first: {bad[0]})" if bad else "")
    row(
        PART,
        check,
        f"{figure}; loaded in {seconds:.2f} s ({nbytes / seconds / 1e9:.2f} GB/s)",
        "0 differ",
        verdict(not bad),
    )


def refuses_data_write(
    saver: AsyncSaver, objs: dict[str, Any], model: nn.Module, args: argparse.Namespace
) -> None:
    """1: a ``.data`` write right after an overlapped save's safe point fails that save."""
    overlap = Overlap(saver.copied)
    try:
        handle = saver.save(objs, step=1, defer=overlap.defer(objs, False))
        for p in model.parameters():
            p.data.mul_(0.5)  # queued on the current stream while the side stream copies
        train_step(model, objs["opt"], args.batch, args.width)  # its step waits: the overlap goes off
        try:
            handle.wait()
            outcome = "the save was committed"
        except OverlapBroken as exc:
            outcome = f"refused: {exc}"
        committed = [c.step for c in list_checkpoints(open_storage(args.root))]
    finally:
        overlap.close()
    ok = outcome.startswith("refused") and not committed and not overlap.on
    row(PART, CHECKS[0], f"{outcome[:160]}; committed {committed}", "refused, nothing committed", verdict(ok))


def default_save(saver: AsyncSaver, objs: dict[str, Any], ref: Reference, device: torch.device) -> float:
    """2 and 3; returns the time training was blocked."""
    tensors = saved_tensors(objs["model"], objs["opt"])
    saver.wait()
    sync(device)
    t0 = time.perf_counter()
    handle = saver.save(objs, step=2)
    blocked = time.perf_counter() - t0
    info = handle.wait()
    say(
        f"step 2 committed: {info.nbytes / 1e9:.2f} GB in {info.seconds:.2f} s "
        f"({info.gbps:.2f} GB/s, to the disk)"
    )
    row(
        PART,
        CHECKS[1],
        f"{blocked:.3f} s for {info.nbytes / 1e9:.2f} GB",
        "<= 0.5 s",
        verdict(blocked <= 0.5),
    )
    first, second = ref.copy(tensors, device), ref.copy(tensors, device)
    ratio = second / blocked
    row(
        PART,
        CHECKS[2],
        f"{ratio:.2f} (snapshot {ref.nbytes / blocked / 1e9:.1f} GB/s; "
        f"copy_ {ref.nbytes / second / 1e9:.1f} GB/s, first {ref.nbytes / first / 1e9:.1f})",
        ">= 0.7",
        verdict(ratio >= 0.7),
    )
    t0 = time.perf_counter()
    loaded = load(saver.url, target_device="cpu").state
    seconds = time.perf_counter() - t0
    _bitwise_row(CHECKS[3], ref.differs(functools.partial(in_loaded, loaded)), seconds, ref.nbytes)
    del loaded  # 13 GB of host memory
    with torch.no_grad():
        for t in tensors.values():
            t.zero_()
    sync(device)
    t0 = time.perf_counter()
    load(saver.url, into=objs)
    sync(device)
    seconds = time.perf_counter() - t0
    live = saved_tensors(objs["model"], objs["opt"])  # load_state_dict gave the optimizer new tensors
    _bitwise_row(CHECKS[4], ref.differs(live.__getitem__), seconds, ref.nbytes)
    shutil.rmtree(info.url)  # one checkpoint of 13 GB on the disk at a time
    return blocked


def overlapped_save(
    saver: AsyncSaver, objs: dict[str, Any], ref: Reference, default: float, args: argparse.Namespace
) -> None:
    """4."""
    device = torch.device(args.device)
    model, opt = objs["model"], objs["opt"]
    train_step(model, opt, args.batch, args.width)
    saver.wait()
    ref.copy(saved_tensors(model, opt), device)  # the safe point's state
    overlap = Overlap(saver.copied)
    try:
        t0 = time.perf_counter()
        handle = saver.save(objs, step=3, defer=overlap.defer(objs, False))
        at_safe_point = time.perf_counter() - t0
        t0 = time.perf_counter()
        train_step(model, opt, args.batch, args.width)
        sync(device)
        step = time.perf_counter() - t0
        deferred = saver.deferred
        waited = 0.0 if deferred is None else deferred.waited
        info = handle.wait()
    finally:
        overlap.close()
    blocked = at_safe_point + waited
    row(
        PART,
        CHECKS[5],
        f"{blocked:.3f} s (safe point {at_safe_point:.3f} s + the step's wait {waited:.3f} s, in a step of "
        f"{step:.3f} s) beside {default:.3f} s",
        "< the default save's",
        verdict(blocked < default),
    )
    t0 = time.perf_counter()
    loaded = load(info.url, target_device="cpu").state
    seconds = time.perf_counter() - t0
    bad = ref.differs(functools.partial(in_loaded, loaded))
    moved = not torch.equal(model[0].weight.detach().cpu(), ref.views["model/0.weight"])
    if not moved:
        bad.append("(the step after the save did not change the weights: nothing was proven)")
    _bitwise_row(CHECKS[6], bad, seconds, ref.nbytes)


def checkpoint_root(root: str, nbytes: int) -> str:
    """``root``, or a folder in /dev/shm where the disk under ``root`` lacks room for one
    checkpoint and a half (the machine's disk is 64 GiB, most of it its image)."""
    need = int(nbytes * 1.5) + (1 << 30)
    parent = os.path.dirname(os.path.abspath(root))
    if shutil.disk_usage(parent).free >= need:
        return root
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free >= need:
        say(
            f"{parent} has {shutil.disk_usage(parent).free / 1e9:.1f} GB free, under {need / 1e9:.1f} GB: "
            "checkpoints go to /dev/shm (host memory)"
        )
        return os.path.join("/dev/shm", os.path.basename(root))
    return root  # the save says what is missing


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="the checkpoint root: a local folder, removed at the end")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=4 if SMALL else 16)
    p.add_argument("--width", type=int, default=512 if SMALL else 8192)
    p.add_argument("--batch", type=int, default=32 if SMALL else 2048)
    args = p.parse_args()
    plan(PART, CHECKS)
    device = torch.device(args.device)
    reason = why_no_cuda() if device.type == "cuda" else None
    if reason is not None:
        for check in CHECKS:
            row(PART, check, "-", "-", "SKIPPED", reason)
        return 0
    model, opt = build(device, args.layers, args.width)
    train_step(model, opt, args.batch, args.width)  # the optimizer's state exists
    sync(device)
    objs = {"model": model, "opt": opt}
    tensors = saved_tensors(model, opt)
    params = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else 0.0
    say(
        f"{params / 1e9:.3f}e9 parameters, {sum(t.nbytes for t in tensors.values()) / 1e9:.2f} GB saved, "
        f"{gpu:.1f} GB at peak on the GPU"
    )
    # A failed save (part 1's, as it should) is said here, not raised again by the next save.
    args.root = checkpoint_root(args.root, sum(t.nbytes for t in tensors.values()))
    saver = AsyncSaver(
        args.root, keep_last=1, on_error=lambda step, exc: say(f"save of step {step} failed: {exc}")
    )
    try:
        refuses_data_write(saver, objs, model, args)
        ref = Reference(tensors, pinned=device.type == "cuda")
        train_step(model, opt, args.batch, args.width)
        default = default_save(saver, objs, ref, device)
        overlapped_save(saver, objs, ref, default, args)
    finally:
        saver.close()
        shutil.rmtree(args.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
