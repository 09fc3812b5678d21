"""Issue 30: weights out of a checkpoint. ``ferry export-weights`` writes a tracked model's
``state_dict`` that ``safetensors`` and ``torch.load(weights_only=True)`` read back bitwise
(bf16 and tied weights included); ``ferry.state_dict`` gives the same from Python, by the
names ``ferry inspect`` shows; a checkpoint of two models needs ``--model``; without the
safetensors package the command names the extra to install."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from torch import nn

import ferry
from ferry.cli import main
from ferry.engine import save


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # one tensor under two names
        self.register_buffer("scale", torch.randn(4).to(torch.bfloat16))


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], *, ordered: bool = True) -> None:
    """Equal names (in order, except for safetensors, which sorts them), dtypes, shapes, bits."""
    assert list(got) == list(want) if ordered else sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        assert bits(got[key]) == bits(tensor), key


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="ferry")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A root with one model (and its optimizer, which is no model) two steps into training."""
    torch.manual_seed(3)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model.head(model.embed(torch.arange(5))).sum().backward()
        opt.step()
    root = tmp_path_factory.mktemp("weights") / "ck"
    save({"model": model, "optimizer": opt}, str(root), step=2)
    return root, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_safetensors_and_torch_files_read_back_bitwise(
    checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    root, want = checkpoint
    st, pt = tmp_path / "model.safetensors", tmp_path / "model.pt"
    for out, fmt in ((st, "safetensors"), (pt, "pt")):
        result = cli("export-weights", str(root), str(out))
        assert result.exit_code == 0, result.output
        assert f"model of {root}/step-000000000002 (step 2): 3 tensors" in result.stdout, result.stdout
        assert f"({fmt})" in result.stdout
    same(load_file(str(st)), want, ordered=False)
    same(torch.load(pt, weights_only=True), want)
    with safe_open(str(st), "pt") as f:
        assert f.metadata()["ferry_step"] == "2" and f.metadata()["ferry_model"] == "model"
    same(ferry.state_dict(str(root)), want)  # the API: the newest checkpoint of a root
    same(ferry.state_dict(f"{root}/step-000000000002", "model"), want)
    forced = cli("export-weights", str(root), str(tmp_path / "weights.bin"), "--format", "safetensors")
    assert forced.exit_code == 0 and "(safetensors)" in forced.stdout, forced.output
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "model.safetensors", "weights.bin"]  # no temp left


def test_a_model_by_name_and_what_is_no_model(tmp_path: Path) -> None:
    a, b = nn.Linear(2, 3), nn.Linear(3, 1)
    root = tmp_path / "two"
    save({"encoder": a, "decoder": b, "epoch": 4}, str(root), step=9)
    several = cli("export-weights", str(root), str(tmp_path / "x.pt"))
    assert several.exit_code == 2, several.output
    assert "holds 2 models (encoder, decoder): name one with --model" in several.stderr, several.stderr
    picked = cli("export-weights", str(root), str(tmp_path / "d.pt"), "--model", "decoder")
    assert picked.exit_code == 0, picked.output
    same(torch.load(tmp_path / "d.pt", weights_only=True), b.state_dict())
    for name, words in (("epoch", "is no model's state_dict"), ("nope", "tracks no object 'nope'")):
        wrong = cli("export-weights", str(root), str(tmp_path / "y.pt"), "--model", name)
        assert wrong.exit_code == 2 and words in wrong.stderr, wrong.output
    missing = cli("export-weights", str(tmp_path / "nowhere"), str(tmp_path / "z.pt"))
    assert missing.exit_code == 4, missing.output
    assert not (tmp_path / "y.pt").exists() and not (tmp_path / "z.pt").exists()


def test_without_safetensors_the_command_names_its_extra(
    checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = checkpoint
    for name in ("safetensors", "safetensors.torch"):  # not installed, as far as imports go
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "m.safetensors"
    result = cli("export-weights", str(root), str(out))
    assert result.exit_code == 2 and "pip install 'gpuferry[safetensors]'" in result.stderr, result.output
    assert "--format pt" in result.stderr and not out.exists()
