"""Which files are the user's code (``state/usercode.py``): a table of paths and folders,
the editable installs read from their ``direct_url.json``, ``FERRY_CODE_ROOTS`` in a real
interpreter, and the innermost frame of user code on a real stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ferry
from ferry.state import usercode
from ferry.state.usercode import _Rules

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
FERRY_DIR = os.path.dirname(os.path.realpath(ferry.__file__))
TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__))

RULES = [
    # (path, roots, is user code)
    ("/home/u/projects/x/train.py", (), True),
    ("/home/u/mypkg/trainer.py", (), True),  # the user's own package, wherever it lies
    (f"{SITE}/transformers/trainer.py", (), False),
    ("/usr/lib/python3/dist-packages/numpy/core.py", (), False),
    (f"{STDLIB}/runpy.py", (), False),
    ("/home/u/.local/lib/python3.11/site-packages/tqdm/std.py", (), False),
    (f"{SITE}/mypkg/trainer.py", (f"{SITE}/mypkg",), True),  # --code-root inside a site folder
    ("/home/u/proj/.venv/lib/python3.11/site-packages/torchvision/x.py", ("/home/u/proj",), False),
    ("/home/u/proj/src/mypkg/x.py", ("/home/u/proj",), True),  # an editable install's source
    (f"{FERRY_DIR}/session/core.py", (os.path.dirname(FERRY_DIR),), False),  # ferry, even editable
    (f"{TORCH_DIR}/optim/adam.py", (TORCH_DIR,), False),
    (f"{SITE}-old/x.py", (), True),  # a folder that only starts like one
]


@pytest.mark.parametrize(("path", "roots", "user"), RULES)
def test_which_files_are_user_code(path: str, roots: tuple[str, ...], user: bool) -> None:
    assert _Rules(roots, (STDLIB, SITE)).decide(path, TORCH_DIR) is user


def test_no_file_is_user_code_without_a_path() -> None:
    assert not usercode.is_user_file("<frozen importlib._bootstrap>")
    assert not usercode.is_user_file("<string>")
    assert not usercode.is_user_file("")
    assert usercode.is_user_file(__file__)
    assert not usercode.is_user_file(torch.__file__ or "")
    assert not usercode.is_user_file(ferry.__file__ or "")


def _dist(site: Path, name: str, record: object) -> None:
    """A distribution's metadata as pip writes it (``pip install -e DIR --prefix P`` wrote
    these files and this ``direct_url.json``)."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "direct_url.json").write_text(record if isinstance(record, str) else json.dumps(record))


def test_editable_installs_are_found_by_their_direct_url(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    project = tmp_path / "my project"  # a space: the URL quotes it
    _dist(site, "tinypkg", {"dir_info": {"editable": True}, "url": project.as_uri()})
    _dist(site, "wheelpkg", {"archive_info": {}, "url": "https://example.org/w.whl"})
    _dist(site, "dirpkg", {"dir_info": {}, "url": (tmp_path / "other").as_uri()})  # pip install DIR
    _dist(site, "broken", "{not json")
    _dist(site, "remote", {"dir_info": {"editable": True}, "url": "https://example.org/x"})
    assert usercode.editable_roots([str(site)]) == [os.path.realpath(project)]


def test_code_roots_come_from_the_environment_in_a_real_interpreter(tmp_path: Path) -> None:
    """FERRY_CODE_ROOTS (what `ferry run --code-root` sets) makes a package under a site
    folder user code; os.pathsep separates folders, relative ones are the working folder's."""
    lib = tmp_path / "lib" / "site-packages" / "mypkg"
    lib.mkdir(parents=True)
    probe = f"from ferry.state.usercode import is_user_file; print(is_user_file({str(lib / 'x.py')!r}))"
    outputs = []
    for roots in ("", f"{tmp_path / 'elsewhere'}{os.pathsep}lib/site-packages/mypkg"):
        env = {**os.environ, "FERRY_CODE_ROOTS": roots}
        proc = subprocess.run(
            [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.strip())
    assert outputs == ["False", "True"]


def test_ferry_run_code_root_sets_the_worker_s_roots(tmp_path: Path) -> None:
    ferry_cli = str(Path(sys.executable).parent / "ferry")
    cmd = [ferry_cli, "run", "--no-autotrack", "--dir", str(tmp_path / "ck"), "--code-root", "lib/mypkg"]
    cmd += ["--", sys.executable, "-c", "import os; print(os.environ['FERRY_CODE_ROOTS'])"]
    env = {**os.environ, "FERRY_HOME": str(tmp_path / "home"), "FERRY_CODE_ROOTS": "/given"}
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{tmp_path / 'lib' / 'mypkg'}{os.pathsep}/given"


def test_the_innermost_frame_of_user_code_is_found_through_library_frames() -> None:
    import json as library  # a stdlib module's frames stand for a library's

    found = []

    class Hook:
        def default(self, obj: object) -> object:  # called from inside json's encoder
            found.append(usercode.innermost_user_frame(sys._getframe(1)))
            return 0

    library.dumps(object(), default=Hook().default)
    frame = found[0]
    assert frame is not None
    assert frame.f_code.co_name == "test_the_innermost_frame_of_user_code_is_found_through_library_frames"
    assert usercode.innermost_user_frame(None) is None
