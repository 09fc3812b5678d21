"""zc_ddp.py, after a look-up of torch without importing it (`importlib.util.find_spec`, as
`datasets` makes while it is imported): ferry's hooks must still arm in every rank."""

from __future__ import annotations

import importlib.util
import os
import runpy

if __name__ == "__main__":
    assert importlib.util.find_spec("torch") is not None
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "zc_ddp.py"), run_name="__main__")
