"""Which package a storage scheme needs, and how to install it: asked before a job starts
(``ferry run`` checks its root), and named when an fsspec backend is missing at a save."""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "pip install 'gpuferry[s3]'"),
    "s3a": ("s3fs", "pip install 'gpuferry[s3]'"),
    "root": ("fsspec_xrootd", "pip install 'gpuferry[xrootd]'"),
}
"""Scheme -> (the module its fsspec backend lives in, the install line of ferry's extra)."""


def install_hint(scheme: str) -> str:
    """How to install the backend of ``scheme``: ferry's extra where there is one, else the
    package fsspec's registry names (gcsfs for gs://, adlfs for az://), else fsspec's list."""
    if scheme in EXTRAS:
        return EXTRAS[scheme][1]
    module, needs = _registered(scheme)
    if module is None:
        return "see fsspec's list of known implementations"
    if module.startswith("fsspec."):  # fsspec's own class, whose dependencies are missing
        return needs or "see fsspec's list of known implementations"
    return f"pip install {module.split('.')[0]}"


def missing_backend(scheme: str) -> str | None:
    """Why the fsspec backend of ``scheme`` cannot load here (its package is not installed),
    with the install line; None when it is there, or fsspec itself implements it."""
    module = EXTRAS[scheme][0] if scheme in EXTRAS else _registered(scheme)[0]
    if module is None:
        return None
    top = module.split(".")[0]
    if top == "fsspec" or importlib.util.find_spec(top) is not None:
        return None
    return f"the {scheme}:// backend is not installed (no {top} module): {install_hint(scheme)}"


def backend_problem(url: str, scheme: str) -> str | None:
    """Why no storage backend can take ``url``, whose scheme is ``scheme`` (not a local
    path): its package is missing (with the install line), or no fsspec backend knows the
    scheme; None when one can."""
    missing = missing_backend(scheme)
    if missing is not None:
        return f"{url!r}: {missing}"
    import fsspec  # here: a local path (the usual) needs no fsspec to start

    if scheme not in fsspec.available_protocols():
        return (
            f"{url!r}: no storage backend knows the scheme {scheme}:// ; give a local path or an "
            "fsspec URL (s3://, gs://, root://, ...)"
        )
    return None


def _registered(scheme: str) -> tuple[str | None, str | None]:
    """The module fsspec's registry loads for ``scheme`` (without importing it) and the
    registry's words for what it needs; (None, None) for a scheme it does not know."""
    from fsspec.registry import known_implementations

    entry = known_implementations.get(scheme)
    if not isinstance(entry, dict) or "class" not in entry:
        return None, None
    needs = entry.get("err")
    return str(entry["class"]).rsplit(".", 1)[0], needs if isinstance(needs, str) else None
