"""Sharded state through torch.distributed.checkpoint with ferry's own storage (engine/dcpio.py):
exact round trip, nothing unpickled, and crafted files with a live pickle payload refused
without running it. In one process (DCP without a process group); resharding across ranks
is tests/integration/test_zero_code.py::test_fsdp_sharded_state_goes_through_dcp_and_reshards."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ferry.engine import save, sharded
from ferry.errors import CorruptCheckpointError, FerryError, UnsafeCheckpointError
from ferry.format.wire import manifest_bytes

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Payload:
    """A pickle that writes ``marker`` when it is unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 2).to(torch.float64))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    for _ in range(2):
        model[1](model[0](torch.randn(3, 5)).double()).sum().backward()
        opt.step()
    return model, opt


def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 2).to(torch.float64))
    return model, torch.optim.AdamW(model.parameters(), lr=5.0)


def dcp_files(tmp_path: Path) -> dict[str, bytes]:
    """What a save writes into ``dcp/``, by name."""
    model, opt = trained()
    folder = tmp_path / "staged" / "dcp"
    assert sharded.optimizers_saved({"m": (model, [opt])}) == {"m": True}
    sharded.write(sharded.stage({"m": (model, [opt])}), str(folder))
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def committed(root: Path, files: dict[str, bytes]) -> str:
    """A committed ferry checkpoint whose ``dcp/`` holds ``files``, each listed in the
    manifest with its checksum: what someone crafting a checkpoint can make."""
    info = save({"x": 1}, str(root), step=1, extra_files={f"dcp/{n}": b for n, b in files.items()})
    return info.url + "/dcp"


def test_round_trip_is_exact_and_unpickles_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = dcp_files(tmp_path)
    assert set(files) == {"metadata.json", "shards-0.bin"}
    json.loads(files["metadata.json"])  # the description is JSON
    url = committed(tmp_path / "ck", files)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("something unpickled")

    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    model, opt = fresh()
    sharded.load({"m": (model, [opt])}, url, {"m": True})
    want_model, want_opt = trained()
    for got, want in zip(model.state_dict().values(), want_model.state_dict().values(), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    got_sd, want_sd = opt.state_dict(), want_opt.state_dict()
    assert got_sd["param_groups"] == want_sd["param_groups"]  # lr 0.01 again, betas a tuple
    for i, st in want_sd["state"].items():
        for key, value in st.items():
            assert torch.equal(got_sd["state"][i][key], value), (i, key)


def _value_made_a_pickle(files: dict[str, bytes], payload: bytes) -> dict[str, bytes]:
    """The first plain value (an optimizer's hyperparameter) re-pointed at ``payload``,
    appended to rank 0's shards, the description's checksum recomputed."""
    desc = json.loads(files["metadata.json"])
    entry = next(e for e in desc["entries"].values() if e["kind"] == "value")
    entry["chunks"][0].update(offset=len(files["shards-0.bin"]), length=len(payload))
    del desc["checksum"]
    return {"metadata.json": manifest_bytes(desc), "shards-0.bin": files["shards-0.bin"] + payload}


CRAFTED: dict[str, Callable[[dict[str, bytes], bytes], dict[str, bytes]]] = {
    "DCP's .metadata, listed": lambda files, p: {**files, ".metadata": p},
    "DCP's .metadata alone": lambda files, p: {".metadata": p, "shards-0.bin": files["shards-0.bin"]},
    "metadata.json is a pickle": lambda files, p: {**files, "metadata.json": p},
    "a value is a pickle": _value_made_a_pickle,
}


@pytest.mark.parametrize("craft", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_pickle_payload_in_dcp_files_is_refused_and_runs_nothing(
    tmp_path: Path, craft: Callable[[dict[str, bytes], bytes], dict[str, bytes]]
) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps(Payload(marker))
    pickle.loads(payload)  # the payload is live: unpickling it writes the marker
    assert marker.exists()
    marker.unlink()
    url = committed(tmp_path / "ck", craft(dcp_files(tmp_path), payload))
    model, opt = fresh()
    with pytest.raises(UnsafeCheckpointError) as refused:
        sharded.load({"m": (model, [opt])}, url, {"m": True})
    assert "\n" not in str(refused.value)
    assert not marker.exists()


def _edit_chunk(files: dict[str, bytes], **fields: object) -> dict[str, bytes]:
    desc = json.loads(files["metadata.json"])
    next(iter(desc["entries"].values()))["chunks"][0].update(fields)
    del desc["checksum"]
    return {**files, "metadata.json": manifest_bytes(desc)}


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"offset": 1 << 40}, CorruptCheckpointError, "outside the file"),
        ({"length": 3}, CorruptCheckpointError, "is not 3 bytes"),
        ({"file": "../../../etc/passwd"}, UnsafeCheckpointError, "not one ferry writes"),
        ({"sizes": [9, 5]}, CorruptCheckpointError, "outside size"),
        ({"offsets": "0"}, CorruptCheckpointError, "malformed"),
    ],
    ids=["far offset", "short length", "file outside", "chunk outside tensor", "offsets not a list"],
)
def test_a_crafted_description_is_a_ferry_error(
    tmp_path: Path, fields: dict[str, object], error: type[FerryError], match: str
) -> None:
    url = committed(tmp_path / "ck", _edit_chunk(dcp_files(tmp_path), **fields))
    model, opt = fresh()
    with pytest.raises(error, match=match):
        sharded.load({"m": (model, [opt])}, url, {"m": True})
