"""A module-level script (no main()): `for step in range(N)` with next() on a loader,
re-created on StopIteration; the counter and the loop live in the module's globals. It
keeps a loss history list, which zero-code mode does not capture: with ZC_TRACK set it
adds the one line that does, `ferry.track(history=history)` (it never imports ferry
otherwise)."""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STOP_AT = {int(s) for s in os.environ.get("ZC_STOP_AT", "").split(",") if s}
p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=15)
args = p.parse_args()
torch.manual_seed(2)
x = torch.randn(40, 4)
y = x @ torch.randn(4, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
running = 0.0
history: list[float] = []
if os.environ.get("ZC_TRACK"):
    import ferry

    ferry.track(history=history)
it = iter(loader)
for step in range(args.steps):
    try:
        xb, yb = next(it)
    except StopIteration:
        it = iter(loader)
        xb, yb = next(it)
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    running = 0.9 * running + 0.1 * loss.item()
    history.append(loss.item())
    print(f"step {step}/{args.steps} loss {loss.item():.8f} running {running:.8f}")
    if step in STOP_AT:  # the tests' stand-in for a scheduler's SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
print(f"history {len(history)} {sum(history):.8f}")
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "params.txt"), "w") as f:
    for name, t in model.state_dict().items():
        f.write(f"{name} {t.numpy().tobytes().hex()}\n")
