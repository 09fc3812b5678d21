"""The one parser of a checkpoint's frame state (``ferry.frames``): whatever the manifest
holds is checked against the types of ``framestate.py`` (types, lengths, nesting, counts and
positions never negative, kinds from a closed set) and turned into them, or refused whole
with the field named."""

from __future__ import annotations

import re
from typing import Any

from ferry.errors import CorruptCheckpointError
from ferry.state.framestate import (
    BY,
    GENERATOR,
    LOADER,
    MAX_DEPTH,
    MAX_FRAMES,
    MAX_ITEMS,
    MAX_NAMES,
    MAX_POSITION,
    MAX_SLOT,
    MAX_STR,
    POSITIONED,
    PRIMITIVES,
    RANGE,
    REVERSED,
    VERSION,
    WRAPPERS,
    Entry,
    Enumerated,
    Fingerprint,
    Frame,
    FrameStateError,
    Legacy,
    Loop,
    LoopState,
    Section,
    got,
    is_key,
    is_name,
    is_plain,
    plain_problem,
)

_UNKNOWN_KIND = re.compile(r"\?[A-Za-z_][A-Za-z0-9_.]{0,200}\Z")
_HEX = re.compile(r"[0-9a-f]{16}\Z")


def parse(raw: object, where: str) -> Section | Legacy:
    """The frames section of the checkpoint at ``where``, checked; CorruptCheckpointError
    naming the field otherwise."""
    try:
        return _section(raw)
    except FrameStateError as exc:
        raise CorruptCheckpointError(
            f"{where}: the loop's frame state, ferry.frames{exc.path}, {exc.why}: ferry never writes "
            "that, so the checkpoint is damaged or was crafted; resume from an older checkpoint "
            "(move this one away) or start fresh in another --dir"
        ) from None


def _section(raw: object) -> Section | Legacy:
    # "files", "library_loops" and "accelerators" are zero-code mode's extras
    # (autotrack/extras.py), which check their own fields when they restore them
    extras = {"files", "library_loops", "accelerators"}
    d = _dict(raw, "", {"version", "by", "model", "python", "sampler", "frames", *extras})
    by = d.get("by", "loader")
    if by not in BY:
        raise FrameStateError(".by", f"is {got(by)}, not one of {', '.join(BY)}")
    if "version" not in d:
        return Legacy(str(by))
    if type(d["version"]) is not int or d["version"] != VERSION:
        raise FrameStateError(".version", f"is {got(d['version'])}, not {VERSION}")
    model = d.get("model")
    if model is not None:
        _str(model, ".model")
    python = _str(d.get("python"), ".python", 16)
    sampler = _dict(d.get("sampler", {}), ".sampler")
    for name, value in sampler.items():
        _name(name, f".sampler.{name}")
        if type(value) not in PRIMITIVES or not is_plain(value):
            raise FrameStateError(f".sampler.{name}", f"is {got(value)}, not a scalar")
    frames = _list(d.get("frames"), ".frames", MAX_FRAMES)
    return Section(
        str(by), model, python, sampler, tuple(_frame(f, f".frames[{i}]") for i, f in enumerate(frames))
    )


def _frame(raw: object, path: str) -> Frame:
    required = {"file", "qualname", "line", "code", "names", "values", "loops"}
    d = _dict(raw, path, {*required, "offset"})
    if not required <= set(d):
        raise FrameStateError(path, f"lacks {', '.join(sorted(required - set(d)))}")
    offset = d.get("offset")
    if offset is not None and (type(offset) is not int or not 0 <= offset <= MAX_POSITION):
        raise FrameStateError(f"{path}.offset", f"is {got(offset)}, not an instruction offset")
    line = d["line"]
    if type(line) is not int or not 0 <= line <= MAX_POSITION:
        raise FrameStateError(f"{path}.line", f"is {got(line)}, not a line number")
    code = _str(d["code"], f"{path}.code", 16)
    if not _HEX.match(code):
        raise FrameStateError(f"{path}.code", f"is {got(code)}, not a 16-digit digest")
    names = _list(d["names"], f"{path}.names", MAX_NAMES)
    for i, n in enumerate(names):
        _name(n, f"{path}.names[{i}]")
    values = {k: _entry(v, f"{path}.values.{_name(k, f'{path}.values')}", 0)
              for k, v in _dict(d["values"], f"{path}.values").items()}  # fmt: skip
    loops = _list(d["loops"], f"{path}.loops", 256)
    return Frame(
        _str(d["file"], f"{path}.file"),
        _str(d["qualname"], f"{path}.qualname"),
        line,
        code,
        tuple(names),
        values,
        tuple(_loop(x, f"{path}.loops[{i}]") for i, x in enumerate(loops)),
        offset,
    )


def _entry(raw: object, path: str, depth: int) -> Entry:
    d = _dict(raw, path, {"value", "set", "object", "fingerprint", "alias", "device"})
    kinds = [k for k in ("value", "set", "object", "fingerprint") if k in d]
    if len(kinds) != 1:
        raise FrameStateError(path, "is not exactly one of a value, a set, an object or a fingerprint")
    kind = kinds[0]
    alias, device = d.get("alias"), d.get("device")
    if alias is not None and (type(alias) is not int or not 0 <= alias < MAX_ITEMS):
        raise FrameStateError(f"{path}.alias", f"is {got(alias)}, not a small count")
    if device is not None:
        _str(device, f"{path}.device", 64)
    if kind == "object":
        if depth >= MAX_DEPTH or alias is not None or device is not None:
            raise FrameStateError(path, "nests objects too deep, or has an alias or device")
        attrs = _dict(d["object"], f"{path}.object")
        return Entry(
            "object", attrs={k: _entry(v, f"{path}.{_name(k, path)}", depth + 1) for k, v in attrs.items()}
        )
    if kind == "fingerprint":
        return Entry("fingerprint", fingerprint=_fingerprint(d["fingerprint"], f"{path}.fingerprint"))
    if kind == "set":
        items = _list(d["set"], f"{path}.set", MAX_ITEMS)
        for i, item in enumerate(items):
            if not is_key(item):
                raise FrameStateError(f"{path}.set[{i}]", f"is {got(item)}, not a scalar")
        return Entry("set", frozenset(items), alias=alias)
    why = plain_problem(d["value"])
    if why is not None:
        raise FrameStateError(f"{path}.value", why)
    if alias is not None and type(d["value"]) not in (list, dict):
        raise FrameStateError(f"{path}.alias", "is given for a value that is not a list or dict")
    return Entry("value", d["value"], alias=alias, device=device)


