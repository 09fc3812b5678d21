"""Issue: commands that neither train nor load tensors start without torch. Each runs in a
fresh interpreter, on a real checkpoint (inspect, verify) and real job directories (list,
status, completion), and must leave ``torch`` out of ``sys.modules``. Timings are the
benchmark's business (benchmarks/startup.py), not a test's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ferry.engine import save
from ferry.engine.codec import TORCH_DTYPES
from ferry.format.wire import TORCH_ITEMSIZES

FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]
PROBE = (
    "import sys\nfrom ferry.cli import main\n"
    "try:\n    main(prog_name='ferry')\nexcept SystemExit as exc:\n    code = exc.code\n"
    "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code, file=sys.stderr)\n"
)


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    return {**env, "FERRY_HOME": str(home), **extra}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real checkpoint root, and two real job directories written by `ferry run`."""
    tmp = tmp_path_factory.mktemp("startup")
    ckpt = tmp / "ckpt"
    state = {"w": torch.ones(4, 4), "dtype": torch.bfloat16, "device": torch.device("cpu"), "n": 3}
    save(state, str(ckpt), step=7)
    home = tmp / "home"
    for job in ("job10", "job2"):
        cmd = [*FERRY, "run", "--no-autotrack", "--job-id", job, "--dir", str(tmp / job), "--", "true"]
        done = subprocess.run(cmd, env=env_for(home), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    return ckpt, home


def test_the_dtype_sizes_of_the_torch_free_table_are_torchs() -> None:
    for name, dtype in TORCH_DTYPES.items():
        assert TORCH_ITEMSIZES[name] == dtype.itemsize, name
    assert set(TORCH_DTYPES) <= set(TORCH_ITEMSIZES)


COMMANDS = {
    "help": ["--help"],
    "bare": [],
    "list": ["list", "--all"],
    "ls": ["ls", "--json"],
    "status": ["status", "job2"],
    "inspect": ["inspect", "{ckpt}", "--tensors"],
    "verify": ["verify", "{ckpt}"],
    "inspect-json": ["inspect", "{ckpt}", "--json"],
    "error-json": ["status", "nope", "--json"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_commands_that_read_only_do_not_import_torch(world: tuple[Path, Path], name: str) -> None:
    ckpt, home = world
    argv = [a.format(ckpt=ckpt) for a in COMMANDS[name]]
    code = f"import sys\nsys.argv = ['ferry', *{argv!r}]\n" + PROBE
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env_for(home), capture_output=True, text=True, timeout=60
    )
    assert proc.stderr.strip().splitlines()[-1].startswith("NO-TORCH"), proc.stderr
    if name == "error-json":
        assert proc.stdout.strip().startswith('{"error"'), proc.stdout
    elif name not in ("bare",):
        assert proc.stderr.strip().endswith(("None", "0")), proc.stderr


def test_job_ids_complete_in_the_shell_in_natural_order_without_torch(world: tuple[Path, Path]) -> None:
    _, home = world
    for words, cword in (("ferry status ", "2"), ("ferry checkpoint jo", "2"), ("ferry stop job1", "2")):
        env = env_for(home, COMP_WORDS=words, COMP_CWORD=cword, _FERRY_COMPLETE="bash_complete")
        proc = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
        )
        assert "NO-TORCH" in proc.stderr, proc.stderr
        expected = ["plain,job10"] if words.endswith("job1") else ["plain,job2", "plain,job10"]
        assert proc.stdout.split() == expected, proc.stdout
