"""Zero-code mode arms whatever way the script imports torch, and says so when it could not
(issue: "never break a working job, never miss a stop, never claim what did not happen")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import compat
from test_zero_code import FERRY, plain, training_record, under_ferry
from trainrun import env_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("order", ["datasets", "find-spec", "import-module", "lazy"])
def test_a_stop_is_served_however_torch_is_imported(order: str, tmp_path: Path) -> None:
    """`importlib.util.find_spec("torch")` before the import (what `datasets` does) used to
    spend ferry's one-shot import hook: no hooks, the stop ignored, "never reached a safe
    point" printed after 300 safe points."""
    if order == "datasets":
        pytest.importorskip("datasets")
    args = ["--order", order]
    plain("zc_imports.py", tmp_path / "ref", args, tmp_path / "home-ref")
    first = under_ferry(
        "zc_imports.py", tmp_path / "run", [*args, "--sleep", "0.03"], tmp_path, stop_after_lines=12
    )
    assert first.returncode == 85, first.stderr
    assert "checkpointed at step" in first.stderr
    assert "never reached a safe point" not in first.stderr
    second = under_ferry("zc_imports.py", tmp_path / "run", args, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr
    assert training_record(tmp_path / "run") == training_record(tmp_path / "ref")


def _ferry_run(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [FERRY, "run", "--dir", str(tmp / "ck"), "--job-id", "zc", "--", sys.executable, *argv]
    return subprocess.run(cmd, env=env_for(tmp / "home"), capture_output=True, text=True, timeout=240)


def test_hooks_keep_what_introspection_sees(tmp_path: Path) -> None:
    """Every hook ferry places on torch keeps the name, signature and ``__wrapped__`` torch
    defines, and the import machinery is left as it was (``torch.__loader__``)."""
    probe = (
        "import inspect, torch\n"
        "from torch.utils.data import DataLoader\n"
        "for f in (DataLoader.__init__, DataLoader.__iter__):\n"
        "    w = inspect.unwrap(f)\n"
        "    print(f.__name__, f.__qualname__, f.__module__, inspect.signature(f) == inspect.signature(w),"
        " w.__module__)\n"
        "print('loader', 'exec_module' in vars(torch.__loader__))\n"
    )
    proc = _ferry_run(tmp_path, "-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "__init__ DataLoader.__init__ torch.utils.data.dataloader True torch.utils.data.dataloader",
        "__iter__ DataLoader.__iter__ torch.utils.data.dataloader True torch.utils.data.dataloader",
        "loader False",
    ]


def test_torch_compile_prints_no_warning_about_ferrys_module_hook(tmp_path: Path) -> None:
    """Zero-code mode's global forward pre-hook (for models trained by hand) made every call
    of a `torch.compile`d module warn of global module hooks, which plain python never does."""
    script = tmp_path / "compiled.py"
    script.write_text(
        "import torch\n"
        "m = torch.compile(torch.nn.Linear(3, 1), backend='eager')\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    loss = m(torch.randn(4, 3)).sum()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "print('ok')\n"
    )
    argv = [sys.executable, str(script)]
    ref = compat.plain(argv, tmp_path / "plain", compat.env_for(tmp_path / "h0"))
    got = compat.under_ferry(argv, tmp_path / "ferry", compat.env_for(tmp_path / "h1"))
    compat.assert_same(ref, got)


def test_a_script_that_never_imports_torch_does_not_get_it(tmp_path: Path) -> None:
    """The start-up hook runs in every Python process under `ferry run` (the script's own
    helper processes too): it imports neither torch nor numpy. Before, it imported both (the
    files' rollback reached the frame state through its imports): 2.5 s more for each such
    process, and `os.environ["OMP_NUM_THREADS"] = ...` before `import torch` came too late."""
    probe = "import sys\nprint(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    plain_run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    proc = _ferry_run(tmp_path, "-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain_run.stdout == "[]\n"