def _fingerprint(raw: object, path: str) -> Fingerprint:
    d = _dict(raw, path, {"kind", "dtype", "shape", "xxh3"}, required=True)
    if d["kind"] not in ("torch", "numpy"):
        raise FrameStateError(f"{path}.kind", f"is {got(d['kind'])}, not torch or numpy")
    shape = _list(d["shape"], f"{path}.shape", 64)
    if not all(type(n) is int and 0 <= n <= MAX_POSITION for n in shape):
        raise FrameStateError(f"{path}.shape", "is not a list of sizes")
    digest = _str(d["xxh3"], f"{path}.xxh3", 16)
    if not _HEX.match(digest):
        raise FrameStateError(f"{path}.xxh3", f"is {got(digest)}, not a 16-digit digest")
    return Fingerprint(d["kind"], _str(d["dtype"], f"{path}.dtype", 32), tuple(shape), digest)


def _loop(raw: object, path: str) -> Loop:
    d = _dict(raw, path, {"slot", "kind", "at"}, required=True)
    slot = d["slot"]
    if type(slot) is not int or not 0 <= slot < MAX_SLOT:
        raise FrameStateError(f"{path}.slot", f"is {got(slot)}, not a stack slot")
    return Loop(slot, _loop_state(d, path, 0))


def _loop_state(d: dict[str, Any], path: str, depth: int) -> LoopState:
    kind, at = d["kind"], d["at"]
    known = kind in POSITIONED or kind in WRAPPERS or kind in (REVERSED, RANGE, LOADER, GENERATOR)
    if not isinstance(kind, str) or not (known or _UNKNOWN_KIND.match(kind)):
        raise FrameStateError(f"{path}.kind", f"is {got(kind)}, not an iterator ferry positions")
    if depth > MAX_DEPTH:
        raise FrameStateError(path, "nests iterators too deep")
    if kind in POSITIONED or kind in (REVERSED, RANGE):
        low = -1 if kind == REVERSED else -MAX_POSITION if kind == RANGE else 0
        if at is not None and (type(at) is not int or not low <= at <= MAX_POSITION):
            raise FrameStateError(f"{path}.at", f"is {got(at)}, not a position from {low}")
        return LoopState(kind, at)
    if kind == GENERATOR:
        if type(at) is not int or not 0 <= at < MAX_FRAMES:
            raise FrameStateError(f"{path}.at", f"is {got(at)}, not the index of one of the loop's frames")
        return LoopState(kind, at)
    if kind == "enumerate":
        e = _dict(at, f"{path}.at", {"count", "inner"}, required=True)
        if type(e["count"]) is not int or not 0 <= e["count"] <= MAX_POSITION:
            raise FrameStateError(f"{path}.at.count", f"is {got(e['count'])}, not a count from 0")
        return LoopState(kind, Enumerated(e["count"], _inner(e["inner"], f"{path}.at.inner", depth)))
    if kind in WRAPPERS:
        z = _dict(at, f"{path}.at", {"inner"}, required=True)
        inners = _list(z["inner"], f"{path}.at.inner", 64)
        return LoopState(kind, tuple(_inner(x, f"{path}.at.inner[{i}]", depth) for i, x in enumerate(inners)))
    if at is not None:
        raise FrameStateError(f"{path}.at", f"is {got(at)}, but a {kind.lstrip('?')} has no position")
    return LoopState(kind, None)


def _inner(raw: object, path: str, depth: int) -> LoopState:
    return _loop_state(_dict(raw, path, {"kind", "at"}, required=True), path, depth + 1)


def _dict(raw: object, path: str, keys: set[str] | None = None, *, required: bool = False) -> dict[str, Any]:
    if type(raw) is not dict:
        raise FrameStateError(path, f"is {got(raw)}, not an object")
    if len(raw) > MAX_ITEMS or not all(type(k) is str for k in raw):
        raise FrameStateError(path, "has keys that are not names, or too many")
    if keys is not None:
        extra = set(raw) - keys
        if extra:
            raise FrameStateError(path, f"has fields ferry does not write: {', '.join(sorted(extra)[:5])}")
        if required and set(raw) != keys:
            raise FrameStateError(path, f"lacks {', '.join(sorted(keys - set(raw)))}")
    return raw


def _list(raw: object, path: str, limit: int) -> list[Any]:
    if type(raw) is not list:
        raise FrameStateError(path, f"is {got(raw)}, not a list")
    if len(raw) > limit:
        raise FrameStateError(path, f"has {len(raw)} items, more than {limit}")
    return raw


def _str(raw: object, path: str, limit: int = MAX_STR) -> str:
    if type(raw) is not str or len(raw) > limit:
        raise FrameStateError(path, f"is {got(raw)}, not a string of up to {limit} characters")
    return raw


def _name(raw: object, path: str) -> str:
    if not is_name(raw):
        raise FrameStateError(path, f"has {got(raw)}, which is not a name ferry keeps")
    return str(raw)
