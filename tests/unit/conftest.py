"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from copygate import CopyGate

from ferry.engine import snapshot as snapshot_module


@pytest.fixture
def copy_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[CopyGate]:
    gate = CopyGate()
    monkeypatch.setattr(snapshot_module, "_start_host", gate.start)
    yield gate
    gate.open()  # nothing left waiting, whatever the test did
