"""ferry's start-up hook for zero-code mode (see ferry.autotrack). Never shadows another
sitecustomize: the next one on the path is run as well."""

from __future__ import annotations


def _chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["_ferry_chained_sitecustomize"] = module
        spec.loader.exec_module(module)


def _arm() -> None:
    import os

    if os.environ.get("FERRY_AUTOTRACK") == "1":
        import importlib.util

        if importlib.util.find_spec("ferry") is None:  # a Python of the job's tree without ferry
            return
        try:
            from ferry.autotrack.hooks import arm

            arm()
        except Exception as exc:  # e.g. a bad FERRY_* variable: never train unprotected
            import sys

            sys.stderr.write(f"ferry: error: {exc}\n")
            sys.stderr.flush()
            os._exit(2)


_chain()
_arm()
