"""An unmodified language model script in the shape of pytorch/examples'
word_language_model (it never imports ferry): no DataLoader, one token tensor sliced in
`for batch, i in enumerate(range(0, n, bptt))`, a hidden state carried across batches,
manual SGD `p.data.add_(p.grad, alpha=-lr)` (or torch.optim with --optim), and the
learning rate annealed in a plain global when validation stops improving."""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn

STOP_AT = {int(s) for s in os.environ.get("ZC_STOP_AT", "").split(",") if s}
p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--optim", action="store_true")
args = p.parse_args()
V, H, BSZ, BPTT = 11, 16, 4, 5
torch.manual_seed(4)
tokens = (torch.arange(260) * 7 + torch.randint(0, 2, (260,))) % V


def batchify(data, bsz):  # type: ignore[no-untyped-def]
    n = data.size(0) // bsz
    return data[: n * bsz].view(bsz, -1).t().contiguous()


train_data, val_data = batchify(tokens[:200], BSZ), batchify(tokens[200:], BSZ)


class TinyRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.rec, self.out, self.drop = (
            nn.Embedding(V, H),
            nn.Linear(H, H),
            nn.Linear(H, V),
            nn.Dropout(0.2),
        )

    def forward(self, x, h):  # type: ignore[no-untyped-def]
        outs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.rec(h) + self.emb(x[t]))
            outs.append(self.out(self.drop(h)))
        return torch.stack(outs), h


def get_batch(source, i):  # type: ignore[no-untyped-def]
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


model = TinyRNN()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5) if args.optim else None
lr = 0.5
best_val_loss = None
step = 0


def train(epoch):  # type: ignore[no-untyped-def]
    global step
    model.train()
    total_loss = 0.0
    hidden = torch.zeros(BSZ, H)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, BPTT)):
        data, targets = get_batch(train_data, i)
        hidden = hidden.detach()
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, V), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if optimizer is None:
            for q in model.parameters():
                q.data.add_(q.grad, alpha=-lr)
        else:
            optimizer.step()
        total_loss += loss.item()
        step += 1
        print(
            f"| epoch {epoch} | {batch:3d}/{len(train_data) // BPTT} batches | lr {lr:.4f} "
            f"| loss {loss.item():.8f} | total {total_loss:.8f}"
        )
        if step in STOP_AT:  # the tests' stand-in for a scheduler's SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)


def evaluate(source):  # type: ignore[no-untyped-def]
    model.eval()
    total, hidden = 0.0, torch.zeros(BSZ, H)
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, BPTT):
            data, targets = get_batch(source, i)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(output.view(-1, V), targets).item()
    return total / (len(source) - 1)


for epoch in range(1, args.epochs + 1):
    train(epoch)
    val_loss = evaluate(val_data)
    print(f"| end of epoch {epoch} | valid loss {val_loss:.8f}")
    if best_val_loss is None or val_loss < best_val_loss - 0.4:
        best_val_loss = val_loss
    else:
        lr /= 4.0
        if optimizer is not None:
            for g in optimizer.param_groups:
                g["lr"] = lr
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "params.txt"), "w") as f:
    for name, t in model.state_dict().items():
        f.write(f"{name} {t.numpy().tobytes().hex()}\n")
