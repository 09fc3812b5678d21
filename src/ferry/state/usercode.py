"""Which files are the user's own code: zero-code mode captures the training loop's state in
their frames (``frames.py``), and names a loader by the line of theirs that built it.

User code is every Python file outside the interpreter's standard library, outside
``site-packages``/``dist-packages`` (and the interpreter's other site folders), and
outside ferry and torch: the script, the folders beside it, the user's own package
wherever it is imported from (``PYTHONPATH``, a path added by the script, an editable
install). More folders are added with ``ferry run --code-root DIR`` or
``FERRY_CODE_ROOTS`` (folders separated by ``os.pathsep``), and so is the source folder of
every editable install (``pip install -e``: a distribution whose ``direct_url.json`` says
``dir_info.editable``), even one that lies under a site folder. ferry's and torch's own
files are never user code, installed editable or not.
"""

from __future__ import annotations

import json
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import FrameType
from urllib.parse import unquote, urlparse

ROOTS_VARIABLE = "FERRY_CODE_ROOTS"
_SITE_PARTS = {"site-packages", "dist-packages"}
_FERRY_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # src/ferry


def is_user_file(path: str) -> bool:
    """Is the Python file ``path`` (a code object's ``co_filename``) the user's own code?"""
    if not path or path.startswith("<"):  # <frozen ...>, <string>, <stdin>: no file of theirs
        return False
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file is None:  # torch's own frames cannot run before it is imported: not cached
        return _Rules.now().decide(os.path.realpath(path), None)
    return _decide(path, _folder_of(torch_file))


@cache
def _folder_of(file: str) -> str:
    """The real folder of ``file`` (a module's ``__file__``: looked up once, it does not move)."""
    return os.path.dirname(os.path.realpath(file))


@cache
def _decide(path: str, torch_dir: str) -> bool:
    return _Rules.now().decide(os.path.realpath(path), torch_dir)


def innermost_user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of user code from ``frame`` outwards (``frame`` itself included),
    or None when no frame on that stack runs user code."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_frames(frame: FrameType | None) -> list[FrameType]:
    """The frames of user code from ``frame`` outwards, outermost first."""
    found: list[FrameType] = []
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            found.append(frame)
        frame = frame.f_back
    return found[::-1]


def _under(path: str, folders: Iterable[str]) -> bool:
    return _deepest(path, folders) > 0


def _deepest(path: str, folders: Iterable[str]) -> int:
    """The length of the longest of ``folders`` that holds ``path`` (0: none)."""
    return max((len(f) for f in folders if path == f or path.startswith(f + os.sep)), default=0)


def _site_folder(path: str) -> str:
    """The part of ``path`` up to its last ``site-packages``/``dist-packages`` ('' if none)."""
    parts = path.split(os.sep)
    last = max((i for i, part in enumerate(parts) if part in _SITE_PARTS), default=-1)
    return os.sep.join(parts[: last + 1]) if last >= 0 else ""


@dataclass(frozen=True)
class _Rules:
    roots: tuple[str, ...]
    """Folders whose files are user code wherever they lie (the options, editable installs)."""
    libraries: tuple[str, ...]
    """The interpreter's standard library and site folders."""

    @staticmethod
    @cache
    def now() -> _Rules:
        """This process's rules, read once (the environment and the installed
        distributions do not change under a running job)."""
        return _Rules(tuple(sorted({*roots_from_env(os.environ), *editable_roots()})), _library_dirs())

    def decide(self, path: str, torch_dir: str | None) -> bool:
        """The most specific folder holding ``path`` decides: a root inside a site folder
        (``--code-root .venv/lib/python3.11/site-packages/mypkg``) makes its files user
        code, a site folder inside a root (a project's own ``.venv``) keeps its files
        libraries."""
        if _under(path, (_FERRY_DIR, *([torch_dir] if torch_dir else []))):
            return False
        library = max(len(_site_folder(path)), _deepest(path, self.libraries))
        return library == 0 or _deepest(path, self.roots) > library


def roots_from_env(environ: Mapping[str, str]) -> list[str]:
    """The folders ``FERRY_CODE_ROOTS`` names (``os.pathsep``-separated), made absolute."""
    raw = environ.get(ROOTS_VARIABLE, "")
    return [os.path.realpath(p) for p in raw.split(os.pathsep) if p.strip()]


def _library_dirs() -> tuple[str, ...]:
    found = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    found |= set(getattr(site, "getsitepackages", list)())
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    found.add(user_site if isinstance(user_site, str) else None)
    return tuple(sorted({os.path.realpath(p) for p in found if p}))


def editable_roots(paths: list[str] | None = None) -> list[str]:
    """The source folders of the distributions installed editable (on ``paths``, by
    default ``sys.path``): those whose ``direct_url.json`` (PEP 610, which pip writes for
    every install from a folder) says ``dir_info.editable``."""
    from importlib import metadata  # here: it costs 0.1-0.3 s where nothing imported it yet

    roots = []
    for dist in metadata.distributions(path=paths if paths is not None else sys.path):
        try:
            text = dist.read_text("direct_url.json")
            record = json.loads(text) if text else None
        except (OSError, ValueError, UnicodeDecodeError):
            continue  # a broken record is no proof of anything
        if not isinstance(record, dict) or not isinstance(record.get("dir_info"), dict):
            continue
        url = record.get("url")
        if record["dir_info"].get("editable") is True and isinstance(url, str):
            parsed = urlparse(url)
            if parsed.scheme == "file" and parsed.path:
                roots.append(os.path.realpath(unquote(parsed.path)))
    return roots
