"""Zero-code discovery walks the heap once (census.py) and still finds what the script makes
later: a new optimizer after a warm-up, a scheduler attached later, a wrapper around the
model, a scaler; what died is never found; what no hook sees (copies made by
``copy.deepcopy``) is found by the walk the census's check calls for.

The classes are the test's own, so that objects other tests left alive in this process do
not shift the names."""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn

from ferry.autotrack.census import census
from ferry.autotrack.discovery import discover


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


class Warm(torch.optim.SGD):
    pass


class Main(torch.optim.AdamW):
    pass


class Decay(torch.optim.lr_scheduler.StepLR):
    pass


def _mine(*objs: Any) -> dict[str, Any]:
    """What discovery finds now, of ``objs``' classes (gathered after it looked: a reference
    to a class held during a look reads as an instance made without its hooks)."""
    found = discover()
    mine = {type(o) for o in objs}
    return {name: obj for name, obj in found.items() if type(obj) in mine}


def test_what_comes_later_is_found_without_another_walk_and_the_dead_are_not() -> None:
    torch.manual_seed(0)
    net = Net()
    warm = Warm(net.parameters(), lr=0.1)
    assert _mine(net, warm) == {"optimizer:Warm:0": warm, "model:Net:0": net}  # (the one walk)
    walks = census.walks
    assert _mine(net, warm) == {"optimizer:Warm:0": warm, "model:Net:0": net}

    main = Main(net.parameters(), lr=1e-3)  # the warm-up is over: a new optimizer...
    del warm
    gc.collect()
    decay = Decay(main, 1)  # ...and a scheduler attached to it later
    wrapped = Wrapper(net)  # the model wrapped (DDP, torch.compile do the same)
    scaler = torch.amp.GradScaler("cpu")
    found = _mine(wrapped, main, decay, scaler)
    assert found == {
        "optimizer:Main:0": main,
        "model:Wrapper:0": wrapped,
        "scheduler[optimizer:Main:0]:Decay:0": decay,
        "scaler:GradScaler:0": scaler,
    }
    assert not [o for o in discover().values() if isinstance(o, Warm)]  # dead: not found

    del wrapped, decay, found
    gc.collect()
    assert _mine(net, main) == {"optimizer:Main:0": main, "model:Net:0": net}
    assert census.walks == walks  # every change seen by a hook, none by a walk


def test_what_no_hook_sees_is_found_by_a_walk() -> None:
    net = Net()
    main = Main(net.parameters(), lr=1e-3)
    assert _mine(net, main) == {"optimizer:Main:0": main, "model:Net:0": net}
    walks = census.walks

    twin = copy.deepcopy(main)  # no __init__ ran: the check sees one more Main than it knows
    found = _mine(net, main)
    assert set(found.values()) == {net, main, twin}
    assert census.walks > walks
    walks = census.walks
    assert _mine(net, main) == found  # kept: no walk again
    assert census.walks == walks

    del twin, found
    gc.collect()
    copied = copy.deepcopy(net)  # a model no registration hook saw, trained by a new optimizer
    other = Warm(copied.parameters(), lr=0.1)
    found = _mine(net, main, other)
    assert {*found.values()} == {net, main, copied, other}
    assert census.walks == walks + 1
    assert _mine(net, main, other) == found
    assert census.walks == walks + 1
