"""A manifest's tensor records (``TensorRecord``), and the check of a big state's tens of
thousands of them in one pass (``fitting_records``): what every manifest ferry writes holds
passes it; anything else falls back to ``manifest.py``'s checks, whose messages name the
field. Both paths accept and refuse the same records (tests/integration/
test_manifest_fastpath.py, over the fuzzer's edits)."""

from __future__ import annotations

from typing import Literal, TypedDict

from ferry.errors import UnsafeCheckpointError
from ferry.format.wire import TORCH_ITEMSIZES, device_ok, safe_np_dtype
from ferry.typedjson import INT_MAX, INT_MIN

MAX_DIMS = 32
"""The most dimensions a tensor may have (numpy's limit before 2.0)."""


class TensorRecord(TypedDict):
    """Where tensor ``i`` of the tree lies, and what it is."""

    dtype: str
    """A name from engine/codec.TORCH_DTYPES (torch), or numpy's dtype string (numpy)."""
    shape: list[int]
    nbytes: int
    kind: Literal["torch", "numpy"]
    device: str
    """Where it was saved from; informational."""
    file: str
    offset: int


RECORD_KEYS = len(TensorRecord.__annotations__)


def plain_records(value: object) -> list[TensorRecord] | None:
    """``value`` itself when it is a list of tensor records exactly as the schema declares
    them (its keys, no others; each value of its type, integers in range): what every
    manifest ferry writes holds, checked at a fraction of the schema's cost per record
    (a checkpoint may hold tens of thousands). None when any record is not: the schema
    then checks the list, and its message names the field."""
    if type(value) is not list:
        return None
    for e in value:
        if type(e) is not dict or len(e) != RECORD_KEYS:
            return None
        shape, nbytes, offset = e.get("shape"), e.get("nbytes"), e.get("offset")
        if not (
            type(e.get("dtype")) is str
            and type(e.get("device")) is str
            and type(e.get("file")) is str
            and e.get("kind") in ("torch", "numpy")
            and type(nbytes) is int
            and type(offset) is int
            and INT_MIN <= nbytes <= INT_MAX
            and INT_MIN <= offset <= INT_MAX
            and type(shape) is list
        ):
            return None
        for dim in shape:
            if type(dim) is not int or not INT_MIN <= dim <= INT_MAX:
                return None
    return value  # type: ignore[return-value]


def _file_sizes(files: object) -> dict[object, int] | None:
    """Each file's size, when ``files`` is a plain dict of plain sizes; None otherwise."""
    if type(files) is not dict:
        return None
    sizes: dict[object, int] = {}
    for name, meta in files.items():
        size = meta.get("size") if type(meta) is dict else None
        if type(size) is not int or not 0 <= size <= INT_MAX:
            return None
        sizes[name] = size
    return sizes


def fitting_records(value: object, files: object) -> list[TensorRecord] | None:
    """``value`` itself when every record is plain (``plain_records``) and passes
    ``check_tensors`` against ``files`` (the manifest's, not yet parsed): both checks in
    one pass, a field read once, for the tens of thousands of records of a big state. None
    when any record does not (or ``files`` is not plain): the two checks then run as
    always, in their order, and their messages say what is wrong."""
    sizes = _file_sizes(files)
    if type(value) is not list or sizes is None:
        return None
    # A state has few kinds of records: (kind, dtype, device, file) is checked once. Only a
    # str equals a str in JSON, so a key equal to one found good is made of strs too.
    seen: dict[tuple[object, ...], tuple[int, int]] = {}
    for e in value:
        if type(e) is not dict or len(e) != RECORD_KEYS:
            return None
        try:
            key = (e["kind"], e["dtype"], e["device"], e["file"])
            shape, nbytes, offset = e["shape"], e["nbytes"], e["offset"]
            known = seen.get(key)  # (a list or dict in it is unhashable: TypeError)
        except (KeyError, TypeError):
            return None
        if known is None:
            if (known := _record_kind(key, sizes)) is None:
                return None
            seen[key] = known
        if type(nbytes) is not int or type(offset) is not int or type(shape) is not list:
            return None
        if len(shape) > MAX_DIMS:
            return None
        count, empty = 1, False
        for dim in shape:
            if type(dim) is not int or dim < 0:
                return None
            if dim:
                count *= dim
            else:
                empty = True
        itemsize, size = known
        if (
            count >= 2**62
            or nbytes != (0 if empty else count * itemsize)
            or nbytes > INT_MAX
            or offset < 0
            or offset % itemsize
            or offset + nbytes > size
        ):
            return None
    return value  # type: ignore[return-value]


def _record_kind(key: tuple[object, ...], sizes: dict[object, int]) -> tuple[int, int] | None:
    """(item size, file size) for a record's (kind, dtype, device, file) when all four are
    good: a known dtype of its kind, a device ferry can name, a file of the manifest."""
    kind, dtype, device, file = key
    if type(kind) is not str or type(dtype) is not str or type(file) is not str:
        return None
    itemsize: int | None = None
    if kind == "torch":
        itemsize = TORCH_ITEMSIZES.get(dtype)
    elif kind == "numpy":
        try:
            itemsize = safe_np_dtype(dtype).itemsize
        except UnsafeCheckpointError:
            return None
    size = sizes.get(file)
    if itemsize is None or size is None or not device_ok(device):
        return None
    return itemsize, size
